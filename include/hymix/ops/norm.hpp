// Ops: RMSNorm over rows (plain or zero-centred, spec.md §1), RMSNorm of every head of a [N, H, d_h] tensor in
// place (qk-norm), and the gated RMSNorm over groups (Mamba-2 gate-then-norm per group, GDN norm-then-gate per
// head, spec.md §3.2 step 6, §4.2). CPU: kernels/norm.hpp, parallel over rows. Reference: fp64 loops.
#pragma once

#include <algorithm>
#include <vector>

#include "hymix/kernels/norm.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct rms_norm_op {};
struct rms_norm_heads_op {};
struct gated_rms_norm_op {};

/// y[M, d] = norm(x[M, d]) with weight w[d]; y may alias x. Unit inner strides.
template <backend B>
void rms_norm(const B& be, view_of<B, const float, 2> x, const float* w, float eps, kernels::rms_flavor flavor,
              view_of<B, float, 2> y) {
    dispatch<rms_norm_op>(be, x, w, eps, flavor, y);
}

/// In place: every head row x[n, h, :] (d_h long, unit stride) ← norm(x[n, h, :]) with weight w[d_h] (qk-norm).
template <backend B>
void rms_norm_heads(const B& be, view_of<B, float, 3> x, const float* w, float eps, kernels::rms_flavor flavor) {
    dispatch<rms_norm_heads_op>(be, x, w, eps, flavor);
}

/// out[m, g, :] = gated RMSNorm of y[m, g, :] with gate z[m, g, :] over each group of gs channels (unit stride
/// along gs, any other strides). w has G·gs entries (per channel, group g uses w + g·gs) or gs (shared): w_len says
/// which. out may alias y.
template <backend B>
void gated_rms_norm(const B& be, view_of<B, const float, 3> y, view_of<B, const float, 3> z, const float* w,
                    std::int64_t w_len, kernels::gate_order order, float eps, view_of<B, float, 3> out) {
    dispatch<gated_rms_norm_op>(be, y, z, w, w_len, order, eps, out);
}

}  // namespace ops

namespace detail {
inline void check_gated_norm_args(const tensor_view<const float, 3>& y, const tensor_view<const float, 3>& z,
                                  std::int64_t w_len, const tensor_view<float, 3>& out) {
    z.require_shape(y.shape, "gated_rms_norm", "z");
    out.require_shape(y.shape, "gated_rms_norm", "out");
    const std::int64_t G = y.dim(1), gs = y.dim(2);
    if (w_len != G * gs && w_len != gs)
        throw shape_error("gated_rms_norm: weight has " + std::to_string(w_len) + " entries, expected " + std::to_string(G * gs) +
                          " or " + std::to_string(gs));
}
}  // namespace detail

template <class Arch>
struct op_impl<ops::rms_norm_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> x, const float* w, float eps,
                    kernels::rms_flavor flavor, tensor_view<float, 2> y) {
        y.require_shape(x.shape, "rms_norm", "y");
        be.parallel_for(x.dim(0), 64, [&](std::int64_t r0, std::int64_t r1) {
            kernels::rms_norm<float>(x.slice(r0, r1 - r0), w, eps, flavor, y.slice(r0, r1 - r0));
        });
    }
};

template <class Arch>
struct op_impl<ops::rms_norm_heads_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<float, 3> x, const float* w, float eps,
                    kernels::rms_flavor flavor) {
        be.parallel_for(x.dim(0), 16, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r) kernels::rms_norm<float>(x[r], w, eps, flavor, x[r]);
        });
    }
};

template <class Arch>
struct op_impl<ops::gated_rms_norm_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 3> y, tensor_view<const float, 3> z,
                    const float* w, std::int64_t w_len, kernels::gate_order order, float eps, tensor_view<float, 3> out) {
        detail::check_gated_norm_args(y, z, w_len, out);
        const std::int64_t M = y.dim(0), G = y.dim(1), gs = y.dim(2);
        const std::int64_t rb = 64, nrb = (M + rb - 1) / rb;
        // About 4 multiply-add equivalents per element (square-sum, scale, the gate's sigmoid and product).
        be.parallel_for(G * nrb, task_grain(4 * std::min(rb, M) * gs), [&](std::int64_t b0, std::int64_t b1) {
            for (std::int64_t i = b0; i < b1; ++i) {
                const std::int64_t g = i / nrb, r0 = (i % nrb) * rb, m = std::min(rb, M - r0);
                auto col = [&](auto v) {  // [m, gs] view of group g, rows r0..r0+m
                    using V = decltype(v);
                    return tensor_view<typename V::value_type, 2>(&v(r0, g, 0), {m, gs}, {v.strides[0], v.strides[2]});
                };
                kernels::gated_rms_norm<float>(col(y), col(z), w_len == gs ? w : w + g * gs, gs, gs, order, eps, col(out));
            }
        });
    }
};

template <>
struct op_impl<ops::rms_norm_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> x, const float* w, float eps,
                    kernels::rms_flavor flavor, tensor_view<float, 2> y) {
        y.require_shape(x.shape, "rms_norm", "y");
        detail::f64_copy<2> xd(x);
        const auto wd = detail::f64_vector(w, x.dim(1));
        kernels::rms_norm<double>(xd.v, wd.data(), eps, flavor, xd.v);
        xd.store(y);
    }
};

template <>
struct op_impl<ops::rms_norm_heads_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 3> x, const float* w, float eps, kernels::rms_flavor flavor) {
        detail::f64_copy<3> xd(x);
        const auto wd = detail::f64_vector(w, x.dim(2));
        for (std::int64_t r = 0; r < x.dim(0); ++r) kernels::rms_norm<double>(xd.v[r], wd.data(), eps, flavor, xd.v[r]);
        xd.store(x);
    }
};

template <>
struct op_impl<ops::gated_rms_norm_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 3> y, tensor_view<const float, 3> z, const float* w,
                    std::int64_t w_len, kernels::gate_order order, float eps, tensor_view<float, 3> out) {
        detail::check_gated_norm_args(y, z, w_len, out);
        const std::int64_t G = y.dim(1), gs = y.dim(2);
        detail::f64_copy<3> yd(y), zd(z);
        const auto wd = detail::f64_vector(w, w_len);
        for (std::int64_t m = 0; m < y.dim(0); ++m)
            for (std::int64_t g = 0; g < G; ++g) {
                tensor_view<double, 2> yg(&yd.v(m, g, 0), {1, gs}), zg(&zd.v(m, g, 0), {1, gs});
                kernels::gated_rms_norm<double>(yg, zg, wd.data() + (w_len == gs ? 0 : g * gs), gs, gs, order, eps, yg);
            }
        yd.store(out);
    }
};

}  // namespace hymix
