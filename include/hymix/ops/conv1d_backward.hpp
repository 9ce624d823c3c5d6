// Op: backward of a batch of causal depthwise conv1d problems (ops/conv1d.hpp; spec.md §3.2 step 2, §4.2, §8
// invariants 2 and 20): input, weight, bias and initial conv-state gradients, with the SiLU and the fused L2 group
// normalisation of the forward. Nothing saved: the pre-activation is recomputed from x, w, bias and state0.
// CPU: kernels::causal_conv1d_backward_block, parallel over (problem, channel block), deterministic for any thread
// count (weight/bias partials per problem, summed in problem order). Reference: kernels::causal_conv1d_backward_ref
// in fp64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/kernels/conv1d_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct causal_conv1d_backward_op {};

/// The backward of one ops::conv_problem. Inputs (as the forward saw them): x [T, C] (unit channel stride, any row
/// stride), w [C, K], bias [C] or null, state0 [C, K−1] or null (zeros; contiguous: the state the forward started
/// from, not the one it left), l2_group / l2_channels / l2_eps exactly as the forward. Upstream gradients: dout
/// [T, C] (any strides, e.g. a column slice or a stride-0 broadcast), dstate_final [C, K−1] or null (gradient of the
/// state the forward left behind: chaining calls through their states). Outputs (empty view / null: not wanted):
/// dx [T, C] (overwritten; unit channel stride), dw [C, K] (accumulated), dbias [C] (accumulated), dstate0 [C, K−1]
/// (overwritten; contiguous; includes the pass-through to the final state when T < K−1).
template <class Space = host_space>
struct conv_backward_problem {
    tensor_view<const float, 2, Space> x;     // [T, C]
    tensor_view<const float, 2, Space> w;     // [C, K]
    const float* bias = nullptr;              // [C]
    const float* state0 = nullptr;            // [C, K−1]
    tensor_view<const float, 2, Space> dout;  // [T, C]
    const float* dstate_final = nullptr;      // [C, K−1]
    tensor_view<float, 2, Space> dx;          // [T, C]
    tensor_view<float, 2, Space> dw;          // [C, K]
    float* dbias = nullptr;                   // [C]
    float* dstate0 = nullptr;                 // [C, K−1]
    std::int64_t l2_group = 0;
    std::int64_t l2_channels = -1;
    float l2_eps = 0.f;

    kernels::conv_l2_groups l2() const { return {l2_group, l2_channels, static_cast<double>(l2_eps)}; }
};

/// Runs the backward of every problem. Problems may share dw / dbias (several sequences of one layer): their
/// contributions add up, in problem order. They must not share dx or dstate0.
template <backend B>
void causal_conv1d_backward(const B& be, std::span<const conv_backward_problem<typename B::memory_space>> problems,
                            kernels::conv_activation act) {
    dispatch<causal_conv1d_backward_op>(be, problems, act);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::causal_conv1d_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, std::span<const ops::conv_backward_problem<host_space>> ps_in,
                    kernels::conv_activation act) {
        // An upstream gradient with a non-unit channel stride (a transposed view) is gathered into rows first, so that
        // every layout runs the same path and gives bit-identical gradients (spec.md §8.20).
        std::vector<ops::conv_backward_problem<host_space>> local;
        std::vector<std::vector<float>> gathered;
        for (const auto& p : ps_in)
            if (p.dout.data && p.dout.dim(1) > 1 && p.dout.strides[1] != 1) {
                local.assign(ps_in.begin(), ps_in.end());
                break;
            }
        for (auto& p : local)
            if (p.dout.data && p.dout.dim(1) > 1 && p.dout.strides[1] != 1) {
                const std::int64_t T = p.dout.dim(0), C = p.dout.dim(1);
                auto& buf = gathered.emplace_back(static_cast<std::size_t>(T * C));
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t c = 0; c < C; ++c) buf[static_cast<std::size_t>(t * C + c)] = p.dout(t, c);
                p.dout = tensor_view<const float, 2>(buf.data(), {T, C});
            }
        const std::span<const ops::conv_backward_problem<host_space>> ps = local.empty() ? ps_in : std::span<const ops::conv_backward_problem<host_space>>(local);
        struct item {
            std::size_t p;
            std::int64_t c0, c1;
        };
        std::vector<item> items;
        std::vector<std::int64_t> off(ps.size() + 1, 0);  // per problem: offset of its [C, K] + [C] partials
        for (std::size_t i = 0; i < ps.size(); ++i) {
            const auto& p = ps[i];
            kernels::detail::check_conv1d_backward<float>(p.x, p.w, p.dout, act, p.l2(), p.dx, p.dw);
            const std::int64_t C = p.x.dim(1), K = p.w.dim(1);
            // channel blocks of ~64 that never cut an L2 group
            const std::int64_t bw = p.l2_group > 0 ? p.l2_group * ((64 + p.l2_group - 1) / p.l2_group) : 64;
            for (std::int64_t c0 = 0; c0 < C; c0 += bw) items.push_back({i, c0, std::min(C, c0 + bw)});
            off[i + 1] = off[i] + (p.dw.data ? C * K : 0) + (p.dbias ? C : 0);
        }
        std::vector<float> part(static_cast<std::size_t>(off.back()), 0.f);
        be.parallel_for(static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t k = b; k < e; ++k) {
                const item& it = items[static_cast<std::size_t>(k)];
                const auto& p = ps[it.p];
                const std::int64_t C = p.x.dim(1), K = p.w.dim(1);
                float* base = part.data() + off[it.p];
                const tensor_view<float, 2> dw = p.dw.data ? tensor_view<float, 2>(base, {C, K}) : tensor_view<float, 2>{};
                float* db = p.dbias ? base + (p.dw.data ? C * K : 0) : nullptr;
                kernels::causal_conv1d_backward_block<Arch>(p.x, p.w, p.bias, p.state0, p.dout, p.dstate_final, act, p.l2(),
                                                            p.dx, dw, db, p.dstate0, it.c0, it.c1);
            }
        });
        for (std::size_t i = 0; i < ps.size(); ++i) {  // fixed order: deterministic, and shared dw / dbias add up
            const auto& p = ps[i];
            const std::int64_t C = p.x.dim(1), K = p.w.dim(1);
            const float* base = part.data() + off[i];
            if (p.dw.data) {
                for (std::int64_t c = 0; c < C; ++c)
                    for (std::int64_t j = 0; j < K; ++j) p.dw(c, j) += base[c * K + j];
                base += C * K;
            }
            if (p.dbias)
                for (std::int64_t c = 0; c < C; ++c) p.dbias[c] += base[c];
        }
    }
};

template <>
struct op_impl<ops::causal_conv1d_backward_op, reference_backend> {
    static void run(const reference_backend&, std::span<const ops::conv_backward_problem<host_space>> ps,
                    kernels::conv_activation act) {
        for (const auto& p : ps) {
            kernels::detail::check_conv1d_backward<float>(p.x, p.w, p.dout, act, p.l2(), p.dx, p.dw);
            const std::int64_t T = p.x.dim(0), C = p.x.dim(1), K = p.w.dim(1), S = K - 1;
            detail::f64_copy<2> xd(p.x), wd(p.w), dod(p.dout);
            const auto bias = detail::f64_vector(p.bias, C), s0 = detail::f64_vector(p.state0, C * S),
                       dsf = detail::f64_vector(p.dstate_final, C * S);
            tensor<double> dx({T, C}), dw({C, K});
            std::vector<double> db(static_cast<std::size_t>(C), 0.0), ds0(static_cast<std::size_t>(C * S), 0.0);
            kernels::causal_conv1d_backward_ref<double>(xd.v, wd.v, p.bias ? bias.data() : nullptr, p.state0 ? s0.data() : nullptr,
                                                        dod.v, p.dstate_final ? dsf.data() : nullptr, act, p.l2(),
                                                        p.dx.data ? dx.view<2>() : tensor_view<double, 2>{},
                                                        p.dw.data ? dw.view<2>() : tensor_view<double, 2>{},
                                                        p.dbias ? db.data() : nullptr, p.dstate0 ? ds0.data() : nullptr);
            if (p.dx.data)
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t c = 0; c < C; ++c) p.dx(t, c) = static_cast<float>(dx.view<2>()(t, c));
            if (p.dw.data)  // accumulate: the fp64 contribution is rounded once onto the fp32 gradient
                for (std::int64_t c = 0; c < C; ++c)
                    for (std::int64_t j = 0; j < K; ++j)
                        p.dw(c, j) = static_cast<float>(static_cast<double>(p.dw(c, j)) + dw.view<2>()(c, j));
            if (p.dbias)
                for (std::int64_t c = 0; c < C; ++c)
                    p.dbias[c] = static_cast<float>(static_cast<double>(p.dbias[c]) + db[static_cast<std::size_t>(c)]);
            if (p.dstate0)
                for (std::int64_t i = 0; i < C * S; ++i) p.dstate0[i] = static_cast<float>(ds0[static_cast<std::size_t>(i)]);
        }
    }
};

}  // namespace hymix
