// Training forward and backward of the SwiGLU MLP y = W_down(silu(g) ⊙ u), g = x W_gateᵀ, u = x W_upᵀ (spec.md §1).
// The training forward keeps the pre-activations gu = [g | u]; the backward recomputes a = silu(g) ⊙ u from them:
//   dW_down += dyᵀ a,  da = dy W_down,  dg = da ⊙ u ⊙ silu'(g),  du = da ⊙ silu(g),  silu'(g) = σ(g)(1 + g(1 − σ(g))),
//   dW_gate += dgᵀ x,  dW_up += duᵀ x,  dx = dg W_gate + du W_up.
// CPU fp32 (kernels::linear / linear_backward GEMMs, deterministic for any thread count); fp64 reference twins.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/backward_common.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/linear_backward.hpp"
#include "hymix/kernels/swiglu.hpp"

namespace hymix::kernels {

namespace detail {

/// Checks a swiglu_weights against d_model (and d_ff when given), naming it as `where` (e.g. "swiglu_backward: g").
inline std::int64_t check_swiglu_weights(const swiglu_weights& w, std::int64_t d, std::int64_t F, const std::string& where) {
    w.validate(d, where);
    if (F >= 0 && w.d_ff() != F)
        throw shape_error(where + ".gate_proj: expected " + std::to_string(F) + " rows (d_ff), found " + std::to_string(w.d_ff()));
    return w.d_ff();
}

/// Shapes and layouts of the swiglu training ops: x, dy, dx [M, d]; gu [M, 2F]; unit inner strides.
template <class T>
void check_swiglu_views(std::string_view who, const tensor_view<const T, 2>& x, std::int64_t F, const tensor_view<const T, 2>& gu,
                        const tensor_view<const T, 2>* dy, const tensor_view<T, 2>& out, std::string_view out_name) {
    const std::int64_t M = x.dim(0), d = x.dim(1);
    gu.require_shape({M, 2 * F}, who, "gu");
    hymix::detail::require_unit_stride(x, 1, who, "x", true);
    hymix::detail::require_unit_stride(gu, 1, who, "gu", true);
    if (dy) {
        dy->require_shape({M, d}, who, "dy");
        hymix::detail::require_unit_stride(*dy, 1, who, "dy", true);
        hymix::detail::require_no_overlap(out, out_name, *dy, "dy", who);
    }
    out.require_shape({M, d}, who, out_name);
    hymix::detail::require_unit_stride(out, 1, who, out_name, true);
    hymix::detail::require_no_self_overlap(out, who, out_name);
    hymix::detail::require_no_overlap(out, out_name, x, "x", who);
    hymix::detail::require_no_overlap(out, out_name, gu, "gu", who);
}

}  // namespace detail

// ---- references (T = double) ------------------------------------------------------------------------------------

/// Training forward, reference twin: gu [M, 2F] = [x W_gateᵀ | x W_upᵀ] (skipped when gu.data is null) and
/// y [M, d] = W_down(silu(g) ⊙ u). x [M, d], wg, wu [F, d], wd [d, F]. Plain loops in T.
template <class T>
void swiglu_train_ref(tensor_view<const T, 2> x, tensor_view<const T, 2> wg, tensor_view<const T, 2> wu, tensor_view<const T, 2> wd,
                      tensor_view<T, 2> gu, tensor_view<T, 2> y) {
    const std::int64_t M = x.dim(0), d = x.dim(1), F = wg.dim(0);
    std::vector<T> a(static_cast<std::size_t>(F));
    for (std::int64_t m = 0; m < M; ++m) {
        for (std::int64_t f = 0; f < F; ++f) {
            T g = 0, u = 0;
            for (std::int64_t k = 0; k < d; ++k) {
                g += wg(f, k) * x(m, k);
                u += wu(f, k) * x(m, k);
            }
            if (gu.data) {
                gu(m, f) = g;
                gu(m, F + f) = u;
            }
            a[static_cast<std::size_t>(f)] = silu(g) * u;
        }
        for (std::int64_t o = 0; o < d; ++o) {
            T s = 0;
            for (std::int64_t f = 0; f < F; ++f) s += wd(o, f) * a[static_cast<std::size_t>(f)];
            y(m, o) = s;
        }
    }
}

/// Backward, reference twin (recomputes g and u from x). dx [M, d] overwritten; dwg, dwu [F, d] and dwd [d, F]
/// accumulated. Plain loops in T.
template <class T>
void swiglu_backward_ref(tensor_view<const T, 2> x, tensor_view<const T, 2> wg, tensor_view<const T, 2> wu, tensor_view<const T, 2> wd,
                         tensor_view<const T, 2> dy, tensor_view<T, 2> dx, tensor_view<T, 2> dwg, tensor_view<T, 2> dwu,
                         tensor_view<T, 2> dwd) {
    const std::int64_t M = x.dim(0), d = x.dim(1), F = wg.dim(0);
    std::vector<T> g(static_cast<std::size_t>(F)), u(g.size()), da(g.size());
    for (std::int64_t m = 0; m < M; ++m) {
        for (std::int64_t f = 0; f < F; ++f) {
            T gs = 0, us = 0;
            for (std::int64_t k = 0; k < d; ++k) {
                gs += wg(f, k) * x(m, k);
                us += wu(f, k) * x(m, k);
            }
            g[static_cast<std::size_t>(f)] = gs;
            u[static_cast<std::size_t>(f)] = us;
        }
        for (std::int64_t f = 0; f < F; ++f) {
            const auto i = static_cast<std::size_t>(f);
            T s = 0;
            for (std::int64_t o = 0; o < d; ++o) {
                s += dy(m, o) * wd(o, f);
                dwd(o, f) += dy(m, o) * silu(g[i]) * u[i];
            }
            da[i] = s;
        }
        for (std::int64_t k = 0; k < d; ++k) dx(m, k) = 0;
        for (std::int64_t f = 0; f < F; ++f) {
            const auto i = static_cast<std::size_t>(f);
            const T sg = sigmoid(g[i]);
            const T dg = da[i] * u[i] * sg * (T(1) + g[i] * (T(1) - sg)), du = da[i] * silu(g[i]);
            for (std::int64_t k = 0; k < d; ++k) {
                dwg(f, k) += dg * x(m, k);
                dwu(f, k) += du * x(m, k);
                dx(m, k) += dg * wg(f, k) + du * wu(f, k);
            }
        }
    }
}

// ---- CPU fp32 ---------------------------------------------------------------------------------------------------

/// Training forward: gu [M, 2F] ← [x W_gateᵀ | x W_upᵀ] (the pre-activations, kept for swiglu_backward) and
/// y [M, d] ← W_down(silu(g) ⊙ u). Same bits as kernels::swiglu's y (both use the batch-invariant linear). w must be
/// prepared (gate_up). Allocates an [M, F] buffer for the activations (computed with kernels::swiglu's scalar
/// expression, so the bits agree).
template <cpu_backend_type Backend>
void swiglu_train(const Backend& be, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2> gu,
                  tensor_view<float, 2> y) {
    constexpr std::string_view who = "swiglu_train";
    const std::int64_t M = x.dim(0), d = x.dim(1);
    const std::int64_t F = detail::check_swiglu_weights(w, d, -1, std::string(who) + ": weights");
    if (w.gate_up.rank() != 2 || w.gate_up.dim(0) != 2 * F)
        throw shape_error(std::string(who) + ": weights.gate_up is not prepared (call swiglu_weights::prepare())");
    detail::check_swiglu_views<float>(who, x, F, gu, nullptr, y, "y");
    hymix::detail::require_no_self_overlap(gu, who, "gu");
    hymix::detail::require_no_overlap(gu, "gu", x, "x", who);
    linear(be, x, w.gate_up.view<2>(), nullptr, gu);
    tensor<float> act({M, F});  // [M, F] silu(g) ⊙ u
    be.parallel_for(M, 16, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t m = r0; m < r1; ++m) {
            const float* g = &gu(m, 0);
            float* a = act.data() + m * F;
            for (std::int64_t f = 0; f < F; ++f) a[f] = silu(g[f]) * g[F + f];  // kernels::swiglu's expression
        }
    });
    linear(be, act.view<2>(), w.down_proj.view<2>(), nullptr, y);
}

/// Backward of the SwiGLU MLP. x [M, d] and gu [M, 2F] (from swiglu_train) are the forward's input and
/// pre-activations; dy [M, d]; dx [M, d] overwritten; g.gate_proj, g.up_proj [F, d] and g.down_proj [d, F]
/// accumulated (g.gate_up is neither read nor written). Allocates two [M, F] fp32 buffers (a then dg; da then du).
/// Every GEMM runs over fixed blocks, so the result is bit-identical for any thread count.
template <cpu_backend_type Backend>
void swiglu_backward(const Backend& be, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<const float, 2> gu,
                     tensor_view<const float, 2> dy, tensor_view<float, 2> dx, swiglu_weights& g) {
    constexpr std::string_view who = "swiglu_backward";
    const std::int64_t M = x.dim(0), d = x.dim(1);
    const std::int64_t F = detail::check_swiglu_weights(w, d, -1, std::string(who) + ": weights");
    detail::check_swiglu_weights(g, d, F, std::string(who) + ": gradient");
    detail::check_swiglu_views<float>(who, x, F, gu, &dy, dx, "dx");
    using Arch = typename Backend::arch;
    tensor<float> A({M, F}), B({M, F});  // [M, F] each: a = silu(g) ⊙ u, then dg; da, then du
    const auto Av = A.view<2>(), Bv = B.view<2>();
    be.parallel_for(M, 16, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t m = r0; m < r1; ++m) {
            const float* gm = &gu(m, 0);
            float* a = &Av(m, 0);
            detail::sigmoid_f32<Arch>(gm, a, F);
            for (std::int64_t f = 0; f < F; ++f) a[f] = gm[f] * a[f] * gm[F + f];
        }
    });
    // da = dy W_down, dW_down += dyᵀ a
    linear_backward(be, tensor_view<const float, 2>(Av), w.down_proj.view<2>(), dy, Bv, g.down_proj.view<2>(), nullptr);
    be.parallel_for(M, 16, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t m = r0; m < r1; ++m) {
            const float* gm = &gu(m, 0);
            float* dg = &Av(m, 0);
            float* du = &Bv(m, 0);
            detail::sigmoid_f32<Arch>(gm, dg, F);  // σ(g), then dg
            for (std::int64_t f = 0; f < F; ++f) {
                const float s = dg[f], gf = gm[f], da = du[f];
                dg[f] = da * gm[F + f] * (s * (1.0f + gf * (1.0f - s)));
                du[f] = da * (gf * s);
            }
        }
    });
    // dx = dg W_gate + du W_up over fixed row blocks
    constexpr std::int64_t RB = linear_backward_block;
    const auto wg = w.gate_proj.view<2>(), wu = w.up_proj.view<2>();
    be.parallel_for((M + RB - 1) / RB, 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
            const std::int64_t r0 = b * RB, rb = std::min(RB, M - r0);
            auto dxb = dx.slice(r0, rb).matrix();  // [rb, d]
            if (F == 0) {
                dxb.setZero();
                continue;
            }
            dxb.noalias() = Av.slice(r0, rb).matrix() * wg.matrix();
            dxb.noalias() += Bv.slice(r0, rb).matrix() * wu.matrix();
        }
    });
    // dW_gate += dgᵀ x, dW_up += duᵀ x
    linear_backward(be, x, wg, tensor_view<const float, 2>(Av), tensor_view<float, 2>(), g.gate_proj.view<2>(), nullptr);
    linear_backward(be, x, wu, tensor_view<const float, 2>(Bv), tensor_view<float, 2>(), g.up_proj.view<2>(), nullptr);
}

}  // namespace hymix::kernels
