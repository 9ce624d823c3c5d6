// ops::cross_entropy (kernels/cross_entropy.hpp): the fused streaming LM head + cross-entropy. The fp64 twin against
// central finite differences (h and head) and against hymix::cross_entropy on explicit logits; the CPU fp32 kernel
// on 1 and 2 threads against the reference backend (odd sizes, several vocabulary tiles, ignored rows, strided views,
// dhead +=, each output optional); spec.md §8 invariant 21 (finite log-sum-exp with −∞ logits in tiles of 128, exact
// zero loss and entropy for a one-hot row, LSE(1e4, 1e4 − 1)); extreme finite logits; argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "hymix/ops/cross_entropy.hpp"
#include "hymix/text/score.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

std::vector<std::int32_t> random_targets(std::int64_t M, std::int64_t V, std::uint64_t seed, bool with_ignored = true) {
    const auto u = test::uniform(std::size_t(M), 0.f, 1.f, seed);
    std::vector<std::int32_t> t(static_cast<std::size_t>(M));
    for (std::size_t i = 0; i < t.size(); ++i) {
        t[i] = std::min<std::int32_t>(std::int32_t(V) - 1, std::int32_t(u[i] * float(V)));
        if (with_ignored && i % 5 == 3) t[i] = -1;
    }
    return t;
}

}  // namespace

TEST_CASE("cross_entropy_ref matches fp64 finite differences of grad_scale·Σ losses (h, head)") {
    for (std::int64_t M : {1, 7})
        for (std::int64_t V : {1, 5, 19})
            for (std::int64_t d : {5, 8}) {
                CAPTURE(M);
                CAPTURE(V);
                CAPTURE(d);
                const auto seed = std::uint64_t(M * 100 + V * 10 + d);
                const auto hf = test::uniform(std::size_t(M * d), -1.f, 1.f, seed), wf = test::uniform(std::size_t(V * d), -1.f, 1.f, seed + 1);
                std::vector<double> h(hf.begin(), hf.end()), head(wf.begin(), wf.end());
                const auto targets = random_targets(M, V, seed + 2);
                const double scale = 0.7;
                auto loss = [&] {
                    std::vector<double> l(static_cast<std::size_t>(M));
                    kernels::cross_entropy_ref<double>(tensor_view<const double, 2>(h.data(), {M, d}), tensor_view<const double, 2>(head.data(), {V, d}),
                                                       targets, l.data(), {}, {}, 1.0, nullptr);
                    double s = 0;
                    for (double v : l) s += v;
                    return scale * s;
                };
                std::vector<double> l(static_cast<std::size_t>(M)), ent(static_cast<std::size_t>(M)), dh(h.size(), 4.0), dhead(head.size(), 0.0);
                kernels::cross_entropy_ref<double>(tensor_view<const double, 2>(h.data(), {M, d}), tensor_view<const double, 2>(head.data(), {V, d}),
                                                   targets, l.data(), tensor_view<double, 2>(dh.data(), {M, d}),
                                                   tensor_view<double, 2>(dhead.data(), {V, d}), scale, ent.data());
                test::check_gradient("dh", h, dh, loss);
                test::check_gradient("dhead", head, dhead, loss);
                // loss values against hymix::cross_entropy on the explicit logits; entropy against −Σ p log p / log V
                for (std::int64_t m = 0; m < M; ++m) {
                    std::vector<double> logit(static_cast<std::size_t>(V));
                    for (std::int64_t v = 0; v < V; ++v)
                        for (std::int64_t k = 0; k < d; ++k) logit[std::size_t(v)] += h[std::size_t(m * d + k)] * head[std::size_t(v * d + k)];
                    const std::int32_t t = targets[std::size_t(m)];
                    if (t < 0) {
                        CHECK(l[std::size_t(m)] == 0.0);
                    } else {
                        const std::vector<float> lf(logit.begin(), logit.end());
                        CHECK(l[std::size_t(m)] == doctest::Approx(hymix::cross_entropy(lf, t)).epsilon(1e-6));
                    }
                    double mx = *std::max_element(logit.begin(), logit.end()), s = 0, H = 0;
                    for (double v : logit) s += std::exp(v - mx);
                    for (double v : logit) {
                        const double p = std::exp(v - mx) / s;
                        H -= p * std::log(p);
                    }
                    CHECK(ent[std::size_t(m)] == doctest::Approx(V > 1 ? H / std::log(double(V)) : 0.0).epsilon(1e-9));
                }
            }
}

namespace {

/// One CPU or reference run with row strides padded by `pad` for h, head, dh and dhead.
struct ce_run {
    std::vector<float> losses, entropy, dh, dhead;
};

template <class B>
ce_run run_ce(const B& be, std::int64_t M, std::int64_t V, std::int64_t d, std::int64_t pad, const std::vector<std::int32_t>& targets,
              std::uint64_t seed, bool want_dh = true, bool want_dhead = true, bool want_entropy = true) {
    const auto hs = test::uniform(std::size_t(M * (d + pad)), -1.f, 1.f, seed);
    const auto ws = test::uniform(std::size_t(V * (d + pad)), -1.f, 1.f, seed + 1);
    ce_run r;
    r.losses.assign(std::size_t(M), -5.f);
    r.entropy.assign(std::size_t(M), -5.f);
    r.dh.assign(std::size_t(M * (d + pad)), -9.f);
    r.dhead = test::uniform(std::size_t(V * (d + pad)), -1.f, 1.f, seed + 2);  // accumulated onto
    const tensor_view<const float, 2> h(hs.data(), {M, d}, {d + pad, 1}), head(ws.data(), {V, d}, {d + pad, 1});
    const tensor_view<float, 2> dh = want_dh ? tensor_view<float, 2>(r.dh.data(), {M, d}, {d + pad, 1}) : tensor_view<float, 2>();
    const tensor_view<float, 2> dhead = want_dhead ? tensor_view<float, 2>(r.dhead.data(), {V, d}, {d + pad, 1}) : tensor_view<float, 2>();
    ops::cross_entropy(be, h, head, targets, r.losses, dh, dhead, 0.37f, want_entropy ? r.entropy.data() : nullptr);
    return r;
}

}  // namespace

TEST_CASE("cross_entropy CPU (1, 2 threads) matches the reference backend; several tiles, ignored rows, strided") {
    std::uint64_t seed = 1000;
    for (std::int64_t M : {1, 7, 33, 200})
        for (std::int64_t V : {1, 5, 300, 1000})
            for (std::int64_t d : {5, 19, 64})
                for (std::int64_t pad : {0, 3}) {
                    if (M * V * d > 4'000'000) continue;  // keep the fp64 reference quick
                    CAPTURE(M);
                    CAPTURE(V);
                    CAPTURE(d);
                    CAPTURE(pad);
                    seed += 7;
                    const auto targets = random_targets(M, V, seed + 9);
                    const auto ref = run_ce(reference_backend(), M, V, d, pad, targets, seed);
                    const auto one = run_ce(cpu_backend(1), M, V, d, pad, targets, seed);
                    const auto two = run_ce(cpu_backend(2), M, V, d, pad, targets, seed);
                    const auto two_again = run_ce(cpu_backend(2), M, V, d, pad, targets, seed);
                    for (const auto* r : {&one, &two}) {
                        CHECK(test::rel_error(r->losses, ref.losses) < 1e-4);
                        CHECK(test::rel_error(r->entropy, ref.entropy) < 1e-4);
                        CHECK(test::rel_error(r->dh, ref.dh) < 1e-4);
                        CHECK(test::rel_error(r->dhead, ref.dhead) < 1e-4);
                    }
                    for (std::int64_t m = 0; m < M; ++m) {
                        if (targets[std::size_t(m)] < 0) CHECK(one.losses[std::size_t(m)] == 0.f);
                        for (std::int64_t k = d; k < d + pad; ++k) CHECK(one.dh[std::size_t(m * (d + pad) + k)] == -9.f);  // padding
                        if (targets[std::size_t(m)] < 0)
                            for (std::int64_t k = 0; k < d; ++k) CHECK(one.dh[std::size_t(m * (d + pad) + k)] == 0.f);
                    }
                    // losses and entropy do not depend on the thread count; gradients do not change between runs
                    CHECK(one.losses == two.losses);
                    CHECK(one.entropy == two.entropy);
                    CHECK(two.dh == two_again.dh);
                    CHECK(two.dhead == two_again.dhead);
                }
}

TEST_CASE("cross_entropy: every output is optional and the paths agree") {
    const std::int64_t M = 150, V = 700, d = 24;
    const auto targets = random_targets(M, V, 5);
    const cpu_backend be1(1), be2(2);
    const auto full = run_ce(be1, M, V, d, 0, targets, 6);
    const auto loss_only = run_ce(be2, M, V, d, 0, targets, 6, false, false, false);
    const auto dh_only = run_ce(be1, M, V, d, 0, targets, 6, true, false, true);
    const auto dhead_only = run_ce(be2, M, V, d, 0, targets, 6, false, true, true);
    CHECK(loss_only.losses == full.losses);
    CHECK(loss_only.entropy == std::vector<float>(std::size_t(M), -5.f));  // not written
    CHECK(dh_only.dh == full.dh);  // one thread: the same tile order with or without dhead
    CHECK(run_ce(be2, M, V, d, 0, targets, 6, true, false, true).dh == dh_only.dh);  // dh alone: any thread count
    CHECK(dhead_only.dhead == full.dhead);
    CHECK(dhead_only.dh == std::vector<float>(std::size_t(M * d), -9.f));
    CHECK(dh_only.dhead == loss_only.dhead);  // untouched (the initial values)
}

TEST_CASE("finite log-sum-exp (spec.md §8 invariant 21): −∞ logits in tiles of 128, one-hot rows, LSE(1e4, 1e4 − 1)") {
    const std::int64_t V = 1000, tile = 128;
    for (std::int64_t at : {0, 500, 999}) {
        CAPTURE(at);
        std::vector<float> logits(std::size_t(V), neg_inf);
        logits[std::size_t(at)] = 10.f;
        kernels::softmax_stream s;
        for (std::int64_t v0 = 0; v0 < V; v0 += tile) s.add(logits.data() + v0, std::min(tile, V - v0));
        CHECK(s.nll(10.f) == 0.f);  // exactly
        CHECK(std::isfinite(s.entropy()));
        CHECK(std::abs(s.entropy() / std::log(float(V))) <= 1e-9);
        CHECK(s.lse() == 10.f);
        std::vector<double> ld(logits.begin(), logits.end());
        const auto st = kernels::softmax_stats_ref(ld.data(), V);
        CHECK(st.lse == 10.0);
        CHECK(std::abs(st.entropy) <= 1e-9);
    }
    {
        const float two[] = {1e4f, 1e4f - 1.f};
        const double want = 1e4 + std::log1p(std::exp(-1.0));
        kernels::softmax_stream s;
        s.add(two, 2);
        CHECK(double(s.lse()) == doctest::Approx(want).epsilon(1e-6));
        CHECK(double(s.log_sum()) == doctest::Approx(std::log1p(std::exp(-1.0))).epsilon(1e-6));
        kernels::softmax_stream t;  // one value per tile, the larger one second
        t.add(two + 1, 1);
        t.add(two, 1);
        CHECK(double(t.lse()) == doctest::Approx(want).epsilon(1e-6));
        const double twod[] = {1e4, 1e4 - 1};
        CHECK(kernels::softmax_stats_ref(twod, 2).lse == doctest::Approx(want).epsilon(1e-12));
    }
    {  // tiles that are all −∞ before and after the finite ones, and a rescale across tiles
        std::vector<float> logits(std::size_t(V), neg_inf);
        logits[300] = 2.f;
        logits[700] = 5.f;
        logits[701] = 5.f;
        kernels::softmax_stream s;
        for (std::int64_t v0 = 0; v0 < V; v0 += tile) s.add(logits.data() + v0, std::min(tile, V - v0));
        std::vector<double> ld(logits.begin(), logits.end());
        const auto st = kernels::softmax_stats_ref(ld.data(), V);
        CHECK(double(s.lse()) == doctest::Approx(st.lse).epsilon(1e-6));
        CHECK(double(s.entropy()) == doctest::Approx(st.entropy).epsilon(1e-6));
        CHECK(double(s.nll(2.f)) == doctest::Approx(st.lse - 2.0).epsilon(1e-6));
    }
}

TEST_CASE("fused cross_entropy is finite and exact for one dominant logit and for extreme finite logits") {
    const std::int64_t V = 1000, d = 1;
    for (std::int64_t at : {0, 500, 999}) {
        CAPTURE(at);
        // h = [1], head[v] = [−1e30] except head[at] = [10]: logits −1e30 (p = 0 exactly) and one 10
        std::vector<float> head(std::size_t(V), -1e30f), h{1.f};
        head[std::size_t(at)] = 10.f;
        const std::vector<std::int32_t> targets{std::int32_t(at)};
        for (int threads : {1, 2}) {
            std::vector<float> loss(1), ent(1), dh(1, 5.f), dhead(std::size_t(V), 0.f);
            ops::cross_entropy(cpu_backend(threads), tensor_view<const float, 2>(h.data(), {1, d}), tensor_view<const float, 2>(head.data(), {V, d}),
                               targets, loss, tensor_view<float, 2>(dh.data(), {1, d}), tensor_view<float, 2>(dhead.data(), {V, d}), 1.f, ent.data());
            CHECK(loss[0] == 0.f);
            CHECK(ent[0] == 0.f);
            CHECK(dh[0] == 0.f);
            for (float v : dhead) CHECK(v == 0.f);
        }
    }
    // logits of ±1e30: finite loss (≈ 2e30 for a bottom target), finite gradients
    std::vector<float> h{1e15f}, head{1e15f, -1e15f, 0.5f};
    const std::vector<std::int32_t> targets{1};
    std::vector<float> loss(1), ent(1), dh(1), dhead(3, 0.f);
    ops::cross_entropy(cpu_backend(1), tensor_view<const float, 2>(h.data(), {1, 1}), tensor_view<const float, 2>(head.data(), {3, 1}), targets, loss,
                       tensor_view<float, 2>(dh.data(), {1, 1}), tensor_view<float, 2>(dhead.data(), {3, 1}), 1.f, ent.data());
    CHECK(std::isfinite(loss[0]));
    CHECK(loss[0] == doctest::Approx(2e30).epsilon(1e-6));
    CHECK(ent[0] == 0.f);
    CHECK(std::isfinite(dh[0]));
    for (float v : dhead) CHECK(std::isfinite(v));
}

TEST_CASE("cross_entropy: uniform logits give normalised entropy 1") {
    const std::int64_t M = 3, V = 777, d = 4;
    std::vector<float> h(std::size_t(M * d), 0.f);
    const auto head = test::uniform(std::size_t(V * d), -1.f, 1.f, 3);
    std::vector<float> loss(static_cast<std::size_t>(M)), ent(static_cast<std::size_t>(M));
    const std::vector<std::int32_t> targets{0, -1, 776};
    ops::cross_entropy(cpu_backend(2), tensor_view<const float, 2>(h.data(), {M, d}), tensor_view<const float, 2>(head.data(), {V, d}), targets, loss,
                       {}, {}, 1.f, ent.data());
    for (float e : ent) CHECK(e == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(loss[0] == doctest::Approx(std::log(double(V))).epsilon(1e-6));
    CHECK(loss[1] == 0.f);
}

TEST_CASE("cross_entropy: errors name the argument") {
    const std::int64_t M = 3, V = 4, d = 2;
    std::vector<float> h(16), head(16), loss(static_cast<std::size_t>(M)), dh(16), dhead(16);
    const tensor_view<const float, 2> hv(h.data(), {M, d}), headv(head.data(), {V, d});
    std::vector<std::int32_t> targets{0, -1, 3};
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto both = [&](auto&& f) {
        f(cpu);
        f(ref);
    };
    both([&](const auto& be) {
        auto call = [&](std::span<const std::int32_t> t, std::span<float> l, tensor_view<const float, 2> hd, tensor_view<float, 2> g,
                        tensor_view<float, 2> gh) { ops::cross_entropy(be, hv, hd, t, l, g, gh, 1.f); };
        const tensor_view<float, 2> dhv(dh.data(), {M, d}), dheadv(dhead.data(), {V, d});
        CHECK_THROWS_WITH_AS(call(std::span(targets).first(2), loss, headv, dhv, dheadv), doctest::Contains("targets"), shape_error);
        CHECK_THROWS_WITH_AS(call(targets, std::span(loss).first(2), headv, dhv, dheadv), doctest::Contains("losses"), shape_error);
        CHECK_THROWS_WITH_AS(call(targets, loss, tensor_view<const float, 2>(head.data(), {V, d + 1}), dhv, dheadv), doctest::Contains("head"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(targets, loss, headv, tensor_view<float, 2>(dh.data(), {M, d + 1}), dheadv), doctest::Contains("dh"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(targets, loss, headv, dhv, tensor_view<float, 2>(dhead.data(), {V + 1, d})), doctest::Contains("dhead"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(targets, loss, headv, dhv, tensor_view<float, 2>(dh.data(), {V, d})), doctest::Contains("dh overlaps dhead"),
                             shape_error);
        targets[2] = 4;
        CHECK_THROWS_WITH_AS(call(targets, loss, headv, dhv, dheadv), doctest::Contains("targets[2] = 4"), value_error);
        targets[2] = -2;
        CHECK_THROWS_WITH_AS(call(targets, loss, headv, dhv, dheadv), doctest::Contains("targets[2] = -2"), value_error);
        targets[2] = 3;
        CHECK_THROWS_WITH_AS(ops::cross_entropy(be, hv, headv, targets, loss, dhv, dheadv, std::nanf("")), doctest::Contains("grad_scale"),
                             value_error);
    });
}

TEST_CASE("cross_entropy on the reference backend equals cross_entropy_ref on fp64 copies") {
    const std::int64_t M = 6, V = 37, d = 5;
    const auto hf = test::uniform(std::size_t(M * d), -1.f, 1.f, 61), wf = test::uniform(std::size_t(V * d), -1.f, 1.f, 62);
    const auto targets = random_targets(M, V, 63);
    std::vector<float> loss(static_cast<std::size_t>(M)), ent(static_cast<std::size_t>(M)), dh(hf.size()), dhead(wf.size(), 0.5f);
    ops::cross_entropy(reference_backend(), tensor_view<const float, 2>(hf.data(), {M, d}), tensor_view<const float, 2>(wf.data(), {V, d}), targets,
                       loss, tensor_view<float, 2>(dh.data(), {M, d}), tensor_view<float, 2>(dhead.data(), {V, d}), 0.3f, ent.data());
    const std::vector<double> h(hf.begin(), hf.end()), head(wf.begin(), wf.end());
    std::vector<double> l(static_cast<std::size_t>(M)), e(static_cast<std::size_t>(M)), gh(h.size()), ghead(head.size(), 0.5);
    kernels::cross_entropy_ref<double>(tensor_view<const double, 2>(h.data(), {M, d}), tensor_view<const double, 2>(head.data(), {V, d}), targets,
                                       l.data(), tensor_view<double, 2>(gh.data(), {M, d}), tensor_view<double, 2>(ghead.data(), {V, d}),
                                       double(0.3f), e.data());
    for (std::size_t i = 0; i < loss.size(); ++i) {
        CHECK(loss[i] == static_cast<float>(l[i]));
        CHECK(ent[i] == static_cast<float>(e[i]));
    }
    for (std::size_t i = 0; i < dh.size(); ++i) CHECK(dh[i] == static_cast<float>(gh[i]));
    for (std::size_t i = 0; i < dhead.size(); ++i) CHECK(dhead[i] == static_cast<float>(ghead[i]));
}
