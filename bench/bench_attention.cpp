// Causal attention layer throughput (spec.md §2): tiled prefill (projections, qk-norm, RoPE, flash-style attention,
// gate, o_proj) and decode steps over a long KV cache, for the shared checkpoints' layer (d 256, 4/2 heads × 64,
// output gate, zero-centred qk-norm, partial RoPE 0.25) and a 130M-class layer (d 768, 12 heads × 64, MHA, no gate);
// prefill also for Qwen3.5 0.8B's layer (d 1024, 8 / 2 heads × 256, output gate). Decode with the KV cache in f32 and
// in bf16 (half the bytes per step).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <type_traits>
#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/attention.hpp"
#include "peak.hpp"

namespace {

hymix::attention_config layer_config(int which) {
    hymix::attention_config c;
    if (which == 1) {  // 130M-class layer
        c.d_model = 768;
        c.n_heads = c.n_kv_heads = 12;
        c.head_dim = 64;
        return c;
    }
    // Qwen3.5's attention layer: the shared checkpoints' (layer 0) or Qwen3.5 0.8B's (layer 2,
    // bench/configs/qwen3.5-0.8b.json), with output gate, zero-centred qk-norm and RoPE on a quarter of the channels.
    c.d_model = which == 0 ? 256 : 1024;
    c.n_heads = which == 0 ? 4 : 8;
    c.n_kv_heads = 2;
    c.head_dim = which == 0 ? 64 : 256;
    c.output_gate = true;
    c.qk_norm.mode = hymix::qk_norm_mode::zero_centered;
    c.rope = {hymix::rope_mode::rotate_half, 1e7, 0.25};
    return c;
}

/// Projection FLOPs per token: q (with gate), k, v, o.
double proj_flops(const hymix::attention_config& c) {
    return 2.0 * static_cast<double>(c.d_model) * static_cast<double>(c.q_rows() + 2 * c.kv_rows() + c.n_heads * c.head_dim);
}
double weight_bytes(const hymix::attention_config& c) {
    return 4.0 * static_cast<double>(c.d_model) * static_cast<double>(c.q_rows() + 2 * c.kv_rows() + c.n_heads * c.head_dim);
}

// Args: layer (0 = d 256, 1 = d 768, 2 = d 1024), batch B, tokens per sequence T. Each iteration prefills fresh sequences.
void BM_attn_prefill(benchmark::State& st) {
    const auto c = layer_config(static_cast<int>(st.range(0)));
    const std::int64_t B = st.range(1), T = st.range(2);
    hymix::cpu_backend be;
    const hymix::attention m(c, hymix::attention_weights::random(c, 1));
    auto state = m.make_state(B);
    state.reserve(T);
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(B * T * c.d_model), 2);
    std::vector<float> y(x.size());
    const auto batch = hymix::seq_batch::dense(B, T);
    const hymix::tensor_view<const float, 2> xv(x.data(), {B * T, c.d_model});
    const hymix::tensor_view<float, 2> yv(y.data(), {B * T, c.d_model});
    for (auto _ : st) {
        for (std::int64_t b = 0; b < B; ++b) state.reset_slot(b);
        m.forward(be, state, batch, xv, yv);
        benchmark::DoNotOptimize(y.data());
    }
    const double tokens = static_cast<double>(B * T), Td = static_cast<double>(T);
    // Causal attention: QKᵀ and PV over the visible half (T(T+1)/2 scores per head), 2 FLOPs per multiply-add.
    const double attn = static_cast<double>(B * c.n_heads) * 4.0 * static_cast<double>(c.head_dim) * Td * (Td + 1) / 2;
    const double bytes = weight_bytes(c) + 2.0 * 4.0 * tokens * static_cast<double>(c.d_model) +
                         2.0 * 4.0 * tokens * static_cast<double>(c.kv_rows());
    hymix::bench::report(st, tokens, tokens * proj_flops(c) + attn, bytes, be.num_threads());
}

// Args: layer, batch B, context (cached tokens per sequence), KV cache element bytes (4: f32, 2: bf16). One decode
// step for B sequences.
void BM_attn_decode(benchmark::State& st) {
    auto c = layer_config(static_cast<int>(st.range(0)));
    const std::int64_t B = st.range(1), ctx = st.range(2);
    c.kv_dtype = st.range(3) == 2 ? hymix::dtype::bf16 : hymix::dtype::f32;
    hymix::cpu_backend be;
    const hymix::attention m(c, hymix::attention_weights::random(c, 1));
    auto state = m.make_state(B);
    // Fill the caches directly with finite values (prefilling 32K tokens would dominate the run).
    std::uint32_t r = 12345;
    for (std::int64_t b = 0; b < B; ++b) hymix::bench::fill_kv_slot(state, b, ctx, r);
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(B * c.d_model), 2);
    std::vector<float> y(x.size());
    std::vector<std::int64_t> slots(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) slots[static_cast<std::size_t>(b)] = b;
    const auto batch = hymix::seq_batch::decode(slots);
    const hymix::tensor_view<const float, 2> xv(x.data(), {B, c.d_model});
    const hymix::tensor_view<float, 2> yv(y.data(), {B, c.d_model});
    for (auto _ : st) {
        m.step(be, state, batch, xv, yv);
        benchmark::DoNotOptimize(y.data());
        st.PauseTiming();
        for (std::int64_t b = 0; b < B; ++b) state.set_length(b, ctx);
        st.ResumeTiming();
    }
    const double Bd = static_cast<double>(B), keys = static_cast<double>(ctx + 1);
    const double kv_bytes = Bd * 2.0 * static_cast<double>(hymix::dtype_size(c.kv_dtype)) * keys * static_cast<double>(c.kv_rows());
    const double attn = Bd * 4.0 * static_cast<double>(c.n_heads * c.head_dim) * keys;
    st.counters["kv_GB/s"] = benchmark::Counter(kv_bytes * static_cast<double>(st.iterations()) * 1e-9, benchmark::Counter::kIsRate);
    hymix::bench::report(st, Bd, Bd * proj_flops(c) + attn, weight_bytes(c) + kv_bytes, be.num_threads());
}

// The decode kernel alone over B caches of `ctx` keys and values stored as KV (float or bf16).
template <class KV>
void attn_decode_kernel(benchmark::State& st, std::int64_t H, std::int64_t Hkv, std::int64_t dh, std::int64_t ctx, std::int64_t B) {
    hymix::cpu_backend be;
    const auto q = hymix::bench::random_vec(static_cast<std::size_t>(B * H * dh), 3);
    hymix::tensor<KV> kv({2 * B, Hkv, ctx, dh});  // 64-byte aligned, as the KV cache is
    std::uint32_t r = 999;
    for (auto& v : kv.span()) {
        r = r * 1664525u + 1013904223u;
        v = hymix::bench::stored_as<KV>(static_cast<float>(r >> 8) * (1.f / 16777216.f) - 0.5f);
    }
    std::vector<float> o(static_cast<std::size_t>(B * H * dh));
    std::vector<hymix::kernels::attention_problem<float, KV>> probs(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) {
        auto& p = probs[static_cast<std::size_t>(b)];
        p.q = hymix::tensor_view<const float, 3>(q.data() + b * H * dh, {1, H, dh});
        // The KV cache's layout: [H_kv, capacity, d_h] per sequence (mixer/kv_cache.hpp), viewed as [ctx, H_kv, d_h].
        p.k = hymix::tensor_view<const KV, 3>(kv.data() + 2 * b * ctx * Hkv * dh, {ctx, Hkv, dh}, {dh, ctx * dh, 1});
        p.v = hymix::tensor_view<const KV, 3>(kv.data() + (2 * b + 1) * ctx * Hkv * dh, {ctx, Hkv, dh}, {dh, ctx * dh, 1});
        p.o = hymix::tensor_view<float, 3>(o.data() + b * H * dh, {1, H, dh});
    }
    for (auto _ : st) {
        hymix::kernels::attention_decode(be, std::span<const hymix::kernels::attention_problem<float, KV>>(probs), {});
        benchmark::DoNotOptimize(o.data());
    }
    const double Bd = static_cast<double>(B);
    const double kv_bytes = Bd * 2.0 * static_cast<double>(sizeof(KV)) * static_cast<double>(ctx * Hkv * dh);
    hymix::bench::report(st, Bd, Bd * 4.0 * static_cast<double>(H * dh * ctx), kv_bytes, be.num_threads());
}

// Args: query heads H, KV heads H_kv, head_dim, context, batch B, KV element bytes (4: f32, 2: bf16). The decode
// kernel alone (kernels::attention_decode, no projections): the shape of llama.cpp's test-backend-ops flash-attention
// decode case (hd 128, 32 / 8 heads, kv 32768), which reads 268 MB of f32 KV per step (134 MB in bf16). The
// bandwidth fraction is against the read bandwidth measured at that working-set size (DRAM).
void BM_attn_decode_kernel(benchmark::State& st) {
    if (st.range(5) == 2)
        attn_decode_kernel<hymix::bf16>(st, st.range(0), st.range(1), st.range(2), st.range(3), st.range(4));
    else
        attn_decode_kernel<float>(st, st.range(0), st.range(1), st.range(2), st.range(3), st.range(4));
}

// Args: query heads H, KV heads H_kv, head_dim, queries Tq, keys Tk. The tiled prefill kernel alone
// (kernels::attention_prefill) for one sequence whose Tq queries are the last of its Tk keys: llama.cpp's
// test-backend-ops flash-attention prefill case (hd 128, 32 / 8 heads, q 512, kv 8192). FLOPs: QKᵀ and P·V over the
// visible keys, 4·d_h per (query, head, key).
void BM_attn_prefill_kernel(benchmark::State& st) {
    const std::int64_t H = st.range(0), Hkv = st.range(1), dh = st.range(2), Tq = st.range(3), Tk = st.range(4);
    hymix::cpu_backend be;
    hymix::tensor<float> q({Tq, H, dh}), k({Tk, Hkv, dh}), v({Tk, Hkv, dh}), o({Tq, H, dh});
    std::uint32_t r = 4242;
    for (auto* t : {&q, &k, &v})
        for (auto& x : t->span()) {
            r = r * 1664525u + 1013904223u;
            x = static_cast<float>(r >> 8) * (1.f / 16777216.f) - 0.5f;
        }
    hymix::kernels::attention_problem<float> p;
    p.q = q.view<3>();
    p.k = k.view<3>();
    p.v = v.view<3>();
    p.o = o.view<3>();
    for (auto _ : st) {
        hymix::kernels::attention_prefill(be, std::span<const hymix::kernels::attention_problem<float>>(&p, 1), {});
        benchmark::DoNotOptimize(o.data());
    }
    double visible = 0;  // Σ over queries of the keys each sees (bottom-right causal)
    for (std::int64_t i = 0; i < Tq; ++i) visible += static_cast<double>(Tk - Tq + i + 1);
    const double bytes = 4.0 * static_cast<double>(2 * Tq * H * dh + 2 * Tk * Hkv * dh);
    hymix::bench::report(st, static_cast<double>(Tq), 4.0 * static_cast<double>(H * dh) * visible, bytes, be.num_threads());
}

}  // namespace

BENCHMARK(BM_attn_prefill_kernel)
    ->ArgNames({"H", "H_kv", "d_h", "Tq", "Tk"})
    ->Args({32, 8, 128, 512, 8192})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attn_decode_kernel)
    ->ArgNames({"H", "H_kv", "d_h", "ctx", "B", "kv_bytes"})
    ->Args({32, 8, 128, 32768, 1, 4})->Args({32, 8, 128, 4096, 1, 4})->Args({32, 8, 128, 1024, 1, 4})->Args({12, 12, 64, 32768, 1, 4})
    ->Args({8, 2, 256, 32768, 1, 4})
    ->Args({32, 8, 128, 32768, 1, 2})->Args({32, 8, 128, 4096, 1, 2})->Args({12, 12, 64, 32768, 1, 2})->Args({8, 2, 256, 32768, 1, 2})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attn_prefill)
    ->ArgNames({"layer", "B", "T"})
    ->Args({0, 1, 512})->Args({0, 1, 2048})->Args({0, 8, 512})->Args({0, 8, 2048})
    ->Args({1, 1, 512})->Args({1, 1, 2048})->Args({1, 8, 512})->Args({1, 8, 2048})->Args({2, 1, 512})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attn_decode)
    ->ArgNames({"layer", "B", "ctx", "kv_bytes"})
    ->Args({0, 1, 4096, 4})->Args({0, 8, 4096, 4})
    ->Args({1, 1, 1024, 4})->Args({1, 1, 4096, 4})->Args({1, 1, 16384, 4})->Args({1, 1, 32768, 4})->Args({1, 1, 65536, 4})
    ->Args({1, 8, 4096, 4})
    ->Args({1, 1, 4096, 2})->Args({1, 1, 32768, 2})->Args({1, 1, 65536, 2})->Args({1, 8, 4096, 2})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();
