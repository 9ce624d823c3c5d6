// SIMD loads that widen stored 16- and 8-bit values (bf16, f16, int8) to fp32 registers, exactly, for kernels that
// keep their operands in reduced precision and compute in fp32: the projections' weights (kernels/linear.hpp) and
// the attention kernels' bf16 / f16 KV cache (kernels/attention.hpp). `widen` is the scalar form.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <xsimd/xsimd.hpp>
#if defined(__AVX512F__) || defined(__FMA__) || defined(__SSE4_1__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "hymix/core/dtype.hpp"

namespace hymix::kernels::detail {

/// One value widened to f32 (exact for every stored type).
template <class T>
inline float widen(T v) noexcept {
    if constexpr (std::is_arithmetic_v<T>)
        return static_cast<float>(v);
    else
        return v.to_float();
}

/// One SIMD vector of W consecutive values starting at p, widened to f32. f32: a plain load. bf16: the 16-bit
/// patterns zero-extended to 32 bits and shifted into the upper half (bf16 is an f32's upper half). f16: the
/// hardware's half-to-single conversion (F16C, AVX-512F, AArch64), else a scalar widening. int8: sign-extended to 32
/// bits and converted (SSE4.1, AVX2, AVX-512F), else a scalar widening. All exact.
template <class Arch, class TW>
inline xsimd::batch<float, Arch> load_widened(const TW* p) {
    using B = xsimd::batch<float, Arch>;
    [[maybe_unused]] constexpr std::size_t bytes = sizeof(typename B::register_type);
    if constexpr (std::is_same_v<TW, float>) {
        return B::load_unaligned(p);
    } else if constexpr (std::is_same_v<TW, std::int8_t>) {
#if defined(__AVX512F__)
        if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>)
            return B(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#endif
#if defined(__AVX2__)
        if constexpr (bytes == 32)
            return B(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#endif
#if defined(__SSE4_1__)
        if constexpr (bytes == 16) {
            std::int32_t four;
            std::memcpy(&four, p, sizeof four);
            return B(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four))));
        }
#endif
        alignas(64) float t[B::size];
        for (std::size_t i = 0; i < B::size; ++i) t[i] = static_cast<float>(p[i]);
        return B::load_aligned(t);
    } else {
#if defined(__AVX512F__)
        if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
            const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            if constexpr (std::is_same_v<TW, bf16>)
                return B(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
            else
                return B(_mm512_cvtph_ps(h));
        }
#endif
#if defined(__AVX2__)
        if constexpr (bytes == 32 && std::is_same_v<TW, bf16>)
            return B(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16)));
#endif
#if defined(__SSE4_1__)
        if constexpr (bytes == 16 && std::is_same_v<TW, bf16>)
            return B(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 16)));
#endif
#if defined(__F16C__)
        if constexpr (bytes == 16 && std::is_same_v<TW, f16>)
            return B(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
        if constexpr (bytes == 32 && std::is_same_v<TW, f16> && !std::is_base_of_v<xsimd::avx512f, Arch>)
            return B(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__aarch64__)
        if constexpr (std::is_base_of_v<xsimd::neon64, Arch>) {
            if constexpr (std::is_same_v<TW, bf16>)
                return B(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p)), 16)));
            else
                return B(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const std::uint16_t*>(p)))));
        }
#endif
        alignas(64) float t[B::size];
        for (std::size_t i = 0; i < B::size; ++i) t[i] = p[i].to_float();
        return B::load_aligned(t);
    }
}

}  // namespace hymix::kernels::detail
