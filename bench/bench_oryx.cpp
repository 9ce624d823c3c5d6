// Oryx layer speed per read-out (issue 10; spec.md §6.6), beside the single-mixer layers of the same width: decode
// steps at a context of n tokens (1K–64K) read out linearly or by attention (a decode step is one or the other, under
// any schedule), and prefill of T tokens under all-linear, all-attention and periodic (one block of 128 in 8 attends)
// schedules, for the Oryx-GDN and Oryx-Mamba-2 layers (d 256, 4 heads × 64), and the
// attention (4 heads × 64) and Gated DeltaNet (4/4 heads × 64) layers. Contexts are filled outside the timed loop
// (Oryx: a linear-mode prefill, which fills the KV cache too); each timed decode step is rolled back off the KV cache
// so the context stays n. Tokens/s is the figure to compare; FLOPs and bytes count the per-token work of spec.md
// §6.6 (attention rows: 4·n·H·d_h FLOPs and the KV bytes read).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/mixer/oryx.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "peak.hpp"

namespace {

constexpr std::int64_t D = 256, H = 4, DH = 64;

hymix::oryx_config oryx_cfg(bool gdn) {
    hymix::oryx_config c;
    c.d_model = D;
    c.n_heads = H;
    c.head_dim = DH;
    c.linear = gdn ? hymix::oryx_linear_kind::gdn : hymix::oryx_linear_kind::mamba2;
    return c;
}

/// Modes of T rows starting at position p0: 0 all linear, 1 all attention, 2 periodic (block 128, every 8th).
std::vector<unsigned char> modes_of(int schedule, std::int64_t p0, std::int64_t T) {
    std::vector<unsigned char> m(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t)
        m[static_cast<std::size_t>(t)] = schedule == 0 ? 0 : schedule == 1 ? 1 : (((p0 + t) / 128) % 8 == 0 ? 1 : 0);
    return m;
}

/// Per-token FLOPs of the Oryx layer (spec.md §6.6): the projections every row needs (q_l, k, v, g, the gate rows:
/// GDN a and b, Mamba-2 dt) and W_O, the linear state update (GDN ≈ 5·H·d_h², Mamba-2 ≈ 3·H·d_h²), then the read-out:
/// attention rows add q_a (2·d·H·d_h) and 4·n·H·d_h over a context of n, linear rows 2·H·d_h².
double oryx_token_flops(bool gdn, bool attention_row, std::int64_t n_ctx) {
    const double d = D, hd = H * DH;
    const double proj = 2.0 * d * hd * 5.0 + 2.0 * d * (gdn ? 2.0 : 1.0) * H;
    const double state = (gdn ? 5.0 : 3.0) * H * DH * DH;
    return proj + state + (attention_row ? 2.0 * d * hd + 4.0 * static_cast<double>(n_ctx) * hd : 2.0 * H * DH * DH);
}

/// Bytes one decode step reads and writes: the weight matrices it uses (q_l, k, v, g, W_O, + q_a on attention rows;
/// the gate rows), the linear state read and written, and the KV cache read by an attention row (n keys and values).
double oryx_step_bytes(bool gdn, bool attention_row, std::int64_t n_ctx) {
    const double hd = H * DH, mats = attention_row ? 6.0 : 5.0;
    return 4.0 * (mats * D * hd + (gdn ? 2.0 : 1.0) * H * D + 2.0 * H * DH * DH + (attention_row ? 2.0 * static_cast<double>(n_ctx) * hd : 0.0));
}

// Args: instance (1 GDN, 0 Mamba-2), read-out of the step (0 linear, 1 attention), context n.
void BM_oryx_decode(benchmark::State& st) {
    const bool gdn = st.range(0) != 0;
    const int schedule = static_cast<int>(st.range(1));
    const std::int64_t n = st.range(2);
    const auto c = oryx_cfg(gdn);
    hymix::cpu_backend be;
    const hymix::oryx m(c, hymix::oryx_weights::random(c, 1));
    auto state = m.make_state(1);
    {  // fill the context in linear mode, in chunks of 4096
        const auto x = hymix::bench::random_vec(static_cast<std::size_t>(4096 * D), 2);
        std::vector<float> y(x.size());
        for (std::int64_t t0 = 0; t0 < n; t0 += 4096) {
            const std::int64_t len = std::min<std::int64_t>(4096, n - t0);
            const auto modes = modes_of(0, t0, len);
            m.forward(be, state, hymix::seq_batch::dense(1, len), hymix::tensor_view<const float, 2>(x.data(), {len, D}),
                      hymix::tensor_view<float, 2>(y.data(), {len, D}), modes);
        }
    }
    state.kv.reserve(n + 1);  // room for the step's token: no growth of the cache inside the timed loop
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(D), 3);
    std::vector<float> y(x.size());
    const auto mode = modes_of(schedule, n, 1);
    const auto batch = hymix::seq_batch::decode(std::vector<std::int64_t>{0});
    for (auto _ : st) {
        m.step(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {1, D}), hymix::tensor_view<float, 2>(y.data(), {1, D}), mode);
        state.kv.set_length(0, n);  // keep the context at n
        benchmark::DoNotOptimize(y.data());
    }
    const bool att = mode[0] != 0;
    hymix::bench::report(st, 1.0, oryx_token_flops(gdn, att, n), oryx_step_bytes(gdn, att, n), be.num_threads());
}

// Args: instance, schedule, T. Prefill of T tokens from an empty state.
void BM_oryx_prefill(benchmark::State& st) {
    const bool gdn = st.range(0) != 0;
    const int schedule = static_cast<int>(st.range(1));
    const std::int64_t T = st.range(2);
    const auto c = oryx_cfg(gdn);
    hymix::cpu_backend be;
    const hymix::oryx m(c, hymix::oryx_weights::random(c, 1));
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(T * D), 4);
    std::vector<float> y(x.size());
    const auto modes = modes_of(schedule, 0, T);
    const auto batch = hymix::seq_batch::dense(1, T);
    double flops = 0;
    for (std::int64_t t = 0; t < T; ++t) flops += oryx_token_flops(gdn, modes[static_cast<std::size_t>(t)] != 0, t + 1);  // causal: t + 1 keys
    for (auto _ : st) {
        st.PauseTiming();
        auto state = m.make_state(1);
        st.ResumeTiming();
        m.forward(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {T, D}), hymix::tensor_view<float, 2>(y.data(), {T, D}), modes);
        benchmark::DoNotOptimize(y.data());
    }
    hymix::bench::report(st, static_cast<double>(T), flops, 4.0 * 2.0 * static_cast<double>(T) * D, be.num_threads());
}

hymix::attention_config attn_cfg() {
    hymix::attention_config c;
    c.d_model = D;
    c.n_heads = H;
    c.n_kv_heads = H;
    c.head_dim = DH;
    return c;
}

hymix::gated_deltanet_config gdn_cfg() {
    hymix::gated_deltanet_config c;
    c.d_model = D;
    c.n_k_heads = c.n_v_heads = H;
    c.d_k = c.d_v = DH;
    return c;
}

// Args: context n. The attention layer's decode step at context n (the context is prefilled once, in chunks).
void BM_attention_decode(benchmark::State& st) {
    const std::int64_t n = st.range(0);
    const auto c = attn_cfg();
    hymix::cpu_backend be;
    const hymix::attention m(c, hymix::attention_weights::random(c, 1));
    auto state = m.make_state(1);
    {
        const auto x = hymix::bench::random_vec(static_cast<std::size_t>(4096 * D), 2);
        std::vector<float> y(x.size());
        for (std::int64_t t0 = 0; t0 < n; t0 += 4096) {
            const std::int64_t len = std::min<std::int64_t>(4096, n - t0);
            m.forward(be, state, hymix::seq_batch::dense(1, len), hymix::tensor_view<const float, 2>(x.data(), {len, D}),
                      hymix::tensor_view<float, 2>(y.data(), {len, D}));
        }
    }
    state.reserve(n + 1);  // room for the step's token: no growth of the cache inside the timed loop
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(D), 3);
    std::vector<float> y(x.size());
    const auto batch = hymix::seq_batch::decode(std::vector<std::int64_t>{0});
    for (auto _ : st) {
        m.step(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {1, D}), hymix::tensor_view<float, 2>(y.data(), {1, D}));
        state.set_length(0, n);
        benchmark::DoNotOptimize(y.data());
    }
    const double hd = H * DH;
    hymix::bench::report(st, 1.0, 2.0 * D * hd * 4.0 + 4.0 * static_cast<double>(n) * hd, 4.0 * (4.0 * D * hd + 2.0 * static_cast<double>(n) * hd),
                         be.num_threads());
}

// The Gated DeltaNet layer's decode step (constant in the context).
void BM_gdn_decode(benchmark::State& st) {
    const auto c = gdn_cfg();
    hymix::cpu_backend be;
    const hymix::gated_deltanet m(c, hymix::gated_deltanet_weights::random(c, 1));
    auto state = m.make_state(1);
    const auto x = hymix::bench::random_vec(static_cast<std::size_t>(D), 3);
    std::vector<float> y(x.size());
    const auto batch = hymix::seq_batch::decode(std::vector<std::int64_t>{0});
    for (auto _ : st) {
        m.step(be, state, batch, hymix::tensor_view<const float, 2>(x.data(), {1, D}), hymix::tensor_view<float, 2>(y.data(), {1, D}));
        benchmark::DoNotOptimize(y.data());
    }
    // The GDN layer: q, k, v, z, W_O and the a, b rows; the same state update and read-out as Oryx-GDN's linear rows.
    hymix::bench::report(st, 1.0, oryx_token_flops(true, false, 0), oryx_step_bytes(true, false, 0), be.num_threads());
}

}  // namespace

BENCHMARK(BM_oryx_decode)
    ->ArgNames({"gdn", "schedule", "n"})
    ->ArgsProduct({{1, 0}, {0, 1}, {1024, 4096, 16384, 65536}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_decode)->ArgNames({"n"})->Arg(1024)->Arg(4096)->Arg(16384)->Arg(65536)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gdn_decode)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_oryx_prefill)
    ->ArgNames({"gdn", "schedule", "T"})
    ->ArgsProduct({{1, 0}, {0, 1, 2}, {1024, 4096}})
    ->Unit(benchmark::kMillisecond);
