// Ops: the data movement and elementwise pieces of mixers, blocks and stacks — embedding gather, row gather /
// scatter / zeroing by a row mask, masked residual add, strided copies (KV cache appends) and the sigmoid output
// gate (spec.md §2 Qwen3.5 gated attention). They are exact (or one rounding) on every backend; the reference
// backend computes the arithmetic ones in fp64.
#pragma once

#include <algorithm>
#include <concepts>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "hymix/core/convert.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/math.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct embedding_op {};
struct gather_rows_op {};
struct scatter_rows_op {};
struct zero_rows_op {};
struct add_rows_op {};
struct copy_op {};
struct mul_sigmoid_op {};

/// x[r, :] = table[tokens[r], :] where mask[r] != 0, else 0. table [V, d], tokens and mask [n], x [n, d].
/// Token ids are not checked here (the stack checks them once per call).
template <backend B>
void embedding(const B& be, view_of<B, const float, 2> table, std::span<const std::int32_t> tokens,
               std::span<const unsigned char> mask, view_of<B, float, 2> x) {
    dispatch<embedding_op>(be, table, tokens, mask, x);
}
/// The same from a host linear_weight table, read as stored (16-bit rows are widened exactly; an 8-bit row is its
/// scale times its integers, q8_view::at). Throws value_error where the backend's op_impl does not take the storage.
template <host_backend B, std::same_as<linear_weight> W>
void embedding(const B& be, const W& table, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
               view_of<B, float, 2> x) {
    using X = view_of<B, float, 2>;
    table.template visit_stored<2>([&]<class T>(T t)
        requires dispatchable_op<embedding_op, B, T, std::span<const std::int32_t>, std::span<const unsigned char>, X>
    { dispatch<embedding_op>(be, t, tokens, mask, x); });
}

/// dst[i, :] = src[rows[i], :] (rows[i] < 0: zeros). src [n, d], dst [m, d], rows [m].
template <backend B>
void gather_rows(const B& be, view_of<B, const float, 2> src, std::span<const std::int64_t> rows, view_of<B, float, 2> dst) {
    dispatch<gather_rows_op>(be, src, rows, dst);
}

/// dst[rows[i], :] = src[i, :] for rows[i] >= 0. src [m, d], dst [n, d], rows [m] distinct.
template <backend B>
void scatter_rows(const B& be, view_of<B, const float, 2> src, std::span<const std::int64_t> rows, view_of<B, float, 2> dst) {
    dispatch<scatter_rows_op>(be, src, rows, dst);
}

/// y[r, :] = 0 where keep[r] == 0. y [n, d], keep [n].
template <backend B>
void zero_rows(const B& be, view_of<B, float, 2> y, std::span<const unsigned char> keep) {
    dispatch<zero_rows_op>(be, y, keep);
}

/// x[r, :] += y[r, :] where mask[r] != 0 (the residual add of a block). x, y [n, d], mask [n].
template <backend B>
void add_rows(const B& be, view_of<B, float, 2> x, view_of<B, const float, 2> y, std::span<const unsigned char> mask) {
    dispatch<add_rows_op>(be, x, y, mask);
}

/// dst = src for [A, B, C] views with unit inner stride (any outer strides): KV cache appends and layout changes.
template <backend B>
void copy(const B& be, view_of<B, const float, 3> src, view_of<B, float, 3> dst) {
    dispatch<copy_op>(be, src, dst);
}
/// dst = src rounded to nearest even in a 16-bit type (bf16 or f16; NaN stays NaN, f16 overflow gives ±Inf), same
/// layout rules: the appends of a 16-bit KV cache.
template <backend B, class D>
    requires(std::is_same_v<D, bf16> || std::is_same_v<D, f16>)
void copy(const B& be, view_of<B, const float, 3> src, tensor_view<D, 3, typename B::memory_space> dst) {
    dispatch<copy_op>(be, src, dst);
}

/// a[n, h, :] ← a[n, h, :] ⊙ σ(gate[n, h, :]) for rows with mask[n] != 0 (a and gate [N, H, d], unit inner stride).
template <backend B>
void mul_sigmoid(const B& be, view_of<B, float, 3> a, view_of<B, const float, 3> gate, std::span<const unsigned char> mask) {
    dispatch<mul_sigmoid_op>(be, a, gate, mask);
}

}  // namespace ops

namespace detail {
inline void check_rows(std::int64_t n, std::size_t m, const char* who, const char* what) {
    if (static_cast<std::size_t>(n) != m)
        throw shape_error(std::string(who) + ": " + what + " has " + std::to_string(m) + " entries for " + std::to_string(n) + " rows");
}
inline void check_unit_inner(std::int64_t stride, std::int64_t width, const char* who, const char* what) {
    if (width > 1 && stride != 1)
        throw shape_error(std::string(who) + ": " + what + " needs unit inner stride, found " + std::to_string(stride));
}

/// A host embedding table: a [V, d] view of fp32, bf16 or f16 values, or 8-bit rows with their scales.
template <class T>
concept embedding_table = std::same_as<T, tensor_view<const float, 2>> || std::same_as<T, tensor_view<const bf16, 2>> ||
                          std::same_as<T, tensor_view<const f16, 2>> || std::same_as<T, q8_view>;

/// The host implementations shared by the CPU and reference backends (pure data movement is exact on both).
struct host_moves {
    template <class T>
    static void embedding(tensor_view<const T, 2> table, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                          tensor_view<float, 2> x, std::int64_t r0, std::int64_t r1) {
        const std::int64_t d = x.dim(1);
        for (std::int64_t r = r0; r < r1; ++r) {
            const auto i = static_cast<std::size_t>(r);
            if (mask[i])
                convert(&table(tokens[i], 0), &x(r, 0), static_cast<std::size_t>(d));
            else
                std::fill_n(&x(r, 0), d, 0.f);
        }
    }
    static void embedding(q8_view table, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                          tensor_view<float, 2> x, std::int64_t r0, std::int64_t r1) {
        const std::int64_t d = x.dim(1);
        for (std::int64_t r = r0; r < r1; ++r) {
            const auto i = static_cast<std::size_t>(r);
            if (mask[i])
                for (std::int64_t k = 0; k < d; ++k) x(r, k) = table.at(tokens[i], k);
            else
                std::fill_n(&x(r, 0), d, 0.f);
        }
    }
    static void gather(tensor_view<const float, 2> src, std::span<const std::int64_t> rows, tensor_view<float, 2> dst,
                       std::int64_t r0, std::int64_t r1) {
        const std::int64_t d = dst.dim(1);
        for (std::int64_t r = r0; r < r1; ++r) {
            const std::int64_t s = rows[static_cast<std::size_t>(r)];
            if (s >= 0)
                std::copy_n(&src(s, 0), d, &dst(r, 0));
            else
                std::fill_n(&dst(r, 0), d, 0.f);
        }
    }
    static void scatter(tensor_view<const float, 2> src, std::span<const std::int64_t> rows, tensor_view<float, 2> dst,
                        std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r) {
            const std::int64_t t = rows[static_cast<std::size_t>(r)];
            if (t >= 0) std::copy_n(&src(r, 0), src.dim(1), &dst(t, 0));
        }
    }
    static void zero(tensor_view<float, 2> y, std::span<const unsigned char> keep, std::int64_t r0, std::int64_t r1) {
        for (std::int64_t r = r0; r < r1; ++r)
            if (!keep[static_cast<std::size_t>(r)]) std::fill_n(&y(r, 0), y.dim(1), 0.f);
    }
    template <class D>
    static void copy(tensor_view<const float, 3> src, tensor_view<D, 3> dst, std::int64_t a0, std::int64_t a1) {
        const std::int64_t Bn = src.dim(1), C = src.dim(2);
        for (std::int64_t a = a0; a < a1; ++a)
            for (std::int64_t b = 0; b < Bn; ++b) {
                if constexpr (std::is_same_v<D, float>)
                    std::memcpy(&dst(a, b, 0), &src(a, b, 0), sizeof(float) * static_cast<std::size_t>(C));
                else
                    convert(&src(a, b, 0), &dst(a, b, 0), static_cast<std::size_t>(C));
            }
    }
    /// Row counts, the table's width against x's, unit inner strides (rows are copied as contiguous runs).
    template <class T>
    static void check_embedding(tensor_view<const T, 2> table, std::size_t n_tokens, std::size_t n_mask, tensor_view<float, 2> x) {
        check_rows(x.dim(0), n_tokens, "embedding", "tokens");
        check_rows(x.dim(0), n_mask, "embedding", "mask");
        if (table.dim(1) != x.dim(1))
            throw shape_error("embedding: the table has " + std::to_string(table.dim(1)) + " columns, x " + std::to_string(x.dim(1)));
        check_unit_inner(table.strides[1], table.dim(1), "embedding", "table");
        check_unit_inner(x.strides[1], x.dim(1), "embedding", "x");
    }
    static void check_embedding(q8_view table, std::size_t n_tokens, std::size_t n_mask, tensor_view<float, 2> x) {
        check_embedding(table.q, n_tokens, n_mask, x);
    }
    /// Row count and unit inner stride of a masked row op's output.
    static void check_masked(tensor_view<const float, 2> y, std::size_t n_mask, const char* who, const char* what, const char* mask_name) {
        check_rows(y.dim(0), n_mask, who, mask_name);
        check_unit_inner(y.strides[1], y.dim(1), who, what);
    }
    static void check_gather(tensor_view<const float, 2> src, std::span<const std::int64_t> rows, tensor_view<float, 2> dst,
                             bool gather) {
        const char* who = gather ? "gather_rows" : "scatter_rows";
        if (src.dim(1) != dst.dim(1))
            throw shape_error(std::string(who) + ": src has " + std::to_string(src.dim(1)) + " columns, dst " + std::to_string(dst.dim(1)));
        check_unit_inner(src.strides[1], src.dim(1), who, "src");
        check_unit_inner(dst.strides[1], dst.dim(1), who, "dst");
        check_rows(gather ? dst.dim(0) : src.dim(0), rows.size(), who, "rows");
        const std::int64_t lim = gather ? src.dim(0) : dst.dim(0);
        for (auto r : rows)
            if (r >= lim) throw shape_error(std::string(who) + ": row index " + std::to_string(r) + " outside [0, " + std::to_string(lim) + ")");
    }
};
}  // namespace detail

// ---- CPU backend ------------------------------------------------------------------------------------------------

template <class Arch>
struct op_impl<ops::embedding_op, basic_cpu_backend<Arch>> {
    template <detail::embedding_table Table>
    static void run(const basic_cpu_backend<Arch>& be, Table table, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                    tensor_view<float, 2> x) {
        detail::host_moves::check_embedding(table, tokens.size(), mask.size(), x);
        be.parallel_for(x.dim(0), 256, [&](std::int64_t r0, std::int64_t r1) { detail::host_moves::embedding(table, tokens, mask, x, r0, r1); });
    }
};
template <class Arch>
struct op_impl<ops::gather_rows_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> src, std::span<const std::int64_t> rows,
                    tensor_view<float, 2> dst) {
        detail::host_moves::check_gather(src, rows, dst, true);
        be.parallel_for(dst.dim(0), 256, [&](std::int64_t r0, std::int64_t r1) { detail::host_moves::gather(src, rows, dst, r0, r1); });
    }
};
template <class Arch>
struct op_impl<ops::scatter_rows_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> src, std::span<const std::int64_t> rows,
                    tensor_view<float, 2> dst) {
        detail::host_moves::check_gather(src, rows, dst, false);
        be.parallel_for(src.dim(0), 256, [&](std::int64_t r0, std::int64_t r1) { detail::host_moves::scatter(src, rows, dst, r0, r1); });
    }
};
template <class Arch>
struct op_impl<ops::zero_rows_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>&, tensor_view<float, 2> y, std::span<const unsigned char> keep) {
        detail::host_moves::check_masked(y, keep.size(), "zero_rows", "y", "keep");
        detail::host_moves::zero(y, keep, 0, y.dim(0));
    }
};
template <class Arch>
struct op_impl<ops::add_rows_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>&, tensor_view<float, 2> x, tensor_view<const float, 2> y,
                    std::span<const unsigned char> mask) {
        y.require_shape(x.shape, "add_rows", "y");
        detail::host_moves::check_masked(x, mask.size(), "add_rows", "x", "mask");
        detail::check_unit_inner(y.strides[1], y.dim(1), "add_rows", "y");
        const std::int64_t d = x.dim(1);
        for (std::int64_t r = 0; r < x.dim(0); ++r) {
            if (!mask[static_cast<std::size_t>(r)]) continue;
            float* xr = &x(r, 0);
            const float* yr = &y(r, 0);
            for (std::int64_t i = 0; i < d; ++i) xr[i] += yr[i];
        }
    }
};
template <class Arch>
struct op_impl<ops::copy_op, basic_cpu_backend<Arch>> {
    template <class D>
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 3> src, tensor_view<D, 3> dst) {
        dst.require_shape(src.shape, "copy", "dst");
        detail::check_unit_inner(src.strides[2], src.dim(2), "copy", "src");
        detail::check_unit_inner(dst.strides[2], dst.dim(2), "copy", "dst");
        be.parallel_for(src.dim(0), 8, [&](std::int64_t a0, std::int64_t a1) { detail::host_moves::copy(src, dst, a0, a1); });
    }
};
template <class Arch>
struct op_impl<ops::mul_sigmoid_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<float, 3> a, tensor_view<const float, 3> gate,
                    std::span<const unsigned char> mask) {
        gate.require_shape(a.shape, "mul_sigmoid", "gate");
        detail::check_rows(a.dim(0), mask.size(), "mul_sigmoid", "mask");
        detail::check_unit_inner(a.strides[2], a.dim(2), "mul_sigmoid", "a");
        detail::check_unit_inner(gate.strides[2], gate.dim(2), "mul_sigmoid", "gate");
        using V = xsimd::batch<float, Arch>;
        constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
        const std::int64_t H = a.dim(1), n = a.dim(2);
        be.parallel_for(a.dim(0), 16, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r) {
                if (!mask[static_cast<std::size_t>(r)]) continue;
                for (std::int64_t h = 0; h < H; ++h) {
                    float* x = &a(r, h, 0);
                    const float* g = &gate(r, h, 0);
                    std::int64_t i = 0;
                    for (; i + W <= n; i += W)
                        (V::load_unaligned(x + i) / (V(1.f) + xsimd::exp(-V::load_unaligned(g + i)))).store_unaligned(x + i);
                    for (; i < n; ++i) x[i] *= sigmoid(g[i]);
                }
            }
        });
    }
};

// ---- reference backend ------------------------------------------------------------------------------------------

template <>
struct op_impl<ops::embedding_op, reference_backend> {
    template <detail::embedding_table Table>
    static void run(const reference_backend&, Table table, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                    tensor_view<float, 2> x) {
        detail::host_moves::check_embedding(table, tokens.size(), mask.size(), x);
        detail::host_moves::embedding(table, tokens, mask, x, 0, x.dim(0));
    }
};
template <>
struct op_impl<ops::gather_rows_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> src, std::span<const std::int64_t> rows, tensor_view<float, 2> dst) {
        detail::host_moves::check_gather(src, rows, dst, true);
        detail::host_moves::gather(src, rows, dst, 0, dst.dim(0));
    }
};
template <>
struct op_impl<ops::scatter_rows_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> src, std::span<const std::int64_t> rows, tensor_view<float, 2> dst) {
        detail::host_moves::check_gather(src, rows, dst, false);
        detail::host_moves::scatter(src, rows, dst, 0, src.dim(0));
    }
};
template <>
struct op_impl<ops::zero_rows_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 2> y, std::span<const unsigned char> keep) {
        detail::host_moves::check_masked(y, keep.size(), "zero_rows", "y", "keep");
        detail::host_moves::zero(y, keep, 0, y.dim(0));
    }
};
template <>
struct op_impl<ops::add_rows_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 2> x, tensor_view<const float, 2> y, std::span<const unsigned char> mask) {
        y.require_shape(x.shape, "add_rows", "y");
        detail::host_moves::check_masked(x, mask.size(), "add_rows", "x", "mask");
        detail::check_unit_inner(y.strides[1], y.dim(1), "add_rows", "y");
        for (std::int64_t r = 0; r < x.dim(0); ++r)
            if (mask[static_cast<std::size_t>(r)])
                for (std::int64_t i = 0; i < x.dim(1); ++i) x(r, i) = static_cast<float>(double(x(r, i)) + double(y(r, i)));
    }
};
template <>
struct op_impl<ops::copy_op, reference_backend> {
    template <class D>
    static void run(const reference_backend&, tensor_view<const float, 3> src, tensor_view<D, 3> dst) {
        dst.require_shape(src.shape, "copy", "dst");
        detail::check_unit_inner(src.strides[2], src.dim(2), "copy", "src");
        detail::check_unit_inner(dst.strides[2], dst.dim(2), "copy", "dst");
        detail::host_moves::copy(src, dst, 0, src.dim(0));
    }
};
template <>
struct op_impl<ops::mul_sigmoid_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 3> a, tensor_view<const float, 3> gate, std::span<const unsigned char> mask) {
        gate.require_shape(a.shape, "mul_sigmoid", "gate");
        detail::check_rows(a.dim(0), mask.size(), "mul_sigmoid", "mask");
        for (std::int64_t r = 0; r < a.dim(0); ++r)
            if (mask[static_cast<std::size_t>(r)])
                for (std::int64_t h = 0; h < a.dim(1); ++h)
                    for (std::int64_t i = 0; i < a.dim(2); ++i)
                        a(r, h, i) = static_cast<float>(double(a(r, h, i)) * sigmoid(double(gate(r, h, i))));
    }
};

}  // namespace hymix
