// Argument checks shared by the public kernels: the stride assumptions a kernel makes about a view (unit stride
// along an axis, an output whose elements do not overlap, outputs that do not overlap inputs) and cheap scalar
// preconditions. They throw shape_error / value_error naming the function and the argument; checked in every build.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::detail {

/// "who: arg" as used at the start of every argument error.
inline std::string arg_label(std::string_view who, std::string_view arg) {
    std::string s(who);
    return s.append(": ").append(arg);
}

/// Throws shape_error unless `axis` of v has unit stride. An axis of extent <= 1 is never stepped along, so its
/// stride is only checked with `strict` (for code that hands the view to Eigen, which checks it regardless).
template <class T, std::size_t R>
void require_unit_stride(const tensor_view<T, R>& v, std::size_t axis, std::string_view who, std::string_view arg,
                         bool strict = false) {
    if ((strict || v.shape[axis] > 1) && v.strides[axis] != 1)
        throw shape_error(arg_label(who, arg) + " " + shape_string(v.shape) + " needs unit stride along axis " +
                          std::to_string(axis) + ", found strides " + shape_string(v.strides));
}

/// Throws shape_error if two distinct index tuples of v address the same element (e.g. a zero stride, or rows
/// closer together than a row is long). Sufficient test: with the axes of extent > 1 sorted by |stride|, each
/// stride must exceed the span of all smaller axes. Layouts that interleave axes without overlap are rejected too.
template <class T, std::size_t R>
void require_no_self_overlap(const tensor_view<T, R>& v, std::string_view who, std::string_view arg) {
    if (v.empty()) return;
    std::array<std::size_t, R> ax{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < R; ++i)
        if (v.shape[i] > 1) ax[n++] = i;
    for (std::size_t i = 1; i < n; ++i)  // insertion sort by |stride| (R is tiny)
        for (std::size_t k = i; k > 0 && std::abs(v.strides[ax[k]]) < std::abs(v.strides[ax[k - 1]]); --k) std::swap(ax[k], ax[k - 1]);
    std::int64_t span = 1;  // elements spanned by the axes checked so far
    for (std::size_t k = 0; k < n; ++k) {
        const std::int64_t s = std::abs(v.strides[ax[k]]);
        if (s < span)
            throw shape_error(arg_label(who, arg) + " " + shape_string(v.shape) + " is written, but its strides " +
                              shape_string(v.strides) + " make elements overlap");
        span += (v.shape[ax[k]] - 1) * s;
    }
}

/// [first, last] element addresses of a non-empty view, as integers (for overlap tests).
template <class T, std::size_t R>
std::array<std::uintptr_t, 2> address_range(const tensor_view<T, R>& v) {
    std::int64_t lo = 0, hi = 0;
    for (std::size_t i = 0; i < R; ++i) {
        const std::int64_t e = (v.shape[i] - 1) * v.strides[i];
        (e < 0 ? lo : hi) += e;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(v.data);
    const auto sz = static_cast<std::int64_t>(sizeof(T));
    return {base + static_cast<std::uintptr_t>(lo * sz), base + static_cast<std::uintptr_t>(hi * sz) + sizeof(T) - 1};
}

/// Throws shape_error if the memory of output `out` overlaps that of input `in`. With `same_ok`, an output that is
/// exactly the input (same pointer, shape and strides: an in-place call) is accepted.
template <class TO, class TI, std::size_t RO, std::size_t RI>
void require_no_overlap(const tensor_view<TO, RO>& out, std::string_view out_name, const tensor_view<TI, RI>& in,
                        std::string_view in_name, std::string_view who, bool same_ok = false) {
    if (out.empty() || in.empty()) return;
    if constexpr (RO == RI && std::is_same_v<std::remove_const_t<TO>, std::remove_const_t<TI>>)
        if (same_ok && static_cast<const void*>(out.data) == static_cast<const void*>(in.data) && out.shape == in.shape &&
            out.strides == in.strides)
            return;
    const auto a = address_range(out), b = address_range(in);
    if (a[0] <= b[1] && b[0] <= a[1])
        throw shape_error(arg_label(who, out_name) + " overlaps " + std::string(in_name) + " in memory" +
                          (same_ok ? " (only an exactly in-place call, same view, is allowed)" : ""));
}

/// Throws value_error unless v is finite.
inline void require_finite(double v, std::string_view who, std::string_view arg) {
    if (!std::isfinite(v)) throw value_error(arg_label(who, arg) + " must be finite, found " + std::to_string(v));
}

/// Throws value_error unless v is finite and >= 0.
inline void require_finite_nonneg(double v, std::string_view who, std::string_view arg) {
    if (!(std::isfinite(v) && v >= 0.0))
        throw value_error(arg_label(who, arg) + " must be finite and >= 0, found " + std::to_string(v));
}

/// Throws value_error when a pointer argument that must hold n > 0 elements is null.
inline void require_pointer(const void* p, std::int64_t n, std::string_view who, std::string_view arg) {
    if (!p && n > 0) throw value_error(arg_label(who, arg) + " is null but must hold " + std::to_string(n) + " elements");
}

}  // namespace hymix::detail
