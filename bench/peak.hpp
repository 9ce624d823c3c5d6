// This machine's ceilings, measured in the same process as the benchmark that is stated against them (the machine
// kind varies between sessions, ../shared/docs/machine.md: nothing here is a constant), and helpers that turn a
// benchmark's counted FLOPs / bytes into GFLOP/s, GB/s and fractions of those ceilings. Also the seeded random
// inputs the benchmarks share.
//
// Ceilings, measured once per process and thread count (about 0.1 s each), best of several repetitions:
//   - fp32 FMA: independent register-resident xsimd FMA chains on every thread of a cpu_backend;
//   - read bandwidth at a working-set size: summing a buffer of that size (rounded up to a power of two, 256 KiB to
//     1 GiB) again and again, split over the threads with a fixed part per thread, so a state that lives in L2 is compared with L2's bandwidth and
//     weights streamed from DRAM with DRAM's.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::bench {

namespace detail {

using peak_batch = xsimd::batch<float, cpu_backend::arch>;

/// Independent FMA chains: latency 4 × 2 FMA ports needs at least 8; more hides issue jitter.
inline constexpr std::size_t fma_chains = 16;

/// `rounds` rounds of fma_chains independent batch FMAs; returns a value that depends on all of them.
inline float fma_kernel(float seed, std::int64_t rounds) {
    std::array<peak_batch, fma_chains> acc;
    for (std::size_t i = 0; i < fma_chains; ++i) acc[i] = peak_batch(seed + static_cast<float>(i));
    // acc = acc * a + b with |a| < 1 converges to a fixed point: no overflow, no denormals.
    const peak_batch a(0.999f), b(0.001f);
    for (std::int64_t it = 0; it < rounds; ++it) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((acc[I] = xsimd::fma(acc[I], a, b)), ...);
        }(std::make_index_sequence<fma_chains>{});
    }
    peak_batch s = acc[0];
    for (std::size_t i = 1; i < fma_chains; ++i) s += acc[i];
    return xsimd::hadd(s);
}

/// FLOPs of one fma_kernel call.
inline double fma_kernel_flops(std::int64_t rounds) {
    return 2.0 * static_cast<double>(peak_batch::size * fma_chains) * static_cast<double>(rounds);
}

/// Sum of p[0, n) with 8 independent vector accumulators (n a multiple of 8 batches, p aligned).
inline float sum_kernel(const float* p, std::int64_t n) {
    constexpr std::int64_t W = static_cast<std::int64_t>(peak_batch::size);
    std::array<peak_batch, 8> acc;
    acc.fill(peak_batch(0.f));
    for (std::int64_t i = 0; i < n; i += 8 * W) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((acc[I] += peak_batch::load_aligned(p + i + static_cast<std::int64_t>(I) * W)), ...);
        }(std::make_index_sequence<8>{});
    }
    peak_batch s = acc[0];
    for (std::size_t i = 1; i < 8; ++i) s += acc[i];
    return xsimd::hadd(s);
}

/// Reads the n floats (a multiple of 64 KiB) once, over the backend's threads with a fixed range-to-thread map
/// (parallel_for_static: each thread re-reads the same part, as a decode step re-reads the state it updated).
inline void read_once(const cpu_backend& be, const float* data, std::int64_t n, std::vector<float>& partial) {
    const std::int64_t piece = 16 * 1024;  // floats (64 KiB)
    be.parallel_for_static(n / piece, [&](std::int64_t c0, std::int64_t c1) {
        for (auto c = c0; c < c1; ++c) partial[static_cast<std::size_t>(c)] = sum_kernel(data + c * piece, piece);
    });
}

template <class F>
double best_seconds(F&& f, int repetitions, double min_seconds) {
    using clock = std::chrono::steady_clock;
    double best = 1e30;
    for (int r = 0; r < repetitions; ++r) {
        std::int64_t calls = 0;
        const auto t0 = clock::now();
        double el = 0;
        do {
            f();
            ++calls;
            el = std::chrono::duration<double>(clock::now() - t0).count();
        } while (el < min_seconds);
        best = std::min(best, el / static_cast<double>(calls));
    }
    return best;
}

inline std::mutex& peak_mutex() {
    static std::mutex m;
    return m;
}

}  // namespace detail

/// Measured fp32 FMA peak in GFLOP/s on `threads` threads (cached per thread count).
inline double peak_gflops(int threads) {
    static std::map<int, double> cache;
    const std::lock_guard lock(detail::peak_mutex());
    if (auto it = cache.find(threads); it != cache.end()) return it->second;
    const cpu_backend be(threads);
    constexpr std::int64_t rounds = 1 << 13;
    const std::int64_t tasks = 4 * static_cast<std::int64_t>(be.num_threads());
    std::vector<float> out(static_cast<std::size_t>(tasks));
    const double s = detail::best_seconds(
        [&] {
            be.parallel_for(tasks, 1, [&](std::int64_t t0, std::int64_t t1) {
                for (auto t = t0; t < t1; ++t) out[static_cast<std::size_t>(t)] = detail::fma_kernel(static_cast<float>(t), rounds);
            });
            benchmark::DoNotOptimize(out.data());
        },
        5, 0.02);
    return cache[threads] = detail::fma_kernel_flops(rounds) * static_cast<double>(tasks) / s * 1e-9;
}

/// Measured read bandwidth in GB/s on `threads` threads for a working set of `working_set_bytes` (rounded up to a
/// power of two between 256 KiB and 1 GiB; cached per size and thread count).
inline double peak_gbs(int threads, double working_set_bytes) {
    std::int64_t bytes = std::int64_t{256} << 10;
    while (bytes < static_cast<std::int64_t>(working_set_bytes) && bytes < (std::int64_t{1} << 30)) bytes *= 2;
    static std::map<std::pair<int, std::int64_t>, double> cache;
    const std::lock_guard lock(detail::peak_mutex());
    if (auto it = cache.find({threads, bytes}); it != cache.end()) return it->second;
    const cpu_backend be(threads);
    const std::int64_t n = bytes / static_cast<std::int64_t>(sizeof(float));
    tensor<float> data{n};
    data.fill(1.f);
    std::vector<float> partial(static_cast<std::size_t>(n / (16 * 1024)));
    const double s = detail::best_seconds(
        [&] {
            detail::read_once(be, data.data(), n, partial);
            benchmark::DoNotOptimize(partial.data());
            benchmark::ClobberMemory();
        },
        5, bytes >= (std::int64_t{64} << 20) ? 0.1 : 0.02);
    return cache[{threads, bytes}] = static_cast<double>(bytes) / s * 1e-9;
}

/// Sets tokens/s, GFLOP/s, GB/s, the measured peaks and the fractions of them. `flops` and `bytes` are per
/// iteration, `tokens` the tokens processed per iteration; the bandwidth ceiling is the one measured for a working
/// set of `working_set_bytes` (default: `bytes`, i.e. the data the iteration touches stays where it is between
/// iterations; pass the whole rotation when inputs rotate through a larger pool).
inline void report(benchmark::State& st, double tokens, double flops, double bytes, int threads,
                   double working_set_bytes = -1) {
    const double iters = static_cast<double>(st.iterations());
    const double gflops_peak = peak_gflops(threads), gbs_peak = peak_gbs(threads, working_set_bytes < 0 ? bytes : working_set_bytes);
    st.counters["tokens/s"] = benchmark::Counter(tokens * iters, benchmark::Counter::kIsRate);
    st.counters["GFLOP/s"] = benchmark::Counter(flops * iters * 1e-9, benchmark::Counter::kIsRate);
    st.counters["GB/s"] = benchmark::Counter(bytes * iters * 1e-9, benchmark::Counter::kIsRate);
    // Fractions are rates divided by the peak: a rate counter scaled by 1/peak.
    st.counters["flop_peak_frac"] = benchmark::Counter(flops * iters * 1e-9 / gflops_peak, benchmark::Counter::kIsRate);
    st.counters["bw_peak_frac"] = benchmark::Counter(bytes * iters * 1e-9 / gbs_peak, benchmark::Counter::kIsRate);
    st.counters["peak_GFLOP/s"] = gflops_peak;
    st.counters["peak_GB/s"] = gbs_peak;
}

/// Thread counts to run: HYMIX_BENCH_THREADS as a comma-separated list (e.g. "1,2,4,8,16" on a many-core host),
/// else `fallback`. Entries that are not positive integers are skipped.
inline std::vector<std::int64_t> thread_counts(std::vector<std::int64_t> fallback = {1, 2}) {
    const char* env = std::getenv("HYMIX_BENCH_THREADS");
    if (!env) return fallback;
    std::vector<std::int64_t> out;
    std::istringstream list(env);
    for (std::string item; std::getline(list, item, ',');) {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (ec == std::errc() && end == item.data() + item.size() && v > 0) out.push_back(v);
    }
    return out.empty() ? fallback : out;
}

/// One thread count: the first of HYMIX_BENCH_THREADS, else `fallback` (0: every core, as cpu_backend takes it).
inline int first_thread_count(int fallback) { return static_cast<int>(thread_counts({fallback}).front()); }

/// n values uniform in [-1, 1) from a fixed seed: benchmark inputs.
inline std::vector<float> random_vec(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// x stored as T: itself for float, rounded to nearest even for bf16 / f16 (T::from_float).
template <class T>
T stored_as(float x) {
    if constexpr (std::is_same_v<T, float>)
        return x;
    else
        return T::from_float(x);
}

/// Fills the first n tokens of `slot` of a KV cache (mixer/kv_cache.hpp's [H_kv, capacity, d_h] keys and values, in
/// the cache's dtype) with finite values in [-0.5, 0.5) from the generator state r, and sets the slot's length to n: a
/// long context for a decode benchmark without prefilling it (which would dominate the run). Reserves room for n + 1
/// tokens.
template <class KVCache>
void fill_kv_slot(KVCache& cache, std::int64_t slot, std::int64_t n, std::uint32_t& r) {
    cache.reserve(n + 1);
    cache.with_kv_type([&](auto tag) {
        using KV = decltype(tag);
        auto k = cache.template keys<KV>(slot), v = cache.template values<KV>(slot);
        for (std::int64_t i = 0; i < k.numel(); ++i) {
            r = r * 1664525u + 1013904223u;
            k.data[i] = stored_as<KV>(static_cast<float>(r >> 8) * (1.f / 16777216.f) - 0.5f);
            v.data[i] = stored_as<KV>(static_cast<float>(r & 0xffffu) * (1.f / 65536.f) - 0.5f);
        }
    });
    cache.set_length(slot, n);
}

}  // namespace hymix::bench
