// Post-hoc AMOR stacks (spec.md §5, invariants §8.22–8.24): W_o = 0 adds nothing, true-sparse inference equals
// dense-with-mask, prefill then decode equals one pass, every block caches every token, the AMOR file round trip,
// and the gradients of the AMOR blocks on a frozen backbone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/models/amor.hpp"
#include "hymix/models/amor_calibrate.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/train/router_fit.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/model_grad.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {
train::byte_lm_spec tiny_spec() {
    train::byte_lm_spec s;
    s.stack = "mamba2";
    s.d_model = 32;
    s.n_layers = 2;
    s.vocab_size = 40;
    s.head_dim = 16;
    s.d_state = 8;
    return s;
}
models::amor_config tiny_amor(bool always = false) {
    models::amor_config c;
    c.backbone = "mamba2";
    c.n_amor_blocks = 3;
    c.n_heads = 2;
    c.head_dim = 16;
    c.always_on = always;
    return c;
}
/// Non-zero W_o and raw_α so the blocks contribute.
template <class S>
void perturb_amor(S& m, std::int64_t first, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.f, 0.3f);
    for (std::int64_t l = first; l < m.n_layers(); ++l) {
        auto& b = std::get<1>(m.layer_at(l));
        b.for_each_param("x", [&](const std::string& n, tensor<float>& t) {
            if (n.find("o_proj") != std::string::npos || n.find("raw_alpha") != std::string::npos)
                for (auto& v : t.span()) v = nd(g);
        });
    }
}
std::vector<std::int32_t> tokens(std::int64_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = static_cast<std::int32_t>(g() % 40);
    return t;
}
}  // namespace

TEST_CASE("with W_o = 0 an AMOR stack adds nothing: logits = head(final_norm(norm_f(backbone)))") {
    const auto spec = tiny_spec();
    auto bb = train::random_mamba2_lm(spec, 1);
    auto ref_bb = bb;
    auto m = models::make_amor<models::amor_mamba2_stack<>>(std::move(bb), tiny_amor(), 2);
    CHECK(m.n_layers() == 5);
    cpu_backend be(1);
    const std::int64_t T = 9;
    const auto tok = tokens(T, 3);
    tensor<float> logits({T, 40}), ref({T, 40});
    auto c = m.make_cache(1);
    m.forward(be, c, seq_batch::dense(1, T), tok, logits.view<2>());
    // Backbone with its own final norm, then AMOR's final norm (ones, eps 1e-6) on top, by hand through a probe.
    auto rc = ref_bb.make_cache(1);
    tensor<float> normed({T, 32});
    ref_bb.forward(be, rc, seq_batch::dense(1, T), tok, ref.view<2>(), [&](std::string_view name, tensor_view<const float, 2> v) {
        if (name == "final_norm")
            for (std::int64_t i = 0; i < v.numel(); ++i) normed[i] = v.data[i];
    });
    tensor<float> h2({T, 32});
    ops::rms_norm(be, tensor_view<const float, 2>(normed.view<2>()), std::vector<float>(32, 1.0f).data(), 1e-6f, kernels::rms_flavor::plain,
                  h2.view<2>());
    ops::linear(be, tensor_view<const float, 2>(h2.view<2>()), ref_bb.head(), nullptr, ref.view<2>());
    CHECK(test::rel_error(logits.span(), ref.span()) < 1e-6);
    REQUIRE(c.stats().size() == 3);
    for (const auto& s : c.stats()) {
        CHECK(s.rows == T);
        CHECK(s.score.size() == static_cast<std::size_t>(T));
    }
}

TEST_CASE("true-sparse inference equals dense-with-mask; prefill + decode equals one pass; every block caches every token") {
    auto m = models::make_amor<models::amor_mamba2_stack<>>(train::random_mamba2_lm(tiny_spec(), 4), tiny_amor(), 5);
    perturb_amor(m, 2, 6);
    cpu_backend be(2);
    const std::int64_t T = 23;
    const auto tok = tokens(T, 7);
    tensor<float> sparse({T, 40}), dense({T, 40});
    // τ at each block's median entropy (blocks in order, so each is set from the stream the previous ones produce).
    for (std::int64_t l = 2; l < 5; ++l) {
        auto c0 = m.make_cache(1);
        m.forward(be, c0, seq_batch::dense(1, T), tok, sparse.view<2>());
        auto H = c0.stats()[static_cast<std::size_t>(l - 2)].score;
        std::nth_element(H.begin(), H.begin() + T / 2, H.end());
        std::get<1>(m.layer_at(l)).gate().set_statistics(H[static_cast<std::size_t>(T / 2)], 0.0f);
    }
    auto c = m.make_cache(1);
    m.forward(be, c, seq_batch::dense(1, T), tok, sparse.view<2>());
    std::int64_t fired = 0;
    for (const auto& s : c.stats()) fired += s.fired;
    CHECK(fired > 0);
    CHECK(fired < 3 * T);
    // Dense-with-mask by hand: from the backbone's output, each block normalises, runs dense attention on every row
    // (fresh cache), keeps the rows its gate fired (the same entropies and τ), scales by α and writes the stream.
    tensor<float> x({T, 32});
    auto cp = m.make_cache(1);
    m.forward(be, cp, seq_batch::dense(1, T), tok, dense.view<2>(), [&](std::string_view name, tensor_view<const float, 2> v) {
        if (name == "layers.1.output")
            for (std::int64_t i = 0; i < v.numel(); ++i) x[i] = v.data[i];
    });
    for (std::int64_t l = 2; l < 5; ++l) {
        const auto& blk = std::get<1>(m.layer_at(l));
        tensor<float> h({T, 32}), y({T, 32});
        ops::rms_norm(be, tensor_view<const float, 2>(x.view<2>()), blk.norm().data(), blk.norm_eps(), blk.norm_flavor(), h.view<2>());
        auto st = blk.make_state(1);
        blk.mixer().forward(be, st, seq_batch::dense(1, T), tensor_view<const float, 2>(h.view<2>()), y.view<2>());
        const auto& stats = c.stats()[static_cast<std::size_t>(l - 2)];
        const auto alpha = blk.alpha();
        for (std::int64_t t = 0; t < T; ++t) {
            const bool f = stats.score[static_cast<std::size_t>(t)] > blk.gate().threshold();
            for (std::int64_t k = 0; k < 32; ++k) {
                const float base = blk.residual() == amor_residual::replace ? h[t * 32 + k] : x[t * 32 + k];
                x[t * 32 + k] = base + (f ? alpha[static_cast<std::size_t>(k)] * y[t * 32 + k] : 0.0f);
            }
        }
    }
    tensor<float> hn({T, 32});
    ops::rms_norm(be, tensor_view<const float, 2>(x.view<2>()), m.weights().final_norm.data(), m.final_eps(), m.final_flavor(),
                  hn.view<2>());
    ops::linear(be, tensor_view<const float, 2>(hn.view<2>()), m.head(), nullptr, dense.view<2>());
    CHECK(test::rel_error(sparse.span(), dense.span()) < 1e-5);
    auto m2 = m;
    auto c2 = m2.make_cache(1);
    // Decode: prefill 10, then 1-token steps.
    tensor<float> step_logits({1, 40});
    m2.forward(be, c2, seq_batch::dense(1, 10), std::span(tok).subspan(0, 10), tensor<float>({10, 40}).view<2>());
    for (std::int64_t t = 10; t < T; ++t) {
        m2.forward(be, c2, seq_batch::dense(1, 1), std::span(tok).subspan(static_cast<std::size_t>(t), 1), step_logits.view<2>());
        for (std::int64_t v = 0; v < 40; ++v) CHECK(step_logits[v] == doctest::Approx(sparse[t * 40 + v]).epsilon(1e-4));
    }
    for (std::int64_t l = 2; l < 5; ++l) CHECK(std::get<1>(c2.layer_state(l)).length(0) == T);
}

TEST_CASE("AMOR file round trip: same logits, same gate statistics; a file for another backbone is refused") {
    auto m = models::make_amor<models::amor_mamba2_stack<>>(train::random_mamba2_lm(tiny_spec(), 8), tiny_amor(), 9);
    perturb_amor(m, 2, 10);
    std::get<1>(m.layer_at(3)).gate().set_statistics(0.5f, 0.2f);
    const auto path = std::filesystem::path(HYMIX_TEST_TMP) / "tiny.amor.safetensors";
    models::save_amor(m, 2, tiny_amor(), path);
    auto back = models::load_amor<models::amor_mamba2_stack<>>(train::random_mamba2_lm(tiny_spec(), 8), path);
    CHECK(std::get<1>(back.layer_at(3)).gate().running_threshold() == 0.5f);
    CHECK(std::get<1>(back.layer_at(3)).gate().running_std() == 0.2f);
    cpu_backend be(1);
    const auto tok = tokens(12, 11);
    tensor<float> a({12, 40}), b({12, 40});
    auto ca = m.make_cache(1);
    auto cb = back.make_cache(1);
    m.forward(be, ca, seq_batch::dense(1, 12), tok, a.view<2>());
    back.forward(be, cb, seq_batch::dense(1, 12), tok, b.view<2>());
    CHECK(test::max_abs_diff(a.span(), b.span()) == 0.0);
    auto spec = tiny_spec();
    spec.d_model = 48;
    CHECK_THROWS_AS(models::load_amor<models::amor_mamba2_stack<>>(train::random_mamba2_lm(spec, 8), path), config_error);
    // The backbone kind the file names against a checkpoint's model_type (auto_model::load and hymix amor-sweep).
    const auto ac = models::read_amor_config(path);
    CHECK_NOTHROW(models::require_amor_backbone(ac, "mamba2", "a.safetensors", "bb/config.json"));
    CHECK_THROWS_WITH_AS(models::require_amor_backbone(ac, "qwen3_5_text", "a.safetensors", "bb/config.json"),
                         "a.safetensors: an AMOR file for a mamba2 backbone, but bb/config.json has model_type 'qwen3_5_text'", config_error);
    auto gdn = ac;
    gdn.backbone = "gdn";
    CHECK_NOTHROW(models::require_amor_backbone(gdn, "qwen3_5_text", "a", "c"));
    CHECK_NOTHROW(models::require_amor_backbone(gdn, "qwen3_5", "a", "c"));
    CHECK_THROWS_AS(models::require_amor_backbone(gdn, "mamba2", "a", "c"), config_error);
}

TEST_CASE("fitted routers on an AMOR stack (spec.md §5.6): taps record what the gates see, routers replace the head pass") {
    using S = models::amor_mamba2_stack<>;
    auto bb = train::random_mamba2_lm(tiny_spec(), 14);
    // A sharper head than the random init's, so that the entropies vary between positions.
    auto& head = bb.config().tie_embeddings ? bb.weights_mut().embedding : bb.weights_mut().lm_head;
    for (auto& v : head.span()) v *= 8.0f;
    auto m = models::make_amor<S>(std::move(bb), tiny_amor(), 15);
    perturb_amor(m, 2, 16);
    cpu_backend be(2);
    const std::int64_t T = 64, B = 32;
    std::vector<std::shared_ptr<router_samples>> taps;
    models::for_each_entropy_gate(m, [&](entropy_ema& g) {
        taps.push_back(std::make_shared<router_samples>());
        taps.back()->max_rows = 1 << 20;
        g.set_sample_tap(taps.back());
    });
    REQUIRE(taps.size() == 3);
    // Record over B sequences; the taps hold exactly the entropies the stats report.
    tensor<float> logits({B * T, 40});
    const auto tok = tokens(B * T, 17);
    auto c = m.make_cache(B);
    m.forward(be, c, seq_batch::dense(B, T), tok, logits.view<2>());
    for (std::size_t k = 0; k < 3; ++k) {
        REQUIRE(taps[k]->rows() == B * T);
        CHECK(taps[k]->H == c.stats()[k].score);
    }
    // τ at each block's median entropy, so that about half fire.
    for (std::int64_t l = 2; l < 5; ++l) {
        auto H = c.stats()[static_cast<std::size_t>(l - 2)].score;
        std::nth_element(H.begin(), H.begin() + static_cast<std::ptrdiff_t>(H.size() / 2), H.end());
        std::get<1>(m.layer_at(l)).gate().set_statistics(H[H.size() / 2], 0.0f);
    }
    models::for_each_entropy_gate(m, [](entropy_ema& g) { g.set_sample_tap(nullptr); });
    // Routers fitted on the recorded positions reproduce most decisions on fresh sequences (a median split: chance is
    // one half; 81% when written, with ~1.8K positions of a random 32-wide model).
    std::vector<std::shared_ptr<const entropy_router>> routers;
    for (auto& t : taps) {
        train::router_fit_options o;
        o.hidden = 64;
        o.epochs = 60;
        o.batch = 32;
        o.lr = 3e-3;
        auto r = train::fit_entropy_router(be, *t, o);
        CHECK(r.heldout_mse < 0.8 * r.heldout_var);  // better than the constant predictor (R² 0.42 when written)
        routers.push_back(std::make_shared<const entropy_router>(std::move(r.router)));
    }
    const auto fresh = tokens(2 * T, 18);
    tensor<float> exact({2 * T, 40}), routed({2 * T, 40});
    auto ce = m.make_cache(2);
    m.forward(be, ce, seq_batch::dense(2, T), fresh, exact.view<2>());
    const auto exact_stats = ce.stats();
    models::attach_entropy_routers(m, routers);
    auto cr = m.make_cache(2);
    m.forward(be, cr, seq_batch::dense(2, T), fresh, routed.view<2>());
    // Block 0 sees the same input either way: compare its decisions there.
    const float tau0 = std::get<1>(m.layer_at(2)).gate().threshold();
    std::int64_t agree = 0;
    for (std::size_t i = 0; i < exact_stats[0].score.size(); ++i)
        agree += (exact_stats[0].score[i] > tau0) == (cr.stats()[0].score[i] > tau0);
    MESSAGE("block 0 decision agreement " << agree << " / " << exact_stats[0].score.size());
    CHECK(agree >= static_cast<std::int64_t>(0.7 * static_cast<double>(exact_stats[0].score.size())));
    // Prefill + decode with routers equals one pass with routers (the router is per row).
    {
        auto cp = m.make_cache(1);
        tensor<float> pre({T - 1, 40}), one({T, 40}), step({1, 40});
        m.forward(be, cp, seq_batch::dense(1, T - 1), std::span(fresh).first(static_cast<std::size_t>(T - 1)), pre.view<2>());
        const std::vector<std::int64_t> slot0{0};
        m.forward(be, cp, seq_batch::decode(slot0), std::span(fresh).subspan(static_cast<std::size_t>(T - 1), 1), step.view<2>());
        auto co = m.make_cache(1);
        m.forward(be, co, seq_batch::dense(1, T), std::span(fresh).first(static_cast<std::size_t>(T)), one.view<2>());
        double diff = 0;
        for (std::int64_t v = 0; v < 40; ++v) diff = std::max(diff, std::abs(double(step[v]) - double(one[(T - 1) * 40 + v])));
        CHECK(diff < 1e-4);
    }
    // Constant routers above τ: every token fires, as always-on does, bit for bit.
    std::vector<std::shared_ptr<const entropy_router>> high;
    for (int k = 0; k < 3; ++k) {
        auto w = train::init_entropy_router_weights(32, 8, 1);
        for (auto* t : {&w.fc1_weight, &w.fc2_weight, &w.skip_weight}) t->fill(0.0f);
        w.fc2_bias[0] = 2.0f;
        high.push_back(std::make_shared<const entropy_router>(std::move(w)));
    }
    models::attach_entropy_routers(m, high);
    auto ch = m.make_cache(2);
    m.forward(be, ch, seq_batch::dense(2, T), fresh, routed.view<2>());
    {  // decode consults the routers too: a step after the prefill fires in every block, with Ĥ = 2 as its score
        const std::vector<std::int64_t> slots{0, 1};
        const std::vector<std::int32_t> next{3, 5};
        tensor<float> step({2, 40});
        auto cd = m.make_cache(2);
        m.forward(be, cd, seq_batch::dense(2, T), fresh, routed.view<2>());
        m.forward(be, cd, seq_batch::decode(slots), next, step.view<2>());
        for (const auto& st : cd.stats()) {
            CHECK(st.fired == 2);
            CHECK(st.score == std::vector<float>{2.0f, 2.0f});
        }
    }
    models::for_each_entropy_gate(m, [](entropy_ema& g) { g.set_router(nullptr), g.set_always_on(true); });
    auto ca = m.make_cache(2);
    m.forward(be, ca, seq_batch::dense(2, T), fresh, exact.view<2>());
    CHECK(test::max_abs_diff(routed.span(), exact.span()) == 0.0);
    // Always-on gates compute no entropy: routers for them are refused.
    try {
        models::attach_entropy_routers(m, high, "r.safetensors");
        FAIL("routers attached to always-on gates");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("always on") != std::string::npos);
    }
    models::for_each_entropy_gate(m, [](entropy_ema& g) { g.set_always_on(false); });
    // Counts, widths and the head's vocabulary must match the model.
    CHECK_THROWS_WITH_AS(models::attach_entropy_routers(m, std::vector<std::shared_ptr<const entropy_router>>(high.begin(), high.begin() + 2), "r"),
                         "r: 2 router(s) for a model with 3 entropy gate(s)", config_error);
    std::vector<std::shared_ptr<const entropy_router>> wide(3, std::make_shared<const entropy_router>(train::init_entropy_router_weights(48, 8, 2)));
    CHECK_THROWS_WITH_AS(models::attach_entropy_routers(m, wide, "r"), "r: routers for d_model 48, the model has d_model 32", config_error);
    CHECK_THROWS_WITH_AS(models::attach_entropy_routers(m, high, "r.safetensors", 41),
                         "r.safetensors: routers fitted for a head of vocabulary 41, the model's has 40", config_error);
    CHECK_NOTHROW(models::attach_entropy_routers(m, high, "r.safetensors", 40));
}

TEST_CASE("AMOR gradients on a frozen backbone: finite differences (always-on) and no backbone gradient") {
    using S = models::amor_mamba2_stack<>;
    auto spec = tiny_spec();
    auto m = models::make_amor<S>(train::random_mamba2_lm(spec, 12), tiny_amor(true), 13);
    perturb_amor(m, 2, 14);
    reference_backend ref;
    const auto b = seq_batch::dense(2, 6);
    const auto tok = tokens(12, 15);
    auto tgt = tokens(12, 16);
    auto g = train::zeros_like(m);
    train::activations<S> a;
    a.frozen_prefix = 2;
    train::loss_and_grad(ref, m, g, a, b, tok, tgt, 1.0f);
    std::vector<double> theta, analytic;
    std::vector<tensor<float>*> ptrs;
    m.for_each_param([&](const std::string& n, tensor<float>& t) {
        if (n.rfind("layers.3.", 0) == 0) {
            ptrs.push_back(&t);
            for (float v : t.span()) theta.push_back(v);
        }
    });
    g.for_each_param([&](const std::string& n, tensor<float>& t) {
        if (n.rfind("layers.3.", 0) == 0)
            for (float v : t.span()) analytic.push_back(v);
        if (n.rfind("layers.0.", 0) == 0 || n == "embedding")
            for (float v : t.span()) REQUIRE(v == 0.0f);
    });
    auto probe = [&]() {
        std::size_t i = 0;
        for (auto* t : ptrs)
            for (auto& v : t->span()) v = static_cast<float>(theta[i++]);
        auto gg = train::zeros_like(m);
        train::activations<S> aa;
        aa.frozen_prefix = 2;
        return train::loss_and_grad(ref, m, gg, aa, b, tok, tgt, 1.0f).sum_nats;
    };
    test::check_gradient("AMOR block 1 parameters", theta, analytic, probe, 3e-3, 1e-3, 64);
}

TEST_CASE("calibrated gates (post-hoc m̄, s̄ of always-on blocks): the statistics of the recorded entropies, every block firing") {
    SUBCASE("entropy_ema::calibrate: lower median and unbiased std; too few or non-finite entropies are refused") {
        entropy_ema g;
        const std::vector<float> H{0.5f, 0.1f, 0.3f, 0.2f};
        g.calibrate(H);
        CHECK(g.running_threshold() == 0.2f);  // sorted 0.1 0.2 0.3 0.5: the lower middle
        const double mean = 0.275, var = ((0.5 - mean) * (0.5 - mean) + (0.1 - mean) * (0.1 - mean) + (0.3 - mean) * (0.3 - mean) +
                                          (0.2 - mean) * (0.2 - mean)) / 3.0;
        CHECK(g.running_std() == doctest::Approx(std::sqrt(var)).epsilon(1e-6));
        CHECK_THROWS_AS(g.calibrate(std::vector<float>{0.4f}), value_error);
        CHECK_THROWS_AS(g.calibrate(std::vector<float>{0.4f, std::nanf("")}), value_error);
        CHECK(g.running_threshold() == 0.2f);  // unchanged by the refused calls
    }
    using S = models::amor_mamba2_stack<>;
    const auto build = [] {
        auto bb = train::random_mamba2_lm(tiny_spec(), 24);
        auto& head = bb.config().tie_embeddings ? bb.weights_mut().embedding : bb.weights_mut().lm_head;
        for (auto& v : head.span()) v *= 8.0f;  // entropies that vary between positions
        auto s = models::make_amor<S>(std::move(bb), tiny_amor(/*always=*/true), 25);
        perturb_amor(s, 2, 26);
        return s;
    };
    auto m = build();
    cpu_backend be(2);
    train::byte_corpus corpus;
    for (std::uint8_t t : [] {
             std::vector<std::uint8_t> v(4000);
             std::mt19937_64 g(27);
             for (auto& x : v) x = static_cast<std::uint8_t>(g() % 40);
             return v;
         }())
        corpus.bytes.push_back(t);
    corpus.train_end = 3800;
    const std::int64_t L = 16, positions = 200;  // rounded up to 13 whole windows: batches of 8 and 5 windows

    SUBCASE("equals the statistics of the entropies of the same windows, computed apart; κ then gates the blocks") {
        std::vector<std::vector<float>> H(3);
        {
            auto ref = build();
            models::for_each_entropy_gate(ref, [](entropy_ema& g) { g.set_always_on(false), g.set_statistics(-1.0f, 0.0f); });
            train::window_sampler s(corpus, L, 5);
            for (std::int64_t n : {8, 5}) {
                const auto b = s.next(n);
                auto c = ref.make_cache(n);
                tensor<float> last({n, 40});
                ref.forward_last(be, c, seq_batch::dense(n, L), b.inputs, last.view<2>());
                for (std::size_t k = 0; k < 3; ++k) {
                    CHECK(c.stats()[k].fired == n * L);  // every block fired
                    H[k].insert(H[k].end(), c.stats()[k].score.begin(), c.stats()[k].score.end());
                }
            }
        }
        models::for_each_entropy_gate(m, [](entropy_ema& g) { g.set_kappa(0.0f); });
        train::window_sampler s(corpus, L, 5);
        std::vector<std::int64_t> seen;
        const auto cal = models::calibrate_entropy_gates(be, m, s, positions, 8, [&](std::int64_t n) { seen.push_back(n); });
        CHECK(seen == std::vector<std::int64_t>{128, 208});
        REQUIRE(cal.size() == 3);
        std::size_t k = 0;
        models::for_each_entropy_gate(m, [&](entropy_ema& g) {
            entropy_ema want;
            want.calibrate(H[k]);
            CHECK(cal[k].positions == 13 * L);
            CHECK(g.running_threshold() == want.running_threshold());
            CHECK(g.running_std() == want.running_std());
            CHECK(cal[k].running_threshold == want.running_threshold());
            CHECK(g.running_std() > 0.0f);
            CHECK_FALSE(g.config().always_on);  // gating now
            CHECK(g.config().kappa == 0.0f);    // κ as it was
            ++k;
        });
        // τ = m̄ (κ 0): about half of fresh positions fire at each block.
        train::window_sampler fresh(corpus, L, 9);
        const auto b = fresh.next(16);
        auto c = m.make_cache(16);
        tensor<float> last({16, 40});
        m.forward_last(be, c, seq_batch::dense(16, L), b.inputs, last.view<2>());
        for (const auto& st : c.stats()) {
            CHECK(st.fire_rate() > 0.3);
            CHECK(st.fire_rate() < 0.7);
        }
    }
    SUBCASE("a non-finite entropy at block 1 is refused after block 0 was calibrated: every gate left as it was") {
        auto tap = std::make_shared<router_samples>();
        std::get<1>(m.layer_at(2)).gate().set_sample_tap(tap);
        std::get<1>(m.layer_at(3)).for_each_param("b1", [](const std::string& n, tensor<float>& t) {
            if (n.ends_with(".norm")) t.fill(std::nanf(""));
        });
        train::window_sampler s(corpus, L, 5);
        CHECK_THROWS_AS(models::calibrate_entropy_gates(be, m, s, positions), nonfinite_error);
        models::for_each_entropy_gate(m, [](entropy_ema& g) {
            CHECK(g.config().always_on);
            CHECK(g.running_threshold() == g.config().init_threshold);
            CHECK(g.running_std() == g.config().init_std);
        });
        CHECK(std::get<1>(m.layer_at(2)).gate().sample_tap() == tap);  // the caller's tap is back
        CHECK(std::get<1>(m.layer_at(3)).gate().sample_tap() == nullptr);
    }
    SUBCASE("refused with a router set or too few positions, the gates left as they were") {
        train::window_sampler s(corpus, L, 5);
        CHECK_THROWS_AS(models::calibrate_entropy_gates(be, m, s, 1), value_error);
        std::get<1>(m.layer_at(3)).gate().set_router(std::make_shared<const entropy_router>(train::detail::router_zeros(32, 4)));
        CHECK_THROWS_AS(models::calibrate_entropy_gates(be, m, s, positions), config_error);
        models::for_each_entropy_gate(m, [](entropy_ema& g) {
            CHECK(g.config().always_on);
            CHECK(g.running_threshold() == g.config().init_threshold);
            CHECK(g.running_std() == g.config().init_std);
        });
    }
}
