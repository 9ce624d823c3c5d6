// Ops: causal softmax attention over a batch of independent problems (one per sequence; GQA by head groups,
// bottom-right causal mask, optional sliding window; spec.md §2) — the tiled flash-style prefill and the split-K
// decode — and RoPE on [T, H, d_h] (§2, rotate-half or interleaved, partial rotary). CPU: kernels/attention.hpp,
// kernels/rope.hpp. Reference: kernels::attention_ref (materialised scores, fp64) and kernels::rope_ref. Keys and
// values may be stored in f32, bf16 or f16 (kv_attention_type: a 16-bit KV cache), widened exactly to fp32 when read.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "hymix/core/dtype.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/rope.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct attention_prefill_op {};
struct attention_decode_op {};
struct rope_op {};

/// Element types the attention ops read keys and values in.
template <class KV>
concept kv_attention_type = std::is_same_v<KV, float> || std::is_same_v<KV, bf16> || std::is_same_v<KV, f16>;

/// Every problem's o (and lse when given) from its q, k, v; any query counts.
template <backend B, kv_attention_type KV>
void attention_prefill(const B& be, std::span<const kernels::attention_problem<float, KV>> problems,
                       const kernels::attention_params& prm) {
    dispatch<attention_prefill_op>(be, problems, prm);
}

/// As attention_prefill, for problems of one query each (decode steps; long contexts split over threads).
template <backend B, kv_attention_type KV>
void attention_decode(const B& be, std::span<const kernels::attention_problem<float, KV>> problems,
                      const kernels::attention_params& prm) {
    dispatch<attention_decode_op>(be, problems, prm);
}

/// In place on x [T, H, d_h] (unit stride along d_h): token t rotated to position positions[t]; the first d_rot
/// channels of each head rotate.
template <backend B>
void rope(const B& be, view_of<B, float, 3> x, std::span<const std::int64_t> positions, kernels::rope_mode mode,
          double theta, std::int64_t d_rot) {
    dispatch<rope_op>(be, x, positions, mode, theta, d_rot);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::attention_prefill_op, basic_cpu_backend<Arch>> {
    template <class KV>
    static void run(const basic_cpu_backend<Arch>& be, std::span<const kernels::attention_problem<float, KV>> ps,
                    const kernels::attention_params& prm) {
        kernels::attention_prefill(be, ps, prm);
    }
};
template <class Arch>
struct op_impl<ops::attention_decode_op, basic_cpu_backend<Arch>> {
    template <class KV>
    static void run(const basic_cpu_backend<Arch>& be, std::span<const kernels::attention_problem<float, KV>> ps,
                    const kernels::attention_params& prm) {
        kernels::attention_decode(be, ps, prm);
    }
};
template <class Arch>
struct op_impl<ops::rope_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<float, 3> x, std::span<const std::int64_t> pos,
                    kernels::rope_mode mode, double theta, std::int64_t d_rot) {
        kernels::detail::rope_check(x, pos, mode, theta, d_rot, "rope");
        be.parallel_for(x.dim(0), 16, [&](std::int64_t r0, std::int64_t r1) {
            kernels::rope(x.slice(r0, r1 - r0), pos.subspan(static_cast<std::size_t>(r0), static_cast<std::size_t>(r1 - r0)), mode,
                          theta, d_rot);
        });
    }
};

namespace detail {
template <class KV>
void attention_reference_run(std::span<const kernels::attention_problem<float, KV>> ps, const kernels::attention_params& prm) {
    for (const auto& p : ps) {
        kernels::detail::attention_check(p, "attention (reference)");
        detail::f64_copy<3> q(p.q), k(p.k), v(p.v), o{tensor_view<const float, 3>(p.o)};
        std::vector<double> lse(p.lse.data ? static_cast<std::size_t>(p.q.dim(0) * p.q.dim(1)) : 0);
        kernels::attention_problem<double> d;
        d.q = q.v;
        d.k = k.v;
        d.v = v.v;
        d.o = o.v;
        if (p.lse.data) d.lse = tensor_view<double, 2>(lse.data(), {p.q.dim(0), p.q.dim(1)});
        kernels::attention_ref(d, prm);
        o.store(p.o);
        if (p.lse.data)
            for (std::int64_t i = 0; i < p.q.dim(0); ++i)
                for (std::int64_t h = 0; h < p.q.dim(1); ++h) p.lse(i, h) = static_cast<float>(d.lse(i, h));
    }
}
}  // namespace detail

template <>
struct op_impl<ops::attention_prefill_op, reference_backend> {
    template <class KV>
    static void run(const reference_backend&, std::span<const kernels::attention_problem<float, KV>> ps,
                    const kernels::attention_params& prm) {
        detail::attention_reference_run(ps, prm);
    }
};
template <>
struct op_impl<ops::attention_decode_op, reference_backend> {
    template <class KV>
    static void run(const reference_backend&, std::span<const kernels::attention_problem<float, KV>> ps,
                    const kernels::attention_params& prm) {
        detail::attention_reference_run(ps, prm);
    }
};
template <>
struct op_impl<ops::rope_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<float, 3> x, std::span<const std::int64_t> pos, kernels::rope_mode mode,
                    double theta, std::int64_t d_rot) {
        detail::f64_copy<3> xd{tensor_view<const float, 3>(x)};
        kernels::rope_ref(xd.v, pos, mode, theta, d_rot);
        xd.store(x);
    }
};

}  // namespace hymix
