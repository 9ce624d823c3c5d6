// Gated delta rule core, chunked forward vs chunked backward (spec.md §4.3; issue 8 target: backward ≤ 2.5× forward),
// 16 heads × 128 (H_k = H_v = 16, d_k = d_v = 128), one sequence of T = 512 tokens, chunk 64, non-zero initial state.
// BM_gdn_core_ratio times one forward and one backward per iteration, back to back, and reports bwd_over_fwd.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/kernels/gated_delta_backward.hpp"
#include "peak.hpp"

namespace {

constexpr std::int64_t H = 16, Dk = 128, Dv = 128, C = 64;

struct core_problem {
    std::int64_t T;
    std::vector<float> q, k, v, g, beta, s0, state, o, d_o, dq, dk, dv, dg, dbeta, ds0;
    explicit core_problem(std::int64_t T_) : T(T_) {
        q = hymix::bench::random_vec(static_cast<std::size_t>(T * H * Dk), 1);
        k = hymix::bench::random_vec(q.size(), 2);
        for (auto* x : {&q, &k})  // L2-normalised rows, as the layer feeds them
            for (std::size_t r = 0; r < x->size(); r += static_cast<std::size_t>(Dk)) {
                float ss = 0.f;
                for (std::int64_t a = 0; a < Dk; ++a) ss += (*x)[r + a] * (*x)[r + a];
                for (std::int64_t a = 0; a < Dk; ++a) (*x)[r + a] /= std::sqrt(ss);
            }
        v = hymix::bench::random_vec(static_cast<std::size_t>(T * H * Dv), 3);
        g = hymix::bench::random_vec(static_cast<std::size_t>(T * H), 4);
        beta = hymix::bench::random_vec(g.size(), 5);
        for (auto& x : g) x = -0.05f * (1.5f + x);
        for (auto& x : beta) x = 0.5f + 0.5f * x;
        s0 = hymix::bench::random_vec(static_cast<std::size_t>(H * Dk * Dv), 6);
        for (auto& x : s0) x *= 0.1f;
        d_o = hymix::bench::random_vec(v.size(), 7);
        state = s0;
        o.resize(v.size());
        dq.resize(q.size());
        dk.resize(k.size());
        dv.resize(v.size());
        dg.resize(g.size());
        dbeta.resize(g.size());
        ds0.resize(s0.size());
    }
    hymix::tensor_view<const float, 3> qv() const { return {q.data(), {T, H, Dk}}; }
    hymix::tensor_view<const float, 3> kv() const { return {k.data(), {T, H, Dk}}; }
    hymix::tensor_view<const float, 3> vv() const { return {v.data(), {T, H, Dv}}; }
    hymix::tensor_view<const float, 2> gv() const { return {g.data(), {T, H}}; }
    hymix::tensor_view<const float, 2> bv() const { return {beta.data(), {T, H}}; }
    float scale() const { return 1.f / std::sqrt(static_cast<float>(Dk)); }

    template <class B>
    void forward(const B& be) {
        std::copy(s0.begin(), s0.end(), state.begin());
        hymix::kernels::gated_delta_rule_chunked(be, hymix::seq_batch::dense(1, T), qv(), kv(), vv(), gv(), bv(), scale(),
                                                 hymix::tensor_view<float, 4>(state.data(), {1, H, Dk, Dv}),
                                                 hymix::tensor_view<float, 3>(o.data(), {T, H, Dv}), C);
    }
    template <class B>
    void backward(const B& be) {
        hymix::kernels::gated_delta_rule_chunked_backward(
            be, hymix::seq_batch::dense(1, T), qv(), kv(), vv(), gv(), bv(), scale(),
            hymix::tensor_view<const float, 4>(s0.data(), {1, H, Dk, Dv}), hymix::tensor_view<const float, 3>(d_o.data(), {T, H, Dv}),
            hymix::tensor_view<float, 3>(dq.data(), {T, H, Dk}), hymix::tensor_view<float, 3>(dk.data(), {T, H, Dk}),
            hymix::tensor_view<float, 3>(dv.data(), {T, H, Dv}), hymix::tensor_view<float, 2>(dg.data(), {T, H}),
            hymix::tensor_view<float, 2>(dbeta.data(), {T, H}), hymix::tensor_view<float, 4>(ds0.data(), {1, H, Dk, Dv}), C);
    }
};

/// FLOPs per token and head of the chunked forward (as bench_gated_deltanet counts them): the three C·d_k·d_v-class
/// products plus K Kᵀ, Q Kᵀ, the triangular solve and P·V_new.
double forward_flops() {
    const double dk = Dk, dv = Dv, c = C;
    return 6.0 * dk * dv + c * (4.0 * dk + 3.0 * dv);
}
/// FLOPs per token and head of the chunked backward: forward sweep (R = V − (K ⊙ e^γ)S, K Kᵀ, the solve, the state
/// update: 4 d_k d_v + C(d_k + d_v)) and backward sweep (dU, U dS'ᵀ, [dO; dR] Sᵀ, dS: 12 d_k d_v; Q Kᵀ, dO Uᵀ, Pᵀ dO, the
/// transposed solve, dR Uᵀ, Dp K, Dpᵀ Q, (M + Mᵀ) K: C(5 d_k + 4 d_v)); triangular C × C products count half.
double backward_flops() {
    const double dk = Dk, dv = Dv, c = C;
    return 16.0 * dk * dv + c * (6.0 * dk + 5.0 * dv);
}

// Args: T, threads.
void BM_gdn_core_forward(benchmark::State& st) {
    core_problem p(st.range(0));
    hymix::cpu_backend be(static_cast<int>(st.range(1)));
    p.forward(be);
    for (auto _ : st) {
        p.forward(be);
        benchmark::DoNotOptimize(p.o.data());
    }
    const double tokens = static_cast<double>(p.T);
    hymix::bench::report(st, tokens, tokens * H * forward_flops(), 4.0 * static_cast<double>(p.q.size() + p.k.size() + 2 * p.v.size()),
                         be.num_threads());
}

void BM_gdn_core_backward(benchmark::State& st) {
    core_problem p(st.range(0));
    hymix::cpu_backend be(static_cast<int>(st.range(1)));
    p.backward(be);
    for (auto _ : st) {
        p.backward(be);
        benchmark::DoNotOptimize(p.dq.data());
    }
    const double tokens = static_cast<double>(p.T);
    hymix::bench::report(st, tokens, tokens * H * backward_flops(),
                         4.0 * static_cast<double>(2 * (p.q.size() + p.k.size() + 2 * p.v.size())), be.num_threads());
}

/// Seconds of CPU time used by the calling thread (with one thread every op runs on it).
double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// One forward and one backward per iteration, timed separately: bwd_over_fwd = Σ backward time / Σ forward time
/// (interleaving keeps both under the same load on a shared machine). With one thread also the ratio of the thread's
/// CPU times, bwd_over_fwd_cpu, which other processes on the machine disturb less.
void BM_gdn_core_ratio(benchmark::State& st) {
    core_problem p(st.range(0));
    hymix::cpu_backend be(static_cast<int>(st.range(1)));
    p.forward(be);
    p.backward(be);
    double tf = 0, tb = 0, cf = 0, cb = 0;
    using clock = std::chrono::steady_clock;
    for (auto _ : st) {
        const auto t0 = clock::now();
        const double c0 = thread_cpu_seconds();
        p.forward(be);
        const auto t1 = clock::now();
        const double c1 = thread_cpu_seconds();
        p.backward(be);
        const auto t2 = clock::now();
        const double c2 = thread_cpu_seconds();
        tf += std::chrono::duration<double>(t1 - t0).count();
        tb += std::chrono::duration<double>(t2 - t1).count();
        cf += c1 - c0;
        cb += c2 - c1;
        benchmark::DoNotOptimize(p.dq.data());
    }
    if (be.num_threads() == 1) st.counters["bwd_over_fwd_cpu"] = cb / cf;
    st.counters["fwd_ms"] = 1e3 * tf / static_cast<double>(st.iterations());
    st.counters["bwd_ms"] = 1e3 * tb / static_cast<double>(st.iterations());
    st.counters["bwd_over_fwd"] = tb / tf;
}

}  // namespace

BENCHMARK(BM_gdn_core_forward)->ArgNames({"T", "threads"})->ArgsProduct({{512}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gdn_core_backward)->ArgNames({"T", "threads"})->ArgsProduct({{512}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_gdn_core_ratio)->ArgNames({"T", "threads"})->ArgsProduct({{512}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
