// This machine's measured ceilings (../shared/docs/machine.md, re-measured by bench_peak) and helpers that turn
// a benchmark's counted FLOPs / bytes into GFLOP/s, GB/s and the fraction of peak, so every result is stated
// against what the hardware can do. Also the seeded random inputs the benchmarks share.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace hymix::bench {

/// fp32 FMA peak in GFLOP/s (AVX-512, register-resident FMAs) for 1 and 2 threads.
inline constexpr double peak_gflops_1t = 176.0;
inline constexpr double peak_gflops_2t = 274.0;
/// DRAM read bandwidth in GB/s for 1 and 2 threads; L3-resident working sets reach about 54 GB/s.
inline constexpr double peak_dram_gbs_1t = 16.0;
inline constexpr double peak_dram_gbs_2t = 31.0;

inline double peak_gflops(int threads) { return threads <= 1 ? peak_gflops_1t : peak_gflops_2t; }
inline double peak_gbs(int threads) { return threads <= 1 ? peak_dram_gbs_1t : peak_dram_gbs_2t; }

/// Sets tokens/s, GFLOP/s, GB/s and the fractions of the FMA and DRAM peaks. `flops` and `bytes` are per
/// iteration; `tokens` is tokens processed per iteration.
inline void report(benchmark::State& st, double tokens, double flops, double bytes, int threads) {
    const double iters = static_cast<double>(st.iterations());
    st.counters["tokens/s"] = benchmark::Counter(tokens * iters, benchmark::Counter::kIsRate);
    st.counters["GFLOP/s"] = benchmark::Counter(flops * iters * 1e-9, benchmark::Counter::kIsRate);
    st.counters["GB/s"] = benchmark::Counter(bytes * iters * 1e-9, benchmark::Counter::kIsRate);
    // Fractions are rates divided by the peak: a rate counter scaled by 1/peak.
    st.counters["flop_peak_frac"] = benchmark::Counter(flops * iters * 1e-9 / peak_gflops(threads), benchmark::Counter::kIsRate);
    st.counters["bw_peak_frac"] = benchmark::Counter(bytes * iters * 1e-9 / peak_gbs(threads), benchmark::Counter::kIsRate);
}

/// n values uniform in [-1, 1) from a fixed seed: benchmark inputs.
inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

}  // namespace hymix::bench
