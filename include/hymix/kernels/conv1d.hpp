// Causal depthwise 1-D convolution with an explicit conv state (spec.md §3.2 step 2, §3.4, invariants 1–2):
//   out_t[c] = b[c] + Σ_{j=0}^{K−1} w[c, j] · in_{t−K+1+j}[c],   tap K−1 multiplies the current token,
// inputs before the call's first token come from the state [C, K−1] (oldest in column 0). After the call the
// state holds the last K−1 inputs of [state ; x]. Optional SiLU after the bias. One sequence per call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

enum class conv_activation { none, silu };

namespace detail {

/// o[c] ← SiLU(o[c]) for c < C; vectorised for float (default xsimd architecture).
template <class T>
void silu_in_place(T* o, std::int64_t C) {
    std::int64_t c = 0;
    if constexpr (std::is_same_v<T, float>) {
        using Bf = xsimd::batch<float>;
        constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
        for (; c + W <= C; c += W) {
            const Bf v = Bf::load_unaligned(o + c);
            (v / (Bf(1.0f) + xsimd::exp(-v))).store_unaligned(o + c);
        }
        // The tail goes through the same SIMD exp (zero-padded), so a channel's bits do not depend on where it sits in
        // the row: the GDN decode step convolves whole token rows, its prefill one head at a time (batch invariance).
        if (c < C) {
            alignas(64) float buf[W] = {};
            std::copy(o + c, o + C, buf);
            const Bf v = Bf::load_aligned(buf);
            (v / (Bf(1.0f) + xsimd::exp(-v))).store_aligned(buf);
            std::copy(buf, buf + (C - c), o + c);
        }
        return;
    }
    for (; c < C; ++c) o[c] = silu(o[c]);
}

/// One token per channel c, kernel width K (compile-time when KC > 0, else w.dim(1)):
///   acc = b[c]; acc = fma(w[c, j], state[c, j], acc) for j < K−1; acc = fma(w[c, K−1], x[c], acc); state row
/// shifted left, x appended. The same fused multiply-adds, in the same order, as the multi-token loop below (explicit
/// std::fma in both, so no compiler contraction choice can make them differ), so a decode step gives the bits a
/// prefill of that token gives. Plain loops the compiler vectorises across channels for the contiguous layouts.
template <std::int64_t KC, class T>
void conv1d_step_k(const T* x, const T* w, std::int64_t ws0, std::int64_t ws1, const T* bias, T* st, std::int64_t ss0,
                   std::int64_t ss1, std::int64_t C, std::int64_t Krt, T* o) {
    const std::int64_t K = KC > 0 ? KC : Krt, S = K - 1;
    for (std::int64_t c = 0; c < C; ++c) {
        const T xc = x[c];
        const T* wc = w + c * ws0;
        T* sc = st + c * ss0;
        T acc = bias ? bias[c] : T(0);
        for (std::int64_t j = 0; j < S; ++j) acc = std::fma(wc[j * ws1], sc[j * ss1], acc);
        acc = std::fma(wc[S * ws1], xc, acc);
        for (std::int64_t j = 0; j + 1 < S; ++j) sc[j * ss1] = sc[(j + 1) * ss1];
        if (S > 0) sc[(S - 1) * ss1] = xc;
        o[c] = acc;
    }
}

template <class T>
void causal_conv1d_step(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, tensor_view<T, 2> state,
                        conv_activation act, tensor_view<T, 2> out) {
    const std::int64_t C = x.dim(1), K = w.dim(1);
    const T* xp = &x(0, 0);
    T* o = &out(0, 0);
    const bool dense = w.strides[1] == 1 && w.strides[0] == K && state.strides[1] == 1 && state.strides[0] == K - 1;
    if (dense && K == 4)
        conv1d_step_k<4>(xp, w.data, 4, 1, bias, state.data, 3, 1, C, K, o);
    else if (dense && K == 2)
        conv1d_step_k<2>(xp, w.data, 2, 1, bias, state.data, 1, 1, C, K, o);
    else if (dense && K == 3)
        conv1d_step_k<3>(xp, w.data, 3, 1, bias, state.data, 2, 1, C, K, o);
    else
        conv1d_step_k<0>(xp, w.data, w.strides[0], w.strides[1], bias, state.data, state.strides[0], state.strides[1], C, K, o);
    if (act == conv_activation::silu) silu_in_place(o, C);
}

}  // namespace detail

namespace detail {
/// causal_conv1d's argument checks (shape_error / value_error naming the argument), also run by the CPU op on a whole
/// problem before it cuts it into channel pieces.
template <class T>
void check_conv1d_args(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, tensor_view<T, 2> state,
                       conv_activation act, tensor_view<T, 2> out) {
    constexpr std::string_view who = "causal_conv1d";
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1);
    w.require_shape({C, -1}, who, "weight");
    out.require_shape({Tn, C}, who, "output");
    if (K < 1) throw shape_error("causal_conv1d: kernel width must be >= 1, found weight " + shape_string(w.shape));
    if (act != conv_activation::none && act != conv_activation::silu)
        throw value_error("causal_conv1d: unknown activation " + std::to_string(static_cast<int>(act)));
    if (state.data) state.require_shape({C, K - 1}, who, "state");
    hymix::detail::require_unit_stride(x, 1, who, "x");
    hymix::detail::require_unit_stride(out, 1, who, "output");
    hymix::detail::require_no_self_overlap(out, who, "output");
    hymix::detail::require_no_overlap(out, "output", w, "weight", who);
    if (bias) hymix::detail::require_no_overlap(out, "output", tensor_view<const T, 1>(bias, {C}), "bias", who);
    if (state.data) {
        hymix::detail::require_no_self_overlap(state, who, "state");
        hymix::detail::require_no_overlap(out, "output", state, "state", who);
    }
}
}  // namespace detail

/// x [T, C] (any row stride, unit channel stride), w [C, K] (any strides), bias [C] or null, state [C, K−1] (any
/// strides; in/out; data == nullptr means zeros, not written back), out [T, C] (any row stride, unit channel stride).
/// x is copied before out is written, so out may be x itself. Works for float and double (the reference).
/// Checked in every build (shape_error / value_error naming the argument): shapes, the unit channel stride of x and
/// out, out's rows not overlapping each other, w, bias or the state, K >= 1, a known activation. Not checked: the
/// values (a NaN input propagates to the outputs it reaches).
template <class T>
void causal_conv1d(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, tensor_view<T, 2> state,
                   conv_activation act, tensor_view<T, 2> out) {
    detail::check_conv1d_args<T>(x, w, bias, state, act, out);
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1);
    const std::int64_t S = K - 1;
    if (Tn == 1 && state.data) {  // the decode step: no transposes, state shifted in place
        detail::causal_conv1d_step(x, w, bias, state, act, out);
        return;
    }
    // ext[(S + Tn), C]: the state transposed to rows, then the inputs; tap-major weights wt[K, C].
    // Per-thread scratch that only grows, so repeated calls (decode steps) allocate nothing.
    thread_local std::vector<T> ext, wt;
    if (ext.size() < static_cast<std::size_t>((S + Tn) * C)) ext.resize(static_cast<std::size_t>((S + Tn) * C));
    if (wt.size() < static_cast<std::size_t>(K * C)) wt.resize(static_cast<std::size_t>(K * C));
    if (!state.data) std::fill_n(ext.begin(), S * C, T(0));
    for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t j = 0; j < K; ++j) wt[j * C + c] = w(c, j);
    if (state.data)
        for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < S; ++j) ext[j * C + c] = state(c, j);
    for (std::int64_t t = 0; t < Tn; ++t) std::copy_n(&x(t, 0), C, ext.data() + (S + t) * C);
    for (std::int64_t t = 0; t < Tn; ++t) {
        T* o = &out(t, 0);
        for (std::int64_t c = 0; c < C; ++c) o[c] = bias ? bias[c] : T(0);
        for (std::int64_t j = 0; j < K; ++j) {
            const T* in = ext.data() + (t + j) * C;
            const T* wj = wt.data() + j * C;
            for (std::int64_t c = 0; c < C; ++c) o[c] = std::fma(wj[c], in[c], o[c]);
        }
        if (act == conv_activation::silu) detail::silu_in_place(o, C);
    }
    if (state.data)
        for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < S; ++j) state(c, j) = ext[(Tn + j) * C + c];
}

/// The same with the state as a contiguous [C, K−1] array (or null for zeros, not written back).
template <class T>
void causal_conv1d(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, T* state, conv_activation act,
                   tensor_view<T, 2> out) {
    const std::int64_t C = x.dim(1), S = std::max<std::int64_t>(w.dim(1) - 1, 0);
    causal_conv1d<T>(x, w, bias, state ? tensor_view<T, 2>(state, {C, S}) : tensor_view<T, 2>{}, act, out);
}

}  // namespace hymix::kernels
