// Gated DeltaNet layer throughput (spec.md §4): chunked prefill (projections, conv, WY/UT core, gated norm, out_proj)
// and batched decode steps, for the shared checkpoints' layer (d 256, 4/4 heads × 64) and a 130M-class layer
// (d 768, 6 key heads × 128, 12 value heads × 128); prefill also for Qwen3.5 0.8B's layer (d 1024, 16 / 16 heads ×
// 128). FLOPs and bytes are counted per call, reported against peak.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "peak.hpp"

namespace {

hymix::gated_deltanet_config layer_config(int which) {
    hymix::gated_deltanet_config c;
    if (which == 0) {  // shared checkpoints' layer
        c.d_model = 256;
        c.n_k_heads = c.n_v_heads = 4;
        c.d_k = c.d_v = 64;
    } else if (which == 1) {  // 130M-class layer
        c.d_model = 768;
        c.n_k_heads = 6;
        c.n_v_heads = 12;
        c.d_k = c.d_v = 128;
    } else {  // Qwen3.5 0.8B's layer (bench/configs/qwen3.5-0.8b.json)
        c.d_model = 1024;
        c.n_k_heads = c.n_v_heads = 16;
        c.d_k = c.d_v = 128;
    }
    return c;
}

/// FLOPs of the projections (in_proj_qkv, z, b, a, out_proj) and conv per token.
double proj_flops(const hymix::gated_deltanet_config& c) {
    const double d = static_cast<double>(c.d_model);
    return 2.0 * d * static_cast<double>(c.conv_dim() + c.value_dim() + 2 * c.n_v_heads) +
           2.0 * static_cast<double>(c.value_dim()) * d + 2.0 * static_cast<double>(c.d_conv * c.conv_dim());
}

double weight_bytes(const hymix::gated_deltanet_config& c) {
    return 4.0 * static_cast<double>(c.d_model * (c.conv_dim() + 2 * c.value_dim() + 2 * c.n_v_heads) + c.conv_dim() * c.d_conv);
}

double state_bytes(const hymix::gated_deltanet_config& c) {
    return 4.0 * static_cast<double>(c.n_v_heads * c.d_k * c.d_v + c.conv_dim() * (c.d_conv - 1));
}

// Args: layer (0 = d 256, 1 = d 768, 2 = d 1024), batch B, tokens per sequence T.
void BM_gdn_prefill(benchmark::State& st) {
    const auto c = layer_config(static_cast<int>(st.range(0)));
    const std::int64_t B = st.range(1), T = st.range(2);
    hymix::cpu_backend be;
    hymix::gated_deltanet m(c, hymix::gated_deltanet_weights::random(c, 1));
    auto state = m.make_state(B);
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(B * T * c.d_model), 2);
    std::vector<float> y(x.size());
    const auto batch = hymix::seq_batch::dense(B, T);
    hymix::tensor_view<const float, 2> xv(x.data(), {B * T, c.d_model});
    hymix::tensor_view<float, 2> yv(y.data(), {B * T, c.d_model});
    m.forward(be, state, batch, xv, yv);  // warm-up: grows the per-thread workspace outside the timed loop
    for (auto _ : st) {
        m.forward(be, state, batch, xv, yv);
        benchmark::DoNotOptimize(y.data());
    }
    // Core FLOPs per token and value head of the chunked form (full chunks of C): the three C×d_k×d_v products
    // ((K⊙e^γ)S, (Q⊙e^γ)S, state update) plus KKᵀ, QKᵀ, the triangular solve and the intra-chunk P·V_new.
    // C: the layer's chunk_size, or the backend's choice where that is 0 (as the layer runs it).
    const double C = static_cast<double>(c.chunk_size > 0 ? c.chunk_size : hymix::ops::gated_delta_chunk_length(be, c.d_k, c.d_v));
    const double dk = static_cast<double>(c.d_k), dv = static_cast<double>(c.d_v);
    const double core = static_cast<double>(c.n_v_heads) * (6.0 * dk * dv + C * (4.0 * dk + 3.0 * dv));
    const double tokens = static_cast<double>(B * T);
    const double bytes = weight_bytes(c) + 2.0 * 4.0 * tokens * static_cast<double>(c.d_model) + 2.0 * static_cast<double>(B) * state_bytes(c);
    hymix::bench::report(st, tokens, tokens * (proj_flops(c) + core), bytes, be.num_threads());
}

// Args: layer, batch B. One decode step for B sequences.
void BM_gdn_decode(benchmark::State& st) {
    const auto c = layer_config(static_cast<int>(st.range(0)));
    const std::int64_t B = st.range(1);
    hymix::cpu_backend be;
    hymix::gated_deltanet m(c, hymix::gated_deltanet_weights::random(c, 1));
    auto state = m.make_state(B);
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(B * c.d_model), 3);
    std::vector<float> y(x.size());
    std::vector<std::int64_t> slots(static_cast<std::size_t>(B));
    for (std::int64_t i = 0; i < B; ++i) slots[static_cast<std::size_t>(i)] = i;
    const auto batch = hymix::seq_batch::decode(slots);
    hymix::tensor_view<const float, 2> xv(x.data(), {B, c.d_model});
    hymix::tensor_view<float, 2> yv(y.data(), {B, c.d_model});
    m.step(be, state, batch, xv, yv);  // warm-up
    for (auto _ : st) {
        m.step(be, state, batch, xv, yv);
        benchmark::DoNotOptimize(y.data());
    }
    const double core = static_cast<double>(c.n_v_heads) * 6.0 * static_cast<double>(c.d_k * c.d_v);
    const double bytes = weight_bytes(c) + 2.0 * static_cast<double>(B) * state_bytes(c);
    hymix::bench::report(st, static_cast<double>(B), static_cast<double>(B) * (proj_flops(c) + core), bytes, be.num_threads());
}

/// The gated delta rule core alone (130M-class heads: 6 key heads, 12 value heads, d_k = d_v = 128, or `heads` of
/// each; chunk length `chunk`), one sequence of T tokens, on 2 threads (or the first count in HYMIX_BENCH_THREADS);
/// FLOPs counted as in BM_gdn_prefill's core term.
void gdn_chunked_core(benchmark::State& st, std::int64_t T, std::int64_t chunk, std::int64_t heads, bool model_decay, bool flush) {
    auto c = layer_config(1);
    c.chunk_size = chunk;
    if (heads > 0) c.n_k_heads = c.n_v_heads = heads;  // llama.cpp's case: 16 heads of 128
    const std::int64_t Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v;
    hymix::cpu_backend be(hymix::bench::first_thread_count(2));
    be.set_flush_subnormals(flush);
    auto q = hymix::bench::random_vec(static_cast<std::size_t>(T * Hk * dk), 6), k = hymix::bench::random_vec(q.size(), 7);
    for (auto* x : {&q, &k})  // L2-normalised rows, as the layer feeds them
        for (std::size_t r = 0; r < x->size(); r += static_cast<std::size_t>(dk)) {
            float ss = 0.f;
            for (std::int64_t a = 0; a < dk; ++a) ss += (*x)[r + a] * (*x)[r + a];
            for (std::int64_t a = 0; a < dk; ++a) (*x)[r + a] /= std::sqrt(ss);
        }
    const auto v = hymix::bench::random_vec(static_cast<std::size_t>(T * Hv * dv), 8);
    auto g = hymix::bench::random_vec(static_cast<std::size_t>(T * Hv), 9), beta = g;
    for (auto& x : g) x = -0.05f * (1.5f + x);
    for (auto& x : beta) x = 0.5f + 0.5f * x;
    if (model_decay) {  // random-init decays (spec.md §4.5): g = −A_h·softplus(a + 1), A_h ~ U(0.01, 16), a ~ N(0, 0.64)
        std::mt19937 rng(13);
        std::uniform_real_distribution<float> ua(0.01f, 16.f);
        std::normal_distribution<float> na(0.f, 0.64f);
        std::vector<float> A(static_cast<std::size_t>(Hv));
        for (auto& a : A) a = ua(rng);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = -A[i % A.size()] * std::log1p(std::exp(1.f + na(rng)));
    }
    std::vector<float> s(static_cast<std::size_t>(Hv * dk * dv)), o(v.size());
    const auto batch = hymix::seq_batch::dense(1, T);
    for (auto _ : st) {
        std::fill(s.begin(), s.end(), 0.f);
        hymix::kernels::gated_delta_rule_chunked(
            be, batch, hymix::tensor_view<const float, 3>(q.data(), {T, Hk, dk}), hymix::tensor_view<const float, 3>(k.data(), {T, Hk, dk}),
            hymix::tensor_view<const float, 3>(v.data(), {T, Hv, dv}), hymix::tensor_view<const float, 2>(g.data(), {T, Hv}),
            hymix::tensor_view<const float, 2>(beta.data(), {T, Hv}), 1.f / std::sqrt(float(dk)),
            hymix::tensor_view<float, 4>(s.data(), {1, Hv, dk, dv}), hymix::tensor_view<float, 3>(o.data(), {T, Hv, dv}), c.chunk_size);
        benchmark::DoNotOptimize(o.data());
    }
    const double C = static_cast<double>(c.chunk_size), dkd = static_cast<double>(dk), dvd = static_cast<double>(dv);
    const double f = static_cast<double>(T * Hv) * (6.0 * dkd * dvd + C * (4.0 * dkd + 3.0 * dvd));
    hymix::bench::report(st, static_cast<double>(T), f, 4.0 * static_cast<double>(q.size() + k.size() + 2 * v.size()), be.num_threads());
    st.counters["threads"] = be.num_threads();  // not in the name: 2 unless HYMIX_BENCH_THREADS says otherwise
}

void BM_gdn_chunked_core(benchmark::State& st) { gdn_chunked_core(st, st.range(0), st.range(1), st.range(2), false, true); }

/// The cost of subnormal numbers: BM_gdn_chunked_core's 16 heads × 128, T 512, chunk 64, with the decays of a
/// randomly initialised layer (decay 1: many heads lose e^-5 to e^-20 per token, so the chunk's forward substitution
/// and decay products fall below 2^-126) or the mild ones (decay 0), on a backend that flushes subnormals (flush 1,
/// the default) or keeps IEEE subnormals (flush 0).
void BM_gdn_chunked_subnormals(benchmark::State& st) { gdn_chunked_core(st, 512, 64, 16, st.range(0) != 0, st.range(1) != 0); }

/// The gated delta rule decode step alone (same heads, or `heads` of them), B sequences of one token, on `threads`
/// threads: 6 d_k·d_v FLOPs per value head.
void BM_gdn_step_core(benchmark::State& st) {
    auto c = layer_config(1);
    if (st.range(1) > 0) c.n_k_heads = c.n_v_heads = st.range(1);
    const std::int64_t B = st.range(0), Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v;
    hymix::cpu_backend be(static_cast<int>(st.range(2)));
    const auto q = hymix::bench::random_vec(static_cast<std::size_t>(B * Hk * dk), 10), k = hymix::bench::random_vec(q.size(), 11),
               v = hymix::bench::random_vec(static_cast<std::size_t>(B * Hv * dv), 12);
    std::vector<float> g(static_cast<std::size_t>(B * Hv), -0.05f), beta(g.size(), 0.5f), o(v.size());
    std::vector<float> s(static_cast<std::size_t>(B * Hv * dk * dv));
    std::vector<std::int64_t> slots(static_cast<std::size_t>(B));
    for (std::int64_t i = 0; i < B; ++i) slots[static_cast<std::size_t>(i)] = i;
    const auto batch = hymix::seq_batch::decode(slots);
    for (auto _ : st) {
        hymix::kernels::gated_delta_rule_step(
            be, batch, hymix::tensor_view<const float, 3>(q.data(), {B, Hk, dk}), hymix::tensor_view<const float, 3>(k.data(), {B, Hk, dk}),
            hymix::tensor_view<const float, 3>(v.data(), {B, Hv, dv}), hymix::tensor_view<const float, 2>(g.data(), {B, Hv}),
            hymix::tensor_view<const float, 2>(beta.data(), {B, Hv}), 0.08f, hymix::tensor_view<float, 4>(s.data(), {B, Hv, dk, dv}),
            hymix::tensor_view<float, 3>(o.data(), {B, Hv, dv}));
        benchmark::DoNotOptimize(o.data());
    }
    hymix::bench::report(st, static_cast<double>(B), static_cast<double>(B * Hv) * 6.0 * static_cast<double>(dk * dv),
                         8.0 * static_cast<double>(s.size()), be.num_threads());
}

}  // namespace

BENCHMARK(BM_gdn_prefill)
    ->ArgNames({"layer", "B", "T"})
    ->ArgsProduct({{0, 1}, {1, 8}, {512, 2048}})
    ->Args({2, 1, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_gdn_decode)->ArgNames({"layer", "B"})->ArgsProduct({{0, 1}, {1, 8}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gdn_chunked_core)->ArgNames({"T", "chunk", "heads"})->ArgsProduct({{512, 2048}, {32, 64, 128}, {0}})->Args({512, 64, 16})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gdn_chunked_subnormals)->ArgNames({"decay", "flush"})->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gdn_step_core)
    ->ArgNames({"B", "heads", "threads"})
    ->ArgsProduct({{1}, {0, 2, 16}, {1, 2}})
    ->Args({8, 0, 1})
    ->Args({8, 0, 2})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
