// Rotary position embedding (RoPE, arXiv 2104.09864) as in spec.md §2: rotate-half (NeoX / HF-Llama) and
// interleaved (GPT-J) pairings, partial rotary factor (channels >= d_rot pass through), angles computed on the
// fly in fp32 from integer positions (θ_i = base^(−2i/d_rot), φ_i = p·θ_i). Fast fp32 path plus an fp64 reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

/// Which channel pairs RoPE rotates: none, (i, i + d_rot/2) (rotate-half) or (2i, 2i+1) (interleaved).
enum class rope_mode { none, rotate_half, interleaved };

/// d_rot = int(head_dim · factor). Throws config_error unless 0 < factor <= 1 and d_rot is even and positive.
inline std::int64_t rope_dims(std::int64_t head_dim, double partial_rotary_factor) {
    if (!(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0))
        throw config_error("rope: partial_rotary_factor must lie in (0, 1], found " + std::to_string(partial_rotary_factor));
    const auto d_rot = static_cast<std::int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
    if (d_rot <= 0 || d_rot % 2 != 0)
        throw config_error("rope: rotary dims int(head_dim " + std::to_string(head_dim) + " * factor " +
                           std::to_string(partial_rotary_factor) + ") = " + std::to_string(d_rot) + " must be even and > 0");
    return d_rot;
}

namespace detail {

/// θ_i = base^(−2i/d_rot) rounded once to fp32 (HF computes its inv_freq table in fp32).
inline float rope_inv_freq(std::int64_t i, std::int64_t d_rot, double base) {
    return static_cast<float>(std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d_rot)));
}

/// φ_i = p · θ_i, the fp32 product of the position (exact below 2^24) and the fp32 frequency. The fp32 kernel
/// and the fp64 reference share this definition of the angle (spec.md §2: "computed in fp32").
inline float rope_angle(std::int64_t pos, float inv_freq) { return static_cast<float>(pos) * inv_freq; }

/// Rotates one head row x[d_h] in place given cos/sin of the d_rot/2 angles.
template <class T, class C>
inline void rope_rotate_row(T* x, const C* c, const C* s, std::int64_t d_rot, rope_mode mode) {
    const std::int64_t half = d_rot / 2;
    if (mode == rope_mode::rotate_half) {
        for (std::int64_t i = 0; i < half; ++i) {
            const C a = static_cast<C>(x[i]), b = static_cast<C>(x[i + half]);
            x[i] = static_cast<T>(a * c[i] - b * s[i]);
            x[i + half] = static_cast<T>(b * c[i] + a * s[i]);
        }
    } else {
        for (std::int64_t i = 0; i < half; ++i) {
            const C a = static_cast<C>(x[2 * i]), b = static_cast<C>(x[2 * i + 1]);
            x[2 * i] = static_cast<T>(a * c[i] - b * s[i]);
            x[2 * i + 1] = static_cast<T>(b * c[i] + a * s[i]);
        }
    }
}

// Argument checks of rope and rope_ref, in every build (shape_error / value_error naming the argument): the
// positions/T match, d_rot even and <= head_dim, the unit channel stride the row rotation assumes (token and head
// strides are free), no two elements of x at one address (it is rotated in place), a known mode, a finite base > 0
// when something rotates, and positions >= 0 (one pass over T positions, small next to the T·H·d_rot rotation).
// Not checked: the values of x (a NaN propagates to its own pair of channels only).
template <class T>
void rope_check(const tensor_view<T, 3>& x, std::span<const std::int64_t> positions, rope_mode mode, double base,
                std::int64_t d_rot, const char* who) {
    if (static_cast<std::int64_t>(positions.size()) != x.dim(0))
        throw shape_error(std::string(who) + ": x has " + std::to_string(x.dim(0)) + " tokens but " +
                          std::to_string(positions.size()) + " positions were given");
    if (d_rot < 0 || d_rot % 2 != 0 || d_rot > x.dim(2))
        throw shape_error(std::string(who) + ": rotary dims " + std::to_string(d_rot) + " must be even and <= head_dim " +
                          std::to_string(x.dim(2)));
    hymix::detail::require_unit_stride(x, 2, who, "x");
    hymix::detail::require_no_self_overlap(x, who, "x");
    if (mode != rope_mode::none && mode != rope_mode::rotate_half && mode != rope_mode::interleaved)
        throw value_error(std::string(who) + ": unknown mode " + std::to_string(static_cast<int>(mode)));
    if (mode != rope_mode::none && d_rot > 0 && !(std::isfinite(base) && base > 0.0))
        throw value_error(std::string(who) + ": base (rope_theta) must be finite and > 0, found " + std::to_string(base));
    for (std::size_t t = 0; t < positions.size(); ++t)
        if (positions[t] < 0)
            throw value_error(std::string(who) + ": positions[" + std::to_string(t) + "] = " + std::to_string(positions[t]) +
                              " is negative");
}

}  // namespace detail

/// In-place RoPE on x [T, H, d_h] (any token/head strides, unit channel stride), token t at positions[t].
/// Only the first d_rot channels of each head rotate. fp32 angles, fp32 cos/sin; cos/sin are computed once per
/// token and shared by all heads. Throws shape_error on a positions/T mismatch, a bad d_rot or a bad view of x,
/// value_error on a negative position, a base that is not finite and > 0, or an unknown mode.
inline void rope(tensor_view<float, 3> x, std::span<const std::int64_t> positions, rope_mode mode, double base,
                 std::int64_t d_rot) {
    detail::rope_check(x, positions, mode, base, d_rot, "rope");
    if (mode == rope_mode::none || d_rot == 0) return;
    const std::int64_t half = d_rot / 2;
    std::vector<float> inv(static_cast<std::size_t>(half)), c(inv.size()), s(inv.size());
    for (std::int64_t i = 0; i < half; ++i) inv[i] = detail::rope_inv_freq(i, d_rot, base);
    for (std::int64_t t = 0; t < x.dim(0); ++t) {
        for (std::int64_t i = 0; i < half; ++i) {
            const float phi = detail::rope_angle(positions[t], inv[i]);
            c[i] = std::cos(phi);
            s[i] = std::sin(phi);
        }
        for (std::int64_t h = 0; h < x.dim(1); ++h) detail::rope_rotate_row(&x(t, h, 0), c.data(), s.data(), d_rot, mode);
    }
}

/// Convenience overload: consecutive positions pos0 … pos0 + T − 1.
inline void rope(tensor_view<float, 3> x, std::int64_t pos0, rope_mode mode, double base, std::int64_t d_rot) {
    std::vector<std::int64_t> p(static_cast<std::size_t>(x.dim(0)));
    for (std::size_t t = 0; t < p.size(); ++t) p[t] = pos0 + static_cast<std::int64_t>(t);
    rope(x, std::span<const std::int64_t>(p), mode, base, d_rot);
}

/// Reference: same angles (fp32 φ, see detail::rope_angle), cos/sin and rotation in fp64, one token and head at a
/// time. x [T, H, d_h] of double, in place.
inline void rope_ref(tensor_view<double, 3> x, std::span<const std::int64_t> positions, rope_mode mode, double base,
                     std::int64_t d_rot) {
    detail::rope_check(x, positions, mode, base, d_rot, "rope_ref");
    if (mode == rope_mode::none || d_rot == 0) return;
    const std::int64_t half = d_rot / 2;
    std::vector<double> c(static_cast<std::size_t>(half)), s(c.size());
    for (std::int64_t t = 0; t < x.dim(0); ++t)
        for (std::int64_t h = 0; h < x.dim(1); ++h) {
            for (std::int64_t i = 0; i < half; ++i) {
                const double phi = detail::rope_angle(positions[t], detail::rope_inv_freq(i, d_rot, base));
                c[i] = std::cos(phi);
                s[i] = std::sin(phi);
            }
            detail::rope_rotate_row(&x(t, h, 0), c.data(), s.data(), d_rot, mode);
        }
}

}  // namespace hymix::kernels
