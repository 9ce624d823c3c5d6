// Horizontal sums of SIMD accumulators shared by the kernels that reduce many dot products at once (linear,
// attention decode): an unrolled compile-time loop, the lane-by-lane halving tree, and with AVX-512 a transposing tree
// that reduces up to 16 accumulators into the lanes of one vector for about one add and two shuffles per sum (the
// same tree, so either form gives the same bits for an accumulator).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace hymix::kernels::detail {

/// Calls f(std::integral_constant<int, i>{}) for i = 0 … N−1, unrolled: indices stay compile-time constants, so the
/// arrays of accumulators indexed by them stay in registers.
template <int N, class F>
inline void static_for(F&& f) {
    [&]<int... I>(std::integer_sequence<int, I...>) {
        (f(std::integral_constant<int, I>{}), ...);
    }(std::make_integer_sequence<int, N>{});
}

/// The sum of one vector's lanes by halving, v[i] ← v[i] + v[i + h] for h = W/2, W/4, …, 1, written lane by lane.
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
/// lane_tree_sum of Count ≤ 16 AVX-512 accumulators at once, a transposing tree (about one add and two shuffles per
/// output): level 1 adds 256-bit halves, level 2 128-bit quarters, levels 3 and 4 lanes 2 and 1 apart, always lower +
/// upper, so each output is lane_tree_sum's tree. get(i) gives accumulator i; its sum ends in lane i. (Tree position p
/// ends in lane 4·(p % 4) + p / 4, a 4 × 4 transpose, so accumulator i goes in at that position.)
template <int Count, class Get>
inline __m512 lane_tree_sum16(Get&& get) {
    static_assert(Count >= 1 && Count <= 16);
    // Which tree positions at each level hold a real sum (the rest are never computed).
    constexpr auto live0 = [](int p) { return 4 * (p % 4) + p / 4 < Count; };
    constexpr auto live1 = [=](int i) { return live0(2 * i) || live0(2 * i + 1); };
    constexpr auto live2 = [=](int i) { return live1(2 * i) || live1(2 * i + 1); };
    constexpr auto live3 = [=](int i) { return live2(2 * i) || live2(2 * i + 1); };
    // The lower and the upper parts of a pair (p, q) at levels 1 … 4, with full masks (GCC's unmasked forms read an
    // uninitialised register and warn).
    auto lo1 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(1, 0, 1, 0)); };
    auto hi1 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 2, 3, 2)); };
    auto lo2 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(2, 0, 2, 0)); };
    auto hi2 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_f32x4(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 1, 3, 1)); };
    auto lo3 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(1, 0, 1, 0)); };
    auto hi3 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 2, 3, 2)); };
    auto lo4 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(2, 0, 2, 0)); };
    auto hi4 = [](__m512 p, __m512 q) { return _mm512_mask_shuffle_ps(p, 0xFFFF, p, q, _MM_SHUFFLE(3, 1, 3, 1)); };
    // One level for the pair (a, b): lower parts plus upper parts; a lone live input pairs with itself.
    auto level = [](__m512 a, __m512 b, bool a_live, bool b_live, auto lo, auto hi) {
        if (!a_live) a = b;
        if (!b_live) b = a;
        return _mm512_add_ps(lo(a, b), hi(a, b));
    };
    __m512 l0[16] = {}, l1[8] = {}, l2[4] = {}, l3[2] = {};  // dead entries stay zero and are never used
    static_for<16>([&](auto p) {
        if constexpr (live0(p)) l0[p] = get(std::integral_constant<int, 4 * (p % 4) + p / 4>{});
    });
    static_for<8>([&](auto i) {
        if constexpr (live1(i)) l1[i] = level(l0[2 * i], l0[2 * i + 1], live0(2 * i), live0(2 * i + 1), lo1, hi1);
    });
    static_for<4>([&](auto i) {
        if constexpr (live2(i)) l2[i] = level(l1[2 * i], l1[2 * i + 1], live1(2 * i), live1(2 * i + 1), lo2, hi2);
    });
    static_for<2>([&](auto i) {
        if constexpr (live3(i)) l3[i] = level(l2[2 * i], l2[2 * i + 1], live2(2 * i), live2(2 * i + 1), lo3, hi3);
    });
    return level(l3[0], l3[1], live3(0), live3(1), lo4, hi4);
}
#endif

/// Calls f(std::integral_constant<int, v>) for the run-time value v in [1, Max].
template <int Max, class F>
inline void with_constant(int v, F&& f) {
    if constexpr (Max > 1)
        if (v < Max) return with_constant<Max - 1>(v, f);
    f(std::integral_constant<int, Max>{});
}

}  // namespace hymix::kernels::detail
