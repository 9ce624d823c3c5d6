// AMOR decode throughput against context (issue 9; spec.md §5.6–5.7): one decode step of B sequences after a context
// of n tokens, for a Mamba-2 backbone alone, the backbone with 3 AMOR blocks run true-sparse (τ set so that about 22%
// of tokens fire, the paper's rate), the same blocks always on, and a fixed hybrid of the same size (the backbone plus
// 3 plain attention layers of the blocks' shape, no gate). Two sizes: the shared KJV models' (d 256, 6 layers,
// V 256, blocks of 4 heads × 64) and a large-vocabulary one (d 1024, 24 layers, V 128256, blocks of 16 heads × 64).
// Weights are random (random_stack / make_amor; seed 0), f32. The KV caches are filled directly with finite values
// (prefilling 128K tokens would dominate the run) and rolled back to n after each timed step; the recurrent states
// simply advance. Counted per token (spec.md §5.7): backbone 2 FLOPs per mixer weight plus ≈ 5 per SSM state element
// (decay, input outer product, read-out), the head 2·d·V, per attention block 4d² (K, V) plus, where it fires, 4d²
// (Q, W_o) and 4·n·d (scores and values), and for true-sparse AMOR the gate's 2·d·V (an always-on gate computes no
// entropy); bytes: every weight read once per step, each sequence's SSM and conv states read and written, and the KV
// rows attended to (W_q, W_o where some row fires). The `fire_rate` counter is the measured mean over blocks and
// timed steps (at least 2 s of steps per case, so that the rate rests on tens of decisions per block).
// BM_amor_decode_bf16: the large-vocabulary size with the weights stored as bf16 (KV caches and states stay f32).
// Where true-sparse overtakes always-on is the question: the gate's head GEMV (d·V weights per block) is its cost.
// The fifth variant runs true-sparse with fitted-router gates (spec.md §5.6: W₁ [512, d], nn.Linear-initialised
// weights from a seed, τ at the 78th percentile of the router's own Ĥ over the same calibration): the gate then costs
// d·513 + 512 multiply-adds per row and block instead of d·V (and reads d·513 + 1025 weights instead of d·V).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/amor.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/train/router_fit.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/stack/random_stack.hpp"
#include "peak.hpp"

namespace {

using hymix::layer_kind;
using backbone_t = hymix::models::hf_mamba2_stack;
using amor_t = hymix::models::amor_mamba2_stack<>;
using hybrid_t = hymix::model<hymix::any_of<layer_kind::mamba2, layer_kind::attention>, hymix::plain_rms_norm, hymix::no_mlp,
                              hymix::bind<layer_kind::mamba2, hymix::mamba2>, hymix::bind<layer_kind::attention, hymix::attention>>;

struct size_spec {
    const char* name;
    std::int64_t d, layers, vocab, heads, d_state;
};
constexpr size_spec sizes[] = {{"kjv", 256, 6, 256, 4, 64}, {"large_vocab", 1024, 24, 128256, 16, 128}};
constexpr std::int64_t n_blocks = 3;
constexpr double target_fire = 0.22;

enum variant : int { backbone_only = 0, amor_sparse = 1, amor_always = 2, fixed_hybrid = 3, amor_router = 4 };
const char* variant_name(int v) {
    static const char* names[] = {"backbone", "amor_true_sparse", "amor_always_on", "fixed_hybrid", "amor_router"};
    return names[v];
}

hymix::stack_config stack_cfg(const size_spec& s) { return {.d_model = s.d, .vocab_size = s.vocab, .norm_eps = 1e-5f, .tie_embeddings = true}; }
hymix::mamba2_config mixer_cfg(const size_spec& s) {
    hymix::mamba2_config c;
    c.d_model = s.d;
    c.head_dim = 64;
    c.n_heads = 2 * s.d / 64;
    c.d_state = s.d_state;
    c.expand = 2;
    return c;
}
hymix::models::amor_config amor_cfg(const size_spec& s) {
    hymix::models::amor_config c;
    c.n_amor_blocks = n_blocks;
    c.d_model = s.d;
    c.vocab_size = s.vocab;
    c.n_heads = s.heads;
    c.head_dim = s.d / s.heads;
    return c;
}
backbone_t make_backbone(const size_spec& s) {
    return hymix::random_stack<backbone_t>(stack_cfg(s), {.n_layers = s.layers}, {mixer_cfg(s)}, 0);
}

using any_model = std::variant<backbone_t, amor_t, hybrid_t>;

/// The decode tokens: a fixed random sequence, cycled through (the gate's entropy depends on the input).
std::int32_t token_at(std::int64_t i, std::int64_t vocab) {
    static const auto r = hymix::bench::random_vec(4096, 7);
    return static_cast<std::int32_t>((r[static_cast<std::size_t>(i % 4096)] + 1.0f) * 0.5f * static_cast<float>(vocab - 1));
}

/// The model of size s for variant v (AMOR: τ of each block at the 78th percentile of its entropies over 128 decode
/// steps after a 64-token prompt, i.e. about 22% fire; W_o = 0 as initialised, so every block sees the backbone's
/// output and the calibration holds for all of them).
any_model build(const size_spec& s, int v, hymix::dtype w) {
    if (v == backbone_only) {
        auto m = make_backbone(s);
        m.store_weights_as(w);
        return m;
    }
    if (v == fixed_hybrid) {
        std::vector<layer_kind> kinds(static_cast<std::size_t>(s.layers), layer_kind::mamba2);
        for (std::int64_t i = 0; i < n_blocks; ++i) kinds.push_back(layer_kind::attention);
        auto m = hymix::random_stack<hybrid_t>(stack_cfg(s), {.kinds = kinds}, {mixer_cfg(s), amor_cfg(s).attention()}, 0);
        m.store_weights_as(w);
        return m;
    }
    amor_t m = hymix::models::make_amor<amor_t>(make_backbone(s), amor_cfg(s), 0);
    m.store_weights_as(w);  // before the calibration: the gate reads the head as stored
    if (v == amor_router) {
        std::vector<std::shared_ptr<const hymix::entropy_router>> routers;
        for (std::int64_t k = 0; k < n_blocks; ++k)
            routers.push_back(std::make_shared<const hymix::entropy_router>(
                hymix::train::init_entropy_router_weights(s.d, hymix::entropy_router::default_hidden, static_cast<std::uint64_t>(k))));
        hymix::models::attach_entropy_routers(m, routers);
    }
    const hymix::cpu_backend be;
    const std::int64_t T = 64, steps = 128;
    std::vector<std::int32_t> tok(static_cast<std::size_t>(T));
    for (std::int64_t i = 0; i < T; ++i) tok[static_cast<std::size_t>(i)] = token_at(i, s.vocab);
    auto cache = m.make_cache(1);
    hymix::tensor<float> logits({1, s.vocab});
    m.forward_last(be, cache, hymix::seq_batch::dense(1, T), tok, logits.view<2>());
    std::vector<std::vector<float>> H(n_blocks);
    const std::vector<std::int64_t> slot0{0};
    for (std::int64_t i = 0; i < steps; ++i) {
        const std::int32_t t = token_at(T + i, s.vocab);
        m.forward_last(be, cache, hymix::seq_batch::decode(slot0), std::span(&t, 1), logits.view<2>());
        for (std::size_t k = 0; k < H.size(); ++k) H[k].insert(H[k].end(), cache.stats().at(k).score.begin(), cache.stats().at(k).score.end());
    }
    std::size_t k = 0;
    hymix::models::for_each_entropy_gate(m, [&](hymix::entropy_ema& g) {
        auto& Hk = H.at(k++);
        std::sort(Hk.begin(), Hk.end());
        g.set_statistics(Hk[static_cast<std::size_t>((1.0 - target_fire) * static_cast<double>(Hk.size()))], 0.0f);
        g.set_always_on(v == amor_always);
    });
    return m;
}

/// One model alive at a time.
template <class F>
void with_model(int size, int v, hymix::dtype w, F&& f) {
    static int key = -1;
    static std::unique_ptr<any_model> model;
    const int k = (size * 8 + (v == amor_always ? amor_sparse : v)) * 8 + static_cast<int>(w);
    if (k != key) {
        model.reset();
        model = std::make_unique<any_model>(build(sizes[size], v, w));
        key = k;
    }
    std::visit([&](auto& m) {
        if constexpr (std::is_same_v<std::decay_t<decltype(m)>, amor_t>)
            hymix::models::for_each_entropy_gate(m, [&](hymix::entropy_ema& g) { g.set_always_on(v == amor_always); });
        f(m);
    }, *model);
}

/// Fills every KV cache of `cache` to n tokens per slot with finite values (capacity n + 1).
template <class Cache>
void fill_kv(Cache& cache, std::int64_t B, std::int64_t n) {
    std::uint32_t r = 12345;
    for (std::int64_t l = 0; l < cache.n_layers(); ++l)
        std::visit([&](auto& st) {
            if constexpr (requires { st.set_length(0, 0); st.keys(0); }) {
                for (std::int64_t b = 0; b < B; ++b) hymix::bench::fill_kv_slot(st, b, n, r);
            }
        }, cache.layer_state(l));
}

template <class Cache>
void roll_back(Cache& cache, std::int64_t B, std::int64_t n) {
    for (std::int64_t l = 0; l < cache.n_layers(); ++l)
        std::visit([&](auto& st) {
            if constexpr (requires { st.set_length(0, 0); })
                for (std::int64_t b = 0; b < B; ++b) st.set_length(b, n);
        }, cache.layer_state(l));
}

/// One decode step of variant v at size `size`, batch B, context n, with the projection and head weights stored as w.
void amor_decode(benchmark::State& st, int size, int v, std::int64_t B, std::int64_t n, hymix::dtype w) {
    const auto& s = sizes[size];
    const hymix::cpu_backend be;
    with_model(size, v, w, [&](auto& m) {
        auto cache = m.make_cache(B);
        fill_kv(cache, B, n);
        std::vector<std::int64_t> slots(static_cast<std::size_t>(B));
        std::vector<std::int32_t> tok(static_cast<std::size_t>(B));
        for (std::int64_t b = 0; b < B; ++b) slots[static_cast<std::size_t>(b)] = b;
        const auto batch = hymix::seq_batch::decode(slots);
        hymix::tensor<float> logits({B, s.vocab});
        double fired = 0, rows = 0;
        std::int64_t i = 0;
        for (auto _ : st) {
            for (auto& t : tok) t = token_at(i++, s.vocab);
            m.forward_last(be, cache, batch, tok, logits.template view<2>());
            benchmark::DoNotOptimize(logits.data());
            st.PauseTiming();
            for (const auto& bs : cache.stats()) fired += static_cast<double>(bs.fired), rows += static_cast<double>(bs.rows);
            roll_back(cache, B, n);
            st.ResumeTiming();
        }
        const double f = v == amor_always || v == fixed_hybrid ? 1.0 : (v == amor_sparse || v == amor_router) && rows > 0 ? fired / rows : 0.0;
        const double d = static_cast<double>(s.d), V = static_cast<double>(s.vocab), nd = static_cast<double>(n + 1);
        const auto mc = mixer_cfg(s);
        const double mixer_w = static_cast<double>(s.layers) *
                               (d * static_cast<double>(mc.d_in_proj()) + static_cast<double>(mc.d_inner()) * d +
                                static_cast<double>(mc.conv_dim() * mc.d_conv));
        const double blocks = v == backbone_only ? 0.0 : static_cast<double>(n_blocks);
        // entropy_ema::decide skips the head when always on; with a router it reads the router's weights instead.
        const double rh = static_cast<double>(hymix::entropy_router::default_hidden);  // router: W₁, b₁, W₂, b₂, w_s
        const double gate_w = v == amor_sparse ? d * V : v == amor_router ? d * (rh + 1) + 2 * rh + 1 : 0.0;
        const double ssm = static_cast<double>(s.layers * mc.d_inner() * mc.d_state);
        const double conv = static_cast<double>(s.layers * mc.conv_dim() * (mc.d_conv - 1));
        const double Bd = static_cast<double>(B);
        const double flops =
            Bd * (2.0 * mixer_w + 5.0 * ssm + 2.0 * d * V + blocks * (2.0 * gate_w + 4.0 * d * d + f * (4.0 * d * d + 4.0 * nd * d)));
        // W_q and W_o are read only when some row of the step fires (about min(1, B·f) of the steps).
        const double qo = std::min(1.0, Bd * f) * 2.0 * d * d;
        // Projections and the head as stored (2 bytes each with bf16); the conv weights, a router's weights, the
        // states and the KV caches stay f32.
        const double wb = w == hymix::dtype::f32 ? 4.0 : 2.0;
        const double conv_w = static_cast<double>(s.layers * mc.conv_dim() * mc.d_conv);
        const double bytes = wb * (mixer_w - conv_w + d * V + blocks * (2.0 * d * d + qo + (v == amor_router ? 0.0 : gate_w))) +
                             4.0 * (conv_w + (v == amor_router ? blocks * gate_w : 0.0) + Bd * 2.0 * (ssm + conv) + Bd * blocks * f * 2.0 * nd * d);
        st.counters["fire_rate"] = f;
        st.counters["context"] = static_cast<double>(n);
        st.SetLabel(std::string(s.name) + " " + variant_name(v) + (w == hymix::dtype::f32 ? "" : " bf16 weights"));
        hymix::bench::report(st, Bd, flops, bytes, be.num_threads());
    });
}

void args(benchmark::internal::Benchmark* b) {
    for (int size = 0; size < 2; ++size)
        for (int v = 0; v < 5; ++v)
            for (std::int64_t B : {1, 8})
                for (std::int64_t n : {1024, 4096, 16384, 65536, 131072}) {
                    if (v == backbone_only && n != 1024) continue;  // no KV cache: the context does not matter
                    if (B == 8 && n > 32768) continue;              // 8 × 64K contexts × 3 blocks: past a 24 GiB machine
                    b->Args({size, v, B, n});
                }
}
// Args: size index, variant, batch B, context n.
void BM_amor_decode(benchmark::State& st) {
    amor_decode(st, static_cast<int>(st.range(0)), static_cast<int>(st.range(1)), st.range(2), st.range(3), hymix::dtype::f32);
}
/// The large-vocabulary size with every projection and the head stored as bf16 (model::store_weights_as): the exact
/// gate's head GEMV reads half the bytes. Args: variant, batch B, context n.
void BM_amor_decode_bf16(benchmark::State& st) {
    amor_decode(st, 1, static_cast<int>(st.range(0)), st.range(1), st.range(2), hymix::dtype::bf16);
}

BENCHMARK(BM_amor_decode_bf16)
    ->ArgNames({"variant", "B", "ctx"})
    ->ArgsProduct({{backbone_only, amor_sparse, amor_always, amor_router}, {1}, {1024, 16384, 65536}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK(BM_amor_decode)->Apply(args)->ArgNames({"size", "variant", "B", "ctx"})->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
