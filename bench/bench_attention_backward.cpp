// Causal attention kernel, forward vs backward (spec.md §2; issue 8 speed target: backward ≤ 2.5× forward): the tiled
// prefill (kernels::attention_prefill, with LSE) and the flash-style backward (kernels::attention_prefill_backward) on
// one sequence of T tokens (queries = keys), 32 query / 8 KV heads of d_h 128. FLOPs count multiply-adds as 2 over the
// visible (causal) half: forward QKᵀ and PV, backward QKᵀ, dO·Vᵀ, PᵀdO, dSᵀQ and dS·K (2.5× the forward's).
// The CPU column is the process's CPU time over all threads: on a loaded shared machine, backward / forward on it (and
// GFLOP/s per CPU-second against bench_peak's process-time FMA peak) is steadier than wall-clock time.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/attention_backward.hpp"
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

}  // namespace

BENCHMARK(BM_attn_forward)
    ->ArgNames({"threads", "T", "H", "Hkv", "dh"})
    ->Args({1, 1024, 32, 8, 128})->Args({2, 1024, 32, 8, 128})->Args({2, 1024, 4, 2, 64})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_attn_backward)
    ->ArgNames({"threads", "T", "H", "Hkv", "dh"})
    ->Args({1, 1024, 32, 8, 128})->Args({2, 1024, 32, 8, 128})->Args({2, 1024, 4, 2, 64})
    ->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
