// Dense projections y[M, N] = x[M, K] · W[N, K]ᵀ (+ b) — PyTorch's nn.Linear layout (spec.md §0).
// Large M: Eigen's GEMM (near this machine's peak) on column blocks of W, one block per thread.
// Small M (decode, M ≤ 8): our own xsimd kernel that streams each weight row once for all M rows, since
// Eigen's small-M GEMM is slower per row than GEMV (../shared/docs/machine.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

/// Reference: y = x Wᵀ + b in double precision with obvious loops. x [M, K], w [N, K], bias [N] or null.
template <class TX, class TW, class TY>
void linear_ref(tensor_view<const TX, 2> x, tensor_view<const TW, 2> w, const TW* bias, tensor_view<TY, 2> y) {
    for (std::int64_t m = 0; m < x.dim(0); ++m)
        for (std::int64_t n = 0; n < w.dim(0); ++n) {
            double acc = bias ? static_cast<double>(bias[n]) : 0.0;
            for (std::int64_t k = 0; k < x.dim(1); ++k) acc += static_cast<double>(x(m, k)) * static_cast<double>(w(n, k));
            y(m, n) = static_cast<TY>(acc);
        }
}

namespace detail {

/// y[m, n0..n1) for all m: each block of 4 weight rows is read once and used for every m (M small).
template <class Arch>
void linear_small_m(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
                    tensor_view<float, 2> y, std::int64_t n0, std::int64_t n1) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    const std::int64_t M = x.dim(0), K = x.dim(1);
    const std::int64_t Kv = K / W * W;
    std::int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        const float* w0 = &w(n, 0);
        const float* w1 = &w(n + 1, 0);
        const float* w2 = &w(n + 2, 0);
        const float* w3 = &w(n + 3, 0);
        for (std::int64_t m = 0; m < M; ++m) {
            const float* xm = &x(m, 0);
            B a0(0.f), a1(0.f), a2(0.f), a3(0.f);
            for (std::int64_t k = 0; k < Kv; k += W) {
                const B xv = B::load_unaligned(xm + k);
                a0 = xsimd::fma(xv, B::load_unaligned(w0 + k), a0);
                a1 = xsimd::fma(xv, B::load_unaligned(w1 + k), a1);
                a2 = xsimd::fma(xv, B::load_unaligned(w2 + k), a2);
                a3 = xsimd::fma(xv, B::load_unaligned(w3 + k), a3);
            }
            float s0 = xsimd::hadd(a0), s1 = xsimd::hadd(a1), s2 = xsimd::hadd(a2),
                  s3 = xsimd::hadd(a3);
            for (std::int64_t k = Kv; k < K; ++k) {
                s0 += xm[k] * w0[k];
                s1 += xm[k] * w1[k];
                s2 += xm[k] * w2[k];
                s3 += xm[k] * w3[k];
            }
            float* ym = &y(m, 0);
            ym[n] = s0 + (bias ? bias[n] : 0.f);
            ym[n + 1] = s1 + (bias ? bias[n + 1] : 0.f);
            ym[n + 2] = s2 + (bias ? bias[n + 2] : 0.f);
            ym[n + 3] = s3 + (bias ? bias[n + 3] : 0.f);
        }
    }
    for (; n < n1; ++n) {
        const float* wn = &w(n, 0);
        for (std::int64_t m = 0; m < M; ++m) {
            const float* xm = &x(m, 0);
            B a(0.f);
            for (std::int64_t k = 0; k < Kv; k += W) a = xsimd::fma(B::load_unaligned(xm + k), B::load_unaligned(wn + k), a);
            float s = xsimd::hadd(a);
            for (std::int64_t k = Kv; k < K; ++k) s += xm[k] * wn[k];
            y(m, n) = s + (bias ? bias[n] : 0.f);
        }
    }
}

}  // namespace detail

/// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]). fp32. Inner strides must be 1. Throws shape_error on mismatch.
/// Parallel over output columns on the backend's threads.
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
            tensor_view<float, 2> y) {
    const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    if (w.dim(1) != K) w.require_shape({N, K}, "linear: weight");
    y.require_shape({M, N}, "linear: output");
    if (x.strides[1] != 1 || w.strides[1] != 1 || y.strides[1] != 1)
        throw shape_error("linear: tensors must have unit inner stride");
    if (M == 0 || N == 0) return;
    if (M <= 8) {
        const std::int64_t grain = std::max<std::int64_t>(16, N / (4 * be.num_threads()) / 4 * 4);
        be.parallel_for(N, grain, [&](std::int64_t n0, std::int64_t n1) {
            detail::linear_small_m<typename Backend::arch>(x, w, bias, y, n0, n1);
        });
        return;
    }
    const auto X = x.matrix();
    const auto Wm = w.matrix();
    auto Y = y.matrix();
    // Column blocks of ~128 (multiple of 16) so both threads get work and each block reuses x from cache.
    const std::int64_t threads = be.num_threads();
    std::int64_t block = std::max<std::int64_t>(64, (N + threads - 1) / threads);
    block = (block + 15) / 16 * 16;
    be.parallel_for(N, block, [&](std::int64_t n0, std::int64_t n1) {
        // Rows in panels keep the working set of x and y in L2.
        constexpr std::int64_t panel = 256;
        for (std::int64_t m0 = 0; m0 < M; m0 += panel) {
            const std::int64_t mb = std::min(panel, M - m0);
            Y.block(m0, n0, mb, n1 - n0).noalias() = X.middleRows(m0, mb) * Wm.middleRows(n0, n1 - n0).transpose();
            if (bias)
                for (std::int64_t m = m0; m < m0 + mb; ++m)
                    for (std::int64_t n = n0; n < n1; ++n) Y(m, n) += bias[n];
        }
    });
}

}  // namespace hymix::kernels
