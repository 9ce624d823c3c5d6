// kernels::linear (y[M, N] = x[M, K] · W[N, K]ᵀ; W in f32, bf16, f16 or i8 with per-row scales) against one plain
// Eigen product, for decode (M = 1, 8) and prefill (M = 512, 2048) at N = K = 768, 2048 and 4096 (M ≤ 512), on 1 and
// 2 threads (HYMIX_BENCH_THREADS="1,2,4,8,16" sets others). Weights rotate through a 1 GiB pool (512 MiB for 16-bit
// weights, 256 MiB for 8-bit ones) so
// every call reads them from DRAM, as in a model whose layers do not fit in cache. Report: GFLOP/s and the
// fraction of the FMA peak; for M ≤ 8, GB/s of weights and the fraction of the DRAM read peak (bench/peak.hpp,
// measured in the same run).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/linear.hpp"
#include "peak.hpp"

#ifdef HYMIX_BENCH_EIGEN_OPENMP
#include <omp.h>
#endif

namespace {

/// 1 GiB of weights (finite, non-denormal values); weight matrices are taken from it in turn.
const hymix::tensor<float>& weight_pool() {
    static const hymix::tensor<float> pool = [] {
        hymix::tensor<float> t{std::int64_t{1} << 28};
        std::uint32_t s = 12345;
        for (std::int64_t i = 0; i < t.numel(); ++i) {
            s = s * 1664525u + 1013904223u;
            t[i] = static_cast<float>(s >> 8) * (1.f / 16777216.f) - 0.5f;
        }
        return t;
    }();
    return pool;
}

/// The pool's first half (512 MiB of bf16 or f16: 2^28 weights) rounded to a 16-bit type.
template <class T>
const hymix::tensor<T>& weight_pool16() {
    static const hymix::tensor<T> pool = [] {
        hymix::tensor<T> t{weight_pool().numel()};
        for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = T::from_float(weight_pool()[i]);
        return t;
    }();
    return pool;
}

/// The pool's values as 8-bit integers (a quarter of its bytes): q = round(254 · w) for w in [−0.5, 0.5) (scale 1/254
/// for every row).
const hymix::tensor<std::int8_t>& weight_pool8() {
    static const hymix::tensor<std::int8_t> pool = [] {
        hymix::tensor<std::int8_t> t{weight_pool().numel()};
        for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int8_t>(std::lround(std::clamp(254.f * weight_pool()[i], -127.f, 127.f)));
        return t;
    }();
    return pool;
}

template <class T>
const hymix::tensor<T>& pool_of() {
    if constexpr (std::is_same_v<T, float>)
        return weight_pool();
    else if constexpr (std::is_same_v<T, std::int8_t>)
        return weight_pool8();
    else
        return weight_pool16<T>();
}

/// Cycles through disjoint [N, K] weight matrices of the pool of element type T (64-byte aligned starts).
template <class T = float>
struct weight_rotation {
    std::int64_t N, K, stride, count, next = 0;
    weight_rotation(std::int64_t n, std::int64_t k)
        : N(n), K(k), stride((n * k + 31) / 32 * 32), count(pool_of<T>().numel() / stride) {}
    hymix::tensor_view<const T, 2> take() {  // [N, K]
        const T* p = pool_of<T>().data() + (next++ % count) * stride;
        return hymix::tensor_view<const T, 2>(p, {N, K});
    }
};

template <class T = float>
struct problem {
    std::int64_t M, N, K;
    int threads;
    hymix::tensor<float> x, bias, y, scale;  // [M, K], [N], [M, N], [N] (8-bit weights' row scales)
    weight_rotation<T> weights;
    // Args: M, NK, threads (square weights), or with `rect` M, N, K, threads.
    explicit problem(const benchmark::State& st, bool rect = false)
        : M(st.range(0)), N(st.range(1)), K(st.range(rect ? 2 : 1)), threads(static_cast<int>(st.range(rect ? 3 : 2))), x{M, K},
          bias{N}, y{M, N}, scale{N}, weights(N, K) {
        for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<float>(i % 17) * 0.01f - 0.08f;
        for (std::int64_t i = 0; i < N; ++i) bias[i] = static_cast<float>(i % 5) * 0.1f;
        scale.fill(1.f / 254.f);
    }
    void report(benchmark::State& st, const std::string& impl) const {
        const double flops = 2.0 * static_cast<double>(M * N * K);
        const double weight_bytes = static_cast<double>(sizeof(T)) * static_cast<double>(N * K) + (sizeof(T) == 1 ? 4.0 * static_cast<double>(N) : 0.0);
        const double bytes = weight_bytes + 4.0 * static_cast<double>(M * K + M * N);
        hymix::bench::report(st, static_cast<double>(M), flops, M <= 8 ? weight_bytes : bytes, threads,
                             static_cast<double>(sizeof(T)) * static_cast<double>(pool_of<T>().numel()));
        st.SetLabel(impl + (M <= 8 ? ": bound by weight bytes (see GB/s, bw_peak_frac)"
                                   : ": bound by FMAs (see GFLOP/s, flop_peak_frac)"));
    }
};

void set_eigen_threads([[maybe_unused]] int n) {
#ifdef HYMIX_BENCH_EIGEN_OPENMP
    Eigen::setNbThreads(n);
#endif
}

template <class T, bool Rect = false>
void BM_linear_hymix(benchmark::State& st) {
    problem<T> p(st, Rect);
    set_eigen_threads(1);  // hymix threads with the backend; Eigen runs inside its tasks, single-threaded
    const hymix::cpu_backend be(p.threads);
    for (auto _ : st) {
        if constexpr (std::is_same_v<T, std::int8_t>)
            hymix::kernels::linear(be, p.x.template view<2>(), hymix::q8_view{p.weights.take(), p.scale.data()}, p.bias.data(),
                                   p.y.template view<2>());
        else
            hymix::kernels::linear(be, p.x.template view<2>(), p.weights.take(), p.bias.data(), p.y.template view<2>());
        benchmark::DoNotOptimize(p.y.data());
        benchmark::ClobberMemory();
    }
    p.report(st, std::is_same_v<T, float>        ? "hymix f32 weights"
                 : std::is_same_v<T, hymix::bf16> ? "hymix bf16 weights"
                 : std::is_same_v<T, hymix::f16>  ? "hymix f16 weights"
                                                  : "hymix i8 weights (per-row scales)");
}

void BM_linear_eigen(benchmark::State& st) {
    problem<> p(st);
#ifndef HYMIX_BENCH_EIGEN_OPENMP
    if (p.threads > 1) {
        st.SkipWithError("Eigen is single-threaded without OpenMP");
        return;
    }
#endif
    set_eigen_threads(p.threads);
    const auto X = p.x.view<2>().matrix();
    const auto b = Eigen::Map<const Eigen::RowVectorXf>(p.bias.data(), p.N);
    auto Y = p.y.view<2>().matrix();
    for (auto _ : st) {
        const auto W = p.weights.take().matrix();
        Y.noalias() = X * W.transpose();
        Y.rowwise() += b;
        benchmark::DoNotOptimize(p.y.data());
        benchmark::ClobberMemory();
    }
    set_eigen_threads(1);
    p.report(st, "Eigen");
}

void shapes(benchmark::internal::Benchmark* b) {
    b->ArgNames({"M", "NK", "threads"});
    for (std::int64_t nk : {768, 2048, 4096})
        for (std::int64_t m : {1, 8, 512, 2048})
            for (std::int64_t t : hymix::bench::thread_counts())
                if (nk < 4096 || m <= 512) b->Args({m, nk, t});
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

/// The prefill projections of the real-size configs in bench/configs (M = 512 tokens, weight [N, K]): Qwen3.5 0.8B's
/// fused MLP gate|up (7168 × 1024) and down (1024 × 3584), gated-DeltaNet in_proj_qkv (6144 × 1024), in_proj_z
/// (2048 × 1024) and out_proj (1024 × 2048); Mamba-2 780M's in_proj (6448 × 1536) and out_proj (1536 × 3072).
void model_shapes(benchmark::internal::Benchmark* b) {
    b->ArgNames({"M", "N", "K", "threads"});
    for (const auto& [n, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{{7168, 1024}, {1024, 3584}, {6144, 1024}, {2048, 1024}, {1024, 2048}, {6448, 1536}, {1536, 3072}})
        for (std::int64_t t : hymix::bench::thread_counts()) b->Args({512, n, k, t});
    b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_linear_hymix<float, true>)->Name("BM_linear_hymix_model_shapes")->Apply(model_shapes);
BENCHMARK(BM_linear_hymix<float>)->Name("BM_linear_hymix")->Apply(shapes);
BENCHMARK(BM_linear_hymix<hymix::bf16>)->Name("BM_linear_hymix_bf16")->Apply(shapes);
BENCHMARK(BM_linear_hymix<hymix::f16>)->Name("BM_linear_hymix_f16")->Apply(shapes);
BENCHMARK(BM_linear_hymix<std::int8_t>)->Name("BM_linear_hymix_i8")->Apply(shapes);
BENCHMARK(BM_linear_eigen)->Apply(shapes);
