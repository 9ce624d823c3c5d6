// Causal depthwise 1-D convolution with an explicit conv state (spec.md §3.2 step 2, §3.4, invariants 1–2):
//   out_t[c] = b[c] + Σ_{j=0}^{K−1} w[c, j] · in_{t−K+1+j}[c],   tap K−1 multiplies the current token,
// inputs before the call's first token come from the state [C, K−1] (oldest in column 0). After the call the
// state holds the last K−1 inputs of [state ; x]. Optional SiLU after the bias. One sequence per call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

enum class conv_activation { none, silu };

/// x [T, C] (any row stride), w [C, K], bias [C] or null, state [C, K−1] (in/out; null means zeros, not
/// written back), out [T, C]. out must not alias x. Works for float and double (the reference).
template <class T>
void causal_conv1d(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, T* state,
                   conv_activation act, tensor_view<T, 2> out) {
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1);
    w.require_shape({C, -1}, "causal_conv1d: weight");
    out.require_shape({Tn, C}, "causal_conv1d: output");
    if (K < 1) throw shape_error("causal_conv1d: kernel width must be >= 1");
    const std::int64_t S = K - 1;
    // ext[(S + Tn), C]: the state transposed to rows, then the inputs; tap-major weights wt[K, C].
    // Per-thread scratch that only grows, so repeated calls (decode steps) allocate nothing.
    thread_local std::vector<T> ext, wt;
    if (ext.size() < static_cast<std::size_t>((S + Tn) * C)) ext.resize(static_cast<std::size_t>((S + Tn) * C));
    if (wt.size() < static_cast<std::size_t>(K * C)) wt.resize(static_cast<std::size_t>(K * C));
    if (!state) std::fill_n(ext.begin(), S * C, T(0));
    for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t j = 0; j < K; ++j) wt[j * C + c] = w(c, j);
    if (state)
        for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < S; ++j) ext[j * C + c] = state[c * S + j];
    for (std::int64_t t = 0; t < Tn; ++t) std::copy_n(&x(t, 0), C, ext.data() + (S + t) * C);
    for (std::int64_t t = 0; t < Tn; ++t) {
        T* o = &out(t, 0);
        for (std::int64_t c = 0; c < C; ++c) o[c] = bias ? bias[c] : T(0);
        for (std::int64_t j = 0; j < K; ++j) {
            const T* in = ext.data() + (t + j) * C;
            const T* wj = wt.data() + j * C;
            for (std::int64_t c = 0; c < C; ++c) o[c] += wj[c] * in[c];
        }
        if (act == conv_activation::silu) {
            std::int64_t c = 0;
            if constexpr (std::is_same_v<T, float>) {  // vectorised SiLU (default xsimd architecture)
                using Bf = xsimd::batch<float>;
                constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
                for (; c + W <= C; c += W) {
                    const Bf v = Bf::load_unaligned(o + c);
                    (v / (Bf(1.0f) + xsimd::exp(-v))).store_unaligned(o + c);
                }
            }
            for (; c < C; ++c) o[c] = silu(o[c]);
        }
    }
    if (state)
        for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < S; ++j) state[c * S + j] = ext[(Tn + j) * C + c];
}

}  // namespace hymix::kernels
