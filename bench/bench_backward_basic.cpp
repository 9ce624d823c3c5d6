// Training ops of issue 8 next to their forwards: linear backward (dx = dy·W, dW += dyᵀx, db) against
// kernels::linear at M = 2048, N = K = 768, and the fused streaming LM head + cross-entropy (loss only, and loss +
// dh + dhead) at d = 768 for V = 256 and V = 32000, on 1 and 2 threads. Report: GFLOP/s and the fraction of the
// FMA peak (bench/peak.hpp; bench_peak re-measures it), tokens/s.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/cross_entropy.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/linear_backward.hpp"
#include "peak.hpp"

namespace {

hymix::tensor<float> random_tensor(std::int64_t a, std::int64_t b, std::uint64_t seed, float scale = 1.f) {
    hymix::tensor<float> t({a, b});
    const auto v = hymix::bench::random_vec(static_cast<std::size_t>(a * b), seed);
    for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = scale * v[static_cast<std::size_t>(i)];
    return t;
}

// ---- linear: forward vs backward --------------------------------------------------------------------------------

struct linear_problem {
    std::int64_t M, N, K;
    int threads;
    hymix::tensor<float> x, w, dy, dx, dw, db, y;
    explicit linear_problem(const benchmark::State& st)
        : M(st.range(0)), N(st.range(1)), K(st.range(1)), threads(static_cast<int>(st.range(2))), x(random_tensor(M, K, 1)),
          w(random_tensor(N, K, 2)), dy(random_tensor(M, N, 3)), dx({M, K}), dw({N, K}), db({N}), y({M, N}) {}
};

void BM_linear_forward(benchmark::State& st) {
    linear_problem p(st);
    const hymix::cpu_backend be(p.threads);
    for (auto _ : st) {
        hymix::kernels::linear(be, p.x.view<2>(), p.w.view<2>(), nullptr, p.y.view<2>());
        benchmark::DoNotOptimize(p.y.data());
        benchmark::ClobberMemory();
    }
    const double flops = 2.0 * static_cast<double>(p.M * p.N * p.K);
    hymix::bench::report(st, static_cast<double>(p.M), flops, 4.0 * static_cast<double>(p.M * p.K + p.N * p.K + p.M * p.N), p.threads);
    st.SetLabel("y = x Wᵀ (2MNK)");
}

void BM_linear_backward(benchmark::State& st) {
    linear_problem p(st);
    const hymix::cpu_backend be(p.threads);
    for (auto _ : st) {
        hymix::kernels::linear_backward(be, p.x.view<2>(), p.w.view<2>(), p.dy.view<2>(), p.dx.view<2>(), p.dw.view<2>(), p.db.data());
        benchmark::DoNotOptimize(p.dw.data());
        benchmark::ClobberMemory();
    }
    const double flops = 4.0 * static_cast<double>(p.M * p.N * p.K);
    hymix::bench::report(st, static_cast<double>(p.M), flops, 4.0 * static_cast<double>(2 * p.M * p.K + 2 * p.N * p.K + p.M * p.N), p.threads);
    st.SetLabel("dx = dy W, dW += dyᵀ x, db (4MNK)");
}

void linear_shapes(benchmark::internal::Benchmark* b) {
    b->ArgNames({"M", "NK", "threads"});
    for (std::int64_t t : {1, 2}) b->Args({2048, 768, t});
    b->UseRealTime()->Unit(benchmark::kMillisecond);
}

// ---- cross-entropy ----------------------------------------------------------------------------------------------

struct ce_problem {
    std::int64_t M, V, d;
    int threads;
    hymix::tensor<float> h, head, dh, dhead;
    std::vector<std::int32_t> targets;
    std::vector<float> losses, entropy;
    explicit ce_problem(const benchmark::State& st)
        : M(st.range(0)), V(st.range(1)), d(768), threads(static_cast<int>(st.range(2))), h(random_tensor(M, d, 4)),
          head(random_tensor(V, d, 5, 0.05f)), dh({M, d}), dhead({V, d}), targets(static_cast<std::size_t>(M)),
          losses(static_cast<std::size_t>(M)), entropy(static_cast<std::size_t>(M)) {
        for (std::int64_t i = 0; i < M; ++i) targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % V);
    }
};

void BM_cross_entropy_loss(benchmark::State& st) {
    ce_problem p(st);
    const hymix::cpu_backend be(p.threads);
    for (auto _ : st) {
        hymix::kernels::cross_entropy(be, p.h.view<2>(), p.head.view<2>(), p.targets, p.losses, {}, {}, 1.f, p.entropy.data());
        benchmark::DoNotOptimize(p.losses.data());
        benchmark::ClobberMemory();
    }
    const double flops = 2.0 * static_cast<double>(p.M * p.V * p.d);
    hymix::bench::report(st, static_cast<double>(p.M), flops, 4.0 * static_cast<double>(p.V * p.d), p.threads);
    st.SetLabel("loss + entropy (2MVd)");
}

void BM_cross_entropy_grad(benchmark::State& st) {
    ce_problem p(st);
    const hymix::cpu_backend be(p.threads);
    for (auto _ : st) {
        hymix::kernels::cross_entropy(be, p.h.view<2>(), p.head.view<2>(), p.targets, p.losses, p.dh.view<2>(), p.dhead.view<2>(),
                                      1.f / static_cast<float>(p.M), p.entropy.data());
        benchmark::DoNotOptimize(p.dhead.data());
        benchmark::ClobberMemory();
    }
    // Counted as executed: logits twice (pass 1 and the recompute), dh and dhead: 8MVd.
    const double flops = 8.0 * static_cast<double>(p.M * p.V * p.d);
    hymix::bench::report(st, static_cast<double>(p.M), flops, 4.0 * static_cast<double>(2 * p.V * p.d), p.threads);
    st.SetLabel("loss + dh + dhead (8MVd executed, 6MVd useful)");
}

void ce_shapes(benchmark::internal::Benchmark* b) {
    b->ArgNames({"M", "V", "threads"});
    for (std::int64_t t : {1, 2}) {
        b->Args({2048, 256, t});
        b->Args({512, 32000, t});
    }
    b->UseRealTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_linear_forward)->Apply(linear_shapes);
BENCHMARK(BM_linear_backward)->Apply(linear_shapes);
BENCHMARK(BM_cross_entropy_loss)->Apply(ce_shapes);
BENCHMARK(BM_cross_entropy_grad)->Apply(ce_shapes);
