// Op: backward of the dense projection y = x Wᵀ + b (spec.md §0): dx = dy · W (=), dW += dyᵀ · x, db += Σ dy.
// CPU: kernels::linear_backward (xsimd register tiles over fixed blocks, deterministic). Reference: fp64 loops.
#pragma once

#include <cstdint>
#include <vector>

#include "hymix/kernels/linear_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct linear_backward_op {};

/// Backward of ops::linear. x [M, K] and w [N, K] are the forward's inputs, dy [M, N] the upstream gradient.
/// dx [M, K] is overwritten; dw [N, K] and db [N] are accumulated (+=). A view with data == nullptr (dx, dw) or a
/// null db means "not needed". Unit inner strides, any row strides. Throws shape_error naming the argument.
template <backend B>
void linear_backward(const B& be, view_of<B, const float, 2> x, view_of<B, const float, 2> w, view_of<B, const float, 2> dy,
                     view_of<B, float, 2> dx, view_of<B, float, 2> dw, float* db) {
    dispatch<linear_backward_op>(be, x, w, dy, dx, dw, db);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::linear_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> x, tensor_view<const float, 2> w,
                    tensor_view<const float, 2> dy, tensor_view<float, 2> dx, tensor_view<float, 2> dw, float* db) {
        kernels::linear_backward(be, x, w, dy, dx, dw, db);
    }
};

template <>
struct op_impl<ops::linear_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> x, tensor_view<const float, 2> w,
                    tensor_view<const float, 2> dy, tensor_view<float, 2> dx, tensor_view<float, 2> dw, float* db) {
        kernels::detail::check_linear_backward(x, w, dy, dx, dw, db);
        const std::int64_t N = w.dim(0);
        detail::f64_copy<2> xd(x), wd(w), dyd(dy);
        detail::f64_copy<2> dxd(dx.data ? dx : tensor_view<float, 2>()), dwd(dw.data ? dw : tensor_view<float, 2>());
        std::vector<double> dbd = detail::f64_vector(db, N);
        const tensor_view<double, 2> dx64 = dx.data ? dxd.v : tensor_view<double, 2>();
        const tensor_view<double, 2> dw64 = dw.data ? dwd.v : tensor_view<double, 2>();
        kernels::linear_backward_ref<double>(xd.v, wd.v, dyd.v, dx64, dw64, db ? dbd.data() : nullptr);
        if (dx.data) dxd.store(dx);
        if (dw.data) dwd.store(dw);
        for (std::int64_t n = 0; db && n < N; ++n) db[n] = static_cast<float>(dbd[static_cast<std::size_t>(n)]);
    }
};

}  // namespace hymix
