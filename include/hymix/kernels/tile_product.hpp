// Register-tile matrix products C (+)= A · B for the CPU fp32 kernels whose operands are small or oddly strided:
// the projections' backward (dx = dy · W, dW += dyᵀ · x), the chunked SSD forward (the state update Xᵀ·B, the
// read-out of the entering state, the intra-chunk product tril(M)·X), the chunked gated delta rule and the backwards of
// both. B's rows are contiguous
// (unit inner stride); A is read element by element at any pair of strides, so Aᵀ costs nothing. Each step
// broadcasts R values of A against VC vectors of one row of B; nothing is packed, transposed or zeroed first, which
// is what makes these products fast at chunk sizes (64 × 64 × 128) where a general GEMM spends its time packing.
// The order of the terms is fixed by the operand sizes alone (never by the thread count or the caller's batch), so
// every output has the same bits wherever it is computed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "hymix/kernels/lane_sum.hpp"
#include "hymix/kernels/linear.hpp"

namespace hymix::kernels::detail {

/// Register tiles of the products: R rows of A (broadcast) × VC vectors of B's row. With 32 vector registers
/// (AVX-512) 6 × 4 accumulators, 4 B vectors and a broadcast; with 16, 3 × 3.
template <class Arch>
struct tile_product_tiles {
    static constexpr bool wide = std::is_base_of_v<xsimd::avx512f, Arch>;
    static constexpr int R = wide ? 6 : 3, VC = wide ? 4 : 3;
};

/// One term of the scalar tail, rounded as the vector path's mul_add rounds on Arch: once where it is fused, else a
/// multiply and an add apart. So a column's bits do not depend on whether it falls in the vector part or the tail.
template <class Arch>
inline float tail_mul_add(float a, float b, float acc) {
    if constexpr (mul_add_is_fused<Arch>()) {
        return std::fma(a, b, acc);
    } else {
        volatile float p = a * b;  // kept apart from the add (no contraction)
        return p + acc;
    }
}

/// Terms per pass of tile_product: a pass sums this many terms into the output (read before, written after), so one
/// row panel of B (this many rows × the tile's VC vectors) stays in cache while every row tile meets it.
inline constexpr std::int64_t tile_product_terms = 256;

/// One register tile: C[r, c·W + e] (+)= Σ_l A(r, l) · B[l·ldb + c·W + e] for r < R, c < VC, e < W, with A(r, l) =
/// a[r·a_row + l·a_col] and C's rows at c + r·ldc. Terms l < n are taken by every row; with `diag`, R more terms
/// l = n + q (q < R) follow, each taken only by the rows r ≥ q (the diagonal block of a lower-triangular A, whose
/// entries above the diagonal are never read). The sum starts from 0 and takes the terms one at a time in order of
/// l, each through mul_add (one rounding where the architecture fuses it); with `accumulate` it is then added to C
/// (one more rounding), else it overwrites C.
template <class Arch, int R, int VC, bool diag = false>
HYMIX_LINEAR_FLATTEN void product_tile(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb,
                                       std::int64_t n, float* c, std::int64_t ldc, bool accumulate) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    B acc[R * VC];
    static_for<R * VC>([&](auto i) { acc[i] = B(0.f); });
    for (std::int64_t l = 0; l < n; ++l) {
        B bv[VC];
        static_for<VC>([&](auto j) {
            bv[j] = B::load_unaligned(b + l * ldb + j * W);
            pin_register(bv[j]);
        });
        static_for<R>([&](auto r) {
            const B av(a[r * a_row + l * a_col]);
            static_for<VC>([&](auto j) { acc[r * VC + j] = mul_add<Arch>(av, bv[j], acc[r * VC + j]); });
        });
    }
    if constexpr (diag) {
        static_for<R>([&](auto q) {
            constexpr int qv = decltype(q)::value;
            const std::int64_t l = n + qv;
            B bv[VC];
            static_for<VC>([&](auto j) { bv[j] = B::load_unaligned(b + l * ldb + j * W); });
            static_for<R>([&](auto r) {
                if constexpr (decltype(r)::value >= qv) {
                    const B av(a[r * a_row + l * a_col]);
                    static_for<VC>([&](auto j) { acc[r * VC + j] = mul_add<Arch>(av, bv[j], acc[r * VC + j]); });
                }
            });
        });
    }
    static_for<R * VC>([&](auto i) {
        float* ci = c + (i / VC) * ldc + (i % VC) * W;
        (accumulate ? B::load_unaligned(ci) + acc[i] : acc[i]).store_unaligned(ci);
    });
}

/// C [I, J] (+)= A [I, L] · B [L, J], A(i, l) = a[i·a_row + l·a_col], B's rows b + l·ldb (unit inner stride), C's
/// rows c + i·ldc: passes of tile_product_terms terms; within a pass, panels of VC vectors of B's columns, each met by
/// every row tile of R rows. The last J % W columns take a scalar loop with the same order of terms and the vector
/// path's rounding (tail_mul_add). Each pass's sum is added to C once; `accumulate`: the first pass too (else it overwrites C). C must not
/// overlap A or B. The order of terms of an output depends on L only (not on I, J or where the output sits); with
/// L ≤ tile_product_terms (one pass) adding the same product twice onto zeros gives exactly twice it.
template <class Arch>
void tile_product(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc,
                  std::int64_t I, std::int64_t J, std::int64_t L, bool accumulate) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    constexpr int R = tile_product_tiles<Arch>::R, VC = tile_product_tiles<Arch>::VC;
    const std::int64_t Jv = J - J % W;
    if (L == 0 && !accumulate) {
        for (std::int64_t i = 0; i < I; ++i) std::fill(c + i * ldc, c + i * ldc + J, 0.f);
        return;
    }
    for (std::int64_t l0 = 0; l0 < L; l0 += tile_product_terms) {
        const std::int64_t n = std::min(tile_product_terms, L - l0);
        const bool acc = accumulate || l0 > 0;
        const float* al = a + l0 * a_col;
        const float* bl = b + l0 * ldb;
        for (std::int64_t j0 = 0; j0 < Jv; j0 += VC * W) {
            with_constant<VC>(static_cast<int>(std::min<std::int64_t>(VC, (Jv - j0) / W)), [&](auto vc) {
                constexpr int V = decltype(vc)::value;
                std::int64_t i = 0;
                for (; i + R <= I; i += R) product_tile<Arch, R, V>(al + i * a_row, a_row, a_col, bl + j0, ldb, n, c + i * ldc + j0, ldc, acc);
                if (i < I)
                    with_constant<R>(static_cast<int>(I - i), [&](auto rc) {
                        product_tile<Arch, decltype(rc)::value, V>(al + i * a_row, a_row, a_col, bl + j0, ldb, n, c + i * ldc + j0, ldc, acc);
                    });
            });
        }
        for (std::int64_t i = 0; i < I; ++i)
            for (std::int64_t j = Jv; j < J; ++j) {
                float s = 0.f;
                for (std::int64_t l = 0; l < n; ++l) s = tail_mul_add<Arch>(al[i * a_row + l * a_col], bl[l * ldb + j], s);
                c[i * ldc + j] = acc ? c[i * ldc + j] + s : s;
            }
    }
}

/// C [I, J] (+)= tril(A) · B for a square A [I, I]: output row i sums the terms l ≤ i only, in order of l (rounded as
/// tile_product rounds them), then is added to C once (`accumulate`) or overwrites it. A's entries above the diagonal are never
/// read, so they may hold anything (a NaN there does not reach earlier rows: causality holds for any input). One pass
/// over all terms: meant for chunk-sized I (a few hundred at most). Same A, B, C conventions as tile_product.
template <class Arch>
void tile_product_lower(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
                        std::int64_t ldc, std::int64_t I, std::int64_t J, bool accumulate) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    constexpr int R = tile_product_tiles<Arch>::R, VC = tile_product_tiles<Arch>::VC;
    const std::int64_t Jv = J - J % W;
    for (std::int64_t j0 = 0; j0 < Jv; j0 += VC * W) {
        with_constant<VC>(static_cast<int>(std::min<std::int64_t>(VC, (Jv - j0) / W)), [&](auto vc) {
            constexpr int V = decltype(vc)::value;
            std::int64_t i = 0;
            for (; i + R <= I; i += R) product_tile<Arch, R, V, true>(a + i * a_row, a_row, a_col, b + j0, ldb, i, c + i * ldc + j0, ldc, accumulate);
            if (i < I)
                with_constant<R>(static_cast<int>(I - i), [&](auto rc) {
                    product_tile<Arch, decltype(rc)::value, V, true>(a + i * a_row, a_row, a_col, b + j0, ldb, i, c + i * ldc + j0, ldc,
                                                                     accumulate);
                });
        });
    }
    for (std::int64_t i = 0; i < I; ++i)
        for (std::int64_t j = Jv; j < J; ++j) {
            float s = 0.f;
            for (std::int64_t l = 0; l <= i; ++l) s = tail_mul_add<Arch>(a[i * a_row + l * a_col], b[l * ldb + j], s);
            c[i * ldc + j] = accumulate ? c[i * ldc + j] + s : s;
        }
}

/// C [I, J] (+)= tril(A)ᵀ · B for a square A [I, I] (A(i, l) = a[i·a_row + l·a_col]; entries above the diagonal never
/// read) and B [I, J] by rows: output row i sums the terms l ≥ i, from l = I − 1 down to i. It is tile_product_lower on
/// the rows taken in reverse order (negative strides), so it rounds as that function does, and output row i depends on
/// rows ≥ i of B only: the adjoint of a causal product (the backward of tril(P)·V, or a transposed triangular solve).
template <class Arch>
void tile_product_lower_transposed(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
                                   std::int64_t ldc, std::int64_t I, std::int64_t J, bool accumulate) {
    if (I == 0) return;
    // Row i' = I − 1 − i of the reversed problem takes Aᵀ(i, l) = A(l, i) at term l' = I − 1 − l.
    tile_product_lower<Arch>(a + (I - 1) * (a_row + a_col), -a_col, -a_row, b + (I - 1) * ldb, -ldb, c + (I - 1) * ldc, -ldc, I, J,
                             accumulate);
}

/// The lower triangle (diagonal included) of C = A · B for a square C [I, I]: A [I, L] strided as in tile_product, B
/// [L, I] by rows (for C = X Yᵀ, B is Yᵀ: see transpose_rows). Rows go in blocks of two row tiles, each block taking the
/// columns up to its last row rounded up to whole SIMD vectors (about half the work of the whole product at chunk
/// sizes). Entries right of the diagonal inside those vectors are written too, with the product's values; the rest of
/// the upper triangle is left as it was. Every written entry has the bits tile_product gives it.
template <class Arch>
void tile_product_lower_part(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t ldb, float* c,
                             std::int64_t ldc, std::int64_t I, std::int64_t L) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    constexpr std::int64_t rows = 2 * tile_product_tiles<Arch>::R;
    for (std::int64_t i0 = 0; i0 < I; i0 += rows) {
        const std::int64_t m = std::min(rows, I - i0), J = std::min(I, (i0 + m + W - 1) / W * W);
        tile_product<Arch>(a + i0 * a_row, a_row, a_col, b, ldb, c + i0 * ldc, ldc, m, J, L, false);
    }
}

/// dst [cols, rows] = srcᵀ for src [rows, cols] (row strides lds and ldd): the transposed operands the products above
/// read as rows. In blocks of 8 source rows: rows of one head in a [n_rows, H, d] tensor lie a power-of-two stride
/// apart and share cache sets, so a block stays below the cache's associativity while its columns go out as runs.
inline void transpose_rows(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst, std::int64_t ldd) {
    constexpr std::int64_t block = 8;
    for (std::int64_t i0 = 0; i0 < rows; i0 += block) {
        const std::int64_t m = std::min(block, rows - i0);
        const float* s = src + i0 * lds;
        float* d = dst + i0;
        for (std::int64_t j = 0; j < cols; ++j)
            for (std::int64_t i = 0; i < m; ++i) d[j * ldd + i] = s[i * lds + j];
    }
}

}  // namespace hymix::kernels::detail
