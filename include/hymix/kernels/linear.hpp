// Dense projections y[M, N] = x[M, K] · W[N, K]ᵀ (+ b), PyTorch's nn.Linear layout (spec.md §0). Batch-invariant
// (spec.md §0): one register-tiled xsimd kernel for every M sums each output in an order fixed by K and the SIMD
// width alone — never by M, the row's tile or the thread count — so a row's result is the same bits in any batch.
// W may be stored in f32, bf16 or f16 (spec.md §0, dtype rules): 16-bit weights are widened to f32 in registers as
// they are loaded (exactly: both widen without rounding) and every product and sum is fp32, so a 16-bit W gives the
// same bits as the f32 kernel on W's widened values, while reading half the bytes (decode is bound by them). An 8-bit
// W (q8_view: integers with one scale per row) runs the same tiles on the integers, widened exactly, and multiplies each
// output by its row's scale once at the end: a quarter of the f32 bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__) || defined(__FMA__) || defined(__SSE4_1__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/dtype.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/lane_sum.hpp"
#include "hymix/kernels/widen.hpp"

// Inlines every call inside a register tile (the step lambda, the reduction): past a size budget, GCC otherwise
// outlines them and the accumulators go through memory at every step.
#if defined(__GNUC__)
#define HYMIX_LINEAR_FLATTEN [[gnu::flatten]] inline
#else
#define HYMIX_LINEAR_FLATTEN inline
#endif

namespace hymix::kernels {

/// Reference: y = x Wᵀ + b in double precision with obvious loops. x [M, K], w [N, K] (any element type: f32, f64,
/// bf16, f16), bias [N] or null.
template <class TX, class TW, class TY, class TB = TW>
void linear_ref(tensor_view<const TX, 2> x, tensor_view<const TW, 2> w, const std::type_identity_t<TB>* bias,
                tensor_view<TY, 2> y) {
    const auto wide = [](TW v) {
        if constexpr (std::is_arithmetic_v<TW>)
            return static_cast<double>(v);
        else
            return static_cast<double>(v.to_float());
    };
    for (std::int64_t m = 0; m < x.dim(0); ++m)
        for (std::int64_t n = 0; n < w.dim(0); ++n) {
            double acc = bias ? static_cast<double>(bias[n]) : 0.0;
            for (std::int64_t k = 0; k < x.dim(1); ++k) {
                acc += static_cast<double>(x(m, k)) * wide(w(n, k));
            }
            y(m, n) = static_cast<TY>(acc);
        }
}

/// Element types a weight matrix of kernels::linear may be stored in.
template <class T>
concept linear_weight_type = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

namespace detail {

// The summation order of one output y[m, n] (the batch-invariance contract), with W = SIMD lanes of fp32:
//   1. lane l accumulates x[m, k]·w[n, k] for k ≡ l (mod W) in increasing k, one multiply-add per term (fused
//      wherever the target has FMA: see mul_add), starting from +0; the last K % W terms are zero-padded;
//   2. the W lanes are summed by halving: v[i] ← v[i] + v[i + h] for h = W/2, W/4, …, 1 (lane_tree_sum);
//   3. then the bias, if any, is added: y = v[0] + b[n].
// Every tile shape and every code path below computes exactly this. Speed comes from the blocking instead: decode
// (M ≤ 2 rows, or two row tiles) streams each weight row once for all rows, the first row tile prefetching the next
// weight tile (a second row tile then computes from cache while memory keeps streaming); prefill keeps a block of x
// in L2 while weight tiles pass through L1, each loaded vector feeding several FMAs (../shared/docs/machine.md).

/// Steps 2 and 3 for a tile: y[m0 + r, n0 + c] = lane_tree_sum(acc[r·C + c]) (+ bias[n0 + c]).
template <class Arch, int R, int C>
inline void linear_store_tile(const xsimd::batch<float, Arch> (&acc)[R * C], const float* bias, tensor_view<float, 2> y,
                              std::int64_t m0, std::int64_t n0) {
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
        // Groups of 16 outputs in row-major tile order; each row's run of lanes is shifted down to lane 0, gets its
        // bias and is stored with a mask.
        static_for<(R * C + 15) / 16>([&](auto g) {
            constexpr int first = 16 * g, n = std::min(16, R * C - first);
            const __m512 sums = lane_tree_sum16<n>([&](auto i) -> __m512 { return acc[first + i]; });
            static_for<R>([&](auto r) {
                constexpr int lo = std::max<int>(r * C, first), hi = std::min<int>((r + 1) * C, first + n);
                if constexpr (lo < hi) {
                    constexpr int c0 = lo - r * C, shift = lo - first;
                    constexpr auto mask = static_cast<__mmask16>((1u << (hi - lo)) - 1);
                    __m512 v = sums;
                    if constexpr (shift > 0) {
                        const __m512i from = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
                        v = _mm512_maskz_permutexvar_ps(0xFFFF, _mm512_add_epi32(from, _mm512_set1_epi32(shift)), v);
                    }
                    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, bias + n0 + c0));
                    _mm512_mask_storeu_ps(&y(m0 + r, n0 + c0), mask, v);
                }
            });
        });
        return;
    }
#endif
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            const float v = lane_tree_sum<Arch>(acc[r * C + c]);
            y(m0 + r, n0 + c) = bias ? v + bias[n0 + c] : v;
        }
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

/// Loads of the last K % W terms of a row, zero-padded to a full vector (step 1's tail), widened to f32.
template <class Arch, class T = float>
inline auto tail_loader(std::int64_t n) {
    using B = xsimd::batch<float, Arch>;
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && std::is_same_v<T, float>) {
        const auto mask = static_cast<__mmask16>((1u << n) - 1);
        return [mask](const float* p) { return B(_mm512_maskz_loadu_ps(mask, p)); };
    } else
#endif
    {
        return [n](const T* p) {
            alignas(64) T t[B::size] = {};
            std::copy(p, p + n, t);
            return load_widened<Arch>(static_cast<const T*>(t));
        };
    }
}

/// Register tile: y[m0 + r, n0 + c] for r < R, c < C (step 1 for R·C outputs, then steps 2 and 3). Each loaded
/// x vector feeds C FMAs and each loaded w vector R FMAs. Given a range [k0, k1) of K (bounds below K multiples of
/// W), the tile runs only those terms, carrying its R·C accumulators between ranges in `partial`: stored exactly,
/// so the sums are those of one pass.
template <class Arch, int R, int C, class TW, bool Prefetch = false>
HYMIX_LINEAR_FLATTEN void linear_tile(tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias,
                        tensor_view<float, 2> y, std::int64_t m0, std::int64_t n0, std::int64_t k0, std::int64_t k1,
                        xsimd::batch<float, Arch>* partial) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    const std::int64_t K = x.dim(1), Kv = K / W * W;
    const float* xr[R];
    const TW* wr[C];
    static_for<R>([&](auto r) { xr[r] = &x(m0 + r, 0); });
    static_for<C>([&](auto c) { wr[c] = &w(n0 + c, 0); });
    // Prefetch: the same columns of the next weight tile's rows (C rows on), into L2, while this tile computes.
    [[maybe_unused]] const std::uintptr_t ahead = static_cast<std::uintptr_t>(C * w.strides[0]) * sizeof(TW);
    B acc[R * C];
    if (k0 == 0)
        static_for<R * C>([&](auto i) { acc[i] = B(0.f); });
    else
        static_for<R * C>([&](auto i) { acc[i] = partial[i]; });
    auto step = [&](std::int64_t k, auto load, auto load_w) {  // terms k … k + W − 1 of every output of the tile
        B wv[C];
        static_for<C>([&](auto c) {
            if constexpr (Prefetch)
                __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(wr[c] + k) + ahead), 0, 2);
            wv[c] = load_w(wr[c] + k);
            if constexpr (R > 1) pin_register(wv[c]);
        });
        static_for<R>([&](auto r) {
            const B xv = load(xr[r] + k);
            static_for<C>([&](auto c) { acc[r * C + c] = mul_add<Arch>(xv, wv[c], acc[r * C + c]); });
        });
    };
    for (std::int64_t k = k0; k < std::min(k1, Kv); k += W)
        step(k, [](const float* p) { return B::load_unaligned(p); }, [](const TW* p) { return load_widened<Arch>(p); });
    if (k1 < K) {
        static_for<R * C>([&](auto i) { partial[i] = acc[i]; });
        return;
    }
    if (Kv < K) step(Kv, tail_loader<Arch>(K - Kv), tail_loader<Arch, TW>(K - Kv));
    linear_store_tile<Arch, R, C>(acc, bias, y, m0, n0);
}

/// Register tile sizes: R rows of x by C rows of w. With 32 vector registers (AVX-512) 4 × 6 accumulators plus
/// 6 weight vectors and one x vector fit, and blocks of one or two rows (decode) take 8 f32 weight rows at a time;
/// with 16 registers (AVX2, SSE, NEON) 3 × 3 and 2 × 4. `group` (a multiple of every width) is the unit of the column
/// split.
template <class Arch>
struct linear_tiles {
    static constexpr bool many_registers = std::is_base_of_v<xsimd::avx512f, Arch>;
    static constexpr int R = many_registers ? 4 : 3;
    static constexpr int C = many_registers ? 6 : 3;
    static constexpr int group = many_registers ? 24 : 12;
    /// Weight rows per tile for blocks of at most 2 rows (decode), by the weight's element type. 16-bit weights take
    /// 4 rows, not 8: one core then streams them closer to f32's rate, in bytes. Measured on a Zen 4 EPYC, one thread,
    /// weights from DRAM, M 1, best of 200 calls of the decode tile's loop (docs/bf16_decode_tile_2core/gemv_rows.cpp):
    /// bf16 4096² with 8 rows 1.45–1.47 ms, with 4 rows 1.26–1.28 ms (23 → 26 GB/s; f32 30 GB/s; kernels::linear
    /// after the change 1.27–1.29 ms); 5 and 6 rows as slow as 8, 2 and 3 rows almost as fast as 4; an earlier run
    /// (not kept) gave the same order at [6400, 1536], [1536, 3072], [4096, 1024] and [2048, 2048]. 8-bit weights stay
    /// at 8 rows: 4 made bench_linear's i8 GEMV 5–41% slower. On a 16-core Xeon the width made no difference beyond
    /// the spread (1 and 16 threads).
    template <class TW>
    static constexpr int C_few_rows = many_registers ? (sizeof(TW) == 2 ? 4 : 8) : 4;
};

/// Rows [m0, m1) of y against weight rows [n, n + CC): row tiles of R, then one tile of the remaining rows. Long
/// rows (K > k_chunk) go in K ranges of k_chunk, all row tiles finishing one range before the next starts, so the
/// weight tile's slice stays in L1 while the row tiles pass; their accumulators wait in `partial` meanwhile. With
/// `Prefetch`, the first row tile also fetches the next weight tile's slice into L2 (decode batches: see linear_columns).
template <class Arch, int R, int CC, class TW, bool Prefetch = false>
void linear_row_tiles(tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias, tensor_view<float, 2> y,
                      std::int64_t m0, std::int64_t m1, std::int64_t n, std::int64_t k_chunk, xsimd::batch<float, Arch>* partial) {
    const std::int64_t K = x.dim(1);
    for (std::int64_t k0 = 0; k0 < K; k0 += k_chunk) {
        const std::int64_t k1 = K - k0 <= k_chunk ? K : k0 + k_chunk;
        std::int64_t m = m0;
        auto* p = partial;
        auto tile = [&](auto rows, auto prefetch) {  // rows of x from m, accumulators from p, then past both
            linear_tile<Arch, decltype(rows)::value, CC, TW, decltype(prefetch)::value>(x, w, bias, y, m, n, k0, k1, p);
            m += decltype(rows)::value;
            p += decltype(rows)::value * CC;
        };
        auto rest = [&](auto prefetch) {  // the last, partial row tile
            with_constant<R - 1>(static_cast<int>(m1 - m), [&](auto rr) { tile(rr, prefetch); });
        };
        if constexpr (Prefetch) {  // the first row tile, full or partial, prefetches
            if (m + R <= m1)
                tile(std::integral_constant<int, R>{}, std::true_type{});
            else if (m < m1)
                rest(std::true_type{});
        }
        while (m + R <= m1) tile(std::integral_constant<int, R>{}, std::false_type{});
        if (m < m1) rest(std::false_type{});
    }
}

/// Rows [m0, m1) against weight rows [n0, n1) in weight tiles of C rows (the last one narrower), first to last or,
/// with `reverse`, last to first (so consecutive row blocks start on the weight tiles still in cache). Blocks of
/// more than one row tile and K > k_chunk (at most MaxRows rows then) run in K ranges (linear_row_tiles). `Prefetch`
/// fetches the tile C rows on, the next one only first to last: callers never combine it with `reverse`.
template <class Arch, int R, int C, int MaxRows = R, bool Prefetch = false, class TW>
void linear_block(tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias, tensor_view<float, 2> y,
                  std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1, std::int64_t k_chunk, bool reverse = false) {
    using B = xsimd::batch<float, Arch>;
    if (m1 - m0 <= R || x.dim(1) <= k_chunk) k_chunk = x.dim(1);
    alignas(64) B partial[(MaxRows + R - 1) / R * R * C];
    const std::int64_t full = (n1 - n0) / C, tail = n1 - n0 - full * C;
    auto narrow = [&] {
        if (tail > 0)
            with_constant<C - 1>(static_cast<int>(tail), [&](auto cc) {
                linear_row_tiles<Arch, R, decltype(cc)::value, TW>(x, w, bias, y, m0, m1, n0 + full * C, k_chunk, partial);
            });
    };
    if (reverse) narrow();
    for (std::int64_t t = 0; t < full; ++t)
        linear_row_tiles<Arch, R, C, TW, Prefetch>(x, w, bias, y, m0, m1, n0 + (reverse ? full - 1 - t : t) * C, k_chunk, partial);
    if (!reverse) narrow();
}

/// y[:, n0..n1) for all rows. Rows go in blocks that fit in L2 (all M at once for decode, so every weight row is
/// read once); within a block each weight tile (in L1) meets every row tile in turn.
template <class Arch, class TW>
void linear_columns(tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias, tensor_view<float, 2> y,
                    std::int64_t n0, std::int64_t n1) {
    using tiles = linear_tiles<Arch>;
    const std::int64_t M = x.dim(0), K = x.dim(1);
    // Decode (M ≤ 2 rows: one row tile) prefetches the next weight tile while it computes. Measured on Zen 5, 2
    // threads: bench_linear M 1 took 10–30% less time with bf16 and i8 weights (their widening otherwise stalls the
    // stream) and the same with f32; whole-model decode steps at batch 1 were 1.01–1.41× faster
    // (docs/decode_prefetch_2core.csv).
    if (M <= 2) {
        linear_block<Arch, 2, tiles::template C_few_rows<TW>, 2, true>(x, w, bias, y, 0, M, n0, n1, K);
        return;
    }
    // Rows in blocks of about 256 KiB of x (a quarter of the smallest L2 seen, 1 MiB). A weight tile of up to
    // chunk_above columns (36 KiB) stays in L1 by itself; longer rows run in K ranges of k_chunk (24 KiB of weight
    // tile: shorter ranges cost more in carried sums than they save, measured), and their row blocks are then at
    // most chunk_rows rows (the carried sums' buffer is on the stack).
    constexpr std::int64_t l2_bytes = 256 * 1024, chunk_above = 1536, k_chunk = 1024, chunk_rows = 64;
    std::int64_t mb = std::max<std::int64_t>(tiles::R, l2_bytes / (4 * std::max<std::int64_t>(K, 1)) / tiles::R * tiles::R);
    if (K > chunk_above) mb = std::min(mb, chunk_rows);
    // One block of rows [m0, m1): weight tiles in L1 by themselves, or K ranges of k_chunk for long rows.
    auto block = [&](auto prefetch, std::int64_t m0, std::int64_t m1, bool reverse) {
        constexpr bool P = decltype(prefetch)::value;
        if (K > chunk_above)
            linear_block<Arch, tiles::R, tiles::C, chunk_rows, P>(x, w, bias, y, m0, m1, n0, n1, k_chunk, reverse);
        else
            linear_block<Arch, tiles::R, tiles::C, tiles::R, P>(x, w, bias, y, m0, m1, n0, n1, K, reverse);
    };
    // Decode batches (two row tiles at most): each weight tile is read from memory by the first row tile and from
    // cache by the second, while the memory would idle; the first prefetches the next weight tile to keep it busy.
    if (M <= 2 * tiles::R) {
        block(std::true_type{}, 0, M, false);
        return;
    }
    for (std::int64_t m0 = 0; m0 < M; m0 += mb) block(std::false_type{}, m0, std::min(M, m0 + mb), (m0 / mb) % 2 == 1);
}

}  // namespace detail

namespace detail {

/// The argument checks of linear, in every build (shape_error naming the argument): shapes, the unit inner stride of
/// x, w and y (row strides are free), y's rows not overlapping each other, x, w or the bias (the products write y
/// while reading them). A few comparisons per call. Not checked: the values (a scan of w per decode step would cost
/// as much as the product itself); a NaN or Inf propagates to the outputs it reaches.
template <class TW>
void check_linear_args(tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias, tensor_view<float, 2> y) {
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
}

/// f(m0, m1, n0, n1) over rows [0, M) × output columns [0, N) in tasks of whole groups of weight tiles, about 4 per
/// thread (decode: enough to balance; prefill: big enough to reuse each block of x), each of at least min_task_macs
/// multiply-adds (M · K per column): a small projection runs inline rather than paying a fork and join for a few
/// microseconds of work. A prefill projection with fewer groups than two per thread (a GDN layer's 16 gate columns,
/// or an attention layer's 512 K/V columns over 16 threads) also splits its rows, in parts of at least 32, so that every thread has work.
/// Neither split changes any output's bits (each output's sum is the same whichever task computes it: see the
/// summation order above).
template <class Arch, class Backend, class F>
void for_column_groups(const Backend& be, std::int64_t M, std::int64_t K, std::int64_t N, F&& f) {
    constexpr std::int64_t G = linear_tiles<Arch>::group, min_part_rows = 32;
    const std::int64_t groups = (N + G - 1) / G, threads = be.num_threads();
    const std::int64_t row_parts =
        groups >= 2 * threads || threads == 1 ? 1 : std::max<std::int64_t>(1, std::min((2 * threads + groups - 1) / groups, M / min_part_rows));
    if (row_parts > 1) {
        // Tasks of one (row part, column group) each, as long as that holds min_task_macs.
        const std::int64_t items = row_parts * groups, rows = M / row_parts;
        be.parallel_for(items, task_grain(rows * K * G), [&](std::int64_t i0, std::int64_t i1) {
            for (std::int64_t i = i0; i < i1; ++i) {
                const std::int64_t p = i / groups, g = i % groups;
                f(p * M / row_parts, (p + 1) * M / row_parts, g * G, std::min(N, (g + 1) * G));
            }
        });
        return;
    }
    const std::int64_t grain = std::max({std::int64_t{1}, groups / (4 * threads), task_grain(M * K * G)});
    be.parallel_for(groups, grain, [&](std::int64_t g0, std::int64_t g1) { f(std::int64_t{0}, M, g0 * G, std::min(N, g1 * G)); });
}

}  // namespace detail

/// y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]). x, bias and y fp32; w fp32, bf16 or f16 (widened exactly as loaded,
/// fp32 products and sums: the result is the f32 kernel's on w's widened values, bit for bit). Inner strides must
/// be 1; y must not overlap x, w or bias. Throws shape_error on a mismatch, naming the argument (detail::
/// check_linear_args). Parallel over output columns on the backend's threads (and over rows too for a prefill with few
/// columns: detail::for_column_groups). Batch-invariant: y[m, :] depends only
/// on x[m, :], w and bias, bit for bit, whatever M, the row's position and the thread count (see detail's summation
/// order).
template <class TW, cpu_backend_type Backend>
    requires linear_weight_type<TW>
void linear_typed(const Backend& be, tensor_view<const float, 2> x, tensor_view<const TW, 2> w, const float* bias,
                  tensor_view<float, 2> y) {
    using Arch = typename Backend::arch;
    detail::check_linear_args(x, w, bias, y);
    if (x.dim(0) == 0 || w.dim(0) == 0) return;
    detail::for_column_groups<Arch>(be, x.dim(0), x.dim(1), w.dim(0), [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
        detail::linear_columns<Arch, TW>(x.slice(m0, m1 - m0), w, bias, y.slice(m0, m1 - m0), n0, n1);
    });
}

/// y[M, N] = scale[n] · (x[M, K] · q[N, K]ᵀ) (+ bias[N]) for an 8-bit weight (q8_view): the same register tiles as
/// linear_typed on the integers (widened exactly to fp32, fp32 products and sums in the same order), then one multiply
/// by the row's scale and the bias add per output. Checks and batch invariance as linear_typed (plus: the scales do
/// not overlap y).
template <cpu_backend_type Backend>
void linear_q8(const Backend& be, tensor_view<const float, 2> x, q8_view w, const float* bias, tensor_view<float, 2> y) {
    using Arch = typename Backend::arch;
    const std::int64_t M = x.dim(0), N = w.dim(0);
    detail::check_linear_args(x, w.q, bias, y);
    if (N > 0) hymix::detail::require_no_overlap(y, "output", tensor_view<const float, 1>(w.scale, {N}), "weight scales", "linear");
    if (M == 0 || N == 0) return;
    detail::for_column_groups<Arch>(be, M, x.dim(1), N, [&](std::int64_t m0, std::int64_t m1, std::int64_t n0, std::int64_t n1) {
        detail::linear_columns<Arch, std::int8_t>(x.slice(m0, m1 - m0), w.q, nullptr, y.slice(m0, m1 - m0), n0, n1);
        for (std::int64_t m = m0; m < m1; ++m) {
            float* yr = &y(m, 0);
            if (bias)
                for (std::int64_t n = n0; n < n1; ++n) yr[n] = yr[n] * w.scale[n] + bias[n];
            else
                for (std::int64_t n = n0; n < n1; ++n) yr[n] *= w.scale[n];
        }
    });
}

/// Reference for an 8-bit weight: y = x · (scale ⊙ q)ᵀ + b in double precision, scale applied to each row sum.
template <class TX, class TY>
void linear_q8_ref(tensor_view<const TX, 2> x, q8_view w, const float* bias, tensor_view<TY, 2> y) {
    for (std::int64_t m = 0; m < x.dim(0); ++m)
        for (std::int64_t n = 0; n < w.dim(0); ++n) {
            double acc = 0;
            for (std::int64_t k = 0; k < x.dim(1); ++k) acc += static_cast<double>(x(m, k)) * static_cast<double>(w.q(n, k));
            y(m, n) = static_cast<TY>(acc * static_cast<double>(w.scale[n]) + (bias ? static_cast<double>(bias[n]) : 0.0));
        }
}

/// The three weight types as plain overloads (the weight's element type is not deduced), so that views of mutable
/// data convert to the const views they take.
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias, tensor_view<float, 2> y) {
    linear_typed<float>(be, x, w, bias, y);
}
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const bf16, 2> w, const float* bias, tensor_view<float, 2> y) {
    linear_typed<bf16>(be, x, w, bias, y);
}
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, tensor_view<const f16, 2> w, const float* bias, tensor_view<float, 2> y) {
    linear_typed<f16>(be, x, w, bias, y);
}
template <cpu_backend_type Backend>
void linear(const Backend& be, tensor_view<const float, 2> x, q8_view w, const float* bias, tensor_view<float, 2> y) {
    linear_q8(be, x, w, bias, y);
}
/// The same on a linear_weight, read as it is stored (f32, bf16, f16 or i8).
/// (W is deduced so that a tensor<float> argument still picks the f32 overload without ambiguity.)
template <cpu_backend_type Backend, std::same_as<linear_weight> W>
void linear(const Backend& be, tensor_view<const float, 2> x, const W& w, const float* bias, tensor_view<float, 2> y) {
    w.template visit_stored<2>([&](auto wv) { linear(be, x, wv, bias, y); });
}

}  // namespace hymix::kernels
