// Backward of the RMSNorm flavours of spec.md §1 (kernels/norm.hpp): plain / zero-centred RMSNorm over rows and
// per head (qk-norm), and the grouped gated norm in both orders (spec.md §3.2 step 6, §4.2, §8 invariant 8).
// With r = 1/sqrt(mean(v²) + eps), n = v·r and an upstream gradient g on the normalised vector n:
//     dv = r·g − r³·(Σ g·v)/len · v       (the Jacobian of v ↦ v·r is r·I − r³ v vᵀ / len)
//   rms_norm:        out = a ⊙ n, a = w (plain) or 1 + w (zero-centred); g = dy ⊙ a; dw += dy ⊙ n.
//   gate_then_norm:  u = y ⊙ silu(z), out = w ⊙ u·r;  g = dout ⊙ w, du from the rule above, dy = du ⊙ silu(z),
//                    dz = du ⊙ y ⊙ silu'(z), dw += dout ⊙ u·r.
//   norm_then_gate:  out = w ⊙ y·r ⊙ silu(z); g = dout ⊙ w ⊙ silu(z), dy from the rule above,
//                    dz = dout ⊙ w ⊙ y·r ⊙ silu'(z), dw += dout ⊙ y·r ⊙ silu(z).
// silu'(z) = σ(z)·(1 + z·(1 − σ(z))). Input gradients are overwritten, dw accumulated. CPU fp32 (xsimd) kernels
// parallel over fixed row blocks with per-block dw partials summed in block order (deterministic for any thread
// count); fp64 reference twins with plain loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/backward_common.hpp"
#include "hymix/kernels/norm.hpp"

namespace hymix::kernels {

namespace detail {

/// One row of rms_norm's backward in fp32: x, dy [n] → dx [n] (may be dy itself); dwp [n] += dy ⊙ x·r (or null).
template <class Arch>
inline void rms_norm_backward_row(const float* x, const float* w, float eps, bool zero_centered, const float* dy, float* dx,
                                  float* dwp, std::int64_t n) {
    const float r = 1.0f / std::sqrt(dot_f32<Arch>(x, x, n) / static_cast<float>(n) + eps);
    float gx = dot3_f32<Arch>(dy, w, x, n);  // Σ dy·w·x (+ Σ dy·x for 1 + w)
    if (zero_centered) gx += dot_f32<Arch>(dy, x, n);
    const float c = r * r * r * gx / static_cast<float>(n);
    for (std::int64_t i = 0; i < n; ++i) {
        const float d = dy[i], xi = x[i];
        if (dwp) dwp[i] += d * (xi * r);
        dx[i] = r * d * (zero_centered ? 1.0f + w[i] : w[i]) - c * xi;
    }
}

/// One group of gated_rms_norm's backward in fp32. y, z, dout [n] → dy [n] (may be dout itself), dz [n];
/// dwp [n] += the group's weight gradient (or null). sig and tmp are scratch of n floats.
template <class Arch>
inline void gated_rms_norm_backward_group(const float* y, const float* z, const float* w, bool gate_first, float eps,
                                          const float* dout, float* dy, float* dz, float* dwp, std::int64_t n, float* sig,
                                          float* tmp) {
    sigmoid_f32<Arch>(z, sig, n);
    const float inv_n = 1.0f / static_cast<float>(n);
    if (gate_first) {  // tmp = u = y ⊙ silu(z)
        for (std::int64_t i = 0; i < n; ++i) tmp[i] = y[i] * (z[i] * sig[i]);
        const float r = 1.0f / std::sqrt(dot_f32<Arch>(tmp, tmp, n) * inv_n + eps);
        const float c = r * r * r * dot3_f32<Arch>(dout, w, tmp, n) * inv_n;
        for (std::int64_t i = 0; i < n; ++i) {
            const float d = dout[i], u = tmp[i], s = sig[i];
            if (dwp) dwp[i] += d * (u * r);
            const float du = r * d * w[i] - c * u;
            dy[i] = du * (z[i] * s);
            dz[i] = du * y[i] * (s * (1.0f + z[i] * (1.0f - s)));
        }
    } else {  // tmp = y ⊙ silu(z)
        for (std::int64_t i = 0; i < n; ++i) tmp[i] = y[i] * (z[i] * sig[i]);
        const float r = 1.0f / std::sqrt(dot_f32<Arch>(y, y, n) * inv_n + eps);
        const float c = r * r * r * dot3_f32<Arch>(dout, w, tmp, n) * inv_n;
        for (std::int64_t i = 0; i < n; ++i) {
            const float d = dout[i], s = sig[i], yi = y[i], nrm = yi * r, zi = z[i];
            if (dwp) dwp[i] += d * (nrm * (zi * s));
            const float dzi = d * w[i] * nrm * (s * (1.0f + zi * (1.0f - s)));
            dy[i] = r * d * w[i] * (zi * s) - c * yi;
            dz[i] = dzi;
        }
    }
}

/// Argument checks of rms_norm_backward: [M, d] views with unit channel stride; dx may be dy itself.
template <class T>
void check_rms_norm_backward(std::string_view who, const tensor_view<const T, 2>& x, const T* w, double eps, rms_flavor flavor,
                             const tensor_view<const T, 2>& dy, const tensor_view<T, 2>& dx, const T* dw) {
    const std::int64_t M = x.dim(0), d = x.dim(1);
    dy.require_shape({M, d}, who, "dy");
    dx.require_shape({M, d}, who, "dx");
    hymix::detail::require_unit_stride(x, 1, who, "x");
    hymix::detail::require_unit_stride(dy, 1, who, "dy");
    hymix::detail::require_unit_stride(dx, 1, who, "dx");
    hymix::detail::require_no_self_overlap(dx, who, "dx");
    hymix::detail::require_no_overlap(dx, "dx", x, "x", who);
    hymix::detail::require_no_overlap(dx, "dx", dy, "dy", who, true);
    hymix::detail::require_pointer(w, M > 0 ? d : 0, who, "weight");
    hymix::detail::require_finite_nonneg(eps, who, "eps");
    if (flavor != rms_flavor::plain && flavor != rms_flavor::zero_centered)
        throw value_error(std::string(who) + ": unknown flavor " + std::to_string(static_cast<int>(flavor)));
    if (dw) {
        const tensor_view<const T, 1> dwv(dw, {d});  // [d]
        hymix::detail::require_no_overlap(dwv, "dw", x, "x", who);
        hymix::detail::require_no_overlap(dwv, "dw", dy, "dy", who);
        hymix::detail::require_no_overlap(dwv, "dw", dx, "dx", who);
    }
}

/// Argument checks of gated_rms_norm_backward: [M, G, gs] views with unit stride along gs; dy may be dout itself.
template <class T>
void check_gated_rms_norm_backward(const tensor_view<const T, 3>& y, const tensor_view<const T, 3>& z, const T* w,
                                   std::int64_t w_len, gate_order order, double eps, const tensor_view<const T, 3>& dout,
                                   const tensor_view<T, 3>& dy, const tensor_view<T, 3>& dz, const T* dw) {
    constexpr std::string_view who = "gated_rms_norm_backward";
    z.require_shape(y.shape, who, "z");
    dout.require_shape(y.shape, who, "dout");
    dy.require_shape(y.shape, who, "dy");
    dz.require_shape(y.shape, who, "dz");
    const std::int64_t M = y.dim(0), G = y.dim(1), gs = y.dim(2);
    if (w_len != G * gs && w_len != gs)
        throw shape_error(std::string(who) + ": weight has " + std::to_string(w_len) + " entries, expected " + std::to_string(G * gs) +
                          " or " + std::to_string(gs));
    hymix::detail::require_unit_stride(y, 2, who, "y");
    hymix::detail::require_unit_stride(z, 2, who, "z");
    hymix::detail::require_unit_stride(dout, 2, who, "dout");
    hymix::detail::require_unit_stride(dy, 2, who, "dy");
    hymix::detail::require_unit_stride(dz, 2, who, "dz");
    hymix::detail::require_no_self_overlap(dy, who, "dy");
    hymix::detail::require_no_self_overlap(dz, who, "dz");
    hymix::detail::require_no_overlap(dy, "dy", y, "y", who);
    hymix::detail::require_no_overlap(dy, "dy", z, "z", who);
    hymix::detail::require_no_overlap(dy, "dy", dout, "dout", who, true);
    hymix::detail::require_no_overlap(dz, "dz", y, "y", who);
    hymix::detail::require_no_overlap(dz, "dz", z, "z", who);
    hymix::detail::require_no_overlap(dz, "dz", dout, "dout", who);
    hymix::detail::require_no_overlap(dz, "dz", dy, "dy", who);
    hymix::detail::require_pointer(w, M > 0 ? w_len : 0, who, "weight");
    hymix::detail::require_finite_nonneg(eps, who, "eps");
    if (order != gate_order::gate_then_norm && order != gate_order::norm_then_gate)
        throw value_error(std::string(who) + ": unknown gate order " + std::to_string(static_cast<int>(order)));
    if (dw) {
        const tensor_view<const T, 1> dwv(dw, {w_len});  // [w_len]
        hymix::detail::require_no_overlap(dwv, "dw", y, "y", who);
        hymix::detail::require_no_overlap(dwv, "dw", z, "z", who);
        hymix::detail::require_no_overlap(dwv, "dw", dout, "dout", who);
        hymix::detail::require_no_overlap(dwv, "dw", dy, "dy", who);
        hymix::detail::require_no_overlap(dwv, "dw", dz, "dz", who);
    }
}

}  // namespace detail

// ---- references (T = double) ------------------------------------------------------------------------------------

/// Reference twin of rms_norm_backward with plain loops in T. x, dy [M, d]; dx [M, d] (=, may be dy itself);
/// dw [d] (+=, or null).
template <class T>
void rms_norm_backward_ref(tensor_view<const T, 2> x, const T* w, T eps, rms_flavor flavor, tensor_view<const T, 2> dy,
                           tensor_view<T, 2> dx, T* dw) {
    detail::check_rms_norm_backward("rms_norm_backward", x, w, static_cast<double>(eps), flavor, dy, dx, dw);
    const std::int64_t M = x.dim(0), d = x.dim(1);
    for (std::int64_t m = 0; m < M; ++m) {
        T ss = 0, gx = 0;
        for (std::int64_t i = 0; i < d; ++i) ss += x(m, i) * x(m, i);
        const T r = T(1) / std::sqrt(ss / static_cast<T>(d) + eps);
        for (std::int64_t i = 0; i < d; ++i) {
            const T a = flavor == rms_flavor::plain ? w[i] : T(1) + w[i];
            gx += dy(m, i) * a * x(m, i);
        }
        for (std::int64_t i = 0; i < d; ++i) {
            const T a = flavor == rms_flavor::plain ? w[i] : T(1) + w[i];
            const T dyi = dy(m, i);
            if (dw) dw[i] += dyi * x(m, i) * r;
            dx(m, i) = r * a * dyi - r * r * r * gx / static_cast<T>(d) * x(m, i);
        }
    }
}

/// Reference twin of gated_rms_norm_backward with plain loops in T. y, z, dout [M, G, gs]; dy, dz (=); w and dw have
/// w_len = G·gs (per channel) or gs (shared) entries; dw += (or null).
template <class T>
void gated_rms_norm_backward_ref(tensor_view<const T, 3> y, tensor_view<const T, 3> z, const T* w, std::int64_t w_len, gate_order order,
                                 T eps, tensor_view<const T, 3> dout, tensor_view<T, 3> dy, tensor_view<T, 3> dz, T* dw) {
    detail::check_gated_rms_norm_backward(y, z, w, w_len, order, static_cast<double>(eps), dout, dy, dz, dw);
    const std::int64_t M = y.dim(0), G = y.dim(1), gs = y.dim(2);
    const bool gate_first = order == gate_order::gate_then_norm;
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t g = 0; g < G; ++g) {
            const std::int64_t wo = w_len == gs ? 0 : g * gs;  // weight offset of this group
            auto v = [&](std::int64_t i) { return gate_first ? y(m, g, i) * silu(z(m, g, i)) : y(m, g, i); };
            T ss = 0, gv = 0;
            for (std::int64_t i = 0; i < gs; ++i) {
                const T gi = dout(m, g, i) * w[wo + i] * (gate_first ? T(1) : silu(z(m, g, i)));
                ss += v(i) * v(i);
                gv += gi * v(i);
            }
            const T r = T(1) / std::sqrt(ss / static_cast<T>(gs) + eps);
            for (std::int64_t i = 0; i < gs; ++i) {
                const T zi = z(m, g, i), yi = y(m, g, i), d = dout(m, g, i);
                const T sg = sigmoid(zi), dsilu = sg * (T(1) + zi * (T(1) - sg));
                const T gi = d * w[wo + i] * (gate_first ? T(1) : silu(zi));
                const T dv = r * gi - r * r * r * gv / static_cast<T>(gs) * v(i);  // gradient w.r.t. the normalised vector
                if (gate_first) {
                    if (dw) dw[wo + i] += d * v(i) * r;
                    dz(m, g, i) = dv * yi * dsilu;
                    dy(m, g, i) = dv * silu(zi);
                } else {
                    if (dw) dw[wo + i] += d * yi * r * silu(zi);
                    dz(m, g, i) = d * w[wo + i] * yi * r * dsilu;
                    dy(m, g, i) = dv;
                }
            }
        }
}

// ---- CPU fp32 ---------------------------------------------------------------------------------------------------

/// Rows per task of the norm backwards (fixed: the dw partials, hence dw, do not depend on the thread count).
inline constexpr std::int64_t norm_backward_block = 64;

/// Backward of rms_norm. x, dy [M, d] (unit channel stride, any row stride); dx [M, d] overwritten (may be dy
/// itself); dw [d] accumulated (or null). Throws shape_error / value_error naming the argument.
template <cpu_backend_type Backend>
void rms_norm_backward(const Backend& be, tensor_view<const float, 2> x, const float* w, float eps, rms_flavor flavor,
                       tensor_view<const float, 2> dy, tensor_view<float, 2> dx, float* dw) {
    detail::check_rms_norm_backward("rms_norm_backward", x, w, static_cast<double>(eps), flavor, dy, dx, dw);
    const std::int64_t d = x.dim(1);
    const bool zc = flavor == rms_flavor::zero_centered;
    detail::blocked_param_grad(be, x.dim(0), norm_backward_block, dw, d, [&](std::int64_t r0, std::int64_t r1, float* part) {
        for (std::int64_t m = r0; m < r1; ++m)
            detail::rms_norm_backward_row<typename Backend::arch>(&x(m, 0), w, eps, zc, &dy(m, 0), &dx(m, 0), part, d);
    });
}

/// Backward of rms_norm_heads (qk-norm). x_in [n, H, d_h] is the forward's input (before its in-place norm);
/// dy [n, H, d_h]; dx [n, H, d_h] overwritten (may be dy itself); dw [d_h] accumulated (or null). Unit stride along
/// d_h, any other strides.
template <cpu_backend_type Backend>
void rms_norm_heads_backward(const Backend& be, tensor_view<const float, 3> x_in, const float* w, float eps, rms_flavor flavor,
                             tensor_view<const float, 3> dy, tensor_view<float, 3> dx, float* dw) {
    constexpr std::string_view who = "rms_norm_heads_backward";
    dy.require_shape(x_in.shape, who, "dy");
    dx.require_shape(x_in.shape, who, "dx");
    hymix::detail::require_no_self_overlap(dx, who, "dx");
    hymix::detail::require_no_overlap(dx, "dx", x_in, "x_in", who);
    hymix::detail::require_no_overlap(dx, "dx", dy, "dy", who, true);
    const std::int64_t d = x_in.dim(2);
    const bool zc = flavor == rms_flavor::zero_centered;
    if (x_in.dim(0) > 0) detail::check_rms_norm_backward(who, x_in[0], w, static_cast<double>(eps), flavor, dy[0], dx[0], dw);
    detail::blocked_param_grad(be, x_in.dim(0), norm_backward_block / 4, dw, d, [&](std::int64_t r0, std::int64_t r1, float* part) {
        for (std::int64_t m = r0; m < r1; ++m)
            for (std::int64_t h = 0; h < x_in.dim(1); ++h)
                detail::rms_norm_backward_row<typename Backend::arch>(&x_in(m, h, 0), w, eps, zc, &dy(m, h, 0), &dx(m, h, 0), part, d);
    });
}

/// Backward of gated_rms_norm over groups. y, z, dout [M, G, gs] (unit stride along gs, any other strides);
/// dy, dz [M, G, gs] overwritten (dy may be dout itself); w and dw have w_len = G·gs (per channel) or gs (shared)
/// entries; dw accumulated (or null).
template <cpu_backend_type Backend>
void gated_rms_norm_backward(const Backend& be, tensor_view<const float, 3> y, tensor_view<const float, 3> z, const float* w,
                             std::int64_t w_len, gate_order order, float eps, tensor_view<const float, 3> dout,
                             tensor_view<float, 3> dy, tensor_view<float, 3> dz, float* dw) {
    detail::check_gated_rms_norm_backward(y, z, w, w_len, order, static_cast<double>(eps), dout, dy, dz, dw);
    const std::int64_t G = y.dim(1), gs = y.dim(2);
    const bool gate_first = order == gate_order::gate_then_norm;
    detail::blocked_param_grad(be, y.dim(0), norm_backward_block, dw, w_len, [&](std::int64_t r0, std::int64_t r1, float* part) {
        std::vector<float> scratch(static_cast<std::size_t>(2 * gs));
        for (std::int64_t m = r0; m < r1; ++m)
            for (std::int64_t g = 0; g < G; ++g) {
                const std::int64_t wo = w_len == gs ? 0 : g * gs;
                detail::gated_rms_norm_backward_group<typename Backend::arch>(&y(m, g, 0), &z(m, g, 0), w + wo, gate_first, eps,
                                                                              &dout(m, g, 0), &dy(m, g, 0), &dz(m, g, 0),
                                                                              part ? part + wo : nullptr, gs, scratch.data(),
                                                                              scratch.data() + gs);
            }
    });
}

}  // namespace hymix::kernels
