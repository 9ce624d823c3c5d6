// Ops: the gated delta rule over a batch of sequences — chunked WY/UT prefill (spec.md §4.3) and the one-token
// decode step (§4.4) — and the GDN gates g = −exp(A_log)·softplus(a + dt_bias) (clamped by the decay floor) and
// β = σ(b) (×2 with negative eigenvalues) (§4.2). CPU: kernels/gated_delta.hpp. Reference: the token-by-token
// recurrence kernels::gated_delta_rule_ref in fp64 for both.
#pragma once

#include <cstdint>

#include "hymix/core/seq_batch.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct gated_delta_chunked_op {};
struct gated_delta_step_op {};
struct gdn_gates_op {};
struct gated_delta_chunk_length_op {};

/// The chunk length the backend runs the chunked gated delta rule at for heads of d_k × d_v (its own tuning; the
/// chunk changes only the rounding). A backend without a choice of its own gets 64.
template <backend B>
std::int64_t gated_delta_chunk_length(const B& be, std::int64_t d_k, std::int64_t d_v) {
    return tuning_query<gated_delta_chunk_length_op>(be, 64, d_k, d_v);
}

/// Chunked prefill. q, k [n, H_k, d_k], v [n, H_v, d_v], g, beta [n, H_v], state [S, H_v, d_k, d_v] (in/out per
/// slot), o [n, H_v, d_v]; rows outside valid sequences of o are zero.
template <backend B>
void gated_delta_chunked(const B& be, const seq_batch& batch, view_of<B, const float, 3> q, view_of<B, const float, 3> k,
                         view_of<B, const float, 3> v, view_of<B, const float, 2> g, view_of<B, const float, 2> beta,
                         float scale, view_of<B, float, 4> state, view_of<B, float, 3> o, std::int64_t chunk) {
    dispatch<gated_delta_chunked_op>(be, batch, q, k, v, g, beta, scale, state, o, chunk);
}

/// Decode step: every sequence holds exactly one token. Arguments as gated_delta_chunked.
template <backend B>
void gated_delta_step(const B& be, const seq_batch& batch, view_of<B, const float, 3> q, view_of<B, const float, 3> k,
                      view_of<B, const float, 3> v, view_of<B, const float, 2> g, view_of<B, const float, 2> beta,
                      float scale, view_of<B, float, 4> state, view_of<B, float, 3> o) {
    dispatch<gated_delta_step_op>(be, batch, q, k, v, g, beta, scale, state, o);
}

/// g[r, h] = gdn_log_decay(a[r, h], dt_bias[h], A_log[h], floor), beta[r, h] = gdn_beta(b[r, h]); [n, H_v] each.
template <backend B>
void gdn_gates(const B& be, view_of<B, const float, 2> a, view_of<B, const float, 2> b, const float* dt_bias,
               const float* A_log, float floor, bool allow_neg_eigval, view_of<B, float, 2> g, view_of<B, float, 2> beta) {
    dispatch<gdn_gates_op>(be, a, b, dt_bias, A_log, floor, allow_neg_eigval, g, beta);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::gated_delta_chunked_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const seq_batch& batch, tensor_view<const float, 3> q,
                    tensor_view<const float, 3> k, tensor_view<const float, 3> v, tensor_view<const float, 2> g,
                    tensor_view<const float, 2> beta, float scale, tensor_view<float, 4> state, tensor_view<float, 3> o,
                    std::int64_t chunk) {
        kernels::gated_delta_rule_chunked(be, batch, q, k, v, g, beta, scale, state, o, chunk);
    }
};
/// CPU: 64 (bench_gated_deltanet's BM_gdn_chunked_core, d_k = d_v = 128: 32 and 64 within noise, 128 1.3× slower).
template <class Arch>
struct op_impl<ops::gated_delta_chunk_length_op, basic_cpu_backend<Arch>> {
    static std::int64_t run(const basic_cpu_backend<Arch>&, std::int64_t, std::int64_t) { return 64; }
};
template <class Arch>
struct op_impl<ops::gated_delta_step_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const seq_batch& batch, tensor_view<const float, 3> q,
                    tensor_view<const float, 3> k, tensor_view<const float, 3> v, tensor_view<const float, 2> g,
                    tensor_view<const float, 2> beta, float scale, tensor_view<float, 4> state, tensor_view<float, 3> o) {
        kernels::gated_delta_rule_step(be, batch, q, k, v, g, beta, scale, state, o);
    }
};
template <class Arch>
struct op_impl<ops::gdn_gates_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> a, tensor_view<const float, 2> b,
                    const float* dt_bias, const float* A_log, float floor, bool neg, tensor_view<float, 2> g,
                    tensor_view<float, 2> beta) {
        const std::int64_t H = a.dim(1);
        be.parallel_for(a.dim(0), 256, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r)
                for (std::int64_t h = 0; h < H; ++h) {
                    g(r, h) = kernels::gdn_log_decay(a(r, h), dt_bias[h], A_log[h], floor);
                    beta(r, h) = kernels::gdn_beta(b(r, h), neg);
                }
        });
    }
};

namespace detail {
inline void gated_delta_reference_run(const seq_batch& batch, tensor_view<const float, 3> q, tensor_view<const float, 3> k,
                                      tensor_view<const float, 3> v, tensor_view<const float, 2> g,
                                      tensor_view<const float, 2> beta, float scale, tensor_view<float, 4> state,
                                      tensor_view<float, 3> o) {
    detail::f64_copy<3> qd(q), kd(k), vd(v), od{tensor_view<const float, 3>(o)};
    detail::f64_copy<2> gd(g), bd(beta);
    detail::f64_copy<4> sd{tensor_view<const float, 4>(state)};
    kernels::gated_delta_rule_ref<double>(batch, qd.v, kd.v, vd.v, gd.v, bd.v, static_cast<double>(scale), sd.v, od.v);
    od.store(o);
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {  // only the slots of valid sequences change
        const std::int64_t slot = batch.slots[static_cast<std::size_t>(s)];
        if (slot < 0) continue;
        detail::f64_copy<3>::for_each_index(
            std::array<std::int64_t, 3>{state.dim(1), state.dim(2), state.dim(3)},
            [&](const std::array<std::int64_t, 3>& i) { state(slot, i[0], i[1], i[2]) = static_cast<float>(sd.v(slot, i[0], i[1], i[2])); });
    }
}
}  // namespace detail

template <>
struct op_impl<ops::gated_delta_chunked_op, reference_backend> {
    static void run(const reference_backend&, const seq_batch& batch, tensor_view<const float, 3> q, tensor_view<const float, 3> k,
                    tensor_view<const float, 3> v, tensor_view<const float, 2> g, tensor_view<const float, 2> beta, float scale,
                    tensor_view<float, 4> state, tensor_view<float, 3> o, std::int64_t chunk) {
        if (chunk < 1) throw config_error("gated_delta_rule_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
        detail::gated_delta_reference_run(batch, q, k, v, g, beta, scale, state, o);
    }
};
template <>
struct op_impl<ops::gated_delta_step_op, reference_backend> {
    static void run(const reference_backend&, const seq_batch& batch, tensor_view<const float, 3> q, tensor_view<const float, 3> k,
                    tensor_view<const float, 3> v, tensor_view<const float, 2> g, tensor_view<const float, 2> beta, float scale,
                    tensor_view<float, 4> state, tensor_view<float, 3> o) {
        for (std::int64_t s = 0; s < batch.n_seq(); ++s)
            if (batch.lengths[static_cast<std::size_t>(s)] != 1)
                throw shape_error("gated_delta_rule_step: sequence " + std::to_string(s) + " has " +
                                  std::to_string(batch.lengths[static_cast<std::size_t>(s)]) + " tokens, a decode step takes exactly 1");
        detail::gated_delta_reference_run(batch, q, k, v, g, beta, scale, state, o);
    }
};
template <>
struct op_impl<ops::gdn_gates_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> a, tensor_view<const float, 2> b, const float* dt_bias,
                    const float* A_log, float floor, bool neg, tensor_view<float, 2> g, tensor_view<float, 2> beta) {
        for (std::int64_t r = 0; r < a.dim(0); ++r)
            for (std::int64_t h = 0; h < a.dim(1); ++h) {
                g(r, h) = static_cast<float>(kernels::gdn_log_decay<double>(a(r, h), dt_bias[h], A_log[h], floor));
                beta(r, h) = static_cast<float>(kernels::gdn_beta<double>(b(r, h), neg));
            }
    }
};

}  // namespace hymix
