// Op: a batch of independent causal depthwise conv1d problems (spec.md §3.2 step 2, §3.4, §4.2), each one
// sequence × one block of channels with its own conv state, optional SiLU and an optional L2 normalisation of
// each group of channels afterwards (GDN's q/k heads, fused while the rows are in cache). Mixers build the problem
// list (which rows, which channels, which state slot, where the output goes: token- or head-major); the backend
// runs it. CPU: kernels::causal_conv1d, parallel over problems. Reference: the same recurrence in fp64.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/kernels/conv1d.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct causal_conv1d_op {};

/// One conv problem: x [T, C] (unit channel stride, any row stride), w [C, K], bias [C] or null, state [C, K−1]
/// (contiguous; read as the previous inputs, overwritten with the last K−1 inputs; null: zeros, not written),
/// out [T, C] (unit channel stride). After the activation, when l2_group > 0, every group of l2_group channels
/// among the first l2_channels (-1: all C) of each output row is divided by sqrt(Σ² + l2_eps).
template <class Space = host_space>
struct conv_problem {
    tensor_view<const float, 2, Space> x;
    tensor_view<const float, 2, Space> w;
    const float* bias = nullptr;
    float* state = nullptr;
    tensor_view<float, 2, Space> out;
    std::int64_t l2_group = 0;
    std::int64_t l2_channels = -1;
    float l2_eps = 0.f;

    std::int64_t l2_limit() const { return l2_channels < 0 ? out.dim(1) : l2_channels; }
};

/// Runs every problem (they must not share a state or overlap in `out`).
template <backend B>
void causal_conv1d(const B& be, std::span<const conv_problem<typename B::memory_space>> problems,
                   kernels::conv_activation act) {
    dispatch<causal_conv1d_op>(be, problems, act);
}

}  // namespace ops

namespace detail {
template <class Arch>
inline void l2_normalise_groups(float* row, std::int64_t C, std::int64_t group, float eps) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    for (std::int64_t g0 = 0; g0 + group <= C; g0 += group) {
        float* p = row + g0;
        V acc(0.f);
        std::int64_t a = 0;
        for (; a + W <= group; a += W) {
            const V x = V::load_unaligned(p + a);
            acc = xsimd::fma(x, x, acc);
        }
        float ss = xsimd::hadd(acc);
        for (; a < group; ++a) ss += p[a] * p[a];
        const float inv = 1.f / std::sqrt(ss + eps);
        a = 0;
        for (; a + W <= group; a += W) (V::load_unaligned(p + a) * V(inv)).store_unaligned(p + a);
        for (; a < group; ++a) p[a] *= inv;
    }
}
}  // namespace detail

template <class Arch>
struct op_impl<ops::causal_conv1d_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, std::span<const ops::conv_problem<host_space>> ps,
                    kernels::conv_activation act) {
        // Tasks sized by the largest problem (T · C · K multiply-adds): a decode step's few channels run inline, and a
        // prefill sharing the call with decode rows keeps a task per problem.
        std::int64_t macs = 0;
        for (const auto& p : ps) macs = std::max(macs, p.x.dim(0) * p.x.dim(1) * p.w.dim(1));
        be.parallel_for(static_cast<std::int64_t>(ps.size()), task_grain(macs), [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) {
                const auto& p = ps[static_cast<std::size_t>(i)];
                kernels::causal_conv1d<float>(p.x, p.w, p.bias, p.state, act, p.out);
                if (p.l2_group > 0)
                    for (std::int64_t t = 0; t < p.out.dim(0); ++t)
                        detail::l2_normalise_groups<Arch>(&p.out(t, 0), p.l2_limit(), p.l2_group, p.l2_eps);
            }
        });
    }
};

template <>
struct op_impl<ops::causal_conv1d_op, reference_backend> {
    static void run(const reference_backend&, std::span<const ops::conv_problem<host_space>> ps, kernels::conv_activation act) {
        for (const auto& p : ps) {
            const std::int64_t T = p.x.dim(0), C = p.x.dim(1), K = p.w.dim(1);
            detail::f64_copy<2> xd(p.x), wd(p.w);
            std::vector<double> bias = detail::f64_vector(p.bias, C), state;
            if (p.state) state = detail::f64_vector(p.state, C * (K - 1));
            tensor<double> out({T, C});
            kernels::causal_conv1d<double>(xd.v, wd.v, p.bias ? bias.data() : nullptr, p.state ? state.data() : nullptr, act,
                                           out.view<2>());
            if (p.l2_group > 0)
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t g0 = 0; g0 + p.l2_group <= p.l2_limit(); g0 += p.l2_group) {
                        double ss = 0;
                        for (std::int64_t a = 0; a < p.l2_group; ++a) ss += out.view<2>()(t, g0 + a) * out.view<2>()(t, g0 + a);
                        const double n = std::sqrt(ss + static_cast<double>(p.l2_eps));
                        for (std::int64_t a = 0; a < p.l2_group; ++a) out.view<2>()(t, g0 + a) /= n;
                    }
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t c = 0; c < C; ++c) p.out(t, c) = static_cast<float>(out.view<2>()(t, c));
            if (p.state)
                for (std::int64_t i = 0; i < C * (K - 1); ++i) p.state[i] = static_cast<float>(state[static_cast<std::size_t>(i)]);
        }
    }
};

}  // namespace hymix
