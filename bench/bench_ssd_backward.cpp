// SSD backward vs forward (kernels/ssd_backward.hpp vs kernels/ssd.hpp) for a 130M-class head layout (H 24, P 64,
// N 128, G 1), T 512, chunk 64 and 256; issue 8 asks backward ≤ 2.5× forward. FLOPs count the GEMMs as executed
// (triangular products at half size): forward T·(4NPH + QPH + 2QNG), backward T·(10NPH + 2QPH + 4QNG) (less the
// skipped zero-state terms when states = 0; not subtracted).
// BM_ssd_bwd_over_fwd times both alternately in one loop, so load changes on a shared machine hit both alike.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <time.h>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/kernels/ssd_backward.hpp"
#include "peak.hpp"

namespace {

constexpr std::int64_t H = 24, P = 64, N = 128, G = 1;

/// Inputs, upstream gradient and gradient buffers of one T-token sequence.
struct problem {
    std::int64_t T;
    bool with_states;  // a non-zero initial state and a final-state gradient (else zero / none: the training case)
    std::vector<float> x, bc, dt, A, D, y, dy, dx, ddt, dbc, dA, dD, state, dstate0, dfinal;
    hymix::kernels::ssd_inputs<float> in;
    hymix::kernels::ssd_grads<float> g;
    problem(std::int64_t T_, bool states)
        : T(T_), with_states(states), x(hymix::bench::random_vec(std::size_t(T * H * P), 1)), bc(hymix::bench::random_vec(std::size_t(2 * T * G * N), 2)),
          dt(std::size_t(T * H)), A(std::size_t(H)), D(std::size_t(H), 1.f), y(x.size()), dy(hymix::bench::random_vec(x.size(), 3)),
          dx(x.size()), ddt(dt.size()), dbc(bc.size()), dA(A.size()), dD(D.size()),
          state(hymix::bench::random_vec(std::size_t(H * P * N), 5)), dstate0(state.size()), dfinal(hymix::bench::random_vec(state.size(), 6)) {
        const auto r = hymix::bench::random_vec(dt.size() + A.size(), 4);
        for (std::size_t i = 0; i < dt.size(); ++i) dt[i] = 0.01f + 0.05f * (r[i] + 1.f);         // Δ in [0.01, 0.11)
        for (std::size_t h = 0; h < A.size(); ++h) A[h] = -1.f - 7.f * (r[dt.size() + h] + 1.f);  // A in [−15, −1)
        in.x = hymix::tensor_view<const float, 3>(x.data(), {T, H, P});
        in.dt = hymix::tensor_view<const float, 2>(dt.data(), {T, H});
        in.A = A.data();
        in.B = hymix::tensor_view<const float, 3>(bc.data(), {T, G, N}, {2 * G * N, N, 1});
        in.C = hymix::tensor_view<const float, 3>(bc.data() + G * N, {T, G, N}, {2 * G * N, N, 1});
        in.D = D.data();
        g.dx = hymix::tensor_view<float, 3>(dx.data(), {T, H, P});
        g.ddt = hymix::tensor_view<float, 2>(ddt.data(), {T, H});
        g.dB = hymix::tensor_view<float, 3>(dbc.data(), {T, G, N}, {2 * G * N, N, 1});
        g.dC = hymix::tensor_view<float, 3>(dbc.data() + G * N, {T, G, N}, {2 * G * N, N, 1});
        g.dA = dA.data();
        g.dD = dD.data();
    }
    void forward(const hymix::cpu_backend& be, std::int64_t Q) {
        const hymix::kernels::ssd_sequence<float> seq{0, T, with_states ? state.data() : nullptr};
        hymix::kernels::ssd_chunked(be, in, std::span(&seq, 1), Q, hymix::tensor_view<float, 3>(y.data(), {T, H, P}));
        benchmark::DoNotOptimize(y.data());
    }
    void backward(const hymix::cpu_backend& be, std::int64_t Q) {
        const hymix::kernels::ssd_backward_sequence<float> seq{0, T, with_states ? state.data() : nullptr,
                                                               with_states ? dstate0.data() : nullptr, with_states ? dfinal.data() : nullptr};
        hymix::kernels::ssd_chunked_backward(be, in, std::span(&seq, 1), Q, hymix::tensor_view<const float, 3>(dy.data(), {T, H, P}), g);
        benchmark::DoNotOptimize(dx.data());
    }
};

double fwd_flops(std::int64_t T, std::int64_t Q) {
    const double q = double(std::min(Q, T));
    return double(T) * (4.0 * N * P * H + q * P * H + 2.0 * q * N * G);
}
double bwd_flops(std::int64_t T, std::int64_t Q) {
    const double q = double(std::min(Q, T));
    return double(T) * (10.0 * N * P * H + 2.0 * q * P * H + 4.0 * q * N * G);
}
double bytes(std::int64_t T) { return 4.0 * double(T) * double(2 * H * P + 2 * G * N + H); }

/// Args: T, chunk, threads, states (0: zero initial state, no final-state gradient, as in training from scratch —
/// the backward then skips the terms of the first chunk's zero state and the last chunk's zero state gradient;
/// 1: both present, dstate0 wanted).
void BM_ssd_forward(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T, st.range(3) != 0);
    for (auto _ : st) pb.forward(be, Q);
    hymix::bench::report(st, double(T), fwd_flops(T, Q), bytes(T), be.num_threads());
}

void BM_ssd_backward(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T, st.range(3) != 0);
    for (auto _ : st) pb.backward(be, Q);
    hymix::bench::report(st, double(T), bwd_flops(T, Q), 2.0 * bytes(T), be.num_threads());
}

/// CPU time of the whole process (every thread), seconds.
double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// Forward and backward alternately. Counters: bwd/fwd = total backward / total forward wall time; bwd/fwd_cpu the
/// same in process CPU time (less sensitive to other processes on a loaded machine; with 2 threads it also counts
/// the workers' idle spinning); fwd_ms and bwd_ms the mean wall times.
void BM_ssd_bwd_over_fwd(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T, st.range(3) != 0);
    double tf = 0, tb = 0, cf = 0, cb = 0;
    for (auto _ : st) {
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_seconds();
        pb.forward(be, Q);
        const auto t1 = std::chrono::steady_clock::now();
        const double c1 = process_cpu_seconds();
        pb.backward(be, Q);
        const auto t2 = std::chrono::steady_clock::now();
        const double c2 = process_cpu_seconds();
        tf += std::chrono::duration<double>(t1 - t0).count();
        tb += std::chrono::duration<double>(t2 - t1).count();
        cf += c1 - c0;
        cb += c2 - c1;
    }
    st.counters["bwd/fwd"] = tb / tf;
    st.counters["bwd/fwd_cpu"] = cb / cf;
    st.counters["fwd_ms"] = 1e3 * tf / double(st.iterations());
    st.counters["bwd_ms"] = 1e3 * tb / double(st.iterations());
}

}  // namespace

BENCHMARK(BM_ssd_forward)->ArgsProduct({{512}, {64, 256}, {1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_backward)->ArgsProduct({{512}, {64, 256}, {1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_bwd_over_fwd)->ArgsProduct({{512}, {64, 256}, {1, 2}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
