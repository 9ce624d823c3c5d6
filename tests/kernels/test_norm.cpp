// RMSNorm flavours (kernels/norm.hpp, spec.md §1): plain and zero-centred RMSNorm, the gated norm in both orders
// with groups (spec.md §8 invariant 8), L2 row norm, each against an fp64 loop reference on odd sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "hymix/kernels/norm.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

double silu_d(double v) { return v / (1.0 + std::exp(-v)); }

/// Gated norm as written in spec.md §1, fp64, over groups of gs channels; w has D or gs entries.
std::vector<double> gated_ref(const std::vector<float>& y, const std::vector<float>& z, const std::vector<float>& w, std::int64_t M,
                              std::int64_t D, std::int64_t gs, bool gate_first, double eps) {
    std::vector<double> out(std::size_t(M * D));
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t g0 = 0; g0 < D; g0 += gs) {
            double ss = 0;
            for (std::int64_t i = g0; i < g0 + gs; ++i) {
                const double u = gate_first ? y[std::size_t(m * D + i)] * silu_d(z[std::size_t(m * D + i)]) : y[std::size_t(m * D + i)];
                ss += u * u;
            }
            const double rms = std::sqrt(ss / double(gs) + eps);
            for (std::int64_t i = g0; i < g0 + gs; ++i) {
                const double wi = w.size() == std::size_t(D) ? w[std::size_t(i)] : w[std::size_t(i - g0)];
                const double yv = y[std::size_t(m * D + i)], g = silu_d(z[std::size_t(m * D + i)]);
                out[std::size_t(m * D + i)] = gate_first ? wi * (yv * g) / rms : wi * yv / rms * g;
            }
        }
    return out;
}

std::vector<float> gated(const std::vector<float>& y, const std::vector<float>& z, const std::vector<float>& w, std::int64_t M,
                         std::int64_t D, std::int64_t gs, kernels::gate_order order, float eps) {
    std::vector<float> out(std::size_t(M * D));
    kernels::gated_rms_norm<float>(tensor_view<const float, 2>(y.data(), {M, D}), tensor_view<const float, 2>(z.data(), {M, D}), w.data(),
                                   std::int64_t(w.size()), gs, order, eps, tensor_view<float, 2>(out.data(), {M, D}));
    return out;
}

}  // namespace

TEST_CASE("grouped gated norm: y ≈ 1 and ≈ 100 per group, z = 10 (invariant 8)") {
    const std::int64_t D = 8, T = 3, gs = 4;
    std::vector<float> y(std::size_t(T * D)), z(std::size_t(T * D), 10.f);
    const auto jitter = uniform(std::size_t(T * D), -0.01f, 0.01f, 1);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < D; ++i) y[std::size_t(t * D + i)] = (i < 4 ? 1.f : 100.f) * (1.f + jitter[std::size_t(t * D + i)]);
    const auto w = uniform(std::size_t(D), 0.5f, 2.f, 2);
    const float eps = 1e-5f;
    auto ratio = [&](const std::vector<float>& out, std::int64_t t, std::int64_t i) { return out[std::size_t(t * D + i)] / w[std::size_t(i)]; };

    const auto gn = gated(y, z, w, T, D, gs, kernels::gate_order::gate_then_norm, eps);
    const auto gw = gated(y, z, w, T, D, D, kernels::gate_order::gate_then_norm, eps);
    const auto ng = gated(y, z, w, T, D, gs, kernels::gate_order::norm_then_gate, eps);
    const auto nw = gated(y, z, w, T, D, D, kernels::gate_order::norm_then_gate, eps);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < D; ++i) {
            CHECK(ratio(gn, t, i) == doctest::Approx(1.0).epsilon(0.03));
            CHECK(ratio(ng, t, i) == doctest::Approx(10.0).epsilon(0.03));
            CHECK(ratio(gw, t, i) == doctest::Approx(i < 4 ? 0.01414 : 1.414).epsilon(0.03));
            CHECK(ratio(nw, t, i) == doctest::Approx(i < 4 ? 0.1414 : 14.14).epsilon(0.03));
        }
    CHECK(rel_error(gn, gated_ref(y, z, w, T, D, gs, true, eps)) < 1e-6);
    CHECK(rel_error(ng, gated_ref(y, z, w, T, D, gs, false, eps)) < 1e-6);

    // G = 1 (one group of the full width) equals the plain RMSNorm of y ⊙ silu(z)
    std::vector<float> u(y.size()), plain(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) u[i] = y[i] * silu(z[i]);
    kernels::rms_norm<float>(tensor_view<const float, 2>(u.data(), {T, D}), w.data(), eps, kernels::rms_flavor::plain,
                             tensor_view<float, 2>(plain.data(), {T, D}));
    CHECK(rel_error(gw, plain) < 1e-6);
}

TEST_CASE("gated norm: both orders, per-channel and shared weights, odd sizes vs fp64") {
    const std::int64_t M = 13, D = 60;
    const auto y = uniform(std::size_t(M * D), -3.f, 3.f, 3);
    const auto z = uniform(std::size_t(M * D), -6.f, 6.f, 4);
    for (std::int64_t gs : {1, 5, 12, 60})
        for (bool shared : {false, true})
            for (bool gate_first : {true, false}) {
                CAPTURE(gs);
                CAPTURE(shared);
                CAPTURE(gate_first);
                const auto w = uniform(std::size_t(shared ? gs : D), -1.f, 2.f, std::uint64_t(5 + gs));
                const auto order = gate_first ? kernels::gate_order::gate_then_norm : kernels::gate_order::norm_then_gate;
                CHECK(rel_error(gated(y, z, w, M, D, gs, order, 1e-5f), gated_ref(y, z, w, M, D, gs, gate_first, 1e-5)) < 1e-6);
            }
    const std::vector<float> w(7, 1.f);
    std::vector<float> out(std::size_t(M * D));
    CHECK_THROWS_AS(gated(y, z, w, M, D, 7, kernels::gate_order::gate_then_norm, 1e-5f), shape_error);   // 7 ∤ 60
    CHECK_THROWS_AS(gated(y, z, w, M, D, 12, kernels::gate_order::gate_then_norm, 1e-5f), shape_error);  // w has 7 entries
}

TEST_CASE("rms_norm plain and zero-centred vs fp64, in place allowed") {
    const std::int64_t M = 9, d = 77;
    const auto x = uniform(std::size_t(M * d), -4.f, 4.f, 6);
    const auto w = uniform(std::size_t(d), -1.f, 1.f, 7);
    for (auto flavor : {kernels::rms_flavor::plain, kernels::rms_flavor::zero_centered}) {
        std::vector<double> ref(x.size());
        for (std::int64_t m = 0; m < M; ++m) {
            double ss = 0;
            for (std::int64_t i = 0; i < d; ++i) ss += double(x[std::size_t(m * d + i)]) * x[std::size_t(m * d + i)];
            const double r = 1.0 / std::sqrt(ss / double(d) + 1e-6);
            for (std::int64_t i = 0; i < d; ++i) {
                const double wi = flavor == kernels::rms_flavor::plain ? w[std::size_t(i)] : 1.0 + w[std::size_t(i)];
                ref[std::size_t(m * d + i)] = wi * x[std::size_t(m * d + i)] * r;
            }
        }
        std::vector<float> y = x;  // in place
        kernels::rms_norm<float>(tensor_view<const float, 2>(y.data(), {M, d}), w.data(), 1e-6f, flavor,
                                 tensor_view<float, 2>(y.data(), {M, d}));
        CHECK(rel_error(y, ref) < 1e-6);
    }
    std::vector<float> bad(std::size_t(M * d));
    CHECK_THROWS_AS(kernels::rms_norm<float>(tensor_view<const float, 2>(x.data(), {M, d}), w.data(), 1e-6f, kernels::rms_flavor::plain,
                                             tensor_view<float, 2>(bad.data(), {d, M})),
                    shape_error);
}

TEST_CASE("l2_norm_rows: unit rows, eps inside the sqrt") {
    auto x = uniform(5 * 33, -2.f, 2.f, 8);
    const auto x0 = x;
    kernels::l2_norm_rows<float>(tensor_view<float, 2>(x.data(), {5, 33}), 1e-6f);
    for (int m = 0; m < 5; ++m) {
        double ss = 0, ss0 = 0;
        for (int i = 0; i < 33; ++i) {
            ss += double(x[std::size_t(m * 33 + i)]) * x[std::size_t(m * 33 + i)];
            ss0 += double(x0[std::size_t(m * 33 + i)]) * x0[std::size_t(m * 33 + i)];
        }
        CHECK(ss == doctest::Approx(ss0 / (ss0 + 1e-6)).epsilon(1e-6));
    }
    std::vector<float> zero(8, 0.f);
    kernels::l2_norm_rows<float>(tensor_view<float, 2>(zero.data(), {1, 8}), 1e-6f);
    for (float v : zero) CHECK(v == 0.f);
}

TEST_CASE("norms: view stride rules and preconditions are checked, naming the argument") {
    const std::int64_t M = 3, d = 8;
    const auto x = uniform(std::size_t(M * d), -1.f, 1.f, 70);
    const auto z = uniform(std::size_t(M * d), -1.f, 1.f, 71);
    const auto w = uniform(std::size_t(d), 0.5f, 1.5f, 72);
    std::vector<float> buf(200);
    const tensor_view<const float, 2> xv(x.data(), {M, d}), zv(z.data(), {M, d});
    const tensor_view<float, 2> yv(buf.data(), {M, d});
    const tensor_view<const float, 2> x_colmajor(x.data(), {M, d}, {1, M});
    const auto plain = kernels::rms_flavor::plain;
    const auto gtn = kernels::gate_order::gate_then_norm;

    SUBCASE("rms_norm") {
        CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(x_colmajor, w.data(), 1e-6f, plain, yv),
                             doctest::Contains("rms_norm: x [3, 8] needs unit stride along axis 1"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(xv, w.data(), 1e-6f, plain, tensor_view<float, 2>(buf.data(), {M, d}, {1, M})),
                             doctest::Contains("rms_norm: output"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(xv, w.data(), 1e-6f, plain, tensor_view<float, 2>(buf.data(), {M, d}, {4, 1})),
                             doctest::Contains("make elements overlap"), shape_error);
        // in place is allowed; a shifted overlap is not
        std::vector<float> io(x.begin(), x.end());
        io.resize(40);
        CHECK_NOTHROW(kernels::rms_norm<float>(tensor_view<const float, 2>(io.data(), {M, d}), w.data(), 1e-6f, plain,
                                               tensor_view<float, 2>(io.data(), {M, d})));
        CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(tensor_view<const float, 2>(io.data(), {M, d}), w.data(), 1e-6f, plain,
                                                      tensor_view<float, 2>(io.data() + 1, {M, d})),
                             doctest::Contains("rms_norm: output overlaps x"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(xv, nullptr, 1e-6f, plain, yv), doctest::Contains("rms_norm: weight is null"), value_error);
        for (float eps : {-1e-6f, std::nanf(""), INFINITY})
            CHECK_THROWS_WITH_AS(kernels::rms_norm<float>(xv, w.data(), eps, plain, yv), doctest::Contains("rms_norm: eps must be finite and >= 0"),
                                 value_error);
        CHECK_THROWS_AS(kernels::rms_norm<float>(xv, w.data(), 1e-6f, static_cast<kernels::rms_flavor>(5), yv), value_error);
        CHECK_NOTHROW(kernels::rms_norm<float>(xv, w.data(), 0.f, plain, yv));
    }
    SUBCASE("gated_rms_norm") {
        auto call = [&](tensor_view<const float, 2> y, tensor_view<const float, 2> g, const float* wp, float eps, kernels::gate_order o,
                        tensor_view<float, 2> out) { kernels::gated_rms_norm<float>(y, g, wp, d, 4, o, eps, out); };
        CHECK_THROWS_WITH_AS(call(x_colmajor, zv, w.data(), 1e-5f, gtn, yv), doctest::Contains("gated_rms_norm: y [3, 8] needs unit stride"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(xv, tensor_view<const float, 2>(z.data(), {M, d}, {1, M}), w.data(), 1e-5f, gtn, yv),
                             doctest::Contains("gated_rms_norm: gate [3, 8] needs unit stride"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, zv, w.data(), 1e-5f, gtn, tensor_view<float, 2>(buf.data(), {M, d}, {1, M})),
                             doctest::Contains("gated_rms_norm: output"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, zv, nullptr, 1e-5f, gtn, yv), doctest::Contains("gated_rms_norm: weight is null"), value_error);
        CHECK_THROWS_WITH_AS(call(xv, zv, w.data(), -1.f, gtn, yv), doctest::Contains("gated_rms_norm: eps"), value_error);
        CHECK_THROWS_WITH_AS(call(xv, zv, w.data(), 1e-5f, static_cast<kernels::gate_order>(9), yv),
                             doctest::Contains("gated_rms_norm: unknown gate order 9"), value_error);
        // out may be y or z itself (both orders), and then equals the out-of-place result
        for (auto o : {kernels::gate_order::gate_then_norm, kernels::gate_order::norm_then_gate}) {
            call(xv, zv, w.data(), 1e-5f, o, yv);
            const std::vector<float> want(buf.begin(), buf.begin() + M * d);
            auto yy = x, zz = z;
            call(tensor_view<const float, 2>(yy.data(), {M, d}), zv, w.data(), 1e-5f, o, tensor_view<float, 2>(yy.data(), {M, d}));
            CHECK(yy == want);
            call(xv, tensor_view<const float, 2>(zz.data(), {M, d}), w.data(), 1e-5f, o, tensor_view<float, 2>(zz.data(), {M, d}));
            CHECK(zz == want);
        }
    }
    SUBCASE("l2_norm_rows") {
        auto io = x;
        CHECK_THROWS_WITH_AS(kernels::l2_norm_rows<float>(tensor_view<float, 2>(io.data(), {M, d}, {1, M}), 1e-6f),
                             doctest::Contains("l2_norm_rows: x [3, 8] needs unit stride"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::l2_norm_rows<float>(tensor_view<float, 2>(io.data(), {M, d}, {0, 1}), 1e-6f),
                             doctest::Contains("l2_norm_rows: x"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::l2_norm_rows<float>(tensor_view<float, 2>(io.data(), {M, d}), std::nanf("")),
                             doctest::Contains("l2_norm_rows: eps must be finite"), value_error);
        CHECK(io == x);
    }
}
