// Backward of the embedding gather (x[r] = E[tokens[r]] where mask[r]: dE[tokens[r]] += dx[r]) and of the sigmoid
// output gate a ← a ⊙ σ(gate) (spec.md §2, Qwen3.5 gated attention: da = dout ⊙ σ(gate),
// dgate = dout ⊙ a ⊙ σ(gate)(1 − σ(gate)); rows outside the mask pass dout through and get dgate = 0).
// CPU fp32 kernels (deterministic: the embedding sums rows in order within fixed column blocks) and fp64 twins.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

namespace detail {

inline void check_row_count(std::string_view who, std::string_view what, std::size_t found, std::int64_t rows) {
    if (found != static_cast<std::size_t>(rows))
        throw shape_error(std::string(who) + ": " + std::string(what) + " has " + std::to_string(found) + " entries, expected " +
                          std::to_string(rows) + " (one per row)");
}

/// Checks of embedding_backward: tokens, mask [n]; dx [n, d]; dtable [V, d]; unit inner strides; every masked token
/// id in [0, V) (an out-of-range id would write outside the table, so this is checked: n comparisons).
template <class T>
void check_embedding_backward(std::span<const std::int32_t> tokens, std::span<const unsigned char> mask, const tensor_view<const T, 2>& dx,
                              const tensor_view<T, 2>& dtable) {
    constexpr std::string_view who = "embedding_backward";
    const std::int64_t n = dx.dim(0), V = dtable.dim(0);
    check_row_count(who, "tokens", tokens.size(), n);
    check_row_count(who, "mask", mask.size(), n);
    dtable.require_shape({V, dx.dim(1)}, who, "dtable");
    hymix::detail::require_unit_stride(dx, 1, who, "dx");
    hymix::detail::require_unit_stride(dtable, 1, who, "dtable");
    hymix::detail::require_no_self_overlap(dtable, who, "dtable");
    hymix::detail::require_no_overlap(dtable, "dtable", dx, "dx", who);
    for (std::size_t r = 0; r < tokens.size(); ++r)
        if (mask[r] && (tokens[r] < 0 || tokens[r] >= V))
            throw value_error(std::string(who) + ": tokens[" + std::to_string(r) + "] = " + std::to_string(tokens[r]) + " outside [0, " +
                              std::to_string(V) + ")");
}

/// Checks of mul_sigmoid_backward: every view [N, H, d] with unit inner stride; mask [N]; da may be dout itself.
template <class T>
void check_mul_sigmoid_backward(const tensor_view<const T, 3>& a_in, const tensor_view<const T, 3>& gate, const tensor_view<const T, 3>& dout,
                                const tensor_view<T, 3>& da, const tensor_view<T, 3>& dgate, std::span<const unsigned char> mask) {
    constexpr std::string_view who = "mul_sigmoid_backward";
    gate.require_shape(a_in.shape, who, "gate");
    dout.require_shape(a_in.shape, who, "dout");
    da.require_shape(a_in.shape, who, "da");
    dgate.require_shape(a_in.shape, who, "dgate");
    check_row_count(who, "mask", mask.size(), a_in.dim(0));
    hymix::detail::require_unit_stride(a_in, 2, who, "a_in");
    hymix::detail::require_unit_stride(gate, 2, who, "gate");
    hymix::detail::require_unit_stride(dout, 2, who, "dout");
    hymix::detail::require_unit_stride(da, 2, who, "da");
    hymix::detail::require_unit_stride(dgate, 2, who, "dgate");
    hymix::detail::require_no_self_overlap(da, who, "da");
    hymix::detail::require_no_self_overlap(dgate, who, "dgate");
    hymix::detail::require_no_overlap(da, "da", a_in, "a_in", who);
    hymix::detail::require_no_overlap(da, "da", gate, "gate", who);
    hymix::detail::require_no_overlap(da, "da", dout, "dout", who, true);
    hymix::detail::require_no_overlap(dgate, "dgate", a_in, "a_in", who);
    hymix::detail::require_no_overlap(dgate, "dgate", gate, "gate", who);
    hymix::detail::require_no_overlap(dgate, "dgate", dout, "dout", who);
    hymix::detail::require_no_overlap(dgate, "dgate", da, "da", who);
}

}  // namespace detail

// ---- references (T = double) ------------------------------------------------------------------------------------

/// dtable[tokens[r], :] += dx[r, :] for rows with mask[r] != 0, in T. dx [n, d], dtable [V, d].
template <class T>
void embedding_backward_ref(std::span<const std::int32_t> tokens, std::span<const unsigned char> mask, tensor_view<const T, 2> dx,
                            tensor_view<T, 2> dtable) {
    detail::check_embedding_backward(tokens, mask, dx, dtable);
    for (std::int64_t r = 0; r < dx.dim(0); ++r)
        if (mask[static_cast<std::size_t>(r)])
            for (std::int64_t c = 0; c < dx.dim(1); ++c) dtable(tokens[static_cast<std::size_t>(r)], c) += dx(r, c);
}

/// Reference twin of mul_sigmoid_backward in T. All views [N, H, d]; da, dgate overwritten (da may be dout itself).
template <class T>
void mul_sigmoid_backward_ref(tensor_view<const T, 3> a_in, tensor_view<const T, 3> gate, tensor_view<const T, 3> dout, tensor_view<T, 3> da,
                              tensor_view<T, 3> dgate, std::span<const unsigned char> mask) {
    detail::check_mul_sigmoid_backward(a_in, gate, dout, da, dgate, mask);
    for (std::int64_t r = 0; r < a_in.dim(0); ++r)
        for (std::int64_t h = 0; h < a_in.dim(1); ++h)
            for (std::int64_t i = 0; i < a_in.dim(2); ++i) {
                const T d = dout(r, h, i);
                if (mask[static_cast<std::size_t>(r)]) {
                    const T s = sigmoid(gate(r, h, i));
                    dgate(r, h, i) = d * a_in(r, h, i) * s * (T(1) - s);
                    da(r, h, i) = d * s;
                } else {
                    dgate(r, h, i) = 0;
                    da(r, h, i) = d;
                }
            }
}

// ---- CPU fp32 ---------------------------------------------------------------------------------------------------

/// Columns per task of embedding_backward (fixed: rows are summed in order within a block, so dtable is
/// bit-identical for any thread count).
inline constexpr std::int64_t embedding_backward_block = 64;

/// dtable[tokens[r], :] += dx[r, :] for rows with mask[r] != 0. dx [n, d], dtable [V, d]: unit inner strides.
/// Parallel over fixed column blocks, each summing the rows in order (no atomics, deterministic).
/// Throws shape_error on shapes, value_error on a masked token id outside [0, V).
template <cpu_backend_type Backend>
void embedding_backward(const Backend& be, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                        tensor_view<const float, 2> dx, tensor_view<float, 2> dtable) {
    detail::check_embedding_backward(tokens, mask, dx, dtable);
    const std::int64_t n = dx.dim(0), d = dx.dim(1);
    constexpr std::int64_t CB = embedding_backward_block;
    be.parallel_for((d + CB - 1) / CB, 1, [&](std::int64_t b0, std::int64_t b1) {
        const std::int64_t c0 = b0 * CB, c1 = std::min(d, b1 * CB);
        for (std::int64_t r = 0; r < n; ++r) {
            if (!mask[static_cast<std::size_t>(r)]) continue;
            const float* src = &dx(r, 0);
            float* dst = &dtable(tokens[static_cast<std::size_t>(r)], 0);
            for (std::int64_t c = c0; c < c1; ++c) dst[c] += src[c];
        }
    });
}

/// Backward of mul_sigmoid (a ← a ⊙ σ(gate) on masked rows). a_in [N, H, d] is a before the in-place forward; gate,
/// dout [N, H, d]; da, dgate [N, H, d] overwritten (da may be dout itself). Masked rows: da = dout ⊙ σ(gate),
/// dgate = dout ⊙ a_in ⊙ σ(gate)(1 − σ(gate)); other rows: da = dout, dgate = 0. Unit inner strides.
template <cpu_backend_type Backend>
void mul_sigmoid_backward(const Backend& be, tensor_view<const float, 3> a_in, tensor_view<const float, 3> gate,
                          tensor_view<const float, 3> dout, tensor_view<float, 3> da, tensor_view<float, 3> dgate,
                          std::span<const unsigned char> mask) {
    detail::check_mul_sigmoid_backward(a_in, gate, dout, da, dgate, mask);
    using V = xsimd::batch<float, typename Backend::arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    const std::int64_t H = a_in.dim(1), n = a_in.dim(2);
    be.parallel_for(a_in.dim(0), 16, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r)
            for (std::int64_t h = 0; h < H; ++h) {
                const float* a = &a_in(r, h, 0);
                const float* g = &gate(r, h, 0);
                const float* d = &dout(r, h, 0);
                float* oa = &da(r, h, 0);
                float* og = &dgate(r, h, 0);
                if (!mask[static_cast<std::size_t>(r)]) {
                    if (oa != d) std::copy_n(d, n, oa);
                    std::fill_n(og, n, 0.f);
                    continue;
                }
                std::int64_t i = 0;
                for (; i + W <= n; i += W) {
                    const V s = V(1.f) / (V(1.f) + xsimd::exp(-V::load_unaligned(g + i)));
                    const V dv = V::load_unaligned(d + i);
                    (dv * V::load_unaligned(a + i) * s * (V(1.f) - s)).store_unaligned(og + i);
                    (dv * s).store_unaligned(oa + i);
                }
                for (; i < n; ++i) {
                    const float s = sigmoid(g[i]), dv = d[i];
                    og[i] = dv * a[i] * s * (1.f - s);
                    oa[i] = dv * s;
                }
            }
    });
}

}  // namespace hymix::kernels
