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
#include "hymix/core/check.hpp"
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

/// Dot products of R rows of x with C rows of w (K long), R x C results, accumulating in registers:
/// each loaded x vector feeds C FMAs and each loaded w vector R FMAs.
template <class Arch, int R, int C>
inline void dot_tile(const float* const* xr, const float* const* wr, std::int64_t K, float (&out)[R][C]) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    const std::int64_t Kv = K / W * W;
    B acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = B(0.f);
    for (std::int64_t k = 0; k < Kv; k += W) {
        B wv[C];
        for (int c = 0; c < C; ++c) wv[c] = B::load_unaligned(wr[c] + k);
        for (int r = 0; r < R; ++r) {
            const B xv = B::load_unaligned(xr[r] + k);
            for (int c = 0; c < C; ++c) acc[r][c] = xsimd::fma(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            float s = xsimd::hadd(acc[r][c]);
            for (std::int64_t k = Kv; k < K; ++k) s += xr[r][k] * wr[c][k];
            out[r][c] = s;
        }
}

/// y[m, n0..n1) for all m (M small, decode): weight rows are streamed once, in blocks of C = 4, and every block
/// is applied to the rows of x in register tiles of up to 4 rows.
template <class Arch>
void linear_small_m(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
                    tensor_view<float, 2> y, std::int64_t n0, std::int64_t n1) {
    constexpr int C = 4;
    const std::int64_t M = x.dim(0), K = x.dim(1);
    auto run_rows = [&]<int R>(std::int64_t m, std::int64_t n, std::integral_constant<int, R>, auto cc) {
        constexpr int CC = decltype(cc)::value;
        const float* xr[R];
        const float* wr[CC];
        for (int r = 0; r < R; ++r) xr[r] = &x(m + r, 0);
        for (int c = 0; c < CC; ++c) wr[c] = &w(n + c, 0);
        float out[R][CC];
        dot_tile<Arch, R, CC>(xr, wr, K, out);
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < CC; ++c) y(m + r, n + c) = out[r][c] + (bias ? bias[n + c] : 0.f);
    };
    auto run_cols = [&](std::int64_t n, auto cc) {
        std::int64_t m = 0;
        for (; m + 4 <= M; m += 4) run_rows(m, n, std::integral_constant<int, 4>{}, cc);
        switch (M - m) {
            case 3: run_rows(m, n, std::integral_constant<int, 3>{}, cc); break;
            case 2: run_rows(m, n, std::integral_constant<int, 2>{}, cc); break;
            case 1: run_rows(m, n, std::integral_constant<int, 1>{}, cc); break;
            default: break;
        }
    };
    std::int64_t n = n0;
    for (; n + C <= n1; n += C) run_cols(n, std::integral_constant<int, C>{});
    for (; n < n1; ++n) run_cols(n, std::integral_constant<int, 1>{});
}

}  // namespace detail

/// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]). fp32. Inner strides must be 1; y must not overlap x, w or bias.
/// Throws shape_error on a mismatch, naming the argument.
/// Parallel over output columns on the backend's threads.
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
            tensor_view<float, 2> y) {
    // Argument checks, in every build (shape_error naming the argument): shapes, the unit inner stride of x, w and y
    // (row strides are free), y's rows not overlapping each other, x, w or the bias (the products write y while
    // reading them). A few comparisons per call. Not checked: the values (a scan of w per decode step would cost as
    // much as the product itself); a NaN or Inf propagates to the outputs it reaches.
    const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    if (w.dim(1) != K) w.require_shape({N, K}, "linear: weight");
    y.require_shape({M, N}, "linear: output");
    hymix::detail::require_unit_stride(x, 1, "linear", "x", true);
    hymix::detail::require_unit_stride(w, 1, "linear", "weight", true);
    hymix::detail::require_unit_stride(y, 1, "linear", "output", true);
    hymix::detail::require_no_self_overlap(y, "linear", "output");
    hymix::detail::require_no_overlap(y, "output", x, "x", "linear");
    hymix::detail::require_no_overlap(y, "output", w, "weight", "linear");
    if (bias) hymix::detail::require_no_overlap(y, "output", tensor_view<const float, 1>(bias, {N}), "bias", "linear");
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
        // One product per column block: Eigen blocks for the caches itself and packs this block of W once.
        Y.middleCols(n0, n1 - n0).noalias() = X * Wm.middleRows(n0, n1 - n0).transpose();
        if (bias)
            for (std::int64_t m = 0; m < M; ++m)
                for (std::int64_t n = n0; n < n1; ++n) Y(m, n) += bias[n];
    });
}

}  // namespace hymix::kernels
