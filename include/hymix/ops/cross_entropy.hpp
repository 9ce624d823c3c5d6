// Op: fused, streaming LM head + cross-entropy with its gradients and the normalised entropy per row (issue 8;
// spec.md §5.2, §8 invariant 21). CPU: kernels::cross_entropy (vocabulary tiles, never [M, V]). Reference: fp64 rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "hymix/kernels/cross_entropy.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct cross_entropy_op {};

/// Loss and gradients of the LM head: logits = h [M, d] · head [V, d]ᵀ, never held whole. targets [M] (−1: no loss
/// at that row). losses [M] ← cross-entropy in nats (0 where ignored). dh [M, d] ← d(grad_scale·Σ losses)/dh
/// (overwritten; an empty view skips it: loss only), dhead [V, d] += its head gradient (or skipped). entropy [M]
/// (or null) ← the softmax entropy / log V (AMOR's gate statistic, computed for every row). Unit inner strides.
/// Throws shape_error on shapes, value_error on a target outside [−1, V) or a non-finite grad_scale.
template <backend B>
void cross_entropy(const B& be, view_of<B, const float, 2> h, view_of<B, const float, 2> head, std::span<const std::int32_t> targets,
                   std::span<float> losses, view_of<B, float, 2> dh, view_of<B, float, 2> dhead, float grad_scale, float* entropy = nullptr) {
    dispatch<cross_entropy_op>(be, h, head, targets, losses, dh, dhead, grad_scale, entropy);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::cross_entropy_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> h, tensor_view<const float, 2> head,
                    std::span<const std::int32_t> targets, std::span<float> losses, tensor_view<float, 2> dh, tensor_view<float, 2> dhead,
                    float grad_scale, float* entropy) {
        kernels::cross_entropy(be, h, head, targets, losses, dh, dhead, grad_scale, entropy);
    }
};

template <>
struct op_impl<ops::cross_entropy_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> h, tensor_view<const float, 2> head,
                    std::span<const std::int32_t> targets, std::span<float> losses, tensor_view<float, 2> dh, tensor_view<float, 2> dhead,
                    float grad_scale, float* entropy) {
        kernels::detail::check_cross_entropy(h, head, targets, losses.size(), dh, dhead, static_cast<double>(grad_scale));
        const std::int64_t M = h.dim(0);
        detail::f64_copy<2> hd(h), headd(head);
        detail::f64_copy<2> dhd(dh.data ? dh : tensor_view<float, 2>()), dheadd(dhead.data ? dhead : tensor_view<float, 2>());
        std::vector<double> ld(static_cast<std::size_t>(M)), ed(static_cast<std::size_t>(M));
        kernels::cross_entropy_ref<double>(hd.v, headd.v, targets, ld.data(), dh.data ? dhd.v : tensor_view<double, 2>(),
                                           dhead.data ? dheadd.v : tensor_view<double, 2>(), grad_scale, entropy ? ed.data() : nullptr);
        for (std::int64_t m = 0; m < M; ++m) {
            losses[static_cast<std::size_t>(m)] = static_cast<float>(ld[static_cast<std::size_t>(m)]);
            if (entropy) entropy[m] = static_cast<float>(ed[static_cast<std::size_t>(m)]);
        }
        if (dh.data) dhd.store(dh);
        if (dhead.data) dheadd.store(dhead);
    }
};

}  // namespace hymix
