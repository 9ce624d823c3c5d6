// Ops: backward of the embedding gather and of the sigmoid output gate (ops/elementwise.hpp; spec.md §2).
// CPU: kernels/elementwise_backward.hpp (deterministic). Reference: the fp64 twins on fp64 copies.
#pragma once

#include <cstdint>
#include <span>

#include "hymix/kernels/elementwise_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct embedding_backward_op {};
struct mul_sigmoid_backward_op {};

/// Backward of ops::embedding: dtable[tokens[r], :] += dx[r, :] for rows with mask[r] != 0 (accumulated, so a tied
/// LM head's gradient can be in dtable already). tokens, mask [n]; dx [n, d]; dtable [V, d]. Deterministic.
/// Throws value_error on a masked token id outside [0, V).
template <backend B>
void embedding_backward(const B& be, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                        view_of<B, const float, 2> dx, view_of<B, float, 2> dtable) {
    dispatch<embedding_backward_op>(be, tokens, mask, dx, dtable);
}

/// Backward of ops::mul_sigmoid. a_in [N, H, d] is a before the in-place forward, gate [N, H, d], dout [N, H, d] the
/// upstream gradient; da, dgate [N, H, d] are overwritten (da may be dout itself). Rows with mask[n] == 0 were not
/// gated: da = dout, dgate = 0 there.
template <backend B>
void mul_sigmoid_backward(const B& be, view_of<B, const float, 3> a_in, view_of<B, const float, 3> gate, view_of<B, const float, 3> dout,
                          view_of<B, float, 3> da, view_of<B, float, 3> dgate, std::span<const unsigned char> mask) {
    dispatch<mul_sigmoid_backward_op>(be, a_in, gate, dout, da, dgate, mask);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::embedding_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                    tensor_view<const float, 2> dx, tensor_view<float, 2> dtable) {
        kernels::embedding_backward(be, tokens, mask, dx, dtable);
    }
};

template <class Arch>
struct op_impl<ops::mul_sigmoid_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 3> a_in, tensor_view<const float, 3> gate,
                    tensor_view<const float, 3> dout, tensor_view<float, 3> da, tensor_view<float, 3> dgate,
                    std::span<const unsigned char> mask) {
        kernels::mul_sigmoid_backward(be, a_in, gate, dout, da, dgate, mask);
    }
};

template <>
struct op_impl<ops::embedding_backward_op, reference_backend> {
    static void run(const reference_backend&, std::span<const std::int32_t> tokens, std::span<const unsigned char> mask,
                    tensor_view<const float, 2> dx, tensor_view<float, 2> dtable) {
        kernels::detail::check_embedding_backward(tokens, mask, dx, dtable);
        detail::f64_copy<2> dxd(dx), dtd(dtable);
        kernels::embedding_backward_ref<double>(tokens, mask, dxd.v, dtd.v);
        dtd.store(dtable);
    }
};

template <>
struct op_impl<ops::mul_sigmoid_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 3> a_in, tensor_view<const float, 3> gate,
                    tensor_view<const float, 3> dout, tensor_view<float, 3> da, tensor_view<float, 3> dgate,
                    std::span<const unsigned char> mask) {
        kernels::detail::check_mul_sigmoid_backward(a_in, gate, dout, da, dgate, mask);
        detail::f64_copy<3> ad(a_in), gd(gate), dod(dout), dad(da), dgd(dgate);
        kernels::mul_sigmoid_backward_ref<double>(ad.v, gd.v, dod.v, dad.v, dgd.v, mask);
        dad.store(da);
        dgd.store(dgate);
    }
};

}  // namespace hymix
