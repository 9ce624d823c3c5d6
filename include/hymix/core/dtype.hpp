// Element types hymix stores and computes in: f32, f64, bf16, f16, i32, i64, i8.
// bf16 / f16 are 16-bit storage types and i8 the 8-bit one of quantized weights (with per-row scales, see
// core/linear_weight.hpp); arithmetic always happens in f32 (spec.md §0, dtype rules).
// Bulk conversions between bf16/f16 and f32 are vectorised with xsimd (see core/convert.hpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "hymix/core/error.hpp"

namespace hymix {

/// Run-time element type tag. Names follow the safetensors dtype strings.
enum class dtype : std::uint8_t { f32, f64, bf16, f16, i32, i64, i8 };

/// bfloat16: the upper 16 bits of an IEEE binary32. Conversion from f32 rounds to nearest even.
struct bf16 {
    std::uint16_t bits = 0;

    static constexpr bf16 from_bits(std::uint16_t b) noexcept { return bf16{b}; }
    static bf16 from_float(float f) noexcept {
        std::uint32_t u = std::bit_cast<std::uint32_t>(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
        return bf16{static_cast<std::uint16_t>(u >> 16)};
    }
    float to_float() const noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
    explicit operator float() const noexcept { return to_float(); }
    friend bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

/// IEEE binary16 half precision. Conversion from f32 rounds to nearest even; handles subnormals, Inf, NaN.
struct f16 {
    std::uint16_t bits = 0;

    static constexpr f16 from_bits(std::uint16_t b) noexcept { return f16{b}; }
    static f16 from_float(float f) noexcept {
        const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
        const std::uint32_t sign = (u >> 16) & 0x8000u;
        const std::uint32_t au = u & 0x7fffffffu;
        if (au > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u)};  // NaN
        if (au >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // overflow -> Inf
        if (au < 0x38800000u) {  // subnormal or zero in f16: add magic to round
            const float mag = std::bit_cast<float>(au) + 0.5f;  // 0.5 = 2^-1, aligns ulp at 2^-24
            return f16{static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(mag) - 0x3f000000u))};
        }
        std::uint32_t m = au + 0xc8000fffu + ((au >> 13) & 1u);  // rebias exponent (-112 << 23) and round
        return f16{static_cast<std::uint16_t>(sign | (m >> 13))};
    }
    float to_float() const noexcept {
        const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
        const std::uint32_t exp = (bits >> 10) & 0x1fu;
        const std::uint32_t man = bits & 0x3ffu;
        if (exp == 0) {  // zero / subnormal: man * 2^-24
            const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
            return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
        }
        if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
        return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
    }
    explicit operator float() const noexcept { return to_float(); }
    friend bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }
};

/// Size in bytes of one element.
constexpr std::size_t dtype_size(dtype t) noexcept {
    switch (t) {
        case dtype::f32: return 4;
        case dtype::f64: return 8;
        case dtype::bf16: return 2;
        case dtype::f16: return 2;
        case dtype::i32: return 4;
        case dtype::i64: return 8;
        case dtype::i8: return 1;
    }
    return 0;
}

/// safetensors spelling ("F32", "BF16", ...).
constexpr std::string_view dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f32: return "F32";
        case dtype::f64: return "F64";
        case dtype::bf16: return "BF16";
        case dtype::f16: return "F16";
        case dtype::i32: return "I32";
        case dtype::i64: return "I64";
        case dtype::i8: return "I8";
    }
    return "?";
}

/// Parse a safetensors dtype string. Throws dtype_error for anything hymix does not support.
inline dtype parse_dtype(std::string_view s) {
    for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16, dtype::i32, dtype::i64, dtype::i8})
        if (s == dtype_name(t)) return t;
    throw dtype_error("unsupported dtype '" + std::string(s) + "' (expected one of F32, F64, BF16, F16, I32, I64, I8)");
}

/// Compile-time mapping C++ type -> dtype tag.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<f16> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::int8_t> { static constexpr dtype value = dtype::i8; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<std::remove_const_t<T>>::value;

}  // namespace hymix
