// Backward of the dense projection y = x Wᵀ + b (spec.md §0, nn.Linear layout W [N, K]): with the upstream
// gradient dy [M, N], dx = dy · W (overwritten), dW += dyᵀ · x and db += Σ_rows dy (accumulated: gradient
// accumulation and tied weights). CPU fp32: both products are C += A · B with B's rows contiguous (W's rows for dx,
// x's rows for dW), so the register-tile kernel of tile_product.hpp serves both without packing or transposing
// anything (A = rows of dy for dx; A = dyᵀ, read down a column, for dW). Fixed blocks (rows per task, terms per
// pass) make every output's summation order independent of the thread count. fp64 reference twin with plain loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <string_view>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/lane_sum.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/tile_product.hpp"

namespace hymix::kernels {

namespace detail {

/// Argument checks of linear_backward (both backends): shapes, unit inner strides (the products load rows as vectors),
/// outputs that overlap neither themselves nor any input. dx / dw with data == nullptr are "not wanted".
template <class T>
void check_linear_backward(const tensor_view<const T, 2>& x, const tensor_view<const T, 2>& w, const tensor_view<const T, 2>& dy,
                           const tensor_view<T, 2>& dx, const tensor_view<T, 2>& dw, const T* db) {
    constexpr std::string_view who = "linear_backward";
    const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    w.require_shape({N, K}, who, "weight");
    dy.require_shape({M, N}, who, "dy");
    hymix::detail::require_unit_stride(x, 1, who, "x", true);
    hymix::detail::require_unit_stride(w, 1, who, "weight", true);
    hymix::detail::require_unit_stride(dy, 1, who, "dy", true);
    const tensor_view<const T, 1> db_v(db, {db ? N : 0});  // [N]
    if (dx.data) {
        dx.require_shape({M, K}, who, "dx");
        hymix::detail::require_unit_stride(dx, 1, who, "dx", true);
        hymix::detail::require_no_self_overlap(dx, who, "dx");
        hymix::detail::require_no_overlap(dx, "dx", x, "x", who);
        hymix::detail::require_no_overlap(dx, "dx", w, "weight", who);
        hymix::detail::require_no_overlap(dx, "dx", dy, "dy", who);
        if (dw.data) hymix::detail::require_no_overlap(dx, "dx", dw, "dw", who);
        hymix::detail::require_no_overlap(dx, "dx", db_v, "db", who);
    }
    if (dw.data) {
        dw.require_shape({N, K}, who, "dw");
        hymix::detail::require_unit_stride(dw, 1, who, "dw", true);
        hymix::detail::require_no_self_overlap(dw, who, "dw");
        hymix::detail::require_no_overlap(dw, "dw", x, "x", who);
        hymix::detail::require_no_overlap(dw, "dw", w, "weight", who);
        hymix::detail::require_no_overlap(dw, "dw", dy, "dy", who);
        hymix::detail::require_no_overlap(dw, "dw", db_v, "db", who);
    }
    if (db) {
        hymix::detail::require_no_overlap(db_v, "db", x, "x", who);
        hymix::detail::require_no_overlap(db_v, "db", dy, "dy", who);
    }
}

}  // namespace detail

/// Reference twin in T (double) with obvious loops. x [M, K], w [N, K], dy [M, N]; dx [M, K] overwritten,
/// dw [N, K] and db [N] accumulated; each skipped when its data is null.
template <class T>
void linear_backward_ref(tensor_view<const T, 2> x, tensor_view<const T, 2> w, tensor_view<const T, 2> dy, tensor_view<T, 2> dx,
                         tensor_view<T, 2> dw, T* db) {
    detail::check_linear_backward(x, w, dy, dx, dw, db);
    const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    if (dx.data)
        for (std::int64_t m = 0; m < M; ++m)
            for (std::int64_t k = 0; k < K; ++k) {
                T s = 0;
                for (std::int64_t n = 0; n < N; ++n) s += dy(m, n) * w(n, k);
                dx(m, k) = s;
            }
    if (dw.data)
        for (std::int64_t n = 0; n < N; ++n)
            for (std::int64_t k = 0; k < K; ++k) {
                T s = 0;
                for (std::int64_t m = 0; m < M; ++m) s += dy(m, n) * x(m, k);
                dw(n, k) += s;
            }
    if (db)
        for (std::int64_t n = 0; n < N; ++n) {
            T s = 0;
            for (std::int64_t m = 0; m < M; ++m) s += dy(m, n);
            db[n] += s;
        }
}

/// Rows per task of linear_backward: fixed (never derived from the thread count), so every output is computed by
/// the same tiles over the same blocks of terms, and hence in the same summation order, on 1 or 64 threads.
inline constexpr std::int64_t linear_backward_block = 128;

/// CPU fp32 backward of y = x wᵀ + b. x [M, K], w [N, K], dy [M, N] (unit inner strides, any row strides);
/// dx [M, K] = dy · w (overwritten); dw [N, K] += dyᵀ · x; db [N] += Σ_m dy[m, :]. Any of dx, dw (data == nullptr)
/// and db (nullptr) may be skipped. One task list: dx by blocks of rows of M and dw / db by blocks of rows of N
/// (each task owns distinct output rows; no atomics); every output is summed by the same register tile over the same
/// blocks of terms (detail::tile_product), so the result is bit-identical for any thread count. db sums rows in
/// order (fp64 accumulator). Throws shape_error naming the argument on a mismatch.
template <cpu_backend_type Backend>
void linear_backward(const Backend& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w, tensor_view<const float, 2> dy,
                     tensor_view<float, 2> dx, tensor_view<float, 2> dw, float* db) {
    using Arch = typename Backend::arch;
    detail::check_linear_backward(x, w, dy, dx, dw, db);
    const std::int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
    constexpr std::int64_t B = linear_backward_block;
    const std::int64_t n_dx = dx.data && M > 0 && K > 0 ? (M + B - 1) / B : 0;
    const std::int64_t n_dw = (dw.data || db) && N > 0 ? (N + B - 1) / B : 0;
    be.parallel_for(n_dx + n_dw, 1, [&](std::int64_t t0, std::int64_t t1) {
        for (std::int64_t t = t0; t < t1; ++t) {
            if (t < n_dx) {  // dx rows [r0, r0 + rb) = dy rows · w: A(i, l) = dy[r0 + i, l], B = w
                const std::int64_t r0 = t * B, rb = std::min(B, M - r0);
                detail::tile_product<Arch>(dy.data + r0 * dy.strides[0], dy.strides[0], 1, w.data, w.strides[0], &dx(r0, 0), dx.strides[0], rb, K,
                                               N, false);
                continue;
            }
            const std::int64_t n0 = (t - n_dx) * B, nb = std::min(B, N - n0);
            // dw rows [n0, n0 + nb) += dyᵀ · x: A(i, l) = dy[l, n0 + i], B = x
            if (dw.data && M > 0 && K > 0)
                detail::tile_product<Arch>(dy.data + n0, 1, dy.strides[0], x.data, x.strides[0], &dw(n0, 0), dw.strides[0], nb, K, M,
                                               true);
            if (db) {
                std::vector<double> acc(static_cast<std::size_t>(nb), 0.0);
                for (std::int64_t m = 0; m < M; ++m) {
                    const float* row = dy.data + m * dy.strides[0] + n0;
                    for (std::int64_t j = 0; j < nb; ++j) acc[static_cast<std::size_t>(j)] += static_cast<double>(row[j]);
                }
                for (std::int64_t j = 0; j < nb; ++j) db[n0 + j] = static_cast<float>(db[n0 + j] + acc[static_cast<std::size_t>(j)]);
            }
        }
    });
}

}  // namespace hymix::kernels
