// ops::rms_norm_backward, rms_norm_heads_backward and gated_rms_norm_backward (kernels/norm_backward.hpp, spec.md
// §1): fp64 twins against central finite differences of the fp64 forwards (both flavours, both gate orders, groups,
// shared and per-channel weights), spec.md §8 invariant 8 (grouped gated norm values and gradients; G = 1 equals
// the plain norm of y ⊙ silu(z)), CPU fp32 on 1 and 2 threads against the reference backend on odd sizes and
// strided views, in-place gradients, deterministic dw, and argument errors.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hymix/kernels/norm.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using kernels::gate_order;
using kernels::rms_flavor;

namespace {

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

/// A [A, B, C] float buffer with padded strides [(B + 1)·(C + 2), C + 2, 1] (pad = true) or dense.
struct buf3 {
    std::array<std::int64_t, 3> shape, strides;
    std::vector<float> data;
    buf3(std::int64_t a, std::int64_t b, std::int64_t c, bool pad, float lo, float hi, std::uint64_t seed)
        : shape{a, b, c}, strides{pad ? (b + 1) * (c + 2) : b * c, pad ? c + 2 : c, 1},
          data(test::uniform(std::size_t(a * strides[0]), lo, hi, seed)) {}
    tensor_view<float, 3> v() { return {data.data(), shape, strides}; }
    tensor_view<const float, 3> cv() const { return {data.data(), shape, strides}; }
    tensor_view<float, 2> v2() {  // [A, C] when B == 1
        return {data.data(), {shape[0], shape[2]}, {strides[0], 1}};
    }
    tensor_view<const float, 2> cv2() const { return {data.data(), {shape[0], shape[2]}, {strides[0], 1}}; }
    std::vector<float> dense() const {  // the A·B·C entries without padding
        std::vector<float> out;
        for (std::int64_t i = 0; i < shape[0]; ++i)
            for (std::int64_t j = 0; j < shape[1]; ++j)
                for (std::int64_t k = 0; k < shape[2]; ++k) out.push_back(data[std::size_t(i * strides[0] + j * strides[1] + k)]);
        return out;
    }
};

}  // namespace

// ---- fp64 twins vs finite differences -----------------------------------------------------------------------------

TEST_CASE("rms_norm_backward_ref matches fp64 finite differences (x, w), plain and zero-centred") {
    for (auto flavor : {rms_flavor::plain, rms_flavor::zero_centered})
        for (std::int64_t M : {1, 7})
            for (std::int64_t d : {5, 19, 64}) {
                CAPTURE(static_cast<int>(flavor));
                CAPTURE(M);
                CAPTURE(d);
                const auto seed = std::uint64_t(M * 100 + d);
                auto x = to_double(test::uniform(std::size_t(M * d), -2.f, 2.f, seed));
                auto w = to_double(test::uniform(std::size_t(d), -1.5f, 1.5f, seed + 1));
                const auto c = test::cotangent(x.size(), seed + 2);
                const double eps = 1e-3;  // large enough to matter
                auto loss = [&] {
                    std::vector<double> y(x.size());
                    kernels::rms_norm<double>(tensor_view<const double, 2>(x.data(), {M, d}), w.data(), eps, flavor,
                                              tensor_view<double, 2>(y.data(), {M, d}));
                    return test::dot(c, y);
                };
                std::vector<double> dx(x.size(), 5.0), dw(w.size(), 0.25);
                kernels::rms_norm_backward_ref<double>(tensor_view<const double, 2>(x.data(), {M, d}), w.data(), eps, flavor,
                                                       tensor_view<const double, 2>(c.data(), {M, d}), tensor_view<double, 2>(dx.data(), {M, d}),
                                                       dw.data());
                for (auto& v : dw) v -= 0.25;  // accumulated onto 0.25
                test::check_gradient("dx", x, dx, loss);
                test::check_gradient("dw", w, dw, loss);
            }
}

namespace {

/// Gated norm forward in fp64 on [M, G, gs] data (kernels::gated_rms_norm<double> over [M, G·gs] with groups).
std::vector<double> gated_forward(const std::vector<double>& y, const std::vector<double>& z, const std::vector<double>& w,
                                  std::int64_t M, std::int64_t G, std::int64_t gs, gate_order order, double eps) {
    std::vector<double> out(y.size());
    kernels::gated_rms_norm<double>(tensor_view<const double, 2>(y.data(), {M, G * gs}), tensor_view<const double, 2>(z.data(), {M, G * gs}),
                                    w.data(), std::int64_t(w.size()), gs, order, eps, tensor_view<double, 2>(out.data(), {M, G * gs}));
    return out;
}

/// Checks gated_rms_norm_backward_ref against finite differences for y, z, w (fp64).
void check_gated_fd(std::vector<double> y, std::vector<double> z, std::vector<double> w, std::int64_t M, std::int64_t G,
                    std::int64_t gs, gate_order order, double eps, std::uint64_t seed) {
    const auto c = test::cotangent(y.size(), seed);
    auto loss = [&] { return test::dot(c, gated_forward(y, z, w, M, G, gs, order, eps)); };
    std::vector<double> dy(y.size(), 3.0), dz(z.size(), 3.0), dw(w.size(), 0.0);
    using cv3 = tensor_view<const double, 3>;
    kernels::gated_rms_norm_backward_ref<double>(cv3(y.data(), {M, G, gs}), cv3(z.data(), {M, G, gs}), w.data(), std::int64_t(w.size()),
                                                 order, eps, cv3(c.data(), {M, G, gs}), tensor_view<double, 3>(dy.data(), {M, G, gs}),
                                                 tensor_view<double, 3>(dz.data(), {M, G, gs}), dw.data());
    test::check_gradient("dy", y, dy, loss);
    test::check_gradient("dz", z, dz, loss);
    test::check_gradient("dw", w, dw, loss);
}

}  // namespace

TEST_CASE("gated_rms_norm_backward_ref matches fp64 finite differences: both orders, groups, shared and per-channel w") {
    for (auto order : {gate_order::gate_then_norm, gate_order::norm_then_gate})
        for (std::int64_t M : {1, 7})
            for (std::int64_t G : {1, 3})
                for (std::int64_t gs : {5, 19})
                    for (bool shared : {false, true}) {
                        CAPTURE(static_cast<int>(order));
                        CAPTURE(M);
                        CAPTURE(G);
                        CAPTURE(gs);
                        CAPTURE(shared);
                        const auto seed = std::uint64_t(M * 1000 + G * 100 + gs + (shared ? 7 : 0));
                        check_gated_fd(to_double(test::uniform(std::size_t(M * G * gs), -2.f, 2.f, seed)),
                                       to_double(test::uniform(std::size_t(M * G * gs), -4.f, 4.f, seed + 1)),
                                       to_double(test::uniform(std::size_t(shared ? gs : G * gs), -1.5f, 1.5f, seed + 2)), M, G, gs,
                                       order, 1e-3, seed + 3);
                    }
}

TEST_CASE("grouped gated norm (spec.md §8 invariant 8): values and gradients vs fp64 finite differences") {
    const std::int64_t T = 3, G = 2, gs = 4, D = G * gs;
    std::vector<float> y(std::size_t(T * D)), z(std::size_t(T * D), 10.f);
    const auto jitter = test::uniform(y.size(), -0.01f, 0.01f, 11);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < D; ++i) y[std::size_t(t * D + i)] = (i < gs ? 1.f : 100.f) * (1.f + jitter[std::size_t(t * D + i)]);
    const auto w = test::uniform(std::size_t(D), 0.5f, 2.f, 12);
    const float eps = 1e-5f;
    for (auto order : {gate_order::gate_then_norm, gate_order::norm_then_gate}) {
        CAPTURE(static_cast<int>(order));
        // values: ≈ w (gate-then-norm) and ≈ 10·w (norm-then-gate) in both groups
        std::vector<float> out(y.size());
        ops::gated_rms_norm(cpu_backend(1), tensor_view<const float, 3>(y.data(), {T, G, gs}), tensor_view<const float, 3>(z.data(), {T, G, gs}),
                            w.data(), D, order, eps, tensor_view<float, 3>(out.data(), {T, G, gs}));
        for (std::size_t i = 0; i < out.size(); ++i)
            CHECK(out[i] / w[i % std::size_t(D)] == doctest::Approx(order == gate_order::gate_then_norm ? 1.0 : 10.0).epsilon(0.03));
        // gradients (grouped, then whole width as the control), fp64 finite differences at 1e-6
        check_gated_fd(to_double(y), to_double(z), to_double(w), T, G, gs, order, eps, 13);
        check_gated_fd(to_double(y), to_double(z), to_double(w), T, 1, D, order, eps, 14);
    }
}

TEST_CASE("gated norm backward with G = 1 equals the plain RMSNorm backward of u = y ⊙ silu(z), chained") {
    const std::int64_t M = 7, D = 19;
    const auto y = test::uniform(std::size_t(M * D), -2.f, 2.f, 21), z = test::uniform(std::size_t(M * D), -3.f, 3.f, 22);
    const auto w = test::uniform(std::size_t(D), 0.5f, 1.5f, 23), dout = test::uniform(std::size_t(M * D), -1.f, 1.f, 24);
    const cpu_backend be(2);
    std::vector<float> dy(y.size()), dz(y.size()), dw(w.size(), 0.f);
    ops::gated_rms_norm_backward(be, tensor_view<const float, 3>(y.data(), {M, 1, D}), tensor_view<const float, 3>(z.data(), {M, 1, D}), w.data(),
                                 D, gate_order::gate_then_norm, 1e-5f, tensor_view<const float, 3>(dout.data(), {M, 1, D}),
                                 tensor_view<float, 3>(dy.data(), {M, 1, D}), tensor_view<float, 3>(dz.data(), {M, 1, D}), dw.data());
    std::vector<float> u(y.size()), du(y.size()), dw2(w.size(), 0.f), dy2(y.size()), dz2(y.size());
    for (std::size_t i = 0; i < u.size(); ++i) u[i] = y[i] * silu(z[i]);
    ops::rms_norm_backward(be, tensor_view<const float, 2>(u.data(), {M, D}), w.data(), 1e-5f, rms_flavor::plain,
                           tensor_view<const float, 2>(dout.data(), {M, D}), tensor_view<float, 2>(du.data(), {M, D}), dw2.data());
    for (std::size_t i = 0; i < u.size(); ++i) {
        const double s = sigmoid(double(z[i]));
        dy2[i] = static_cast<float>(du[i] * z[i] * s);
        dz2[i] = static_cast<float>(du[i] * y[i] * s * (1 + z[i] * (1 - s)));
    }
    CHECK(test::rel_error(dy, dy2) < 1e-5);
    CHECK(test::rel_error(dz, dz2) < 1e-5);
    CHECK(test::rel_error(dw, dw2) < 1e-5);
}

TEST_CASE("rms_norm_heads_backward (reference backend) matches fp64 finite differences of the per-head norm") {
    const std::int64_t n = 5, H = 3, dh = 7;
    for (auto flavor : {rms_flavor::plain, rms_flavor::zero_centered}) {
        CAPTURE(static_cast<int>(flavor));
        const auto xf = test::uniform(std::size_t(n * H * dh), -2.f, 2.f, 31), wf = test::uniform(std::size_t(dh), -1.f, 1.f, 32);
        auto x = to_double(xf), w = to_double(wf);
        const auto c = test::cotangent(x.size(), 33);
        const std::vector<float> cf(c.begin(), c.end());
        std::vector<double> cd(cf.begin(), cf.end());  // the cotangent as the op sees it (fp32)
        auto loss = [&] {
            std::vector<double> y(x.size());
            kernels::rms_norm<double>(tensor_view<const double, 2>(x.data(), {n * H, dh}), w.data(), 1e-6, flavor,
                                      tensor_view<double, 2>(y.data(), {n * H, dh}));
            return test::dot(cd, y);
        };
        std::vector<float> dx(x.size()), dw(w.size(), 0.f);
        ops::rms_norm_heads_backward(reference_backend(), tensor_view<const float, 3>(xf.data(), {n, H, dh}), wf.data(), 1e-6f, flavor,
                                     tensor_view<const float, 3>(cf.data(), {n, H, dh}), tensor_view<float, 3>(dx.data(), {n, H, dh}), dw.data());
        test::check_gradient("dx", x, to_double(dx), loss);
        test::check_gradient("dw", w, to_double(dw), loss);
    }
}

// ---- CPU fp32 vs the reference backend ----------------------------------------------------------------------------

TEST_CASE("rms_norm_backward CPU (1, 2 threads) matches the reference backend; strided, in place, deterministic") {
    std::uint64_t seed = 100;
    for (auto flavor : {rms_flavor::plain, rms_flavor::zero_centered})
        for (std::int64_t M : {1, 7, 33, 300})
            for (std::int64_t d : {5, 19, 64})
                for (bool pad : {false, true})
                    for (bool in_place : {false, true}) {
                        CAPTURE(static_cast<int>(flavor));
                        CAPTURE(M);
                        CAPTURE(d);
                        CAPTURE(pad);
                        CAPTURE(in_place);
                        seed += 5;
                        const buf3 x(M, 1, d, pad, -2.f, 2.f, seed);
                        const auto w = test::uniform(std::size_t(d), -1.f, 1.f, seed + 1);
                        auto run = [&](const auto& be, std::vector<float>& dw) {
                            buf3 dy(M, 1, d, pad, -1.f, 1.f, seed + 2), dx(M, 1, d, pad, -9.f, -9.f, 0);
                            buf3& out = in_place ? dy : dx;
                            ops::rms_norm_backward(be, x.cv2(), w.data(), 1e-5f, flavor, dy.cv2(), out.v2(), dw.data());
                            return out.dense();
                        };
                        std::vector<float> dw_ref(std::size_t(d), 0.5f);
                        const auto dx_ref = run(reference_backend(), dw_ref);
                        std::vector<float> dx1, dw1;
                        for (int threads : {1, 2}) {
                            CAPTURE(threads);
                            std::vector<float> dw(std::size_t(d), 0.5f);
                            const auto dx = run(cpu_backend(threads), dw);
                            CHECK(test::rel_error(dx, dx_ref) < 1e-4);
                            CHECK(test::rel_error(dw, dw_ref) < 1e-4);
                            if (threads == 1) {
                                dx1 = dx;
                                dw1 = dw;
                            } else {
                                CHECK(dx == dx1);
                                CHECK(dw == dw1);
                            }
                        }
                    }
}

TEST_CASE("rms_norm_heads_backward CPU (1, 2 threads) matches the reference backend; strided and in place") {
    std::uint64_t seed = 200;
    for (std::int64_t n : {1, 7, 33, 70})
        for (std::int64_t dh : {5, 19, 64})
            for (bool pad : {false, true})
                for (bool in_place : {false, true}) {
                    CAPTURE(n);
                    CAPTURE(dh);
                    CAPTURE(pad);
                    CAPTURE(in_place);
                    seed += 5;
                    const std::int64_t H = 3;
                    const buf3 x(n, H, dh, pad, -2.f, 2.f, seed);
                    const auto w = test::uniform(std::size_t(dh), -1.f, 1.f, seed + 1);
                    auto run = [&](const auto& be, std::vector<float>& dw) {
                        buf3 dy(n, H, dh, pad, -1.f, 1.f, seed + 2), dx(n, H, dh, pad, -9.f, -9.f, 0);
                        buf3& out = in_place ? dy : dx;
                        ops::rms_norm_heads_backward(be, x.cv(), w.data(), 1e-6f, rms_flavor::zero_centered, dy.cv(), out.v(), dw.data());
                        return out.dense();
                    };
                    std::vector<float> dw_ref(std::size_t(dh), 0.f);
                    const auto dx_ref = run(reference_backend(), dw_ref);
                    std::vector<float> dw1;
                    for (int threads : {1, 2}) {
                        CAPTURE(threads);
                        std::vector<float> dw(std::size_t(dh), 0.f);
                        CHECK(test::rel_error(run(cpu_backend(threads), dw), dx_ref) < 1e-4);
                        CHECK(test::rel_error(dw, dw_ref) < 1e-4);
                        if (threads == 1)
                            dw1 = dw;
                        else
                            CHECK(dw == dw1);
                    }
                }
}

TEST_CASE("gated_rms_norm_backward CPU (1, 2 threads) matches the reference backend; both orders, strided, in place") {
    std::uint64_t seed = 300;
    for (auto order : {gate_order::gate_then_norm, gate_order::norm_then_gate})
        for (std::int64_t M : {1, 7, 33, 130})
            for (const auto& g_gs : {std::array<std::int64_t, 2>{1, 5}, {2, 19}, {3, 64}, {4, 16}})
                for (bool shared : {false, true})
                    for (bool pad : {false, true}) {
                        const std::int64_t G = g_gs[0], gs = g_gs[1];
                        CAPTURE(static_cast<int>(order));
                        CAPTURE(M);
                        CAPTURE(G);
                        CAPTURE(gs);
                        CAPTURE(shared);
                        CAPTURE(pad);
                        seed += 5;
                        const bool in_place = pad;  // dy written over dout in the padded runs
                        const buf3 y(M, G, gs, pad, -2.f, 2.f, seed), z(M, G, gs, pad, -5.f, 5.f, seed + 1);
                        const std::int64_t w_len = shared ? gs : G * gs;
                        const auto w = test::uniform(std::size_t(w_len), -1.f, 1.f, seed + 2);
                        auto run = [&](const auto& be, std::vector<float>& dw, std::vector<float>& dz_out) {
                            buf3 dout(M, G, gs, pad, -1.f, 1.f, seed + 3), dy(M, G, gs, pad, -9.f, -9.f, 0), dz(M, G, gs, pad, -9.f, -9.f, 0);
                            buf3& dyo = in_place ? dout : dy;
                            ops::gated_rms_norm_backward(be, y.cv(), z.cv(), w.data(), w_len, order, 1e-5f, dout.cv(), dyo.v(), dz.v(), dw.data());
                            dz_out = dz.dense();
                            return dyo.dense();
                        };
                        std::vector<float> dw_ref(std::size_t(w_len), 0.f), dz_ref;
                        const auto dy_ref = run(reference_backend(), dw_ref, dz_ref);
                        std::vector<float> dw1;
                        for (int threads : {1, 2}) {
                            CAPTURE(threads);
                            std::vector<float> dw(std::size_t(w_len), 0.f), dz;
                            CHECK(test::rel_error(run(cpu_backend(threads), dw, dz), dy_ref) < 1e-4);
                            CHECK(test::rel_error(dz, dz_ref) < 1e-4);
                            CHECK(test::rel_error(dw, dw_ref) < 1e-4);
                            if (threads == 1)
                                dw1 = dw;
                            else
                                CHECK(dw == dw1);
                        }
                    }
}

TEST_CASE("norm backwards skip a null dw and leave it alone") {
    const std::int64_t M = 7, d = 19;
    const auto x = test::uniform(std::size_t(M * d), -1.f, 1.f, 40), w = test::uniform(std::size_t(d), -1.f, 1.f, 41);
    const auto dy = test::uniform(x.size(), -1.f, 1.f, 42);
    std::vector<float> dx(x.size()), dx2(x.size()), dw(w.size(), 0.f);
    const cpu_backend be(2);
    ops::rms_norm_backward(be, tensor_view<const float, 2>(x.data(), {M, d}), w.data(), 1e-6f, rms_flavor::plain,
                           tensor_view<const float, 2>(dy.data(), {M, d}), tensor_view<float, 2>(dx.data(), {M, d}), nullptr);
    ops::rms_norm_backward(be, tensor_view<const float, 2>(x.data(), {M, d}), w.data(), 1e-6f, rms_flavor::plain,
                           tensor_view<const float, 2>(dy.data(), {M, d}), tensor_view<float, 2>(dx2.data(), {M, d}), dw.data());
    CHECK(dx == dx2);
    std::vector<float> dz(x.size());
    ops::gated_rms_norm_backward(be, tensor_view<const float, 3>(x.data(), {M, 1, d}), tensor_view<const float, 3>(dy.data(), {M, 1, d}),
                                 w.data(), d, gate_order::norm_then_gate, 1e-6f, tensor_view<const float, 3>(dy.data(), {M, 1, d}),
                                 tensor_view<float, 3>(dx.data(), {M, 1, d}), tensor_view<float, 3>(dz.data(), {M, 1, d}), nullptr);
    for (float v : dz) CHECK(std::isfinite(v));
}

TEST_CASE("norm backwards: bad shapes, layouts and arguments throw naming the argument") {
    const std::int64_t M = 4, G = 2, gs = 3;
    std::vector<float> a(64, 0.5f), b(64, 0.5f), c(64, 0.5f), d(64), e(64), w(8, 1.f);
    using cv2 = tensor_view<const float, 2>;
    using v2 = tensor_view<float, 2>;
    using cv3 = tensor_view<const float, 3>;
    using v3 = tensor_view<float, 3>;
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto rms = [&](const auto& be, cv2 x, cv2 dy, v2 dx, const float* wp) {
        ops::rms_norm_backward(be, x, wp, 1e-6f, rms_flavor::plain, dy, dx, nullptr);
    };
    auto gated = [&](const auto& be, cv3 y, cv3 z, std::int64_t w_len, cv3 dout, v3 dy, v3 dz) {
        ops::gated_rms_norm_backward(be, y, z, w.data(), w_len, gate_order::gate_then_norm, 1e-6f, dout, dy, dz, nullptr);
    };
    auto all = [&](auto&& f) {
        f(cpu);
        f(ref);
    };
    all([&](const auto& be) {
        CHECK_THROWS_WITH_AS(rms(be, cv2(a.data(), {M, 5}), cv2(b.data(), {M, 6}), v2(d.data(), {M, 5}), w.data()), doctest::Contains("dy"),
                             shape_error);
        CHECK_THROWS_WITH_AS(rms(be, cv2(a.data(), {M, 5}), cv2(b.data(), {M, 5}), v2(d.data(), {M + 1, 5}), w.data()),
                             doctest::Contains("dx"), shape_error);
        CHECK_THROWS_WITH_AS(rms(be, cv2(a.data(), {M, 5}), cv2(b.data(), {M, 5}), v2(d.data(), {M, 5}), nullptr), doctest::Contains("weight"),
                             value_error);
        CHECK_THROWS_WITH_AS(rms(be, cv2(a.data(), {M, 5}), cv2(b.data(), {M, 5}), v2(a.data(), {M, 5}), w.data()),
                             doctest::Contains("dx overlaps x"), shape_error);
        const cv3 y(a.data(), {M, G, gs}), z(b.data(), {M, G, gs}), dout(c.data(), {M, G, gs});
        const v3 dy(d.data(), {M, G, gs}), dz(e.data(), {M, G, gs});
        CHECK_THROWS_WITH_AS(gated(be, y, z, 5, dout, dy, dz), doctest::Contains("weight has 5 entries"), shape_error);
        CHECK_THROWS_WITH_AS(gated(be, y, cv3(b.data(), {M, G, gs + 1}), G * gs, dout, dy, dz), doctest::Contains("z"), shape_error);
        CHECK_THROWS_WITH_AS(gated(be, y, z, G * gs, cv3(c.data(), {M, G + 1, gs}), dy, dz), doctest::Contains("dout"), shape_error);
        CHECK_THROWS_WITH_AS(gated(be, y, z, G * gs, dout, v3(d.data(), {M, G, gs}, {G * gs, gs, 2}), dz), doctest::Contains("dy"),
                             shape_error);
        CHECK_THROWS_WITH_AS(gated(be, y, z, G * gs, dout, dy, v3(d.data(), {M, G, gs})), doctest::Contains("dz overlaps"), shape_error);
    });
    CHECK_THROWS_WITH_AS(ops::rms_norm_heads_backward(cpu, cv3(a.data(), {M, G, gs}), w.data(), 1e-6f, rms_flavor::plain,
                                                      cv3(b.data(), {M, G, gs + 1}), v3(d.data(), {M, G, gs}), nullptr),
                         doctest::Contains("dy"), shape_error);
}

TEST_CASE("gated_rms_norm_backward and rms_norm_backward on the reference backend equal the fp64 twins on fp64 copies") {
    const std::int64_t M = 5, G = 2, gs = 7;
    const auto y = test::uniform(std::size_t(M * G * gs), -2.f, 2.f, 50), z = test::uniform(y.size(), -3.f, 3.f, 51);
    const auto dout = test::uniform(y.size(), -1.f, 1.f, 52), w = test::uniform(std::size_t(gs), 0.5f, 1.5f, 53);
    using cv3 = tensor_view<const float, 3>;
    using cd3 = tensor_view<const double, 3>;
    std::vector<float> dy(y.size()), dz(y.size()), dw(w.size(), 0.25f);
    ops::gated_rms_norm_backward(reference_backend(), cv3(y.data(), {M, G, gs}), cv3(z.data(), {M, G, gs}), w.data(), gs,
                                 gate_order::norm_then_gate, 1e-5f, cv3(dout.data(), {M, G, gs}), tensor_view<float, 3>(dy.data(), {M, G, gs}),
                                 tensor_view<float, 3>(dz.data(), {M, G, gs}), dw.data());
    const auto yd = to_double(y), zd = to_double(z), dod = to_double(dout), wd = to_double(w);
    std::vector<double> dyd(y.size()), dzd(y.size()), dwd(w.size(), double(0.25f));
    kernels::gated_rms_norm_backward_ref<double>(cd3(yd.data(), {M, G, gs}), cd3(zd.data(), {M, G, gs}), wd.data(), gs, gate_order::norm_then_gate,
                                                 double(1e-5f), cd3(dod.data(), {M, G, gs}), tensor_view<double, 3>(dyd.data(), {M, G, gs}),
                                                 tensor_view<double, 3>(dzd.data(), {M, G, gs}), dwd.data());
    for (std::size_t i = 0; i < dy.size(); ++i) {
        CHECK(dy[i] == static_cast<float>(dyd[i]));
        CHECK(dz[i] == static_cast<float>(dzd[i]));
    }
    for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == static_cast<float>(dwd[i]));

    std::vector<float> dx(std::size_t(M * gs)), dw2(w.size(), 0.f);
    ops::rms_norm_backward(reference_backend(), tensor_view<const float, 2>(y.data(), {M, gs}), w.data(), 1e-6f, rms_flavor::zero_centered,
                           tensor_view<const float, 2>(dout.data(), {M, gs}), tensor_view<float, 2>(dx.data(), {M, gs}), dw2.data());
    std::vector<double> dxd(dx.size()), dwd2(w.size(), 0.0);
    kernels::rms_norm_backward_ref<double>(tensor_view<const double, 2>(yd.data(), {M, gs}), wd.data(), double(1e-6f), rms_flavor::zero_centered,
                                           tensor_view<const double, 2>(dod.data(), {M, gs}), tensor_view<double, 2>(dxd.data(), {M, gs}), dwd2.data());
    for (std::size_t i = 0; i < dx.size(); ++i) CHECK(dx[i] == static_cast<float>(dxd[i]));
    for (std::size_t i = 0; i < dw2.size(); ++i) CHECK(dw2[i] == static_cast<float>(dwd2[i]));
}
