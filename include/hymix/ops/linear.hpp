// Op: dense projection y[M, N] = x[M, K] · W[N, K]ᵀ (+ b), PyTorch's nn.Linear layout (spec.md §0).
// CPU: kernels::linear (register-tiled xsimd / Eigen, parallel over output columns). Reference: fp64 loops.
#pragma once

#include "hymix/kernels/linear.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct linear_op {};

/// y[M, N] = x[M, K] · w[N, K]ᵀ + bias[N] (bias may be null). x, bias, y fp32; w fp32, bf16 or f16 (16-bit weights
/// are widened exactly and every product and sum is fp32: the f32 result on w's widened values, same bits). Unit
/// inner strides. Throws shape_error on mismatched shapes.
template <backend B>
void linear(const B& be, view_of<B, const float, 2> x, view_of<B, const float, 2> w, const float* bias,
            view_of<B, float, 2> y) {
    dispatch<linear_op>(be, x, w, bias, y);
}
template <backend B>
void linear(const B& be, view_of<B, const float, 2> x, view_of<B, const bf16, 2> w, const float* bias,
            view_of<B, float, 2> y) {
    dispatch<linear_op>(be, x, w, bias, y);
}
template <backend B>
void linear(const B& be, view_of<B, const float, 2> x, view_of<B, const f16, 2> w, const float* bias,
            view_of<B, float, 2> y) {
    dispatch<linear_op>(be, x, w, bias, y);
}

/// An 8-bit weight with per-row scales (host memory): y = scale[n] · (x · qᵀ)[:, n] + bias[n] (see q8_view).
template <host_backend B>
void linear(const B& be, view_of<B, const float, 2> x, q8_view w, const float* bias, view_of<B, float, 2> y) {
    dispatch<linear_op>(be, x, w, bias, y);
}

/// The same with a host linear_weight, read as it is stored (f32, bf16, f16 or i8): the f32 overload's result on the
/// stored values (i8: the q8_view overload). Throws shape_error on mismatched shapes, and value_error where the
/// backend's op_impl does not take the weight's storage.
/// (W is deduced so that a tensor<float> argument still picks the f32 overload without ambiguity.)
template <host_backend B, std::same_as<linear_weight> W>
void linear(const B& be, view_of<B, const float, 2> x, const W& w, const float* bias, view_of<B, float, 2> y) {
    // A backend that runs some storages only (see runs_op) gets value_error for the others, not a compile error.
    using X = view_of<B, const float, 2>;
    using Y = view_of<B, float, 2>;
    w.template visit_stored<2>([&]<class V>(V wv) requires dispatchable_op<linear_op, B, X, V, const float*, Y> {
        dispatch<linear_op>(be, x, wv, bias, y);
    });
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::linear_op, basic_cpu_backend<Arch>> {
    template <kernels::linear_weight_type TW>
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> x, tensor_view<const TW, 2> w,
                    const float* bias, tensor_view<float, 2> y) {
        kernels::linear_typed<TW>(be, x, w, bias, y);
    }
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> x, q8_view w, const float* bias,
                    tensor_view<float, 2> y) {
        kernels::linear_q8(be, x, w, bias, y);
    }
};

template <>
struct op_impl<ops::linear_op, reference_backend> {
    template <kernels::linear_weight_type TW>
    static void run(const reference_backend&, tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias,
                    tensor_view<float, 2> y) {
        const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
        w.require_shape({N, K}, "linear: weight");
        y.require_shape({M, N}, "linear: output");
        kernels::linear_ref<float, TW, float, float>(x, w, bias, y);
    }
    static void run(const reference_backend&, tensor_view<const float, 2> x, q8_view w, const float* bias, tensor_view<float, 2> y) {
        const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
        w.q.require_shape({N, K}, "linear: weight");
        y.require_shape({M, N}, "linear: output");
        kernels::linear_q8_ref<float, float>(x, w, bias, y);
    }
};

}  // namespace hymix
