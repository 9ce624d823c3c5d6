// Bulk element conversions bf16/f16 <-> f32 (and generic casts), vectorised with xsimd.
// Used when loading bf16/f16 checkpoints and when writing reduced-precision tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <xsimd/xsimd.hpp>

#include "hymix/core/dtype.hpp"

namespace hymix {

namespace detail {
// Lane masks (all ones / all zeros) for unsigned lanes below 2^31, from the sign of a difference. xsimd 8's
// integer `select` does not compile at -O0 with GCC 12 on AVX-512BW (its blend intrinsics need the
// optimiser), so the conversions below blend with these masks instead.
using u32_batch = xsimd::batch<std::uint32_t>;
/// Lanes where a < c (a, c < 2^31).
inline u32_batch mask_less(const u32_batch& a, std::uint32_t c) noexcept {
    return xsimd::bitwise_cast<u32_batch>(xsimd::bitwise_cast<xsimd::batch<std::int32_t>>(a - u32_batch(c)) >> 31);
}
/// Lanes where a > c (a, c < 2^31).
inline u32_batch mask_greater(const u32_batch& a, std::uint32_t c) noexcept {
    return xsimd::bitwise_cast<u32_batch>(xsimd::bitwise_cast<xsimd::batch<std::int32_t>>(u32_batch(c) - a) >> 31);
}
/// m ? a : b, lane by lane, for all-ones / all-zeros masks m.
inline u32_batch blend(const u32_batch& m, const u32_batch& a, const u32_batch& b) noexcept {
    return (a & m) | (b & ~m);
}
}  // namespace detail

/// bf16 -> f32, n elements. Exact (bf16 is a truncated f32).
inline void convert(const bf16* src, float* dst, std::size_t n) noexcept {
    using u32 = xsimd::batch<std::uint32_t>;
    constexpr std::size_t W = u32::size;
    const auto* s = reinterpret_cast<const std::uint16_t*>(src);
    std::size_t i = 0;
    for (; i + W <= n; i += W) {
        const u32 v = u32::load_unaligned(s + i) << 16;  // widening load, then move to the high half
        xsimd::bitwise_cast<xsimd::batch<float>>(v).store_unaligned(dst + i);
    }
    for (; i < n; ++i) dst[i] = src[i].to_float();
}

/// f32 -> bf16, n elements, round to nearest even; NaN stays NaN.
inline void convert(const float* src, bf16* dst, std::size_t n) noexcept {
    using u32 = xsimd::batch<std::uint32_t>;
    using f32 = xsimd::batch<float>;
    constexpr std::size_t W = u32::size;
    auto* d = reinterpret_cast<std::uint16_t*>(dst);
    std::size_t i = 0;
    for (; i + W <= n; i += W) {
        const f32 f = f32::load_unaligned(src + i);
        const u32 u = xsimd::bitwise_cast<u32>(f);
        u32 r = (u + u32(0x7fffu) + ((u >> 16) & u32(1u))) >> 16;
        const u32 is_nan = detail::mask_greater(u & u32(0x7fffffffu), 0x7f800000u);
        r = detail::blend(is_nan, (u >> 16) | u32(0x40u), r);
        alignas(64) std::uint32_t tmp[W];
        r.store_aligned(tmp);
        for (std::size_t j = 0; j < W; ++j) d[i + j] = static_cast<std::uint16_t>(tmp[j]);
    }
    for (; i < n; ++i) dst[i] = bf16::from_float(src[i]);
}

/// f16 -> f32, n elements. Exact: the 15 exponent+mantissa bits moved into place and scaled by 2^112 handle the
/// normals; a subnormal's 10-bit mantissa is converted as an integer and scaled by 2^-24 (moved into place, it would
/// be an f32 subnormal, which reads as zero where denormals-are-zero is set, as in the CPU backend's work:
/// backend/float_env.hpp); exponent 31 (Inf/NaN) is mapped to exponent 255 with the payload kept.
inline void convert(const f16* src, float* dst, std::size_t n) noexcept {
    using u32 = xsimd::batch<std::uint32_t>;
    using i32 = xsimd::batch<std::int32_t>;
    using f32 = xsimd::batch<float>;
    constexpr std::size_t W = u32::size;
    const auto* s = reinterpret_cast<const std::uint16_t*>(src);
    const f32 scale = xsimd::bitwise_cast<f32>(u32(0x77800000u));      // 2^112
    const f32 sub_scale = xsimd::bitwise_cast<f32>(u32(0x33800000u));  // 2^-24, one f16 subnormal step
    std::size_t i = 0;
    for (; i + W <= n; i += W) {
        const u32 h = u32::load_unaligned(s + i);
        const u32 sign = (h & u32(0x8000u)) << 16;
        const u32 em = (h & u32(0x7fffu)) << 13;
        const u32 normal = xsimd::bitwise_cast<u32>(xsimd::bitwise_cast<f32>(em) * scale);
        const u32 subnormal = xsimd::bitwise_cast<u32>(xsimd::to_float(xsimd::bitwise_cast<i32>(h & u32(0x3ffu))) * sub_scale);
        const u32 scaled = detail::blend(detail::mask_less(em, 0x00800000u), subnormal, normal);
        const u32 special = em | u32(0x7f800000u);
        const u32 r = detail::blend(detail::mask_less(em, 0x0f800000u), scaled, special) | sign;
        xsimd::bitwise_cast<f32>(r).store_unaligned(dst + i);
    }
    for (; i < n; ++i) dst[i] = src[i].to_float();
}

/// f32 -> f16, n elements, round to nearest even (overflow -> Inf, NaN stays NaN); bit-identical to
/// f16::from_float.
inline void convert(const float* src, f16* dst, std::size_t n) noexcept {
    using u32 = xsimd::batch<std::uint32_t>;
    using f32 = xsimd::batch<float>;
    constexpr std::size_t W = u32::size;
    auto* d = reinterpret_cast<std::uint16_t*>(dst);
    std::size_t i = 0;
    for (; i + W <= n; i += W) {
        const u32 u = xsimd::bitwise_cast<u32>(f32::load_unaligned(src + i));
        const u32 sign = (u >> 16) & u32(0x8000u);
        const u32 au = u & u32(0x7fffffffu);
        // subnormal / zero results: adding 0.5 aligns the f16 ulp (2^-24) with the f32 mantissa's last bit
        const u32 sub = xsimd::bitwise_cast<u32>(xsimd::bitwise_cast<f32>(au) + f32(0.5f)) - u32(0x3f000000u);
        const u32 norm = (au + u32(0xc8000fffu) + ((au >> 13) & u32(1u))) >> 13;
        u32 r = detail::blend(detail::mask_less(au, 0x38800000u), sub, norm);
        r = detail::blend(detail::mask_less(au, 0x477ff000u), r, u32(0x7c00u));
        r = detail::blend(detail::mask_greater(au, 0x7f800000u), u32(0x7e00u), r);
        r = r | sign;
        alignas(64) std::uint32_t tmp[W];
        r.store_aligned(tmp);
        for (std::size_t j = 0; j < W; ++j) d[i + j] = static_cast<std::uint16_t>(tmp[j]);
    }
    for (; i < n; ++i) dst[i] = f16::from_float(src[i]);
}

/// Generic arithmetic conversion (f64, i32, i64, i8 <-> f32, identity).
template <class S, class D>
    requires(std::is_arithmetic_v<S> && std::is_arithmetic_v<D>)
inline void convert(const S* src, D* dst, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
}

/// Convert n elements of run-time dtype `t` at `src` to f32.
inline void convert_to_f32(dtype t, const void* src, float* dst, std::size_t n) {
    switch (t) {
        case dtype::f32: convert(static_cast<const float*>(src), dst, n); return;
        case dtype::f64: convert(static_cast<const double*>(src), dst, n); return;
        case dtype::bf16: convert(static_cast<const bf16*>(src), dst, n); return;
        case dtype::f16: convert(static_cast<const f16*>(src), dst, n); return;
        case dtype::i32: convert(static_cast<const std::int32_t*>(src), dst, n); return;
        case dtype::i64: convert(static_cast<const std::int64_t*>(src), dst, n); return;
        case dtype::i8: convert(static_cast<const std::int8_t*>(src), dst, n); return;
    }
}

}  // namespace hymix
