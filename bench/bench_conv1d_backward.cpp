// Causal depthwise conv1d + SiLU, forward (ops/conv1d.hpp) vs backward (ops/conv1d_backward.hpp: dx, dw, dbias,
// dstate0, recomputing the pre-activation) on the conv of a 130M-class Mamba-2 layer's xBC slice: C = 1792, K = 4,
// T = 512. The forward runs as Mamba-2 runs it (one problem per 128-channel block); the backward takes the whole
// problem and splits it itself. FLOPs: forward 2KC per token (+ SiLU), backward 6KC per token (recompute, dw, dx).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/ops/conv1d.hpp"
#include "hymix/ops/conv1d_backward.hpp"
#include "peak.hpp"

namespace {

constexpr std::int64_t C = 1792, K = 4, S = K - 1;

void BM_conv1d_forward(benchmark::State& st) {
    const std::int64_t T = st.range(0);
    const hymix::cpu_backend be(static_cast<int>(st.range(1)));
    const auto x = hymix::bench::random_vec(std::size_t(T * C), 1), w = hymix::bench::random_vec(std::size_t(C * K), 2);
    const auto b = hymix::bench::random_vec(std::size_t(C), 3);
    std::vector<float> state(std::size_t(C * S)), out(std::size_t(T * C));
    std::vector<hymix::ops::conv_problem<>> ps;
    for (std::int64_t c0 = 0; c0 < C; c0 += 128) {
        hymix::ops::conv_problem<> p;
        p.x = hymix::tensor_view<const float, 2>(x.data() + c0, {T, 128}, {C, 1});  // [T, 128] of [T, C]
        p.w = hymix::tensor_view<const float, 2>(w.data() + c0 * K, {128, K});
        p.bias = b.data() + c0;
        p.state = state.data() + c0 * S;
        p.out = hymix::tensor_view<float, 2>(out.data() + c0, {T, 128}, {C, 1});
        ps.push_back(p);
    }
    for (auto _ : st) {
        hymix::ops::causal_conv1d(be, std::span<const hymix::ops::conv_problem<>>(ps), hymix::kernels::conv_activation::silu);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double tokens = double(T);
    hymix::bench::report(st, tokens, tokens * double(2 * K * C), tokens * 8.0 * double(C), be.num_threads());
}

void BM_conv1d_backward(benchmark::State& st) {
    const std::int64_t T = st.range(0);
    const hymix::cpu_backend be(static_cast<int>(st.range(1)));
    const auto x = hymix::bench::random_vec(std::size_t(T * C), 1), w = hymix::bench::random_vec(std::size_t(C * K), 2);
    const auto b = hymix::bench::random_vec(std::size_t(C), 3), dy = hymix::bench::random_vec(std::size_t(T * C), 4);
    const auto s0 = hymix::bench::random_vec(std::size_t(C * S), 5);
    std::vector<float> dx(std::size_t(T * C)), dw(std::size_t(C * K)), db(static_cast<std::size_t>(C)), ds0(std::size_t(C * S));
    hymix::ops::conv_backward_problem<> p;
    p.x = hymix::tensor_view<const float, 2>(x.data(), {T, C});
    p.w = hymix::tensor_view<const float, 2>(w.data(), {C, K});
    p.bias = b.data();
    p.state0 = s0.data();
    p.dout = hymix::tensor_view<const float, 2>(dy.data(), {T, C});
    p.dx = hymix::tensor_view<float, 2>(dx.data(), {T, C});
    p.dw = hymix::tensor_view<float, 2>(dw.data(), {C, K});
    p.dbias = db.data();
    p.dstate0 = ds0.data();
    for (auto _ : st) {
        hymix::ops::causal_conv1d_backward(be, std::span<const hymix::ops::conv_backward_problem<>>(&p, 1),
                                           hymix::kernels::conv_activation::silu);
        benchmark::DoNotOptimize(dx.data());
        benchmark::ClobberMemory();
    }
    const double tokens = double(T);
    hymix::bench::report(st, tokens, tokens * double(6 * K * C), tokens * 12.0 * double(C), be.num_threads());
}

}  // namespace

BENCHMARK(BM_conv1d_forward)->ArgNames({"T", "threads"})->Args({1, 1})->Args({1, 2})->Args({512, 1})->Args({512, 2})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_conv1d_backward)->ArgNames({"T", "threads"})->Args({512, 1})->Args({512, 2})->Unit(benchmark::kMicrosecond);
