// Op: backward of ops::rope (spec.md §2): the output gradient of the rotary embedding, rotated back by −φ in place
// (the transpose of each 2×2 rotation). CPU: kernels::rope_backward, parallel over tokens. Reference:
// kernels::rope_backward_ref in fp64.
#pragma once

#include <cstdint>
#include <span>

#include "hymix/kernels/rope_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct rope_backward_op {};

/// In place on dx [T, H, d_h] (unit stride along d_h): the gradient w.r.t. rope's output becomes the gradient
/// w.r.t. its input, for the same positions, mode, theta and d_rot as the forward.
template <backend B>
void rope_backward(const B& be, view_of<B, float, 3> dx, std::span<const std::int64_t> positions, kernels::rope_mode mode,
                   double theta, std::int64_t d_rot) {
    dispatch<rope_backward_op>(be, dx, positions, mode, theta, d_rot);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::rope_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<float, 3> dx, std::span<const std::int64_t> pos,
                    kernels::rope_mode mode, double theta, std::int64_t d_rot) {
        kernels::detail::rope_backward_check(dx, pos, mode, theta, d_rot, "rope_backward");
        be.parallel_for(dx.dim(0), 16, [&](std::int64_t r0, std::int64_t r1) {
            kernels::rope_backward(dx.slice(r0, r1 - r0), pos.subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(r1 - r0)),
                                   mode, theta, d_rot);
        });
    }
};

template <>
struct op_impl<ops::rope_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 3> dx, std::span<const std::int64_t> pos, kernels::rope_mode mode,
                    double theta, std::int64_t d_rot) {
        kernels::detail::rope_backward_check(dx, pos, mode, theta, d_rot, "rope_backward");
        detail::f64_copy<3> d{tensor_view<const float, 3>(dx)};
        kernels::rope_backward_ref<double>(d.v, pos, mode, theta, d_rot);
        d.store(dx);
    }
};

}  // namespace hymix
