// ops::swiglu_train and ops::swiglu_backward (kernels/swiglu_backward.hpp, spec.md §1): the fp64 twin against
// central finite differences of the fp64 forward (x and the three weights), the training forward against ops::swiglu
// (same y bits) and its documented gu layout, the CPU fp32 backward on 1 and 2 threads against the reference
// backend on odd sizes and strided views (deterministic, += on the weight gradients), and argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "hymix/kernels/linear.hpp"
#include "hymix/ops/swiglu.hpp"
#include "hymix/ops/swiglu_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

using cv2 = tensor_view<const double, 2>;
using v2 = tensor_view<double, 2>;

tensor<float> random_tensor(std::int64_t a, std::int64_t b, std::uint64_t seed, float scale = 0.5f) {
    tensor<float> t({a, b});
    const auto v = test::uniform(std::size_t(a * b), -scale, scale, seed);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

swiglu_weights random_weights(std::int64_t d, std::int64_t F, std::uint64_t seed, float scale = 0.5f) {
    swiglu_weights w;
    w.gate_proj = random_tensor(F, d, seed, scale);
    w.up_proj = random_tensor(F, d, seed + 1, scale);
    w.down_proj = random_tensor(d, F, seed + 2, scale);
    w.prepare();
    return w;
}

template <class T>  // tensor<float> or linear_weight
std::vector<double> to_double(const T& t) { return {t.data(), t.data() + t.numel()}; }

}  // namespace

TEST_CASE("swiglu_backward_ref matches fp64 finite differences (x, gate_proj, up_proj, down_proj)") {
    for (const auto& s : {std::array<std::int64_t, 3>{1, 5, 7}, {7, 19, 5}, {3, 6, 11}}) {
        const std::int64_t M = s[0], d = s[1], F = s[2];
        CAPTURE(M);
        CAPTURE(d);
        CAPTURE(F);
        const auto seed = std::uint64_t(M * 100 + d * 10 + F);
        const auto wf = random_weights(d, F, seed, 1.f);
        auto x = to_double(random_tensor(M, d, seed + 5, 2.f));
        auto wg = to_double(wf.gate_proj), wu = to_double(wf.up_proj), wd = to_double(wf.down_proj);
        const auto c = test::cotangent(std::size_t(M * d), seed + 6);
        auto loss = [&] {
            std::vector<double> y(std::size_t(M * d));
            kernels::swiglu_train_ref<double>(cv2(x.data(), {M, d}), cv2(wg.data(), {F, d}), cv2(wu.data(), {F, d}), cv2(wd.data(), {d, F}),
                                              v2(), v2(y.data(), {M, d}));
            return test::dot(c, y);
        };
        std::vector<double> dx(x.size(), 7.0), dwg(wg.size(), 0.0), dwu(wu.size(), 0.0), dwd(wd.size(), 0.0);
        kernels::swiglu_backward_ref<double>(cv2(x.data(), {M, d}), cv2(wg.data(), {F, d}), cv2(wu.data(), {F, d}), cv2(wd.data(), {d, F}),
                                             cv2(c.data(), {M, d}), v2(dx.data(), {M, d}), v2(dwg.data(), {F, d}), v2(dwu.data(), {F, d}),
                                             v2(dwd.data(), {d, F}));
        test::check_gradient("dx", x, dx, loss);
        test::check_gradient("d gate_proj", wg, dwg, loss);
        test::check_gradient("d up_proj", wu, dwu, loss);
        test::check_gradient("d down_proj", wd, dwd, loss);
    }
}

TEST_CASE("swiglu_train: y equals ops::swiglu bit for bit, gu = [x W_gateᵀ | x W_upᵀ]; reference backend agrees") {
    const cpu_backend be(2);
    for (const auto& s : {std::array<std::int64_t, 3>{1, 5, 7}, {33, 19, 48}, {70, 64, 130}}) {
        const std::int64_t M = s[0], d = s[1], F = s[2];
        CAPTURE(M);
        const auto w = random_weights(d, F, std::uint64_t(M + d + F));
        const auto x = random_tensor(M, d, 9, 2.f);
        tensor<float> gu({M, 2 * F}), y({M, d}), scratch({M, 2 * F}), y0({M, d}), gu_ref({M, 2 * F}), y_ref({M, d}), lin({M, 2 * F});
        ops::swiglu_train(be, w, x.view<2>(), gu.view<2>(), y.view<2>());
        ops::swiglu(be, w, x.view<2>(), scratch.view<2>(), y0.view<2>());
        for (std::int64_t i = 0; i < y.numel(); ++i) CHECK(y[i] == y0[i]);
        kernels::linear(be, x.view<2>(), w.gate_up.view<2>(), nullptr, lin.view<2>());
        for (std::int64_t i = 0; i < gu.numel(); ++i) CHECK(gu[i] == lin[i]);
        ops::swiglu_train(reference_backend(), w, x.view<2>(), gu_ref.view<2>(), y_ref.view<2>());
        CHECK(test::rel_error(gu.span(), gu_ref.span()) < 1e-5);
        CHECK(test::rel_error(y.span(), y_ref.span()) < 1e-5);
    }
}

namespace {

/// One backward run on backend `be` with padded row strides (pad extra floats per row) for x, gu, dy and dx.
struct run_result {
    std::vector<float> dx;
    swiglu_weights g;
};

template <class B>
run_result run_backward(const B& be, const swiglu_weights& w, std::int64_t M, std::int64_t d, std::int64_t pad, std::uint64_t seed) {
    const std::int64_t F = w.d_ff();
    const auto xs = test::uniform(std::size_t(M * (d + pad)), -2.f, 2.f, seed);
    const auto dys = test::uniform(std::size_t(M * (d + pad)), -1.f, 1.f, seed + 1);
    const tensor_view<const float, 2> x(xs.data(), {M, d}, {d + pad, 1});    // [M, d]
    const tensor_view<const float, 2> dy(dys.data(), {M, d}, {d + pad, 1});  // [M, d]
    std::vector<float> gus(std::size_t(M * (2 * F + pad))), ys(std::size_t(M * d));
    const tensor_view<float, 2> gu(gus.data(), {M, 2 * F}, {2 * F + pad, 1});  // [M, 2F]
    ops::swiglu_train(cpu_backend(1), w, x, gu, tensor_view<float, 2>(ys.data(), {M, d}));
    run_result r;
    r.g = random_weights(d, F, seed + 2);  // accumulated onto
    std::vector<float> dxs(std::size_t(M * (d + pad)), -9.f);
    ops::swiglu_backward(be, w, x, tensor_view<const float, 2>(gu), dy, tensor_view<float, 2>(dxs.data(), {M, d}, {d + pad, 1}), r.g);
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t k = 0; k < d + pad; ++k) {
            const float v = dxs[std::size_t(m * (d + pad) + k)];
            if (k < d)
                r.dx.push_back(v);
            else
                CHECK(v == -9.f);  // padding untouched
        }
    return r;
}

template <class T>  // tensor<float> or linear_weight
bool same(const T& a, const T& b) { return std::equal(a.data(), a.data() + a.numel(), b.data()); }

}  // namespace

TEST_CASE("swiglu_backward CPU (1, 2 threads) matches the reference backend; odd sizes, strided, deterministic") {
    std::uint64_t seed = 500;
    for (std::int64_t M : {1, 7, 33, 200})
        for (const auto& s : {std::array<std::int64_t, 2>{5, 7}, {19, 48}, {64, 130}})
            for (std::int64_t pad : {0, 3}) {
                const std::int64_t d = s[0], F = s[1];
                CAPTURE(M);
                CAPTURE(d);
                CAPTURE(F);
                CAPTURE(pad);
                seed += 11;
                const auto w = random_weights(d, F, seed);
                const auto ref = run_backward(reference_backend(), w, M, d, pad, seed + 3);
                const auto one = run_backward(cpu_backend(1), w, M, d, pad, seed + 3);
                const auto two = run_backward(cpu_backend(2), w, M, d, pad, seed + 3);
                for (const auto* r : {&one, &two}) {
                    CHECK(test::rel_error(r->dx, ref.dx) < 1e-4);
                    CHECK(test::rel_error(r->g.gate_proj.span(), ref.g.gate_proj.span()) < 1e-4);
                    CHECK(test::rel_error(r->g.up_proj.span(), ref.g.up_proj.span()) < 1e-4);
                    CHECK(test::rel_error(r->g.down_proj.span(), ref.g.down_proj.span()) < 1e-4);
                }
                CHECK(one.dx == two.dx);
                CHECK(same(one.g.gate_proj, two.g.gate_proj));
                CHECK(same(one.g.up_proj, two.g.up_proj));
                CHECK(same(one.g.down_proj, two.g.down_proj));
            }
}

TEST_CASE("swiglu_backward accumulates: two calls from zero give twice one call") {
    const std::int64_t M = 9, d = 19, F = 48;
    const auto w = random_weights(d, F, 3);
    const auto x = random_tensor(M, d, 4, 2.f), dy = random_tensor(M, d, 5, 1.f);
    tensor<float> gu({M, 2 * F}), y({M, d}), dx({M, d});
    const cpu_backend be(2);
    ops::swiglu_train(be, w, x.view<2>(), gu.view<2>(), y.view<2>());
    swiglu_weights g1 = random_weights(d, F, 6), g2;
    for (auto* t : {&g1.gate_proj, &g1.up_proj, &g1.down_proj}) t->zero();
    g2 = g1;
    ops::swiglu_backward(be, w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), dx.view<2>(), g1);
    ops::swiglu_backward(be, w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), dx.view<2>(), g2);
    ops::swiglu_backward(be, w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), dx.view<2>(), g2);
    for (std::int64_t i = 0; i < g1.down_proj.numel(); ++i) CHECK(g2.down_proj[i] == 2 * g1.down_proj[i]);
    for (std::int64_t i = 0; i < g1.gate_proj.numel(); ++i) CHECK(g2.gate_proj[i] == 2 * g1.gate_proj[i]);
}

TEST_CASE("swiglu_backward / swiglu_train: bad shapes throw shape_error naming the argument") {
    const std::int64_t M = 4, d = 5, F = 7;
    const auto w = random_weights(d, F, 1);
    const auto x = random_tensor(M, d, 2);
    tensor<float> gu({M, 2 * F}), dy({M, d}), dx({M, d}), bad_gu({M, 2 * F + 1}), bad_dx({M + 1, d});
    auto g = random_weights(d, F, 3);
    auto g_bad = random_weights(d, F + 1, 4);
    auto unprepared = w;
    unprepared.gate_up = tensor<float>();
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto both = [&](auto&& f) {
        f(cpu);
        f(ref);
    };
    both([&](const auto& be) {
        CHECK_THROWS_WITH_AS(ops::swiglu_backward(be, w, x.view<2>(), std::as_const(bad_gu).view<2>(), dy.view<2>(), dx.view<2>(), g),
                             doctest::Contains("gu"), shape_error);
        CHECK_THROWS_WITH_AS(ops::swiglu_backward(be, w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), bad_dx.view<2>(), g),
                             doctest::Contains("dx"), shape_error);
        CHECK_THROWS_WITH_AS(ops::swiglu_backward(be, w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), dx.view<2>(), g_bad),
                             doctest::Contains("gradient.gate_proj"), shape_error);
        CHECK_THROWS_WITH_AS(ops::swiglu_train(be, w, x.view<2>(), bad_gu.view<2>(), dx.view<2>()), doctest::Contains("gu"), shape_error);
    });
    CHECK_THROWS_WITH_AS(ops::swiglu_train(cpu, unprepared, x.view<2>(), gu.view<2>(), dx.view<2>()), doctest::Contains("gate_up"),
                         shape_error);
}

TEST_CASE("swiglu_backward on the reference backend equals swiglu_backward_ref on fp64 copies") {
    const std::int64_t M = 5, d = 6, F = 9;
    const auto w = random_weights(d, F, 71);
    const auto x = random_tensor(M, d, 72, 2.f), dy = random_tensor(M, d, 73);
    tensor<float> gu({M, 2 * F}), y({M, d}), dx({M, d});
    ops::swiglu_train(reference_backend(), w, x.view<2>(), gu.view<2>(), y.view<2>());
    auto g = random_weights(d, F, 74);
    const auto g0 = g;
    ops::swiglu_backward(reference_backend(), w, x.view<2>(), std::as_const(gu).view<2>(), dy.view<2>(), dx.view<2>(), g);
    auto xd = to_double(x), dyd = to_double(dy), wg = to_double(w.gate_proj), wu = to_double(w.up_proj), wd = to_double(w.down_proj);
    auto dwg = to_double(g0.gate_proj), dwu = to_double(g0.up_proj), dwd = to_double(g0.down_proj);
    std::vector<double> dxd(xd.size());
    kernels::swiglu_backward_ref<double>(cv2(xd.data(), {M, d}), cv2(wg.data(), {F, d}), cv2(wu.data(), {F, d}), cv2(wd.data(), {d, F}),
                                         cv2(dyd.data(), {M, d}), v2(dxd.data(), {M, d}), v2(dwg.data(), {F, d}), v2(dwu.data(), {F, d}),
                                         v2(dwd.data(), {d, F}));
    for (std::size_t i = 0; i < dxd.size(); ++i) CHECK(dx[std::int64_t(i)] == static_cast<float>(dxd[i]));
    for (std::size_t i = 0; i < dwg.size(); ++i) {
        CHECK(g.gate_proj[std::int64_t(i)] == static_cast<float>(dwg[i]));
        CHECK(g.up_proj[std::int64_t(i)] == static_cast<float>(dwu[i]));
    }
    for (std::size_t i = 0; i < dwd.size(); ++i) CHECK(g.down_proj[std::int64_t(i)] == static_cast<float>(dwd[i]));
}

TEST_CASE("swiglu forward: bad shapes and strides throw shape_error naming swiglu and the argument, on both backends") {
    const std::int64_t M = 3, d = 5, F = 7;
    const auto w = random_weights(d, F, 5);
    const auto x = random_tensor(M, d, 6);
    tensor<float> gu({M, 2 * F}), y({M, d}), wide({M, 2 * d}), bad_y({M, d + 1});
    const tensor_view<const float, 2> x_strided(wide.data(), {M, d}, {2 * d, 2});  // inner stride 2
    const cpu_backend cpu(1);
    const reference_backend ref;
    CHECK_THROWS_WITH_AS(ops::swiglu(cpu, w, x_strided, gu.view<2>(), y.view<2>()), doctest::Contains("swiglu: x"), shape_error);
    CHECK_THROWS_WITH_AS(ops::swiglu(cpu, w, x.view<2>(), gu.view<2>(), bad_y.view<2>()), doctest::Contains("swiglu: y"), shape_error);
    CHECK_THROWS_WITH_AS(ops::swiglu(ref, w, x.view<2>(), gu.view<2>(), bad_y.view<2>()), doctest::Contains("swiglu: y"), shape_error);
    const tensor_view<float, 2> y_strided(wide.data(), {M, d}, {2 * d, 2});
    CHECK_THROWS_WITH_AS(ops::swiglu(cpu, w, x.view<2>(), gu.view<2>(), y_strided), doctest::Contains("swiglu: y"), shape_error);
    auto unprepared = w;
    unprepared.gate_up = tensor<float>();
    CHECK_THROWS_WITH_AS(ops::swiglu(cpu, unprepared, x.view<2>(), gu.view<2>(), y.view<2>()),
                         doctest::Contains("swiglu: weights.gate_up"), shape_error);
    const auto narrow = random_tensor(M, d - 1, 7);
    CHECK_THROWS_WITH_AS(ops::swiglu(ref, w, narrow.view<2>(), gu.view<2>(), y.view<2>()), doctest::Contains("swiglu: weights.down_proj"),
                         shape_error);
    // The same arguments, well formed, run on both.
    CHECK_NOTHROW(ops::swiglu(cpu, w, x.view<2>(), gu.view<2>(), y.view<2>()));
    CHECK_NOTHROW(ops::swiglu(ref, w, x.view<2>(), gu.view<2>(), y.view<2>()));
}
