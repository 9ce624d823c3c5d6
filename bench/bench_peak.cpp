// This machine's ceilings, measured: fp32 FMA throughput (xsimd FMAs on independent register accumulators)
// and memory read bandwidth (summing a 1 GiB array for DRAM, 32 MiB for L3, 1 MiB for L2), on 1 and 2 threads
// of the CPU backend. The results are the constants of bench/peak.hpp (../shared/docs/machine.md).
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"

namespace {

using arch = hymix::cpu_backend::arch;
using batch = xsimd::batch<float, arch>;

// Independent FMA chains: latency 4 × 2 FMA ports needs at least 8; more hides issue jitter.
constexpr std::size_t n_acc = 16;
constexpr std::int64_t fma_iters = 1 << 16;  // per task: 16 × 65536 batch FMAs

/// Runs fma_iters rounds of n_acc independent batch FMAs; returns a value that depends on all of them.
float fma_kernel(float seed) {
    std::array<batch, n_acc> acc;
    for (std::size_t i = 0; i < n_acc; ++i) acc[i] = batch(seed + static_cast<float>(i));
    // acc = acc * a + b with |a| < 1 converges to a fixed point: no overflow, no denormals.
    const batch a(0.999f), b(0.001f);
    for (std::int64_t it = 0; it < fma_iters; ++it) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((acc[I] = xsimd::fma(acc[I], a, b)), ...);
        }(std::make_index_sequence<n_acc>{});
    }
    batch s = acc[0];
    for (std::size_t i = 1; i < n_acc; ++i) s += acc[i];
    return xsimd::hadd(s);
}

void BM_fma_peak(benchmark::State& st) {
    const int threads = static_cast<int>(st.range(0));
    const hymix::cpu_backend be(threads);
    constexpr std::int64_t tasks = 32;  // enough tasks that every thread gets some
    std::array<float, tasks> out{};
    for (auto _ : st) {
        be.parallel_for(tasks, 1, [&](std::int64_t t0, std::int64_t t1) {
            for (auto t = t0; t < t1; ++t) out[static_cast<std::size_t>(t)] = fma_kernel(static_cast<float>(t));
        });
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double flops = 2.0 * static_cast<double>(batch::size * n_acc) * fma_iters * tasks;
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(st.iterations()),
                                                benchmark::Counter::kIsRate);
    st.SetLabel(std::string(be.arch_name()) + ", " + std::to_string(threads) + " thread(s)");
}

/// Sum of p[0, n) with 8 independent vector accumulators (n a multiple of 8 batches, p aligned).
float sum_kernel(const float* p, std::int64_t n) {
    constexpr std::int64_t W = static_cast<std::int64_t>(batch::size);
    std::array<batch, 8> acc;
    acc.fill(batch(0.f));
    for (std::int64_t i = 0; i < n; i += 8 * W) {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((acc[I] += batch::load_aligned(p + i + static_cast<std::int64_t>(I) * W)), ...);
        }(std::make_index_sequence<8>{});
    }
    batch s = acc[0];
    for (std::size_t i = 1; i < 8; ++i) s += acc[i];
    return xsimd::hadd(s);
}

void BM_read_bandwidth(benchmark::State& st) {
    const std::int64_t bytes = st.range(0) << 20;  // MiB
    const int threads = static_cast<int>(st.range(1));
    const hymix::cpu_backend be(threads);
    const std::int64_t n = bytes / static_cast<std::int64_t>(sizeof(float));
    hymix::tensor<float> data{n};  // zero-filled: every page is touched before timing
    data.fill(1.f);
    constexpr std::int64_t chunk = 64 * 1024;  // floats per task (256 KiB)
    const std::int64_t n_chunks = n / chunk;
    std::vector<float> partial(static_cast<std::size_t>(n_chunks));
    for (auto _ : st) {
        be.parallel_for(n_chunks, 1, [&](std::int64_t c0, std::int64_t c1) {
            for (auto c = c0; c < c1; ++c) partial[static_cast<std::size_t>(c)] = sum_kernel(data.data() + c * chunk, chunk);
        });
        benchmark::DoNotOptimize(partial.data());
        benchmark::ClobberMemory();
    }
    st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9 * static_cast<double>(st.iterations()),
                                             benchmark::Counter::kIsRate);
    st.SetLabel(std::to_string(st.range(0)) + " MiB, " + std::to_string(threads) + " thread(s)");
}

}  // namespace

// Wall-clock rates are the ceilings. The process-CPU-time variants divide by the CPU seconds the benchmark got
// instead (per busy core): on a shared, loaded machine they estimate what one core does when it runs.
BENCHMARK(BM_fma_peak)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_fma_peak)->ArgName("threads")->Arg(1)->Arg(2)->MeasureProcessCPUTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_read_bandwidth)
    ->ArgNames({"MiB", "threads"})
    ->ArgsProduct({{1, 32, 1024}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_read_bandwidth)
    ->ArgNames({"MiB", "threads"})
    ->ArgsProduct({{1, 32, 1024}, {1, 2}})
    ->MeasureProcessCPUTime()
    ->Unit(benchmark::kMillisecond);
