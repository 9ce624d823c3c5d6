// AMOR's entropy-EMA gate (spec.md §5.2, invariant §8.23) and the streaming head entropy it uses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/gate/entropy_ema.hpp"
#include "hymix/stack/context.hpp"
#include "gate_fixture.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {
/// −Σ p log(p + 1e−10) / log V and the stable form, in double, from an explicit logits row.
void entropy_ref(const std::vector<double>& l, double& stable, double& plus_eps) {
    double m = -INFINITY;
    for (double x : l) m = std::max(m, x);
    double s = 0;
    for (double x : l) s += std::exp(x - m);
    const double lse = m + std::log(s);
    double spl = 0, pe = 0;
    for (double x : l) {
        const double p = std::exp(x - lse);
        if (p > 0) spl += p * x;
        pe -= p * std::log(p + 1e-10);
    }
    const double logV = std::log(static_cast<double>(l.size()));
    stable = (lse - spl) / logV;
    plus_eps = pe / logV;
}
}  // namespace

TEST_CASE("gate arithmetic of spec.md §8.23: EMA step before τ, strict comparison, frozen in eval") {
    entropy_ema g(entropy_ema_config{.kappa = 0.2f, .momentum = 0.99f, .init_threshold = 0.3f, .init_std = 0.1f});
    const std::vector<float> H{0.1f, 0.2f, 0.3f, 0.4f};
    CHECK(detail::lower_median(H) == doctest::Approx(0.2));
    CHECK(detail::unbiased_std(H) == doctest::Approx(0.129099).epsilon(1e-5));
    g.observe(H);
    CHECK(g.running_threshold() == doctest::Approx(0.299).epsilon(1e-6));
    CHECK(g.running_std() == doctest::Approx(0.1002910).epsilon(1e-6));
    CHECK(g.threshold() == doctest::Approx(0.3190582).epsilon(1e-6));
    std::vector<unsigned char> fire(4);
    g.fire_from(H, fire);
    CHECK(fire == std::vector<unsigned char>{0, 0, 0, 1});
    const float tau = g.threshold();
    std::vector<float> at_tau{tau, std::nextafter(tau, 1.0f)};
    std::vector<unsigned char> f2(2);
    g.fire_from(at_tau, f2);
    CHECK(f2 == std::vector<unsigned char>{0, 1});  // H = τ does not fire
    // One value: the mean moves, the std does not (the reference would produce NaN).
    const float s_before = g.running_std();
    g.observe(std::vector<float>{0.5f});
    CHECK(g.running_std() == s_before);
    CHECK(g.running_threshold() == doctest::Approx(0.99 * 0.299 + 0.01 * 0.5).epsilon(1e-6));
    CHECK_THROWS_AS(entropy_ema(entropy_ema_config{.momentum = 1.0f}), config_error);
}

TEST_CASE("set_kappa moves τ = m̄ + κ·s̄ at inference and keeps the statistics; fixed-offset gates refuse it") {
    entropy_ema g(entropy_ema_config{.kappa = 0.2f, .init_threshold = 0.4f, .init_std = 0.1f});
    g.set_kappa(1.5f);
    CHECK(g.config().kappa == 1.5f);
    CHECK(g.running_threshold() == 0.4f);
    CHECK(g.running_std() == 0.1f);
    CHECK(g.threshold() == doctest::Approx(0.55).epsilon(1e-6));
    const std::vector<float> H{0.5f, 0.56f, 0.9f};
    std::vector<unsigned char> fire(3);
    g.fire_from(H, fire);
    CHECK(fire == std::vector<unsigned char>{0, 1, 1});
    g.set_kappa(-4.0f);  // τ = 0: every positive entropy fires
    g.fire_from(H, fire);
    CHECK(fire == std::vector<unsigned char>{1, 1, 1});
    CHECK_THROWS_WITH_AS(g.set_kappa(std::numeric_limits<float>::quiet_NaN()), doctest::Contains("kappa must be finite"), config_error);
    CHECK(g.config().kappa == -4.0f);  // a refused value changes nothing
    entropy_ema fixed(entropy_ema_config{.offset_mode = amor_offset_mode::fixed, .gate_offset = 0.05f});
    CHECK_THROWS_WITH_AS(fixed.set_kappa(0.5f), doctest::Contains("adaptive offset mode only"), config_error);
    CHECK(fixed.threshold() == doctest::Approx(0.35).epsilon(1e-6));
}

TEST_CASE("streaming head entropy equals the explicit forms, over tiles and masked tiles") {
    const std::int64_t n = 7, d = 5, V = 301;
    const auto hv = test::uniform(static_cast<std::size_t>(n * d), -2.f, 2.f, 11);
    const auto ev = test::uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, 12);
    tensor_view<const float, 2> h(hv.data(), {n, d}), head(ev.data(), {V, d});
    cpu_backend be(1);
    reference_backend ref;
    std::vector<float> Hs(n), Hp(n), Hr(n);
    head_entropy(be, h, head, std::span<float>(Hs), entropy_form::stable, 64, 3);
    head_entropy(be, h, head, std::span<float>(Hp), entropy_form::plus_eps, 128, 4);
    head_entropy(ref, h, head, std::span<float>(Hr), entropy_form::stable, 1000, 64);
    for (std::int64_t r = 0; r < n; ++r) {
        std::vector<double> l(static_cast<std::size_t>(V));
        for (std::int64_t v = 0; v < V; ++v)
            for (std::int64_t k = 0; k < d; ++k) l[static_cast<std::size_t>(v)] += double(hv[r * d + k]) * double(ev[v * d + k]);
        double st, pe;
        entropy_ref(l, st, pe);
        CHECK(Hs[r] == doctest::Approx(st).epsilon(1e-6));
        CHECK(Hr[r] == doctest::Approx(st).epsilon(1e-6));
        CHECK(Hp[r] == doctest::Approx(pe).epsilon(1e-6));
        CHECK(std::abs(Hs[r] - pe) < 1e-6);  // the stable form is within 1e-6 of the +1e−10 form at this V
    }
}

TEST_CASE("uniform logits give H = 1 (stable) and 1 − 1.09e−6 (+1e−10 form) at V = 128256; a lone finite logit gives 0") {
    const std::int64_t V = 128256, d = 2;
    std::vector<float> head(static_cast<std::size_t>(V * d), 0.0f), h{1.0f, -1.0f};
    cpu_backend be(1);
    std::vector<float> H(1);
    head_entropy(be, tensor_view<const float, 2>(h.data(), {1, d}), tensor_view<const float, 2>(head.data(), {V, d}), std::span<float>(H));
    CHECK(H[0] == doctest::Approx(1.0).epsilon(1e-6));
    head_entropy(be, tensor_view<const float, 2>(h.data(), {1, d}), tensor_view<const float, 2>(head.data(), {V, d}), std::span<float>(H),
                 entropy_form::plus_eps);
    CHECK(1.0 - H[0] == doctest::Approx(1.09e-6).epsilon(0.02));
    // spec.md §8.21: one finite logit among −∞ (tiles of 128 that are all −∞ contribute nothing).
    const std::int64_t V2 = 1000;
    for (std::int64_t at : {0, 500, 999}) {
        std::vector<float> hd(static_cast<std::size_t>(V2 * 1), -std::numeric_limits<float>::infinity());
        hd[static_cast<std::size_t>(at)] = 10.0f;
        std::vector<float> one{1.0f};
        head_entropy(be, tensor_view<const float, 2>(one.data(), {1, 1}), tensor_view<const float, 2>(hd.data(), {V2, 1}), std::span<float>(H),
                     entropy_form::stable, 128);
        CHECK(std::isfinite(H[0]));
        CHECK(std::abs(H[0]) < 1e-9);
    }
}

TEST_CASE("decide reads the context's head; decide_train advances the statistics over live rows only") {
    test::padded_gate_fixture f(21, 22);
    const auto n = f.n;
    auto& ws = f.ws;
    auto& fire = f.fire;
    const auto& vb = f.vb;
    entropy_ema g;
    g.decide(f.ctx, f.h(), fire);
    CHECK(g.running_threshold() == 0.3f);  // inference: frozen
    REQUIRE(ws.score.size() == static_cast<std::size_t>(n));
    std::vector<float> live_h;
    for (std::int64_t r = 0; r < n; ++r) {
        CHECK(fire[r] == (ws.score[r] > g.threshold() ? 1 : 0));
        if (vb.live()[r]) live_h.push_back(ws.score[r]);
    }
    entropy_ema expect;
    expect.observe(live_h);
    g.decide_train(f.ctx, f.h(), fire);
    CHECK(g.running_threshold() == expect.running_threshold());
    CHECK(g.running_std() == expect.running_std());
}

TEST_CASE("head_entropy with a bf16 / f16 head: the f32 head's entropies on the rounded values, bit for bit") {
    const std::int64_t n = 9, d = 37, V = 301;
    const auto hv = test::uniform(static_cast<std::size_t>(n * d), -2.f, 2.f, 31);
    const auto ev = test::uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, 32);
    cpu_backend be(2);
    const tensor_view<const float, 2> h(hv.data(), {n, d});
    for (dtype t : {dtype::bf16, dtype::f16}) {
        CAPTURE(weight_dtype_name(t));
        linear_weight head = tensor<float>({V, d});
        std::copy(ev.begin(), ev.end(), head.data());
        head.store_as(t);
        linear_weight rounded = head;
        rounded.store_as(dtype::f32);
        std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
        head_entropy(be, h, head, std::span<float>(a), entropy_form::stable, 64, 4);  // several vocabulary and row tiles
        head_entropy(be, h, rounded.view<2>(), std::span<float>(b), entropy_form::stable, 64, 4);
        CHECK(a == b);
        CHECK(a[0] > 0.0f);
    }
}

TEST_CASE("head_entropy with an i8 head (per-row scales): the dequantized head's entropies to fp32 rounding, both backends") {
    const std::int64_t n = 9, d = 37, V = 301;
    const auto hv = test::uniform(static_cast<std::size_t>(n * d), -2.f, 2.f, 33);
    const auto ev = test::uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, 34);
    const tensor_view<const float, 2> h(hv.data(), {n, d});
    linear_weight head = tensor<float>({V, d});
    std::copy(ev.begin(), ev.end(), head.data());
    const linear_weight f32 = head;
    head.store_as(dtype::i8);
    linear_weight deq = head;
    deq.store_as(dtype::f32);
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size()), r(a.size()), f(a.size());
    head_entropy(cpu_backend(2), h, head, std::span<float>(a), entropy_form::stable, 64, 4);  // several vocabulary and row tiles
    head_entropy(cpu_backend(1), h, deq.view<2>(), std::span<float>(b));
    head_entropy(reference_backend{}, h, head, std::span<float>(r), entropy_form::plus_eps, 50, 3);
    head_entropy(cpu_backend(1), h, f32.view<2>(), std::span<float>(f));
    double diff = 0, qerr = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        CHECK(std::abs(a[k] - b[k]) <= 1e-6f);
        CHECK(std::abs(r[k] - b[k]) <= 1e-6f);
        diff = std::max(diff, static_cast<double>(std::abs(a[k] - b[k])));
        qerr = std::max(qerr, static_cast<double>(std::abs(a[k] - f[k])));
    }
    CHECK(qerr > diff);  // quantization moves the entropies more than the order of the sums does
    CHECK(a[0] > 0.0f);
}
