// Backward of RoPE (kernels/rope.hpp; spec.md §2, arXiv 2104.09864): each rotated pair (a, b) ↦ (a c − b s, b c + a s)
// is an orthogonal 2×2 map, so the gradient w.r.t. the input is the transpose applied to the output gradient,
// (da, db) = (dy_a c + dy_b s, dy_b c − dy_a s): the same rotation with −φ. The pairing (rotate-half or
// interleaved), the partial rotary dims (channels ≥ d_rot pass through) and the fp32 angles are those of the forward.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/core/check.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/rope.hpp"

namespace hymix::kernels {

namespace detail {
/// The checks of kernels::rope (detail::rope_check), with the view named dx.
template <class T>
void rope_backward_check(const tensor_view<T, 3>& dx, std::span<const std::int64_t> positions, rope_mode mode, double base,
                         std::int64_t d_rot, const char* who) {
    hymix::detail::require_unit_stride(dx, 2, who, "dx");
    hymix::detail::require_no_self_overlap(dx, who, "dx");
    rope_check(dx, positions, mode, base, d_rot, who);
}
}  // namespace detail

/// In place on dx [T, H, d_h] (any token/head strides, unit channel stride): the gradient of rope's output becomes
/// the gradient of its input. fp32 cos/sin of the fp32 angle, as the forward kernel; errors as kernels::rope.
inline void rope_backward(tensor_view<float, 3> dx, std::span<const std::int64_t> positions, rope_mode mode, double base,
                          std::int64_t d_rot) {
    detail::rope_backward_check(dx, positions, mode, base, d_rot, "rope_backward");
    if (mode == rope_mode::none || d_rot == 0) return;
    const std::int64_t half = d_rot / 2;
    std::vector<float> inv(static_cast<std::size_t>(half)), c(inv.size()), s(inv.size());
    for (std::int64_t i = 0; i < half; ++i) inv[i] = detail::rope_inv_freq(i, d_rot, base);
    for (std::int64_t t = 0; t < dx.dim(0); ++t) {
        for (std::int64_t i = 0; i < half; ++i) {
            const float phi = detail::rope_angle(positions[t], inv[i]);
            c[i] = std::cos(phi);
            s[i] = -std::sin(phi);  // the transpose: rotation by −φ
        }
        for (std::int64_t h = 0; h < dx.dim(1); ++h) detail::rope_rotate_row(&dx(t, h, 0), c.data(), s.data(), d_rot, mode);
    }
}

/// Reference (any T, fp64 in practice): the same fp32 angle (detail::rope_angle), cos/sin in fp64, one token and
/// head at a time. dx [T, H, d_h] in place.
template <class T>
void rope_backward_ref(tensor_view<T, 3> dx, std::span<const std::int64_t> positions, rope_mode mode, double base,
                       std::int64_t d_rot) {
    detail::rope_backward_check(dx, positions, mode, base, d_rot, "rope_backward_ref");
    if (mode == rope_mode::none || d_rot == 0) return;
    const std::int64_t half = d_rot / 2;
    std::vector<double> c(static_cast<std::size_t>(half)), s(c.size());
    for (std::int64_t t = 0; t < dx.dim(0); ++t)
        for (std::int64_t h = 0; h < dx.dim(1); ++h) {
            for (std::int64_t i = 0; i < half; ++i) {
                const double phi = detail::rope_angle(positions[t], detail::rope_inv_freq(i, d_rot, base));
                c[std::size_t(i)] = std::cos(phi);
                s[std::size_t(i)] = -std::sin(phi);
            }
            detail::rope_rotate_row(&dx(t, h, 0), c.data(), s.data(), d_rot, mode);
        }
}

}  // namespace hymix::kernels
