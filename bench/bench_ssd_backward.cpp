// SSD backward vs forward (kernels/ssd_backward.hpp vs kernels/ssd.hpp) for a 130M-class head layout (H 24, P 64,
// N 128, G 1), T 512, chunk 64 and 256; issue 8 asks backward ≤ 2.5× forward. FLOPs count the GEMMs as executed
// (triangular products at half size): forward T·(4NPH + QPH + 2QNG), backward T·(10NPH + 2QPH + 4QNG).
// BM_ssd_bwd_over_fwd times both alternately in one loop, so load changes on a shared machine hit both alike.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
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
    std::vector<float> x, bc, dt, A, D, y, dy, dx, ddt, dbc, dA, dD;
    hymix::kernels::ssd_inputs<float> in;
    hymix::kernels::ssd_grads<float> g;
    explicit problem(std::int64_t T_)
        : T(T_), x(hymix::bench::random_vec(std::size_t(T * H * P), 1)), bc(hymix::bench::random_vec(std::size_t(2 * T * G * N), 2)),
          dt(std::size_t(T * H)), A(std::size_t(H)), D(std::size_t(H), 1.f), y(x.size()), dy(hymix::bench::random_vec(x.size(), 3)),
          dx(x.size()), ddt(dt.size()), dbc(bc.size()), dA(A.size()), dD(D.size()) {
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
        const hymix::kernels::ssd_sequence<float> seq{0, T, nullptr};
        hymix::kernels::ssd_chunked(be, in, std::span(&seq, 1), Q, hymix::tensor_view<float, 3>(y.data(), {T, H, P}));
        benchmark::DoNotOptimize(y.data());
    }
    void backward(const hymix::cpu_backend& be, std::int64_t Q) {
        const hymix::kernels::ssd_backward_sequence<float> seq{0, T, nullptr, nullptr, nullptr};
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

/// Args: T, chunk, threads.
void BM_ssd_forward(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T);
    for (auto _ : st) pb.forward(be, Q);
    hymix::bench::report(st, double(T), fwd_flops(T, Q), bytes(T), be.num_threads());
}

void BM_ssd_backward(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T);
    for (auto _ : st) pb.backward(be, Q);
    hymix::bench::report(st, double(T), bwd_flops(T, Q), 2.0 * bytes(T), be.num_threads());
}

/// Forward and backward alternately; counter bwd/fwd = total backward time / total forward time.
void BM_ssd_bwd_over_fwd(benchmark::State& st) {
    const std::int64_t T = st.range(0), Q = st.range(1);
    const hymix::cpu_backend be(int(st.range(2)));
    problem pb(T);
    double tf = 0, tb = 0;
    for (auto _ : st) {
        const auto t0 = std::chrono::steady_clock::now();
        pb.forward(be, Q);
        const auto t1 = std::chrono::steady_clock::now();
        pb.backward(be, Q);
        const auto t2 = std::chrono::steady_clock::now();
        tf += std::chrono::duration<double>(t1 - t0).count();
        tb += std::chrono::duration<double>(t2 - t1).count();
    }
    st.counters["bwd/fwd"] = tb / tf;
    st.counters["fwd_ms"] = 1e3 * tf / double(st.iterations());
    st.counters["bwd_ms"] = 1e3 * tb / double(st.iterations());
}

}  // namespace

BENCHMARK(BM_ssd_forward)->ArgsProduct({{512}, {64, 256}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_backward)->ArgsProduct({{512}, {64, 256}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_bwd_over_fwd)->ArgsProduct({{512}, {64, 256}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();
