// Mamba-2 layer throughput (mixer/mamba2.hpp): chunked prefill and batched decode steps for the shared
// checkpoints' layer (d_model 256, 8×64 heads, N 64, chunk 64) and a 130M-class layer (d_model 768, 24×64 heads,
// N 128, chunk 256). FLOPs count projections, conv and the SSD stages as executed; decode bytes count weights + states.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "peak.hpp"

namespace {

hymix::mamba2_config layer_config(std::int64_t d_model) {
    hymix::mamba2_config c;
    c.d_model = d_model;
    c.head_dim = 64;
    c.n_groups = 1;
    c.d_conv = 4;
    if (d_model == 256) {
        c.n_heads = 8;
        c.d_state = 64;
        c.chunk_size = 64;
    } else {  // 130M / 780M heads; chunk_size 0 as a loaded checkpoint runs (its 256 is not used: the backend's choice)
        c.n_heads = 24;
        c.d_state = 128;
        c.chunk_size = 0;
    }
    return c;
}

/// FLOPs per token of one layer: projections, conv, and the SSD work per token (chunked: C·Bᵀ per group,
/// triangular intra-chunk product, inter-chunk output and chunk state per head; step: update + output).
double flops_per_token(const hymix::mamba2_config& c, std::int64_t Q_run, std::int64_t T, bool decode) {
    const double d = double(c.d_model), di = double(c.d_inner()), np = double(c.d_in_proj()), cd = double(c.conv_dim());
    const double H = double(c.n_heads), P = double(c.head_dim), N = double(c.d_state), G = double(c.n_groups);
    const double Q = double(std::min(Q_run, T));
    double f = 2 * d * np + 2 * di * d + 2 * double(c.d_conv) * cd;
    if (decode) f += 4 * H * P * N;
    else f += 2 * Q * N * G + Q * P * H + 4 * N * P * H;
    return f;
}

double weight_bytes(const hymix::mamba2_config& c) {
    return 4.0 * double(c.d_in_proj() * c.d_model + c.d_model * c.d_inner() + c.conv_dim() * c.d_conv);
}
double state_bytes(const hymix::mamba2_config& c) {
    return 4.0 * double(c.n_heads * c.head_dim * c.d_state + c.conv_dim() * (c.d_conv - 1));
}

void BM_mamba2_prefill(benchmark::State& st) {
    const auto cfg = layer_config(st.range(0));
    const std::int64_t B = st.range(1), T = st.range(2), d = cfg.d_model;
    const hymix::cpu_backend be(2);
    const hymix::mamba2 m(cfg, hymix::mamba2_weights::random(cfg, 1));
    std::vector<float> x(std::size_t(B * T * d)), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    auto state = m.make_state(B);
    const auto batch = hymix::seq_batch::dense(B, T);
    for (auto _ : st) {
        m.forward(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {B * T, d}),
                  hymix::tensor_view<float, 2>(y.data(), {B * T, d}));
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    const double tokens = double(B * T);
    hymix::bench::report(st, tokens, tokens * flops_per_token(cfg, m.chunk_for(be), T, false),
                         weight_bytes(cfg) + tokens * 8.0 * double(d) + 2.0 * double(B) * state_bytes(cfg), be.num_threads());
}

void BM_mamba2_decode(benchmark::State& st) {
    const auto cfg = layer_config(st.range(0));
    const std::int64_t B = st.range(1), d = cfg.d_model;
    const hymix::cpu_backend be(2);
    const hymix::mamba2 m(cfg, hymix::mamba2_weights::random(cfg, 1));
    std::vector<float> x(std::size_t(B * d)), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    auto state = m.make_state(B);
    std::vector<std::int64_t> slots(static_cast<std::size_t>(B));
    for (std::int64_t b = 0; b < B; ++b) slots[std::size_t(b)] = b;
    const auto batch = hymix::seq_batch::decode(slots);
    for (auto _ : st) {
        m.step(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {B, d}), hymix::tensor_view<float, 2>(y.data(), {B, d}));
        benchmark::DoNotOptimize(y.data());
        benchmark::ClobberMemory();
    }
    const double tokens = double(B);
    hymix::bench::report(st, tokens, tokens * flops_per_token(cfg, 1, 1, true), weight_bytes(cfg) + 2.0 * double(B) * state_bytes(cfg),
                         be.num_threads());
}

/// The SSD core alone (130M-class head layout: H 24 unless `heads` says otherwise, P 64, N 128; one sequence of T
/// tokens) at chunk length Q, FLOPs as in flops_per_token.
void ssd_chunked_core(benchmark::State& st, std::int64_t T, std::int64_t chunk, int threads, bool model_decay, bool flush,
                      std::int64_t heads = 0) {
    auto cfg = layer_config(768);
    cfg.chunk_size = chunk;
    const std::int64_t H = heads > 0 ? heads : cfg.n_heads, P = cfg.head_dim, N = cfg.d_state, G = cfg.n_groups;
    hymix::cpu_backend be(threads);
    be.set_flush_subnormals(flush);
    std::vector<float> x(std::size_t(T * H * P)), bc(std::size_t(2 * T * G * N)), dt(std::size_t(T * H), 0.02f), A(std::size_t(H), -1.f),
        D(std::size_t(H), 1.f), y(x.size()), s(std::size_t(H * P * N));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    for (std::size_t i = 0; i < bc.size(); ++i) bc[i] = float((i * 40503u) % 2001) * 1e-3f - 1.0f;
    if (model_decay) {  // random-init decays (spec.md §3): A = −U(1, 16), Δ = softplus(a + dt_bias), dt_bias the inverse
                        // softplus of dt ~ log-U(0.001, 0.1) per head, a ~ N(0, 0.64)
        std::mt19937 rng(17);
        std::uniform_real_distribution<float> ua(1.f, 16.f), ul(std::log(0.001f), std::log(0.1f));
        std::normal_distribution<float> na(0.f, 0.64f);
        std::vector<float> bias(static_cast<std::size_t>(H));
        for (std::size_t h = 0; h < bias.size(); ++h) {
            A[h] = -ua(rng);
            bias[h] = std::log(std::expm1(std::exp(ul(rng))));
        }
        for (std::size_t i = 0; i < dt.size(); ++i) dt[i] = std::log1p(std::exp(bias[i % bias.size()] + na(rng)));
    }
    hymix::kernels::ssd_inputs<float> in;
    in.x = hymix::tensor_view<const float, 3>(x.data(), {T, H, P});
    in.dt = hymix::tensor_view<const float, 2>(dt.data(), {T, H});
    in.A = A.data();
    in.B = hymix::tensor_view<const float, 3>(bc.data(), {T, G, N}, {2 * G * N, N, 1});
    in.C = hymix::tensor_view<const float, 3>(bc.data() + G * N, {T, G, N}, {2 * G * N, N, 1});
    in.D = D.data();
    const hymix::kernels::ssd_sequence<float> seq{0, T, s.data()};
    for (auto _ : st) {
        std::fill(s.begin(), s.end(), 0.f);
        hymix::kernels::ssd_chunked(be, in, std::span(&seq, 1), cfg.chunk_size, hymix::tensor_view<float, 3>(y.data(), {T, H, P}));
        benchmark::DoNotOptimize(y.data());
    }
    const double Q = double(std::min(cfg.chunk_size, T));
    const double f = double(T) * (2 * Q * double(N * G) + Q * double(P * H) + 4 * double(N * P * H));
    hymix::bench::report(st, double(T), f, 4.0 * double(x.size() + bc.size() + y.size()), be.num_threads());
}

void BM_ssd_chunked_core(benchmark::State& st) { ssd_chunked_core(st, st.range(0), st.range(1), 2, false, true); }

/// The SSD core with H heads of 64 × 128 (24 as the 130M model, 48 as the 780M one, whose rows of x then lie 12 KiB
/// apart: a multiple of 4 KiB), T tokens, chunk Q, on the first count in HYMIX_BENCH_THREADS (default 2).
void BM_ssd_chunked_heads(benchmark::State& st) {
    const int threads = hymix::bench::first_thread_count(2);
    ssd_chunked_core(st, st.range(1), st.range(2), threads, false, true, st.range(0));
    st.counters["threads"] = threads;
}

/// The cost of subnormal numbers: BM_ssd_chunked_core's heads, T 512, chunk 256 (a real Mamba-2 checkpoint's), on 2
/// threads (or the first count in HYMIX_BENCH_THREADS), with the decays of a randomly initialised layer (decay 1:
/// segment sums far below −87 inside a chunk, so exp(segsum) and its products fall below 2^-126) or the mild ones
/// (decay 0), on a backend that flushes subnormals (flush 1, the default) or keeps IEEE subnormals (flush 0).
void BM_ssd_chunked_subnormals(benchmark::State& st) {
    ssd_chunked_core(st, 512, 256, hymix::bench::first_thread_count(2), st.range(0) != 0, st.range(1) != 0);
    st.counters["threads"] = hymix::bench::first_thread_count(2);
}

/// The SSD decode step alone (130M-class head layout with H heads: 24 as the 130M model, 4 for a small layer whose
/// state is 512 KiB; B sequences of one token each) on 1 or 2 threads, FLOPs and bytes of the state update and read-out.
void BM_ssd_step_core(benchmark::State& st) {
    const auto cfg = layer_config(768);
    const std::int64_t B = st.range(0), H = st.range(1), P = cfg.head_dim, N = cfg.d_state, G = cfg.n_groups;
    const hymix::cpu_backend be(static_cast<int>(st.range(2)));
    const auto x = hymix::bench::random_vec(std::size_t(B * H * P), 4), bc = hymix::bench::random_vec(std::size_t(2 * B * G * N), 5);
    std::vector<float> dt(std::size_t(B * H), 0.02f), A(std::size_t(H), -1.f), D(std::size_t(H), 1.f), y(x.size()),
        s(std::size_t(B * H * P * N));
    hymix::kernels::ssd_inputs<float> in;
    in.x = hymix::tensor_view<const float, 3>(x.data(), {B, H, P});
    in.dt = hymix::tensor_view<const float, 2>(dt.data(), {B, H});
    in.A = A.data();
    in.B = hymix::tensor_view<const float, 3>(bc.data(), {B, G, N}, {2 * G * N, N, 1});
    in.C = hymix::tensor_view<const float, 3>(bc.data() + G * N, {B, G, N}, {2 * G * N, N, 1});
    in.D = D.data();
    std::vector<hymix::kernels::ssd_sequence<float>> seqs;
    for (std::int64_t b = 0; b < B; ++b) seqs.push_back({b, 1, s.data() + b * H * P * N});
    for (auto _ : st) {
        hymix::kernels::ssd_step(be, in, std::span<const hymix::kernels::ssd_sequence<float>>(seqs),
                                 hymix::tensor_view<float, 3>(y.data(), {B, H, P}));
        benchmark::DoNotOptimize(y.data());
    }
    hymix::bench::report(st, double(B), double(B) * 4.0 * double(H * P * N), 8.0 * double(s.size()), be.num_threads());
}

/// Calibration in the same run: the in_proj GEMM alone (2048 × 768 → 3352) through kernels::linear, i.e. what
/// the projections can reach on the machine as loaded right now.
void BM_linear_in_proj_calibration(benchmark::State& st) {
    const auto cfg = layer_config(768);
    const std::int64_t M = st.range(0), K = cfg.d_model, Nn = cfg.d_in_proj();
    const hymix::cpu_backend be(2);
    std::vector<float> x(std::size_t(M * K), 0.5f), w(std::size_t(Nn * K), 0.25f), y(std::size_t(M * Nn));
    for (auto _ : st) {
        hymix::kernels::linear(be, hymix::tensor_view<const float, 2>(x.data(), {M, K}), hymix::tensor_view<const float, 2>(w.data(), {Nn, K}),
                               nullptr, hymix::tensor_view<float, 2>(y.data(), {M, Nn}));
        benchmark::DoNotOptimize(y.data());
    }
    hymix::bench::report(st, double(M), 2.0 * double(M * K * Nn), 4.0 * double(M * K + Nn * K + M * Nn), be.num_threads());
}

}  // namespace

BENCHMARK(BM_mamba2_prefill)
    ->ArgNames({"d", "B", "T"})
    ->ArgsProduct({{256, 768}, {1, 8}, {512, 2048}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_mamba2_decode)->ArgNames({"d", "B"})->ArgsProduct({{256, 768}, {1, 8}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_ssd_chunked_core)->ArgNames({"T", "chunk"})->ArgsProduct({{512, 2048}, {32, 64, 128, 256}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_chunked_heads)->ArgNames({"H", "T", "chunk"})->ArgsProduct({{24, 48}, {512, 2048}, {64, 256}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_chunked_subnormals)->ArgNames({"decay", "flush"})->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ssd_step_core)->ArgNames({"B", "H", "threads"})->ArgsProduct({{1, 8}, {4, 24}, {1, 2}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_linear_in_proj_calibration)->ArgName("M")->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
