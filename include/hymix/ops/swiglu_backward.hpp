// Ops: the SwiGLU MLP's training forward (keeps the gate|up pre-activations) and its backward (spec.md §1).
// CPU: kernels/swiglu_backward.hpp (GEMMs over fixed blocks, deterministic). Reference: fp64 twins on fp64 copies.
#pragma once

#include <cstdint>
#include <string>

#include "hymix/kernels/swiglu_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct swiglu_train_op {};
struct swiglu_backward_op {};

/// Training forward of the SwiGLU MLP: y [M, d] as ops::swiglu, and gu [M, 2·d_ff] = [x W_gateᵀ | x W_upᵀ], the
/// pre-activations (gate in the first d_ff columns, up in the last), which swiglu_backward reads. (ops::swiglu leaves
/// silu(g) ⊙ u over the gate half of its scratch, so it cannot feed the backward.) w must be prepared.
template <backend B>
void swiglu_train(const B& be, const swiglu_weights& w, view_of<B, const float, 2> x, view_of<B, float, 2> gu, view_of<B, float, 2> y) {
    dispatch<swiglu_train_op>(be, w, x, gu, y);
}

/// Backward of the SwiGLU MLP. x [M, d] is the forward's input, gu [M, 2·d_ff] its pre-activations (swiglu_train),
/// dy [M, d] the upstream gradient; dx [M, d] is overwritten; g.gate_proj, g.up_proj and g.down_proj (shaped as w's,
/// e.g. from zero tensors) are accumulated (+=). Allocates two [M, d_ff] fp32 buffers internally.
template <backend B>
void swiglu_backward(const B& be, const swiglu_weights& w, view_of<B, const float, 2> x, view_of<B, const float, 2> gu,
                     view_of<B, const float, 2> dy, view_of<B, float, 2> dx, swiglu_weights& g) {
    dispatch<swiglu_backward_op>(be, w, x, gu, dy, dx, g);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::swiglu_train_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2> gu,
                    tensor_view<float, 2> y) {
        kernels::swiglu_train(be, w, x, gu, y);
    }
};

template <class Arch>
struct op_impl<ops::swiglu_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const swiglu_weights& w, tensor_view<const float, 2> x,
                    tensor_view<const float, 2> gu, tensor_view<const float, 2> dy, tensor_view<float, 2> dx, swiglu_weights& g) {
        kernels::swiglu_backward(be, w, x, gu, dy, dx, g);
    }
};

template <>
struct op_impl<ops::swiglu_train_op, reference_backend> {
    static void run(const reference_backend&, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2> gu,
                    tensor_view<float, 2> y) {
        constexpr const char* who = "swiglu_train";
        const std::int64_t F = kernels::detail::check_swiglu_weights(w, x.dim(1), -1, std::string(who) + ": weights");
        kernels::detail::check_swiglu_views<float>(who, x, F, gu, nullptr, y, "y");
        detail::f64_copy<2> xd(x), wg(w.gate_proj.view<2>()), wu(w.up_proj.view<2>()), wd(w.down_proj.view<2>()), gud(gu), yd(y);
        kernels::swiglu_train_ref<double>(xd.v, wg.v, wu.v, wd.v, gud.v, yd.v);
        gud.store(gu);
        yd.store(y);
    }
};

template <>
struct op_impl<ops::swiglu_backward_op, reference_backend> {
    static void run(const reference_backend&, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<const float, 2> gu,
                    tensor_view<const float, 2> dy, tensor_view<float, 2> dx, swiglu_weights& g) {
        constexpr const char* who = "swiglu_backward";
        const std::int64_t d = x.dim(1);
        const std::int64_t F = kernels::detail::check_swiglu_weights(w, d, -1, std::string(who) + ": weights");
        kernels::detail::check_swiglu_weights(g, d, F, std::string(who) + ": gradient");
        kernels::detail::check_swiglu_views<float>(who, x, F, gu, &dy, dx, "dx");
        detail::f64_copy<2> xd(x), wg(w.gate_proj.view<2>()), wu(w.up_proj.view<2>()), wd(w.down_proj.view<2>()), dyd(dy), dxd(dx);
        detail::f64_copy<2> dwg(g.gate_proj.view<2>()), dwu(g.up_proj.view<2>()), dwd(g.down_proj.view<2>());
        kernels::swiglu_backward_ref<double>(xd.v, wg.v, wu.v, wd.v, dyd.v, dxd.v, dwg.v, dwu.v, dwd.v);
        dxd.store(dx);
        dwg.store(g.gate_proj.view<2>());
        dwu.store(g.up_proj.view<2>());
        dwd.store(g.down_proj.view<2>());
    }
};

}  // namespace hymix
