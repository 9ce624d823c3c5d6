// Ops: Mamba-2 SSD over a batch of sequences — the chunked prefill (spec.md §3.3) and the one-token decode step
// (§3.4) — plus the Δ preparation Δ = clamp(softplus(dt + dt_bias), lo, hi) (§3.2 step 4). CPU: kernels/ssd.hpp.
// Reference: the token-by-token recurrence kernels::ssd_ref in fp64 for both (the chunk size changes cost only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/core/math.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct ssd_chunked_op {};
struct ssd_step_op {};
struct ssd_delta_op {};
struct ssd_chunk_length_op {};

/// The chunk length Q the backend runs the chunked SSD at for heads of head_dim P and d_state N (its own tuning,
/// not a checkpoint's chunk_size: Q changes only the rounding). A backend without a choice of its own gets 64.
template <backend B>
std::int64_t ssd_chunk_length(const B& be, std::int64_t head_dim, std::int64_t d_state) {
    return tuning_query<ssd_chunk_length_op>(be, 64, head_dim, d_state);
}

/// Chunked SSD prefill: y [R, H, P] for the rows of every sequence (other rows untouched); states in place.
template <backend B>
void ssd_chunked(const B& be, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_sequence<float>> seqs,
                 std::int64_t chunk, view_of<B, float, 3> y) {
    dispatch<ssd_chunked_op>(be, in, seqs, chunk, y);
}

/// SSD decode step: every sequence holds exactly one token (shape_error otherwise).
template <backend B>
void ssd_step(const B& be, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_sequence<float>> seqs,
              view_of<B, float, 3> y) {
    dispatch<ssd_step_op>(be, in, seqs, y);
}

/// delta[r, h] = clamp(softplus(raw[r, h] + bias[h]), lo, hi); raw any row stride, unit inner stride.
template <backend B>
void ssd_delta(const B& be, view_of<B, const float, 2> raw, const float* bias, float lo, float hi, view_of<B, float, 2> delta) {
    dispatch<ssd_delta_op>(be, raw, bias, lo, hi, delta);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::ssd_chunked_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const kernels::ssd_inputs<float>& in,
                    std::span<const kernels::ssd_sequence<float>> seqs, std::int64_t chunk, tensor_view<float, 3> y) {
        kernels::ssd_chunked(be, in, seqs, chunk, y);
    }
};
/// CPU: 64 (measured in bench_mamba2's BM_ssd_chunked_core for the 130M/780M head layout, P 64, N 128: Q 64 and 128
/// within 5% of each other, 256 — the checkpoints' value — 1.3× slower, 32 no faster; smaller Q also keeps the C·Bᵀ
/// blocks and the per-chunk scratch in L1/L2).
template <class Arch>
struct op_impl<ops::ssd_chunk_length_op, basic_cpu_backend<Arch>> {
    static std::int64_t run(const basic_cpu_backend<Arch>&, std::int64_t, std::int64_t) { return 64; }
};
template <class Arch>
struct op_impl<ops::ssd_step_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const kernels::ssd_inputs<float>& in,
                    std::span<const kernels::ssd_sequence<float>> seqs, tensor_view<float, 3> y) {
        kernels::ssd_step(be, in, seqs, y);
    }
};
template <class Arch>
struct op_impl<ops::ssd_delta_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> raw, const float* bias, float lo, float hi,
                    tensor_view<float, 2> delta) {
        delta.require_shape(raw.shape, "ssd_delta", "delta");
        const std::int64_t H = raw.dim(1);
        be.parallel_for(raw.dim(0), 256, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r)
                for (std::int64_t h = 0; h < H; ++h) delta(r, h) = std::clamp(softplus(raw(r, h) + bias[h]), lo, hi);
        });
    }
};

namespace detail {
/// The SSD of every sequence by the fp64 recurrence; states and outputs rounded back to fp32.
inline void ssd_reference_run(const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_sequence<float>> seqs,
                              tensor_view<float, 3> y, const char* who) {
    kernels::detail::ssd_check(in, seqs, y, who);
    const std::int64_t H = in.n_heads(), P = in.head_dim();
    detail::f64_copy<3> x(in.x), Bm(in.B), Cm(in.C), yd{tensor_view<const float, 3>(y)};
    detail::f64_copy<2> dt(in.dt);
    const auto A = detail::f64_vector(in.A, H);
    const auto D = detail::f64_vector(in.D, in.D_per_channel ? H * P : H);
    kernels::ssd_inputs<double> din;
    din.x = x.v;
    din.dt = dt.v;
    din.A = A.data();
    din.B = Bm.v;
    din.C = Cm.v;
    din.D = in.D ? D.data() : nullptr;
    din.D_per_channel = in.D_per_channel;
    const std::int64_t S = H * P * in.d_state();
    for (const auto& s : seqs) {
        std::vector<double> st = s.state ? detail::f64_vector(s.state, S) : std::vector<double>(static_cast<std::size_t>(S), 0.0);
        kernels::ssd_ref(din, kernels::ssd_sequence<double>{s.start, s.length, st.data()}, yd.v);
        if (s.state)
            for (std::int64_t i = 0; i < S; ++i) s.state[i] = static_cast<float>(st[static_cast<std::size_t>(i)]);
        for (std::int64_t t = s.start; t < s.start + s.length; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t p = 0; p < P; ++p) y(t, h, p) = static_cast<float>(yd.v(t, h, p));
    }
}
}  // namespace detail

template <>
struct op_impl<ops::ssd_chunked_op, reference_backend> {
    static void run(const reference_backend&, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_sequence<float>> seqs,
                    std::int64_t chunk, tensor_view<float, 3> y) {
        if (chunk < 1) throw config_error("ssd_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
        detail::ssd_reference_run(in, seqs, y, "ssd_chunked (reference)");
    }
};
template <>
struct op_impl<ops::ssd_step_op, reference_backend> {
    static void run(const reference_backend&, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_sequence<float>> seqs,
                    tensor_view<float, 3> y) {
        for (std::size_t s = 0; s < seqs.size(); ++s)
            if (seqs[s].length != 1)
                throw shape_error("ssd_step: sequence " + std::to_string(s) + " has " + std::to_string(seqs[s].length) +
                                  " tokens, the decode step takes exactly 1");
        detail::ssd_reference_run(in, seqs, y, "ssd_step (reference)");
    }
};
template <>
struct op_impl<ops::ssd_delta_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> raw, const float* bias, float lo, float hi,
                    tensor_view<float, 2> delta) {
        delta.require_shape(raw.shape, "ssd_delta", "delta");
        for (std::int64_t r = 0; r < raw.dim(0); ++r)
            for (std::int64_t h = 0; h < raw.dim(1); ++h)
                delta(r, h) = static_cast<float>(std::clamp(softplus(static_cast<double>(raw(r, h)) + bias[h]), double(lo), double(hi)));
    }
};

}  // namespace hymix
