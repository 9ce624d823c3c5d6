// Op: backward of the chunked gated delta rule (spec.md §4.1, §4.3; issue 8) — gradients w.r.t. q, k, v, the log-decay
// g, β and the initial state. CPU: kernels::gated_delta_rule_chunked_backward (chunked WY/UT backward, fp32).
// Reference: kernels::gated_delta_backward_ref in fp64 (BPTT through the token recurrence).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "hymix/core/seq_batch.hpp"
#include "hymix/kernels/gated_delta_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct gated_delta_chunked_backward_op {};

/// Gradients of gated_delta_chunked's output o w.r.t. its inputs, given d_o = dL/do [n, H_v, d_v]. q, k [n, H_k, d_k],
/// v [n, H_v, d_v], g, beta [n, H_v] and scale as the forward; state0 [S, H_v, d_k, d_v] the states the forward started
/// from (const; null = zeros). dq, dk [n, H_k, d_k] (summed over the value heads of a key head), dv, dg, dbeta and
/// dstate0 [S, H_v, d_k, d_v] are overwritten (=); any of them may be null (not needed). Rows outside valid sequences and
/// slots no sequence uses get zero gradients.
template <backend B>
void gated_delta_chunked_backward(const B& be, const seq_batch& batch, view_of<B, const float, 3> q, view_of<B, const float, 3> k,
                                  view_of<B, const float, 3> v, view_of<B, const float, 2> g, view_of<B, const float, 2> beta,
                                  float scale, view_of<B, const float, 4> state0, view_of<B, const float, 3> d_o,
                                  view_of<B, float, 3> dq, view_of<B, float, 3> dk, view_of<B, float, 3> dv, view_of<B, float, 2> dg,
                                  view_of<B, float, 2> dbeta, view_of<B, float, 4> dstate0, std::int64_t chunk) {
    dispatch<gated_delta_chunked_backward_op>(be, batch, q, k, v, g, beta, scale, state0, d_o, dq, dk, dv, dg, dbeta, dstate0, chunk);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::gated_delta_chunked_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const seq_batch& batch, tensor_view<const float, 3> q,
                    tensor_view<const float, 3> k, tensor_view<const float, 3> v, tensor_view<const float, 2> g,
                    tensor_view<const float, 2> beta, float scale, tensor_view<const float, 4> state0, tensor_view<const float, 3> d_o,
                    tensor_view<float, 3> dq, tensor_view<float, 3> dk, tensor_view<float, 3> dv, tensor_view<float, 2> dg,
                    tensor_view<float, 2> dbeta, tensor_view<float, 4> dstate0, std::int64_t chunk) {
        kernels::gated_delta_rule_chunked_backward(be, batch, q, k, v, g, beta, scale, state0, d_o, dq, dk, dv, dg, dbeta, dstate0, chunk);
    }
};

namespace detail {
/// fp64 copy of an optional view (null stays null, with the same shape).
template <std::size_t R>
struct f64_optional {
    std::optional<f64_copy<R>> c;
    tensor_view<double, R> v;
    template <class T>
    explicit f64_optional(tensor_view<T, R> src) {
        if (src.data) {
            c.emplace(src);
            v = c->v;
        } else {
            v.shape = src.shape;
        }
    }
    template <class T>
    void store(tensor_view<T, R> dst) const {
        if (dst.data) c->store(dst);
    }
};
}  // namespace detail

template <>
struct op_impl<ops::gated_delta_chunked_backward_op, reference_backend> {
    static void run(const reference_backend&, const seq_batch& batch, tensor_view<const float, 3> q, tensor_view<const float, 3> k,
                    tensor_view<const float, 3> v, tensor_view<const float, 2> g, tensor_view<const float, 2> beta, float scale,
                    tensor_view<const float, 4> state0, tensor_view<const float, 3> d_o, tensor_view<float, 3> dq,
                    tensor_view<float, 3> dk, tensor_view<float, 3> dv, tensor_view<float, 2> dg, tensor_view<float, 2> dbeta,
                    tensor_view<float, 4> dstate0, std::int64_t chunk) {
        if (chunk < 1)
            throw config_error("gated_delta_rule_chunked_backward: chunk size must be >= 1, found " + std::to_string(chunk));
        detail::f64_copy<3> qd(q), kd(k), vd(v), dod(d_o);
        detail::f64_copy<2> gd(g), bd(beta);
        detail::f64_optional<4> s0(state0), ds0{tensor_view<const float, 4>(dstate0)};
        detail::f64_optional<3> dqd{tensor_view<const float, 3>(dq)}, dkd{tensor_view<const float, 3>(dk)},
            dvd{tensor_view<const float, 3>(dv)};
        detail::f64_optional<2> dgd{tensor_view<const float, 2>(dg)}, dbd{tensor_view<const float, 2>(dbeta)};
        kernels::gated_delta_backward_ref<double>(batch, qd.v, kd.v, vd.v, gd.v, bd.v, static_cast<double>(scale),
                                                  tensor_view<const double, 4>(s0.v), dod.v, dqd.v, dkd.v, dvd.v, dgd.v, dbd.v, ds0.v);
        dqd.store(dq);
        dkd.store(dk);
        dvd.store(dv);
        dgd.store(dg);
        dbd.store(dbeta);
        ds0.store(dstate0);
    }
};

}  // namespace hymix
