// Op: the SwiGLU MLP y = W_down(silu(W_gate x) ⊙ W_up x) (spec.md §1). CPU: kernels::swiglu (fused gate|up
// projection, then the down projection). Reference: kernels::swiglu_ref in fp64.
#pragma once

#include "hymix/kernels/swiglu.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct swiglu_op {};

/// x [M, d] → y [M, d]; gu [M, 2·d_ff] is scratch (the CPU path's gate|up activations). w must be prepared.
template <backend B>
void swiglu(const B& be, const swiglu_weights& w, view_of<B, const float, 2> x, view_of<B, float, 2> gu,
            view_of<B, float, 2> y) {
    dispatch<swiglu_op>(be, w, x, gu, y);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::swiglu_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const swiglu_weights& w, tensor_view<const float, 2> x,
                    tensor_view<float, 2> gu, tensor_view<float, 2> y) {
        kernels::swiglu(be, w, x, gu, y);
    }
};

template <>
struct op_impl<ops::swiglu_op, reference_backend> {
    static void run(const reference_backend&, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2>,
                    tensor_view<float, 2> y) {
        kernels::detail::require_swiglu_args(w, x, {}, y, "swiglu", false);
        kernels::swiglu_ref(w, x, y);
    }
};

}  // namespace hymix
