// This machine's ceilings on their own: fp32 FMA throughput (xsimd FMAs on independent register accumulators)
// and memory read bandwidth (summing a 1 GiB array for DRAM, 32 MiB for L3, 1 MiB for L2), on 1 and 2 threads
// of the CPU backend, with the kernels bench/peak.hpp measures inside every other benchmark program.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <utility>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "peak.hpp"

namespace {

using hymix::bench::detail::fma_kernel;
using batch = hymix::bench::detail::peak_batch;
constexpr std::size_t n_acc = hymix::bench::detail::fma_chains;
constexpr std::int64_t fma_iters = 1 << 16;  // per task: 16 × 65536 batch FMAs

void BM_fma_peak(benchmark::State& st) {
    const int threads = static_cast<int>(st.range(0));
    const hymix::cpu_backend be(threads);
    constexpr std::int64_t tasks = 32;  // enough tasks that every thread gets some
    std::array<float, tasks> out{};
    for (auto _ : st) {
        be.parallel_for(tasks, 1, [&](std::int64_t t0, std::int64_t t1) {
            for (auto t = t0; t < t1; ++t) out[static_cast<std::size_t>(t)] = fma_kernel(static_cast<float>(t), fma_iters);
        });
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double flops = 2.0 * static_cast<double>(batch::size * n_acc) * fma_iters * tasks;
    st.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(st.iterations()),
                                                benchmark::Counter::kIsRate);
    st.SetLabel(std::string(be.arch_name()) + ", " + std::to_string(threads) + " thread(s)");
}

void BM_read_bandwidth(benchmark::State& st) {
    const std::int64_t bytes = st.range(0) << 20;  // MiB
    const int threads = static_cast<int>(st.range(1));
    const hymix::cpu_backend be(threads);
    const std::int64_t n = bytes / static_cast<std::int64_t>(sizeof(float));
    hymix::tensor<float> data{n};  // zero-filled: every page is touched before timing
    data.fill(1.f);
    std::vector<float> partial(static_cast<std::size_t>(n / (16 * 1024)));
    for (auto _ : st) {
        hymix::bench::detail::read_once(be, data.data(), n, partial);
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
