// Sliding-window attention as its own layer kind (mixer/sliding_window_attention.hpp): the shared mixer invariants on
// every backend, plus what is specific to it — the window mask against the fp64 reference over long continuations,
// a KV cache bounded by the window, its kind and Hugging Face layer type, and the config check.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/mixer/sliding_window_attention.hpp"
#include "hymix/stack/model.hpp"
#include "support/mixer_harness.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {
/// Mistral-like: GQA 3:1, window 7 (shorter than the harness's sequences), rotate-half RoPE, no qk-norm.
attention_config swa_config(std::int64_t window = 7) {
    attention_config c;
    c.d_model = 36;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.head_dim = 12;
    c.rope = {rope_mode::rotate_half, 1e4, 1.0};
    c.sliding_window = window;
    return c;
}
}  // namespace

HYMIX_MIXER_HARNESS("sliding_window_attention", sliding_window_attention(swa_config(), attention_weights::random(swa_config(), 21)))

TEST_CASE("sliding_window_attention: long decode matches the reference and the KV cache stays bounded") {
    const sliding_window_attention m(swa_config(), attention_weights::random(swa_config(), 22));
    const cpu_backend be(2);
    const std::int64_t d = m.config().d_model, w = m.window();
    auto st = m.make_state(2);
    auto rst = make_ref_state(m, 2);
    std::int64_t max_stored = 0;
    for (std::int64_t step = 0; step < 60; ++step) {
        const std::int64_t T = step % 5 == 0 ? 6 : 1;  // prefill chunks between decode steps
        const auto x = test::uniform(static_cast<std::size_t>(2 * T * d), -1.f, 1.f, 1000 + static_cast<std::uint64_t>(step));
        std::vector<float> y(x.size());
        const auto b = seq_batch::dense(2, T);
        m.forward(be, st, b, tensor_view<const float, 2>(x.data(), {2 * T, d}), tensor_view<float, 2>(y.data(), {2 * T, d}));
        std::vector<double> xd(x.begin(), x.end()), yr(x.size());
        layer_ref(m, b, tensor_view<const double, 2>(xd.data(), {2 * T, d}), rst, tensor_view<double, 2>(yr.data(), {2 * T, d}));
        CHECK(test::rel_error(y, yr) <= 1e-5);
        max_stored = std::max(max_stored, st.stored(0));
        CHECK(st.length(0) == rst.length(0));
    }
    CHECK(st.length(0) > 4 * w);
    CHECK(max_stored <= 2 * w + 6);  // a window, what waits for eviction, and one call's tokens
    CHECK(st.first(0) > 0);
}

TEST_CASE("sliding_window_attention: declares its kind and rejects a missing window") {
    static_assert(sliding_window_attention::kind.kind == layer_kind('S'));
    CHECK(sliding_window_attention::kind.matches_hf("sliding_attention"));
    CHECK(layer_kind_name(sliding_window_attention::kind.kind) == "sliding_attention");
    CHECK_THROWS_AS(sliding_window_attention(swa_config(0), attention_weights::random(swa_config(0), 1)), config_error);
}

TEST_CASE("sliding_window_attention: a new kind in a stack, by its letter; both backends agree") {
    using swa_stack = model<pattern<"MSMS">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>,
                            bind<sliding_window_attention::kind.kind, sliding_window_attention>>;
    const std::int64_t d = 36, V = 23;
    mamba2_config mc;
    mc.d_model = d;
    mc.n_heads = 3;
    mc.head_dim = 24;
    mc.d_state = 8;
    mc.chunk_size = 8;
    auto vec = [](std::int64_t n, float lo, float hi, std::uint64_t seed) {
        tensor<float> t({n});
        const auto v = test::uniform(static_cast<std::size_t>(n), lo, hi, seed);
        std::copy(v.begin(), v.end(), t.data());
        return t;
    };
    std::vector<swa_stack::layer> layers;
    for (int l = 0; l < 4; ++l) {
        if (l % 2 == 0)
            layers.emplace_back(vec(d, 0.5f, 1.5f, 40 + l), swa_stack::mixer_variant(std::in_place_index<0>, mc, mamba2_weights::random(mc, 50 + l)));
        else
            layers.emplace_back(vec(d, 0.5f, 1.5f, 40 + l),
                                swa_stack::mixer_variant(std::in_place_index<1>, swa_config(), attention_weights::random(swa_config(), 50 + l)));
    }
    stack_weights w;
    w.embedding = tensor<float>({V, d});
    const auto e = test::uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, 60);
    std::copy(e.begin(), e.end(), w.embedding.data());
    w.final_norm = vec(d, 0.5f, 1.5f, 61);
    const swa_stack m(stack_config{d, V, 1e-5f, true}, std::move(w), std::move(layers));
    CHECK(schedule_string(m.layer_kinds()) == "MSMS");
    CHECK(swa_stack::kind_name(layer_kind('S')) == "sliding_attention");
    const std::int64_t T = 25;
    std::vector<std::int32_t> tok(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) tok[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 7 + 3) % V);
    std::vector<float> a(static_cast<std::size_t>(T * V)), b(a.size());
    auto ca = m.make_cache(1), cb = m.make_cache(1);
    m.forward(cpu_backend(2), ca, seq_batch::dense(1, T), tok, tensor_view<float, 2>(a.data(), {T, V}));
    m.forward(reference_backend(), cb, seq_batch::dense(1, T), tok, tensor_view<float, 2>(b.data(), {T, V}));
    CHECK(test::rel_error(a, b) <= 1e-5);
}
