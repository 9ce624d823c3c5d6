// Op: per-channel scaling of selected rows, y[r, c] ← s[c] · y[r, c] where mask[r] != 0, and its backward — AMOR's
// α ⊙ o output scale (spec.md §5.3). CPU: rows split over threads; reference: the same loops in double.
#pragma once

#include <cstdint>
#include <span>

#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct scale_columns_op {};
struct scale_columns_backward_op {};

/// y[r, :] ← scale ⊙ y[r, :] for rows with mask[r] != 0 (empty mask: every row). y [n, d] unit inner stride, scale [d].
template <backend B>
void scale_columns(const B& be, view_of<B, float, 2> y, const float* scale, std::span<const unsigned char> mask) {
    dispatch<scale_columns_op>(be, y, scale, mask);
}
/// Backward of scale_columns on y_in (the values before scaling): dy_in = scale ⊙ dout on masked rows, dout elsewhere
/// (overwritten; may alias dout); dscale[c] += Σ_{masked r} dout[r, c] · y_in[r, c] (null: not needed).
template <backend B>
void scale_columns_backward(const B& be, view_of<B, const float, 2> y_in, const float* scale, view_of<B, const float, 2> dout,
                            view_of<B, float, 2> dy_in, float* dscale, std::span<const unsigned char> mask) {
    dispatch<scale_columns_backward_op>(be, y_in, scale, dout, dy_in, dscale, mask);
}

}  // namespace ops

namespace detail {
inline void scale_columns_check(std::int64_t n, std::int64_t inner_stride, std::size_t mask_size) {
    if (inner_stride != 1) throw shape_error("scale_columns: y needs unit inner stride, found " + std::to_string(inner_stride));
    if (mask_size != 0 && static_cast<std::int64_t>(mask_size) != n)
        throw shape_error("scale_columns: mask has " + std::to_string(mask_size) + " entries for " + std::to_string(n) + " rows");
}
template <class Acc, class Backend>
void scale_columns_backward_impl(const Backend& be, int threads, tensor_view<const float, 2> y_in, const float* scale,
                                 tensor_view<const float, 2> dout, tensor_view<float, 2> dy_in, float* dscale,
                                 std::span<const unsigned char> mask) {
    const std::int64_t n = dout.dim(0), d = dout.dim(1);
    y_in.require_shape({n, d}, "scale_columns_backward: y_in");
    dy_in.require_shape({n, d}, "scale_columns_backward: dy_in");
    scale_columns_check(n, dout.strides[1], mask.size());
    auto on = [&](std::int64_t r) { return mask.empty() || mask[static_cast<std::size_t>(r)]; };
    // dscale: fixed row blocks, per-block partials summed in block order (deterministic for a thread count).
    const std::int64_t nb = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n));
    std::vector<Acc> part(static_cast<std::size_t>(nb * d), Acc(0));
    be.parallel_for(nb, 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
            const std::int64_t r0 = n * b / nb, r1 = n * (b + 1) / nb;
            Acc* p = part.data() + b * d;
            for (std::int64_t r = r0; r < r1; ++r) {
                const bool m = on(r);
                for (std::int64_t c = 0; c < d; ++c) {
                    const Acc g = dout(r, c);
                    if (m && dscale) p[c] += g * static_cast<Acc>(y_in(r, c));
                    dy_in(r, c) = static_cast<float>(m ? g * static_cast<Acc>(scale[c]) : g);
                }
            }
        }
    });
    if (dscale)
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t c = 0; c < d; ++c) dscale[c] += static_cast<float>(part[static_cast<std::size_t>(b * d + c)]);
}
}  // namespace detail

template <class Arch>
struct op_impl<ops::scale_columns_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<float, 2> y, const float* scale, std::span<const unsigned char> mask) {
        const std::int64_t n = y.dim(0), d = y.dim(1);
        detail::scale_columns_check(n, y.strides[1], mask.size());
        be.parallel_for(n, 64, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r)
                if (mask.empty() || mask[static_cast<std::size_t>(r)])
                    for (std::int64_t c = 0; c < d; ++c) y(r, c) *= scale[c];
        });
    }
};
template <>
struct op_impl<ops::scale_columns_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 2> y, const float* scale, std::span<const unsigned char> mask) {
        const std::int64_t n = y.dim(0), d = y.dim(1);
        detail::scale_columns_check(n, y.strides[1], mask.size());
        for (std::int64_t r = 0; r < n; ++r)
            if (mask.empty() || mask[static_cast<std::size_t>(r)])
                for (std::int64_t c = 0; c < d; ++c) y(r, c) = static_cast<float>(static_cast<double>(y(r, c)) * scale[c]);
    }
};
template <class Arch>
struct op_impl<ops::scale_columns_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> y_in, const float* scale, tensor_view<const float, 2> dout,
                    tensor_view<float, 2> dy_in, float* dscale, std::span<const unsigned char> mask) {
        detail::scale_columns_backward_impl<float>(be, be.num_threads(), y_in, scale, dout, dy_in, dscale, mask);
    }
};
template <>
struct op_impl<ops::scale_columns_backward_op, reference_backend> {
    static void run(const reference_backend& be, tensor_view<const float, 2> y_in, const float* scale, tensor_view<const float, 2> dout,
                    tensor_view<float, 2> dy_in, float* dscale, std::span<const unsigned char> mask) {
        detail::scale_columns_backward_impl<double>(be, 1, y_in, scale, dout, dy_in, dscale, mask);
    }
};

}  // namespace hymix
