// Argument checks shared by the kernels: the stride assumptions of a view argument, stated and checked with a
// shape_error that names the kernel and the argument (issue 11: no kernel may silently assume a layout).
// Fast paths map rows onto Eigen matrices, which needs the last dimension (or the last two) dense.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels::detail {

/// Throws shape_error unless the last dimension of v has unit stride (any other strides are fine).
template <class T, std::size_t R>
void require_unit_inner_stride(const tensor_view<T, R>& v, std::string_view who, std::string_view name) {
    if (v.strides[R - 1] != 1 && v.shape[R - 1] > 1)
        throw shape_error(std::string(who) + ": " + std::string(name) + " needs a unit stride in its last dimension, found strides " +
                          shape_string(v.strides));
}

/// Throws shape_error unless every matrix over the last two dimensions of v is dense row-major (strides [.., c, 1]
/// for c columns), as a state matrix that is read and written through one pointer must be.
template <class T, std::size_t R>
void require_dense_matrices(const tensor_view<T, R>& v, std::string_view who, std::string_view name) {
    static_assert(R >= 2);
    const bool inner_ok = v.strides[R - 1] == 1 || v.shape[R - 1] <= 1;
    const bool outer_ok = v.strides[R - 2] == v.shape[R - 1] || v.shape[R - 2] <= 1;
    if (!inner_ok || !outer_ok)
        throw shape_error(std::string(who) + ": each " + std::string(name) +
                          " matrix over the last two dimensions must be dense row-major (strides [..., " + std::to_string(v.shape[R - 1]) +
                          ", 1]), found strides " + shape_string(v.strides));
}

}  // namespace hymix::kernels::detail
