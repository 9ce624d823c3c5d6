// Op: a batch of independent causal depthwise conv1d problems (spec.md §3.2 step 2, §3.4, §4.2), each one
// sequence × one block of channels with its own conv state, optional SiLU and an optional L2 normalisation of
// each group of channels afterwards (GDN's q/k heads, fused while the rows are in cache). Mixers build the problem
// list (which rows, which channels, which state slot, where the output goes: token- or head-major); the backend
// runs it. CPU: kernels::causal_conv1d, parallel over problems (few problems cut into channel pieces). Reference: the
// same recurrence in fp64.
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
        // Work items are (problem, channel piece). Few problems of many channels (a decode step's one problem per
        // sequence, a Mamba-2 prefill's one problem) are cut into pieces of whole L2 groups (else of 64 channels), so
        // that every thread has work: serially, the 8 problems of a batch-8 decode step of Mamba-2 780M took 80 µs
        // per layer on 16 cores (HYMIX_OP_PROFILE). A channel's arithmetic does not depend on the others (per-channel
        // sums, a lane-independent SIMD exp, whole L2 groups), so the pieces give the bits of the whole problem. A task
        // holds enough of the largest piece's work by either count: min_task_macs multiply-adds (T · width · K), or
        // 48 KiB of inputs, outputs, weights and state touched (a decode step is bound by those, not by its few
        // multiply-adds; the same minimum as the gated delta rule's decode step).
        struct piece {
            std::size_t p;
            std::int64_t c0, c1;
        };
        std::vector<piece> items;
        const std::int64_t threads = be.num_threads(), n_prob = static_cast<std::int64_t>(ps.size());
        const std::int64_t want = threads == 1 ? 1 : (2 * threads + n_prob - 1) / std::max<std::int64_t>(1, n_prob);
        std::int64_t macs = 0, bytes = 0;
        for (std::size_t i = 0; i < ps.size(); ++i) {
            const auto& p = ps[i];
            const std::int64_t C = p.x.dim(1), align = p.l2_group > 0 ? p.l2_group : 64;
            // The whole problem's checks first (the pieces are built from its shapes); an empty one is not cut.
            kernels::detail::check_conv1d_args<float>(
                p.x, p.w, p.bias, p.state ? tensor_view<float, 2>(p.state, {C, std::max<std::int64_t>(p.w.dim(1) - 1, 0)}) : tensor_view<float, 2>{}, act, p.out);
            const std::int64_t n = p.x.dim(0) == 0 ? 1 : std::max<std::int64_t>(1, std::min(want, C / align));
            const std::int64_t width = n == 1 ? std::max<std::int64_t>(C, 1) : ((C + n - 1) / n + align - 1) / align * align;
            for (std::int64_t c0 = 0; c0 < std::max<std::int64_t>(C, 1); c0 += width) {
                const std::int64_t wd = std::min(C, c0 + width) - c0, T = p.x.dim(0), K = p.w.dim(1);
                items.push_back({i, c0, c0 + wd});
                macs = std::max(macs, T * wd * K);
                bytes = std::max(bytes, 4 * wd * (2 * T + K + 2 * (K - 1)));
            }
        }
        const std::int64_t grain =
            split_grain(std::min(items_per_task(macs, min_task_macs), items_per_task(bytes, std::int64_t{48} << 10)));
        be.parallel_for(static_cast<std::int64_t>(items.size()), grain, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) {
                const auto [pi, c0, c1] = items[static_cast<std::size_t>(i)];
                const auto& p = ps[pi];
                const std::int64_t T = p.x.dim(0), K = p.w.dim(1), wd = c1 - c0;
                run_piece(p, tensor_view<const float, 2>(p.x.data + c0 * p.x.strides[1], {T, wd}, p.x.strides),
                          p.w.slice(c0, wd), p.bias ? p.bias + c0 : nullptr,
                          p.state ? p.state + c0 * (K - 1) : nullptr,
                          tensor_view<float, 2>(p.out.data + c0 * p.out.strides[1], {T, wd}, p.out.strides),
                          std::clamp<std::int64_t>(p.l2_limit() - c0, 0, wd), act);
            }
        });
    }

private:
    /// One problem's channels [c0, c0 + width) as views of their own; l2_limit: how many of them the L2 groups cover.
    static void run_piece(const ops::conv_problem<host_space>& p, tensor_view<const float, 2> x, tensor_view<const float, 2> w,
                          const float* bias, float* state, tensor_view<float, 2> out, std::int64_t l2_limit, kernels::conv_activation act) {
        kernels::causal_conv1d<float>(x, w, bias, state, act, out);
        if (p.l2_group > 0 && l2_limit > 0)
            for (std::int64_t t = 0; t < out.dim(0); ++t) detail::l2_normalise_groups<Arch>(&out(t, 0), l2_limit, p.l2_group, p.l2_eps);
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
