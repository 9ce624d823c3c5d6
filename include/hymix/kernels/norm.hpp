// RMSNorm flavours of spec.md §1: plain (w ⊙ x / rms), zero-centred ((1 + w) ⊙ x / rms, Qwen3-Next/3.5),
// and the gated norm (Mamba-2 gate-then-norm per group; GDN/Oryx norm-then-gate per head). Statistics in fp32
// (fp64 in the references). rms(x) = sqrt(mean(x²) + eps).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

enum class rms_flavor { plain, zero_centered };
enum class gate_order { gate_then_norm, norm_then_gate };

// Argument checks of the norms, in every build (shape_error / value_error naming the argument): shapes, the unit
// channel stride every row loop assumes (row strides are free), outputs whose rows do not overlap each other or the
// inputs (except the exact in-place call), a non-null weight, eps finite and >= 0, known enum values. A few
// comparisons per call; qk-norm calls these once per token, which stays negligible next to the d_h-wide row work.
// Not checked: the values of x, y, z and w (a scan per call would double the memory traffic of these
// memory-bound kernels); a NaN or Inf there propagates to the output rows it reaches.

/// y[M, d] = norm(x[M, d]) with weight w[d]; x and y have unit channel stride. y may be x itself (in place), but
/// not overlap it otherwise. Works for float and double (reference).
template <class T>
void rms_norm(tensor_view<const T, 2> x, const T* w, T eps, rms_flavor flavor, tensor_view<T, 2> y) {
    constexpr std::string_view who = "rms_norm";
    const std::int64_t M = x.dim(0), d = x.dim(1);
    y.require_shape({M, d}, "rms_norm: output");
    hymix::detail::require_unit_stride(x, 1, who, "x");
    hymix::detail::require_unit_stride(y, 1, who, "output");
    hymix::detail::require_no_self_overlap(y, who, "output");
    hymix::detail::require_no_overlap(y, "output", x, "x", who, true);
    hymix::detail::require_pointer(w, M > 0 ? d : 0, who, "weight");
    hymix::detail::require_finite_nonneg(static_cast<double>(eps), who, "eps");
    if (flavor != rms_flavor::plain && flavor != rms_flavor::zero_centered)
        throw value_error("rms_norm: unknown flavor " + std::to_string(static_cast<int>(flavor)));
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (std::int64_t m = 0; m < M; ++m) {
        const T* xm = &x(m, 0);
        T* ym = &y(m, 0);
        Acc ss = 0;
        for (std::int64_t i = 0; i < d; ++i) ss += static_cast<Acc>(xm[i]) * static_cast<Acc>(xm[i]);
        const Acc r = Acc(1) / std::sqrt(ss / static_cast<Acc>(d) + static_cast<Acc>(eps));
        if (flavor == rms_flavor::plain)
            for (std::int64_t i = 0; i < d; ++i) ym[i] = static_cast<T>(w[i] * (xm[i] * r));
        else
            for (std::int64_t i = 0; i < d; ++i) ym[i] = static_cast<T>((Acc(1) + w[i]) * (xm[i] * r));
    }
}

namespace detail {

/// fp32 gated norm of one group of n channels with xsimd (default architecture); same maths as the generic loop.
inline void gated_rms_norm_group_f32(const float* y, const float* z, const float* w, std::int64_t n, bool gate_first, float eps,
                                     float* out) {
    using Bf = xsimd::batch<float>;
    constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
    const Bf one(1.0f);
    auto silu_v = [&](Bf v) { return v / (one + xsimd::exp(-v)); };
    Bf ssv(0.0f);
    float ss = 0;
    std::int64_t i = 0;
    if (gate_first) {  // out ← u = y ⊙ silu(z), then scaled in place
        for (; i + W <= n; i += W) {
            const Bf u = Bf::load_unaligned(y + i) * silu_v(Bf::load_unaligned(z + i));
            ssv = xsimd::fma(u, u, ssv);
            u.store_unaligned(out + i);
        }
        for (; i < n; ++i) {
            const float u = y[i] * silu(z[i]);
            ss += u * u;
            out[i] = u;
        }
        const float r = 1.0f / std::sqrt((ss + xsimd::hadd(ssv)) / static_cast<float>(n) + eps);
        const Bf rv(r);
        i = 0;
        for (; i + W <= n; i += W) (Bf::load_unaligned(w + i) * (Bf::load_unaligned(out + i) * rv)).store_unaligned(out + i);
        for (; i < n; ++i) out[i] = w[i] * (out[i] * r);
    } else {
        for (; i + W <= n; i += W) {
            const Bf v = Bf::load_unaligned(y + i);
            ssv = xsimd::fma(v, v, ssv);
        }
        for (; i < n; ++i) ss += y[i] * y[i];
        const float r = 1.0f / std::sqrt((ss + xsimd::hadd(ssv)) / static_cast<float>(n) + eps);
        const Bf rv(r);
        i = 0;
        for (; i + W <= n; i += W)
            (Bf::load_unaligned(w + i) * (Bf::load_unaligned(y + i) * rv) * silu_v(Bf::load_unaligned(z + i))).store_unaligned(out + i);
        for (; i < n; ++i) out[i] = w[i] * (y[i] * r) * silu(z[i]);
    }
}

}  // namespace detail

/// Gated RMSNorm over groups of `group_size` contiguous channels of y[M, D] with gate z[M, D]:
///   gate_then_norm: out = w ⊙ normalize_g(y ⊙ silu(z))         (Mamba-2, spec.md §3.2 step 6)
///   norm_then_gate: out = (w ⊙ normalize_g(y)) ⊙ silu(z)        (GDN / Qwen3.5 / Oryx, per head)
/// `w` has D entries (per channel) or group_size entries (shared by all groups); `w_len` says which.
/// y, z and out have unit channel stride (any row stride). out may be y or z itself (in place), but not overlap
/// them otherwise.
template <class T>
void gated_rms_norm(tensor_view<const T, 2> y, tensor_view<const T, 2> z, const T* w, std::int64_t w_len,
                    std::int64_t group_size, gate_order order, T eps, tensor_view<T, 2> out) {
    constexpr std::string_view who = "gated_rms_norm";
    const std::int64_t M = y.dim(0), D = y.dim(1);
    z.require_shape({M, D}, "gated_rms_norm: gate");
    out.require_shape({M, D}, "gated_rms_norm: output");
    hymix::detail::require_unit_stride(y, 1, who, "y");
    hymix::detail::require_unit_stride(z, 1, who, "gate");
    hymix::detail::require_unit_stride(out, 1, who, "output");
    hymix::detail::require_no_self_overlap(out, who, "output");
    hymix::detail::require_no_overlap(out, "output", y, "y", who, true);
    hymix::detail::require_no_overlap(out, "output", z, "gate", who, true);
    hymix::detail::require_pointer(w, M > 0 ? w_len : 0, who, "weight");
    hymix::detail::require_finite_nonneg(static_cast<double>(eps), who, "eps");
    if (order != gate_order::gate_then_norm && order != gate_order::norm_then_gate)
        throw value_error("gated_rms_norm: unknown gate order " + std::to_string(static_cast<int>(order)));
    if (group_size <= 0 || D % group_size != 0)
        throw shape_error("gated_rms_norm: group size " + std::to_string(group_size) + " does not divide width " + std::to_string(D));
    if (w_len != D && w_len != group_size)
        throw shape_error("gated_rms_norm: weight has " + std::to_string(w_len) + " entries, expected " + std::to_string(D) +
                          " or " + std::to_string(group_size));
    if constexpr (std::is_same_v<T, float>) {
        for (std::int64_t m = 0; m < M; ++m)
            for (std::int64_t g0 = 0; g0 < D; g0 += group_size)
                detail::gated_rms_norm_group_f32(&y(m, g0), &z(m, g0), w_len == D ? w + g0 : w, group_size,
                                                 order == gate_order::gate_then_norm, eps, &out(m, g0));
        return;
    }
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (std::int64_t m = 0; m < M; ++m) {
        const T* ym = &y(m, 0);
        const T* zm = &z(m, 0);
        T* om = &out(m, 0);
        for (std::int64_t g0 = 0; g0 < D; g0 += group_size) {
            const T* wg = w_len == D ? w + g0 : w;
            Acc ss = 0;
            if (order == gate_order::gate_then_norm) {
                for (std::int64_t i = 0; i < group_size; ++i) {
                    const Acc u = static_cast<Acc>(ym[g0 + i]) * silu(static_cast<Acc>(zm[g0 + i]));
                    ss += u * u;
                }
                const Acc r = Acc(1) / std::sqrt(ss / static_cast<Acc>(group_size) + static_cast<Acc>(eps));
                for (std::int64_t i = 0; i < group_size; ++i) {
                    const Acc u = static_cast<Acc>(ym[g0 + i]) * silu(static_cast<Acc>(zm[g0 + i]));
                    om[g0 + i] = static_cast<T>(wg[i] * (u * r));
                }
            } else {
                for (std::int64_t i = 0; i < group_size; ++i) ss += static_cast<Acc>(ym[g0 + i]) * static_cast<Acc>(ym[g0 + i]);
                const Acc r = Acc(1) / std::sqrt(ss / static_cast<Acc>(group_size) + static_cast<Acc>(eps));
                for (std::int64_t i = 0; i < group_size; ++i)
                    om[g0 + i] = static_cast<T>(wg[i] * (ym[g0 + i] * r) * silu(static_cast<Acc>(zm[g0 + i])));
            }
        }
    }
}

/// In-place L2 normalisation of each row of x[M, d] (unit channel stride): x / sqrt(Σx² + eps) (GDN q/k, spec.md §1).
template <class T>
void l2_norm_rows(tensor_view<T, 2> x, T eps) {
    hymix::detail::require_unit_stride(x, 1, "l2_norm_rows", "x");
    hymix::detail::require_no_self_overlap(x, "l2_norm_rows", "x");
    hymix::detail::require_finite_nonneg(static_cast<double>(eps), "l2_norm_rows", "eps");
    using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (std::int64_t m = 0; m < x.dim(0); ++m) {
        T* xm = &x(m, 0);
        Acc ss = 0;
        for (std::int64_t i = 0; i < x.dim(1); ++i) ss += static_cast<Acc>(xm[i]) * static_cast<Acc>(xm[i]);
        const Acc r = Acc(1) / std::sqrt(ss + static_cast<Acc>(eps));
        for (std::int64_t i = 0; i < x.dim(1); ++i) xm[i] = static_cast<T>(xm[i] * r);
    }
}

}  // namespace hymix::kernels
