// Dense projections y[M, N] = x[M, K] · W[N, K]ᵀ (+ b), PyTorch's nn.Linear layout (spec.md §0). Batch-invariant
// (spec.md §0): one register-tiled xsimd kernel for every M sums each output in an order fixed by K and the SIMD
// width alone — never by M, the row's tile or the thread count — so a row's result is the same bits in any batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

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

// The summation order of one output y[m, n] (the batch-invariance contract), with W = SIMD lanes of fp32:
//   1. lane l accumulates x[m, k]·w[n, k] for k ≡ l (mod W) in increasing k, one multiply-add per term (fused
//      wherever the target has FMA: see mul_add), starting from +0; the last K % W terms are zero-padded;
//   2. the W lanes are summed by halving: v[i] ← v[i] + v[i + h] for h = W/2, W/4, …, 1 (lane_tree_sum);
//   3. then the bias is added: y = v[0] + b[n].
// Every tile shape and every code path below computes exactly this. Speed comes from the blocking instead: decode
// (M ≤ 2 rows, or a few row tiles) streams each weight row once for all rows; prefill keeps a block of x in L2
// while weight tiles pass through L1, each loaded vector feeding several FMAs (../shared/docs/machine.md).

/// Step 2 for one vector, written lane by lane.
template <class Arch>
inline float lane_tree_sum(xsimd::batch<float, Arch> v) {
    constexpr std::size_t W = xsimd::batch<float, Arch>::size;
    alignas(64) float a[W];
    v.store_aligned(a);
    for (std::size_t h = W / 2; h >= 1; h /= 2)
        for (std::size_t i = 0; i < h; ++i) a[i] = a[i] + a[i + h];
    return a[0];
}

#if defined(__AVX512F__)
/// Step 2 for up to 16 AVX-512 accumulators at once (a transposing tree: ~1 add and 2 shuffles per output instead
/// of ~8 ops). Level 1 adds 256-bit halves, level 2 128-bit quarters, levels 3 and 4 lanes 2 and 1 apart, always
/// lower + upper, so each output is the same tree as lane_tree_sum. Input i ends in lane 4·(i % 4) + i / 4.
template <int Count>
inline __m512 lane_tree_sum16(const __m512* v) {
    static_assert(Count >= 1 && Count <= 16);
    auto level = [](__m512 a, __m512 b, auto lo_sel, auto hi_sel) { return _mm512_add_ps(lo_sel(a, b), hi_sel(a, b)); };
    __m512 l1[8], l2[4], l3[2];
    for (int i = 0; i < 8; ++i) {
        if (2 * i >= Count) break;
        const __m512 a = v[2 * i], b = 2 * i + 1 < Count ? v[2 * i + 1] : a;
        l1[i] = level(a, b, [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(1, 0, 1, 0)); },
                      [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 2, 3, 2)); });
    }
    const int n1 = (Count + 1) / 2, n2 = (n1 + 1) / 2, n3 = (n2 + 1) / 2;
    for (int i = 0; i < n2; ++i) {
        const __m512 a = l1[2 * i], b = 2 * i + 1 < n1 ? l1[2 * i + 1] : a;
        l2[i] = level(a, b, [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(2, 0, 2, 0)); },
                      [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 1, 3, 1)); });
    }
    for (int i = 0; i < n3; ++i) {
        const __m512 a = l2[2 * i], b = 2 * i + 1 < n2 ? l2[2 * i + 1] : a;
        l3[i] = level(a, b, [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(1, 0, 1, 0)); },
                      [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 2, 3, 2)); });
    }
    const __m512 a = l3[0], b = n3 > 1 ? l3[1] : a;
    return level(a, b, [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(2, 0, 2, 0)); },
                 [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 1, 3, 1)); });
}
#endif

/// Step 2 for Count accumulators: out[i] = lane_tree_sum(acc[i]).
template <class Arch, int Count>
inline void lane_tree_sums(const xsimd::batch<float, Arch>* acc, float* out) {
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
        [&]<int... G>(std::integer_sequence<int, G...>) {
            ([&] {
                constexpr int first = 16 * G, n = std::min(16, Count - first);
                __m512 v[n];
                for (int i = 0; i < n; ++i) v[i] = acc[first + i];
                alignas(64) float lanes[16];
                _mm512_store_ps(lanes, lane_tree_sum16<n>(v));
                for (int i = 0; i < n; ++i) out[first + i] = lanes[4 * (i % 4) + i / 4];
            }(), ...);
        }(std::make_integer_sequence<int, (Count + 15) / 16>{});
        return;
    }
#endif
    for (int i = 0; i < Count; ++i) out[i] = lane_tree_sum<Arch>(acc[i]);
}

/// Makes the compiler keep v in a register: without it GCC folds every use of a weight vector into its FMA as a
/// memory operand, R loads instead of one, and the tile becomes load-bound.
template <class B>
inline void pin_register([[maybe_unused]] B& v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    auto r = static_cast<typename B::register_type>(v);
    asm("" : "+v"(r));
    v = B(r);
#endif
}

/// Whether mul_add rounds once (a fused multiply-add) for this architecture and build.
template <class Arch>
constexpr bool mul_add_is_fused() {
#if defined(__AVX512F__)
    if (std::is_base_of_v<xsimd::avx512f, Arch>) return true;
#endif
#if defined(__FMA__)
    return sizeof(typename xsimd::batch<float, Arch>::register_type) <= 32;
#elif defined(__aarch64__)
    return std::is_base_of_v<xsimd::neon64, Arch>;
#else
    return false;
#endif
}

/// One term of step 1: acc + x·w, fused (one rounding) with AVX-512, x86 FMA or AArch64; elsewhere a multiply then
/// an add kept apart. Never left to the compiler: xsimd 8's fma is a plain x·w + acc on AVX-512 and on archs
/// without FMA, which GCC (-ffp-contract=fast) fuses in some tile shapes and not in others — the same output
/// would differ between tiles — and clang does not fuse at all.
template <class Arch>
inline xsimd::batch<float, Arch> mul_add(xsimd::batch<float, Arch> x, xsimd::batch<float, Arch> w, xsimd::batch<float, Arch> acc) {
    using B = xsimd::batch<float, Arch>;
    [[maybe_unused]] constexpr std::size_t bytes = sizeof(typename B::register_type);
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) return B(_mm512_fmadd_ps(x, w, acc));
#endif
#if defined(__FMA__)
    if constexpr (bytes == 32 && !std::is_base_of_v<xsimd::avx512f, Arch>) return B(_mm256_fmadd_ps(x, w, acc));
    if constexpr (bytes == 16) return B(_mm_fmadd_ps(x, w, acc));
#elif defined(__aarch64__)
    if constexpr (std::is_base_of_v<xsimd::neon64, Arch>) return B(vfmaq_f32(acc, x, w));
#endif
    B p = x * w;
    pin_register(p);
    return p + acc;
}

/// Register tile: y[m0 + r, n0 + c] for r < R, c < C (step 1 for R·C outputs, then steps 2 and 3). Each loaded
/// x vector feeds C FMAs and each loaded w vector R FMAs.
template <class Arch, int R, int C>
inline void linear_tile(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
                        tensor_view<float, 2> y, std::int64_t m0, std::int64_t n0) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    const std::int64_t K = x.dim(1), Kv = K / W * W;
    const float* xr[R];
    const float* wr[C];
    for (int r = 0; r < R; ++r) xr[r] = &x(m0 + r, 0);
    for (int c = 0; c < C; ++c) wr[c] = &w(n0 + c, 0);
    B acc[R * C];
    for (int i = 0; i < R * C; ++i) acc[i] = B(0.f);
    auto step = [&](const float* const* xp, const float* const* wp, std::int64_t k) {
        B wv[C];
        for (int c = 0; c < C; ++c) {
            wv[c] = B::load_unaligned(wp[c] + k);
            if constexpr (R > 1) pin_register(wv[c]);
        }
        for (int r = 0; r < R; ++r) {
            const B xv = B::load_unaligned(xp[r] + k);
            for (int c = 0; c < C; ++c) acc[r * C + c] = mul_add<Arch>(xv, wv[c], acc[r * C + c]);
        }
    };
    for (std::int64_t k = 0; k < Kv; k += W) step(xr, wr, k);
    if (Kv < K) {  // the last K % W terms, zero-padded to a full vector
#if defined(__AVX512F__)
        if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
            const auto mask = static_cast<__mmask16>((1u << (K - Kv)) - 1);
            B wv[C];
            for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, wr[c] + Kv);
            for (int r = 0; r < R; ++r) {
                const B xv = _mm512_maskz_loadu_ps(mask, xr[r] + Kv);
                for (int c = 0; c < C; ++c) acc[r * C + c] = mul_add<Arch>(xv, wv[c], acc[r * C + c]);
            }
        } else
#endif
        {
            alignas(64) float xt[R][W] = {}, wt[C][W] = {};
            const float* xtp[R];
            const float* wtp[C];
            for (int r = 0; r < R; ++r) std::copy(xr[r] + Kv, xr[r] + K, xt[r]), xtp[r] = xt[r];
            for (int c = 0; c < C; ++c) std::copy(wr[c] + Kv, wr[c] + K, wt[c]), wtp[c] = wt[c];
            step(xtp, wtp, 0);
        }
    }
    float out[R * C];
    lane_tree_sums<Arch, R * C>(acc, out);
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) y(m0 + r, n0 + c) = out[r * C + c] + (bias ? bias[n0 + c] : 0.f);
}

/// Register tile sizes: R rows of x by C rows of w. With 32 vector registers (AVX-512) 4 × 6 accumulators plus
/// 6 weight vectors and one x vector fit, and blocks of one or two rows (decode) take 8 weight rows at a time; with
/// 16 registers (AVX2, SSE, NEON) 3 × 3 and 2 × 4. `group` (a multiple of both widths) is the unit of the column split.
template <class Arch>
struct linear_tiles {
    static constexpr bool many_registers = std::is_base_of_v<xsimd::avx512f, Arch>;
    static constexpr int R = many_registers ? 4 : 3;
    static constexpr int C = many_registers ? 6 : 3;
    static constexpr int C_few_rows = many_registers ? 8 : 4;  // for blocks of at most 2 rows
    static constexpr int group = many_registers ? 24 : 12;
};

/// Calls f(std::integral_constant<int, v>) for the run-time value v in [1, Max].
template <int Max, class F>
inline void with_constant(int v, F&& f) {
    if constexpr (Max > 1)
        if (v < Max) return with_constant<Max - 1>(v, f);
    f(std::integral_constant<int, Max>{});
}

/// Rows [m0, m1) of y against weight rows [n, n + CC): row tiles of R, then one tile of the remaining rows.
template <class Arch, int R, int CC>
void linear_row_tiles(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias, tensor_view<float, 2> y,
                      std::int64_t m0, std::int64_t m1, std::int64_t n) {
    std::int64_t m = m0;
    for (; m + R <= m1; m += R) linear_tile<Arch, R, CC>(x, w, bias, y, m, n);
    if (m < m1)
        with_constant<R - 1>(static_cast<int>(m1 - m), [&](auto rr) { linear_tile<Arch, decltype(rr)::value, CC>(x, w, bias, y, m, n); });
}

/// Rows [m0, m1) against weight rows [n0, n1) in weight tiles of C rows (the last one narrower).
template <class Arch, int R, int C>
void linear_block(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias, tensor_view<float, 2> y,
                  std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
    std::int64_t n = n0;
    for (; n + C <= n1; n += C) linear_row_tiles<Arch, R, C>(x, w, bias, y, m0, m1, n);
    if (n < n1)
        with_constant<C - 1>(static_cast<int>(n1 - n), [&](auto cc) { linear_row_tiles<Arch, R, decltype(cc)::value>(x, w, bias, y, m0, m1, n); });
}

/// y[:, n0..n1) for all rows. Rows go in blocks that fit in L2 (all M at once for decode, so every weight row is
/// read once); within a block each weight tile (in L1) meets every row tile in turn.
template <class Arch>
void linear_columns(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias, tensor_view<float, 2> y,
                    std::int64_t n0, std::int64_t n1) {
    using tiles = linear_tiles<Arch>;
    const std::int64_t M = x.dim(0), K = x.dim(1);
    if (M <= 2) {
        linear_block<Arch, 2, tiles::C_few_rows>(x, w, bias, y, 0, M, n0, n1);
        return;
    }
    constexpr std::int64_t l2_bytes = 256 * 1024;  // x block budget: a quarter of the smallest L2 seen (1 MiB)
    const std::int64_t mb = std::max<std::int64_t>(tiles::R, l2_bytes / (4 * std::max<std::int64_t>(K, 1)) / tiles::R * tiles::R);
    for (std::int64_t m0 = 0; m0 < M; m0 += mb)
        linear_block<Arch, tiles::R, tiles::C>(x, w, bias, y, m0, std::min(M, m0 + mb), n0, n1);
}

}  // namespace detail

/// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]). fp32. Inner strides must be 1; y must not overlap x, w or bias.
/// Throws shape_error on a mismatch, naming the argument. Parallel over output columns on the backend's threads.
/// Batch-invariant: y[m, :] depends only on x[m, :], w and bias, bit for bit, whatever M, the row's position and
/// the thread count (see detail's summation order).
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
            tensor_view<float, 2> y) {
    using Arch = typename Backend::arch;
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
    // Tasks are whole groups of weight tiles; about 4 per thread (decode: enough to balance; prefill: big enough
    // to reuse each block of x).
    constexpr std::int64_t G = detail::linear_tiles<Arch>::group;
    const std::int64_t groups = (N + G - 1) / G;
    const std::int64_t grain = std::max<std::int64_t>(1, groups / (4 * be.num_threads()));
    be.parallel_for(groups, grain, [&](std::int64_t g0, std::int64_t g1) {
        detail::linear_columns<Arch>(x, w, bias, y, g0 * G, std::min(N, g1 * G));
    });
}

}  // namespace hymix::kernels
