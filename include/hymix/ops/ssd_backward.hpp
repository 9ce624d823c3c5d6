// Op: the Mamba-2 SSD backward over a batch of sequences (spec.md §3.2 step 5, §3.3): gradients of the chunked SSD's
// output w.r.t. x, Δ, A, B, C, D and the initial states. CPU: the chunked backward of kernels/ssd_backward.hpp.
// Reference: BPTT through the fp64 token recurrence (kernels::ssd_backward_ref<double>; the chunk size changes cost only).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hymix/kernels/ssd_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct ssd_chunked_backward_op {};

/// Gradients of ops::ssd_chunked for the upstream gradient dy [R, H, P]: grads' dx, ddt, dB, dC overwritten (zero on
/// rows outside every sequence), dA, dD accumulated; each sequence's dstate0 overwritten from its state0 (the state
/// its forward started from) and dstate_final. Null views / pointers are skipped.
template <backend B>
void ssd_chunked_backward(const B& be, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_backward_sequence<float>> seqs,
                          std::int64_t chunk, view_of<B, const float, 3> dy, const kernels::ssd_grads<float>& grads) {
    dispatch<ssd_chunked_backward_op>(be, in, seqs, chunk, dy, grads);
}

}  // namespace ops

template <class Arch>
struct op_impl<ops::ssd_chunked_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, const kernels::ssd_inputs<float>& in,
                    std::span<const kernels::ssd_backward_sequence<float>> seqs, std::int64_t chunk, tensor_view<const float, 3> dy,
                    const kernels::ssd_grads<float>& grads) {
        kernels::ssd_chunked_backward(be, in, seqs, chunk, dy, grads);
    }
};

namespace detail {
/// A zero fp64 buffer shaped like an fp32 gradient view (empty when the view is null), with its contiguous view.
template <std::size_t R>
struct f64_out {
    std::vector<double> buf;
    tensor_view<double, R> v;
    explicit f64_out(tensor_view<float, R> like)
        : buf(like.data ? static_cast<std::size_t>(like.numel()) : 0), v(like.data ? buf.data() : nullptr, like.shape) {}
    void store(tensor_view<float, R> dst) const {
        if (dst.data) f64_copy<R>::for_each_index(dst.shape, [&](const auto& i) { f64_copy<R>::at(dst, i) = static_cast<float>(f64_copy<R>::at(v, i)); });
    }
};
}  // namespace detail

template <>
struct op_impl<ops::ssd_chunked_backward_op, reference_backend> {
    static void run(const reference_backend&, const kernels::ssd_inputs<float>& in, std::span<const kernels::ssd_backward_sequence<float>> seqs,
                    std::int64_t chunk, tensor_view<const float, 3> dy, const kernels::ssd_grads<float>& grads) {
        constexpr const char* who = "ssd_chunked_backward (reference)";
        kernels::detail::ssd_backward_check(in, seqs, dy, grads, who);
        if (chunk < 1) throw config_error(std::string(who) + ": chunk size must be >= 1, found " + std::to_string(chunk));
        const std::int64_t H = in.n_heads(), P = in.head_dim(), S = H * P * in.d_state(), nD = in.D_per_channel ? H * P : H;
        detail::f64_copy<3> x(in.x), Bm(in.B), Cm(in.C), dyd(dy);
        detail::f64_copy<2> dt(in.dt);
        const auto A = detail::f64_vector(in.A, H);
        const auto D = detail::f64_vector(in.D, nD);
        kernels::ssd_inputs<double> din;
        din.x = x.v;
        din.dt = dt.v;
        din.A = A.data();
        din.B = Bm.v;
        din.C = Cm.v;
        din.D = in.D ? D.data() : nullptr;
        din.D_per_channel = in.D_per_channel;
        detail::f64_out<3> dx(grads.dx), dB(grads.dB), dC(grads.dC);
        detail::f64_out<2> ddt(grads.ddt);
        std::vector<double> dA(static_cast<std::size_t>(H), 0.0), dD(static_cast<std::size_t>(nD), 0.0);
        kernels::ssd_grads<double> g{dx.v, ddt.v, dB.v, dC.v, grads.dA ? dA.data() : nullptr, grads.dD ? dD.data() : nullptr};
        std::vector<std::vector<double>> s0(seqs.size()), ds0(seqs.size()), dsf(seqs.size());
        std::vector<kernels::ssd_backward_sequence<double>> dseqs;
        for (std::size_t i = 0; i < seqs.size(); ++i) {
            const auto& s = seqs[i];
            s0[i] = detail::f64_vector(s.state0, S);
            dsf[i] = detail::f64_vector(s.dstate_final, S);
            if (s.dstate0) ds0[i].assign(static_cast<std::size_t>(S), 0.0);
            dseqs.push_back({s.start, s.length, s.state0 ? s0[i].data() : nullptr, s.dstate0 ? ds0[i].data() : nullptr,
                             s.dstate_final ? dsf[i].data() : nullptr});
        }
        kernels::ssd_backward_ref<double>(din, std::span<const kernels::ssd_backward_sequence<double>>(dseqs), tensor_view<const double, 3>(dyd.v), g);
        dx.store(grads.dx);
        dB.store(grads.dB);
        dC.store(grads.dC);
        ddt.store(grads.ddt);
        for (std::int64_t h = 0; h < H && grads.dA; ++h) grads.dA[h] += static_cast<float>(dA[static_cast<std::size_t>(h)]);
        for (std::int64_t e = 0; e < nD && grads.dD; ++e) grads.dD[e] += static_cast<float>(dD[static_cast<std::size_t>(e)]);
        for (std::size_t i = 0; i < seqs.size(); ++i)
            if (seqs[i].dstate0)
                for (std::int64_t e = 0; e < S; ++e) seqs[i].dstate0[e] = static_cast<float>(ds0[i][static_cast<std::size_t>(e)]);
    }
};

}  // namespace hymix
