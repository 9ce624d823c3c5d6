// Ops: backward of the RMSNorms of spec.md §1 — rows (plain / zero-centred), per head (qk-norm) and the grouped
// gated norm in both orders. CPU: kernels/norm_backward.hpp (xsimd, fixed row blocks, deterministic dw).
// Reference: the fp64 twins on fp64 copies of the views.
#pragma once

#include <cstdint>
#include <vector>

#include "hymix/kernels/norm_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct rms_norm_backward_op {};
struct rms_norm_heads_backward_op {};
struct gated_rms_norm_backward_op {};

/// Backward of ops::rms_norm. x [M, d] is the forward's input, dy [M, d] the upstream gradient; dx [M, d] is
/// overwritten (may be dy itself); dw [d] accumulated (or null). Unit inner strides, any row strides.
template <backend B>
void rms_norm_backward(const B& be, view_of<B, const float, 2> x, const float* w, float eps, kernels::rms_flavor flavor,
                       view_of<B, const float, 2> dy, view_of<B, float, 2> dx, float* dw) {
    dispatch<rms_norm_backward_op>(be, x, w, eps, flavor, dy, dx, dw);
}

/// Backward of ops::rms_norm_heads. x_in [n, H, d_h] is the input before the in-place forward; dy [n, H, d_h];
/// dx [n, H, d_h] overwritten (may be dy itself); dw [d_h] accumulated (or null). Unit stride along d_h.
template <backend B>
void rms_norm_heads_backward(const B& be, view_of<B, const float, 3> x_in, const float* w, float eps, kernels::rms_flavor flavor,
                             view_of<B, const float, 3> dy, view_of<B, float, 3> dx, float* dw) {
    dispatch<rms_norm_heads_backward_op>(be, x_in, w, eps, flavor, dy, dx, dw);
}

/// Backward of ops::gated_rms_norm. y, z [M, G, gs] are the forward's inputs, dout [M, G, gs] the upstream
/// gradient; dy, dz [M, G, gs] are overwritten (dy may be dout itself); dw (w_len = G·gs or gs entries, as w)
/// accumulated (or null). Unit stride along gs, any other strides (the forward's rules).
template <backend B>
void gated_rms_norm_backward(const B& be, view_of<B, const float, 3> y, view_of<B, const float, 3> z, const float* w,
                             std::int64_t w_len, kernels::gate_order order, float eps, view_of<B, const float, 3> dout,
                             view_of<B, float, 3> dy, view_of<B, float, 3> dz, float* dw) {
    dispatch<gated_rms_norm_backward_op>(be, y, z, w, w_len, order, eps, dout, dy, dz, dw);
}

}  // namespace ops

namespace detail {
/// dw as fp64 (zeros when null) and its write-back (+= already applied by the reference).
inline void store_f64(const std::vector<double>& src, float* dst) {
    for (std::size_t i = 0; dst && i < src.size(); ++i) dst[i] = static_cast<float>(src[i]);
}
}  // namespace detail

template <class Arch>
struct op_impl<ops::rms_norm_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> x, const float* w, float eps,
                    kernels::rms_flavor flavor, tensor_view<const float, 2> dy, tensor_view<float, 2> dx, float* dw) {
        kernels::rms_norm_backward(be, x, w, eps, flavor, dy, dx, dw);
    }
};

template <class Arch>
struct op_impl<ops::rms_norm_heads_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 3> x_in, const float* w, float eps,
                    kernels::rms_flavor flavor, tensor_view<const float, 3> dy, tensor_view<float, 3> dx, float* dw) {
        kernels::rms_norm_heads_backward(be, x_in, w, eps, flavor, dy, dx, dw);
    }
};

template <class Arch>
struct op_impl<ops::gated_rms_norm_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 3> y, tensor_view<const float, 3> z, const float* w,
                    std::int64_t w_len, kernels::gate_order order, float eps, tensor_view<const float, 3> dout,
                    tensor_view<float, 3> dy, tensor_view<float, 3> dz, float* dw) {
        kernels::gated_rms_norm_backward(be, y, z, w, w_len, order, eps, dout, dy, dz, dw);
    }
};

template <>
struct op_impl<ops::rms_norm_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> x, const float* w, float eps, kernels::rms_flavor flavor,
                    tensor_view<const float, 2> dy, tensor_view<float, 2> dx, float* dw) {
        kernels::detail::check_rms_norm_backward("rms_norm_backward", x, w, static_cast<double>(eps), flavor, dy, dx, dw);
        const std::int64_t d = x.dim(1);
        detail::f64_copy<2> xd(x), dyd(dy), dxd(dx);
        const auto wd = detail::f64_vector(w, d);
        auto dwd = dw ? detail::f64_vector(dw, d) : std::vector<double>();
        kernels::rms_norm_backward_ref<double>(xd.v, wd.data(), eps, flavor, dyd.v, dxd.v, dw ? dwd.data() : nullptr);
        dxd.store(dx);
        detail::store_f64(dwd, dw);
    }
};

template <>
struct op_impl<ops::rms_norm_heads_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 3> x_in, const float* w, float eps, kernels::rms_flavor flavor,
                    tensor_view<const float, 3> dy, tensor_view<float, 3> dx, float* dw) {
        dy.require_shape(x_in.shape, "rms_norm_heads_backward", "dy");
        dx.require_shape(x_in.shape, "rms_norm_heads_backward", "dx");
        const std::int64_t d = x_in.dim(2);
        detail::f64_copy<3> xd(x_in), dyd(dy), dxd(dx);
        const auto wd = detail::f64_vector(w, d);
        auto dwd = dw ? detail::f64_vector(dw, d) : std::vector<double>();
        for (std::int64_t n = 0; n < x_in.dim(0); ++n)
            kernels::rms_norm_backward_ref<double>(xd.v[n], wd.data(), eps, flavor, dyd.v[n], dxd.v[n], dw ? dwd.data() : nullptr);
        dxd.store(dx);
        detail::store_f64(dwd, dw);
    }
};

template <>
struct op_impl<ops::gated_rms_norm_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 3> y, tensor_view<const float, 3> z, const float* w,
                    std::int64_t w_len, kernels::gate_order order, float eps, tensor_view<const float, 3> dout,
                    tensor_view<float, 3> dy, tensor_view<float, 3> dz, float* dw) {
        kernels::detail::check_gated_rms_norm_backward(y, z, w, w_len, order, static_cast<double>(eps), dout, dy, dz, dw);
        detail::f64_copy<3> yd(y), zd(z), dod(dout), dyd(dy), dzd(dz);
        const auto wd = detail::f64_vector(w, w_len);
        auto dwd = dw ? detail::f64_vector(dw, w_len) : std::vector<double>();
        kernels::gated_rms_norm_backward_ref<double>(yd.v, zd.v, wd.data(), w_len, order, eps, dod.v, dyd.v, dzd.v,
                                                     dw ? dwd.data() : nullptr);
        dyd.store(dy);
        dzd.store(dz);
        detail::store_f64(dwd, dw);
    }
};

}  // namespace hymix
