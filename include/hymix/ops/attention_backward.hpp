// Op: backward of causal softmax attention over a batch of independent problems (spec.md §2; GQA, bottom-right causal
// mask, sliding window): dq, dk, dv from q, k, v, the forward's o and LSE and the upstream gradient do.
// CPU: kernels::attention_prefill_backward (flash-attention-2 style tiles, recomputed probabilities).
// Reference: kernels::attention_backward_ref<double> (softmax recomputed per row, plain fp64 loops).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/kernels/attention_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct attention_prefill_backward_op {};

/// Every problem's dq, dk, dv (overwritten; dk, dv summed over the query heads of each KV head; a null view is skipped)
/// from its q, k, v, o, lse and do. Same problems and params as the forward attention_prefill call.
template <backend B>
void attention_prefill_backward(const B& be, std::span<const kernels::attention_backward_problem<float>> problems,
                                const kernels::attention_params& prm) {
    dispatch<attention_prefill_backward_op>(be, problems, prm);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::attention_prefill_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, std::span<const kernels::attention_backward_problem<float>> ps,
                    const kernels::attention_params& prm) {
        kernels::attention_prefill_backward(be, ps, prm);
    }
};

template <>
struct op_impl<ops::attention_prefill_backward_op, reference_backend> {
    static void run(const reference_backend&, std::span<const kernels::attention_backward_problem<float>> ps,
                    const kernels::attention_params& prm) {
        const char* who = "attention_prefill_backward (reference)";
        kernels::detail::attention_check_params(prm, who);
        for (const auto& p : ps) kernels::detail::attention_backward_check(p, who);
        for (const auto& p : ps) {
            detail::f64_copy<3> q(p.q), k(p.k), v(p.v), o(p.o), d_o(p.dout);
            detail::f64_copy<2> lse(p.lse);
            // Gradient buffers: fp64 copies of the outputs' shapes (contents are overwritten by the reference).
            detail::f64_copy<3> dq{tensor_view<const float, 3>(p.dq.data ? p.dq : tensor_view<float, 3>())};
            detail::f64_copy<3> dk{tensor_view<const float, 3>(p.dk.data ? p.dk : tensor_view<float, 3>())};
            detail::f64_copy<3> dv{tensor_view<const float, 3>(p.dv.data ? p.dv : tensor_view<float, 3>())};
            kernels::attention_backward_problem<double> d;
            d.q = q.v;
            d.k = k.v;
            d.v = v.v;
            d.o = o.v;
            d.lse = lse.v;
            d.dout = d_o.v;
            if (p.dq.data) d.dq = dq.v;
            if (p.dk.data) d.dk = dk.v;
            if (p.dv.data) d.dv = dv.v;
            kernels::attention_backward_ref(d, prm);
            if (p.dq.data) dq.store(p.dq);
            if (p.dk.data) dk.store(p.dk);
            if (p.dv.data) dv.store(p.dv);
        }
    }
};

}  // namespace hymix
