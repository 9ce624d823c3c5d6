// Causal attention kernel, forward vs backward (spec.md §2; issue 8 speed target: backward ≤ 2.5× forward): the tiled
// prefill (kernels::attention_prefill, with LSE) and the flash-style backward (kernels::attention_prefill_backward) on
// one sequence of T tokens (queries = keys), 32 query / 8 KV heads of d_h 128. FLOPs count multiply-adds as 2 over the
// visible (causal) half: forward QKᵀ and PV, backward QKᵀ, dO·Vᵀ, PᵀdO, dSᵀQ and dS·K (2.5× the forward's).
// The CPU column is the process's CPU time over all threads: on a loaded shared machine, backward / forward on it (and
// GFLOP/s per CPU-second against bench_peak's process-time FMA peak) is steadier than wall-clock time.
// Also the whole attention layer's training step (mixer forward_train, backward) for the shared checkpoints' layer.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/attention_backward.hpp"
#include "hymix/mixer/attention.hpp"
#include "peak.hpp"

namespace {

struct attn_data {
    std::int64_t T, H, Hkv, dh;
    std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
    attn_data(std::int64_t T_, std::int64_t H_, std::int64_t Hkv_, std::int64_t dh_) : T(T_), H(H_), Hkv(Hkv_), dh(dh_) {
        const auto nq = static_cast<std::size_t>(T * H * dh), nk = static_cast<std::size_t>(T * Hkv * dh);
        q = hymix::bench::random_vec(nq, 1);
        k = hymix::bench::random_vec(nk, 2);
        v = hymix::bench::random_vec(nk, 3);
        dout = hymix::bench::random_vec(nq, 4);
        o.assign(nq, 0.f);
        dq.assign(nq, 0.f);
        lse.assign(static_cast<std::size_t>(T * H), 0.f);
        dk.assign(nk, 0.f);
        dv.assign(nk, 0.f);
    }
    hymix::kernels::attention_problem<float> fwd() {
        return {hymix::tensor_view<const float, 3>(q.data(), {T, H, dh}), hymix::tensor_view<const float, 3>(k.data(), {T, Hkv, dh}),
                hymix::tensor_view<const float, 3>(v.data(), {T, Hkv, dh}), hymix::tensor_view<float, 3>(o.data(), {T, H, dh}),
                hymix::tensor_view<float, 2>(lse.data(), {T, H})};
    }
    hymix::kernels::attention_backward_problem<float> bwd() {
        hymix::kernels::attention_backward_problem<float> p;
        p.q = hymix::tensor_view<const float, 3>(q.data(), {T, H, dh});
        p.k = hymix::tensor_view<const float, 3>(k.data(), {T, Hkv, dh});
        p.v = hymix::tensor_view<const float, 3>(v.data(), {T, Hkv, dh});
        p.o = hymix::tensor_view<const float, 3>(o.data(), {T, H, dh});
        p.lse = hymix::tensor_view<const float, 2>(lse.data(), {T, H});
        p.dout = hymix::tensor_view<const float, 3>(dout.data(), {T, H, dh});
        p.dq = hymix::tensor_view<float, 3>(dq.data(), {T, H, dh});
        p.dk = hymix::tensor_view<float, 3>(dk.data(), {T, Hkv, dh});
        p.dv = hymix::tensor_view<float, 3>(dv.data(), {T, Hkv, dh});
        return p;
    }
    /// Multiply-adds of one causal QKᵀ-sized product, times 2.
    double product_flops() const {
        return 2.0 * static_cast<double>(H * dh) * static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
    }
};

// Args: threads, T, H, H_kv, d_h.
void BM_attn_forward(benchmark::State& st) {
    const hymix::cpu_backend be(static_cast<int>(st.range(0)));
    attn_data d(st.range(1), st.range(2), st.range(3), st.range(4));
    const auto p = d.fwd();
    for (auto _ : st) {
        hymix::kernels::attention_prefill(be, std::span<const hymix::kernels::attention_problem<float>>(&p, 1), {});
        benchmark::DoNotOptimize(d.o.data());
    }
    hymix::bench::report(st, static_cast<double>(d.T), 2 * d.product_flops(), 4.0 * static_cast<double>(d.q.size() * 2 + d.k.size() * 2),
                         be.num_threads());
}

void BM_attn_backward(benchmark::State& st) {
    const hymix::cpu_backend be(static_cast<int>(st.range(0)));
    attn_data d(st.range(1), st.range(2), st.range(3), st.range(4));
    const auto pf = d.fwd();
    hymix::kernels::attention_prefill(be, std::span<const hymix::kernels::attention_problem<float>>(&pf, 1), {});
    const auto p = d.bwd();
    for (auto _ : st) {
        hymix::kernels::attention_prefill_backward(be, std::span<const hymix::kernels::attention_backward_problem<float>>(&p, 1), {});
        benchmark::DoNotOptimize(d.dq.data());
    }
    hymix::bench::report(st, static_cast<double>(d.T), 5 * d.product_flops(), 4.0 * static_cast<double>(d.q.size() * 5 + d.k.size() * 4),
                         be.num_threads());
}

/// The shared checkpoints' attention layer: d 256, 4 / 2 heads × 64, output gate, zero-centred qk-norm, RoPE 0.25.
hymix::attention_config layer_config() {
    hymix::attention_config c;
    c.d_model = 256;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.output_gate = true;
    c.qk_norm.mode = hymix::qk_norm_mode::zero_centered;
    c.rope = {hymix::rope_mode::rotate_half, 1e7, 0.25};
    return c;
}

/// FLOPs of the layer's forward for B sequences of T tokens: projections (q with gate, k, v, o) and causal attention.
double layer_forward_flops(const hymix::attention_config& c, std::int64_t B, std::int64_t T) {
    const double tokens = static_cast<double>(B * T), Td = static_cast<double>(T);
    const double proj = 2.0 * static_cast<double>(c.d_model) * static_cast<double>(c.q_rows() + 2 * c.kv_rows() + c.n_heads * c.head_dim);
    return tokens * proj + static_cast<double>(B * c.n_heads) * 4.0 * static_cast<double>(c.head_dim) * Td * (Td + 1) / 2;
}

// Args: threads, B sequences, T tokens each (packed). forward_train, or backward (projections 2× their forward FLOPs,
// attention 2.5×).
void BM_layer_train(benchmark::State& st, bool backward) {
    const hymix::cpu_backend be(static_cast<int>(st.range(0)));
    const std::int64_t B = st.range(1), T = st.range(2);
    const auto c = layer_config();
    const hymix::attention m(c, hymix::attention_weights::random(c, 1));
    const auto batch = hymix::seq_batch::dense(B, T);
    const std::int64_t N = B * T, d = c.d_model;
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(N * d), 2);
    const auto dy = hymix::bench::random_vec(static_cast<std::size_t>(N * d), 3);
    std::vector<float> y(x.size()), dx(x.size());
    const hymix::tensor_view<const float, 2> xv(x.data(), {N, d}), dyv(dy.data(), {N, d});
    hymix::attention::train_cache tc;
    auto g = m.weights().zeros_like();
    m.forward_train(be, batch, xv, hymix::tensor_view<float, 2>(y.data(), {N, d}), tc);
    for (auto _ : st) {
        if (backward)
            m.backward(be, batch, tc, xv, dyv, hymix::tensor_view<float, 2>(dx.data(), {N, d}), g);
        else
            m.forward_train(be, batch, xv, hymix::tensor_view<float, 2>(y.data(), {N, d}), tc);
        benchmark::DoNotOptimize(dx.data());
        benchmark::DoNotOptimize(y.data());
    }
    const double Td = static_cast<double>(T), attn = static_cast<double>(B * c.n_heads) * 4.0 * static_cast<double>(c.head_dim) * Td * (Td + 1) / 2;
    const double fwd = layer_forward_flops(c, B, T);
    const double flops = backward ? 2.0 * (fwd - attn) + 2.5 * attn : fwd;
    hymix::bench::report(st, static_cast<double>(N), flops, 4.0 * static_cast<double>(x.size()) * 3, be.num_threads());
}
void BM_layer_forward_train(benchmark::State& st) { BM_layer_train(st, false); }
void BM_layer_backward(benchmark::State& st) { BM_layer_train(st, true); }

}  // namespace

BENCHMARK(BM_layer_forward_train)
    ->ArgNames({"threads", "B", "T"})
    ->Args({1, 4, 512})->Args({2, 4, 512})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_layer_backward)
    ->ArgNames({"threads", "B", "T"})
    ->Args({1, 4, 512})->Args({2, 4, 512})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_attn_forward)
    ->ArgNames({"threads", "T", "H", "Hkv", "dh"})
    ->Args({1, 1024, 32, 8, 128})->Args({2, 1024, 32, 8, 128})->Args({2, 1024, 4, 2, 64})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_attn_backward)
    ->ArgNames({"threads", "T", "H", "Hkv", "dh"})
    ->Args({1, 1024, 32, 8, 128})->Args({2, 1024, 32, 8, 128})->Args({2, 1024, 4, 2, 64})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
