// Backward of the causal depthwise conv1d (kernels/conv1d.hpp; spec.md §3.2 step 2, §4.2, §8 invariants 2, 20),
// with its optional SiLU and the fused L2 normalisation of channel groups (GDN q/k). With ext = [state0 ; x]
// (S = K−1 state rows, then T input rows), the forward is
//   p_t = b + Σ_j w[:, j] ⊙ ext_{t+j},   a_t = act(p_t),   out_t = a_t / sqrt(Σ_group a_t² + eps)  (per L2 group),
// and the final conv state is ext rows T … T+S−1. Given dout (and optionally the gradient of the final state):
//   L2:    da = (dout − y (y·dout)) / n per group (y = a/n, n = sqrt(Σa² + eps));  elsewhere da = dout
//   SiLU:  dp = da · σ(p) (1 + p (1 − σ(p)));  none: dp = da
//   db += Σ_t dp_t;   dw[:, j] += Σ_t dp_t ⊙ ext_{t+j};   dext_r = Σ_j w[:, j] ⊙ dp_{r−j} (+ dstate_final_{r−T})
//   dx_t = dext_{S+t};   dstate0[:, r] = dext_r (r < S: includes the pass-through rows when T < S).
// Nothing is saved by the forward: p is recomputed from x, w, b and state0.
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
#include "hymix/kernels/conv1d.hpp"

namespace hymix::kernels {

/// The fused L2 normalisation after the activation: every group of `group` channels among the first `channels`
/// (-1: all C; a trailing partial group is left alone) is divided by sqrt(Σ² + eps). group == 0: none.
struct conv_l2_groups {
    std::int64_t group = 0;
    std::int64_t channels = -1;
    double eps = 0.0;

    std::int64_t limit(std::int64_t C) const { return channels < 0 ? C : std::min(channels, C); }
};

namespace detail {

/// Checks every argument of a conv backward (shape_error / value_error naming it). x [T, C], w [C, K], dout [T, C],
/// dx [T, C] or empty, dw [C, K] or empty; the pointers are contiguous [C], [C, K−1].
template <class T>
void check_conv1d_backward(tensor_view<const T, 2> x, tensor_view<const T, 2> w, tensor_view<const T, 2> dout,
                           conv_activation act, const conv_l2_groups& l2, tensor_view<T, 2> dx, tensor_view<T, 2> dw) {
    constexpr std::string_view who = "causal_conv1d_backward";
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1);
    w.require_shape({C, -1}, who, "w");
    if (K < 1) throw shape_error("causal_conv1d_backward: w: kernel width must be >= 1, found shape " + shape_string(w.shape));
    dout.require_shape({Tn, C}, who, "dout");
    if (act != conv_activation::none && act != conv_activation::silu)
        throw value_error("causal_conv1d_backward: unknown activation " + std::to_string(static_cast<int>(act)));
    if (l2.group < 0) throw value_error("causal_conv1d_backward: l2_group must be >= 0, found " + std::to_string(l2.group));
    if (l2.group > 0 && l2.channels > C)
        throw value_error("causal_conv1d_backward: l2_channels " + std::to_string(l2.channels) + " exceeds the " +
                          std::to_string(C) + " channels");
    if (l2.group > 0 && !(std::isfinite(l2.eps) && l2.eps >= 0))
        throw value_error("causal_conv1d_backward: l2_eps must be finite and >= 0, found " + std::to_string(l2.eps));
    hymix::detail::require_unit_stride(x, 1, who, "x");
    if (dx.data) {
        dx.require_shape({Tn, C}, who, "dx");
        hymix::detail::require_unit_stride(dx, 1, who, "dx");
        hymix::detail::require_no_self_overlap(dx, who, "dx");
        hymix::detail::require_no_overlap(dx, "dx", x, "x", who);
        hymix::detail::require_no_overlap(dx, "dx", w, "w", who);
        hymix::detail::require_no_overlap(dx, "dx", dout, "dout", who);
    }
    if (dw.data) {
        dw.require_shape({C, K}, who, "dw");
        hymix::detail::require_no_self_overlap(dw, who, "dw");
        hymix::detail::require_no_overlap(dw, "dw", x, "x", who);
        hymix::detail::require_no_overlap(dw, "dw", w, "w", who);
        hymix::detail::require_no_overlap(dw, "dw", dout, "dout", who);
        if (dx.data) hymix::detail::require_no_overlap(dw, "dw", tensor_view<const T, 2>(dx), "dx", who);
    }
}

}  // namespace detail

/// fp64 (or any T) reference: the formulas of the header comment as plain loops over the whole problem.
/// x [T, C], w [C, K], bias [C] or null, state0 [C, K−1] or null (zeros), dout [T, C] (any strides),
/// dstate_final [C, K−1] or null (gradient of the state the forward left behind), dx [T, C] (=, or empty),
/// dw [C, K] (+=, or empty), dbias [C] (+=, or null), dstate0 [C, K−1] (=, or null).
template <class T>
void causal_conv1d_backward_ref(tensor_view<const T, 2> x, tensor_view<const T, 2> w, const T* bias, const T* state0,
                                tensor_view<const T, 2> dout, const T* dstate_final, conv_activation act,
                                const conv_l2_groups& l2, tensor_view<T, 2> dx, tensor_view<T, 2> dw, T* dbias, T* dstate0) {
    detail::check_conv1d_backward<T>(x, w, dout, act, l2, dx, dw);
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1), S = K - 1;
    auto ext = [&](std::int64_t r, std::int64_t c) -> T {  // row r of [state0 ; x]
        if (r >= S) return x(r - S, c);
        return state0 ? state0[c * S + r] : T(0);
    };
    std::vector<T> dp(static_cast<std::size_t>(Tn * C));  // [T, C] gradient of the pre-activation
    std::vector<T> pre(static_cast<std::size_t>(C)), a(static_cast<std::size_t>(C)), da(static_cast<std::size_t>(C));
    const std::int64_t lim = l2.limit(C);
    for (std::int64_t t = 0; t < Tn; ++t) {
        for (std::int64_t c = 0; c < C; ++c) {
            T p = bias ? bias[c] : T(0);
            for (std::int64_t j = 0; j < K; ++j) p += w(c, j) * ext(t + j, c);
            pre[std::size_t(c)] = p;
            a[std::size_t(c)] = act == conv_activation::silu ? silu(p) : p;
            da[std::size_t(c)] = dout(t, c);
        }
        if (l2.group > 0)
            for (std::int64_t g0 = 0; g0 + l2.group <= lim; g0 += l2.group) {
                T ss = 0, ady = 0;
                for (std::int64_t c = g0; c < g0 + l2.group; ++c) {
                    ss += a[std::size_t(c)] * a[std::size_t(c)];
                    ady += a[std::size_t(c)] * da[std::size_t(c)];
                }
                const T n = std::sqrt(ss + T(l2.eps));
                for (std::int64_t c = g0; c < g0 + l2.group; ++c)
                    da[std::size_t(c)] = (da[std::size_t(c)] - a[std::size_t(c)] * ady / (n * n)) / n;
            }
        for (std::int64_t c = 0; c < C; ++c) {
            const T p = pre[std::size_t(c)];
            T g = da[std::size_t(c)];
            if (act == conv_activation::silu) {
                const T s = sigmoid(p);
                g *= s * (T(1) + p * (T(1) - s));
            }
            dp[std::size_t(t * C + c)] = g;
        }
    }
    for (std::int64_t c = 0; c < C; ++c) {
        if (dbias) {
            T s = 0;
            for (std::int64_t t = 0; t < Tn; ++t) s += dp[std::size_t(t * C + c)];
            dbias[c] += s;
        }
        if (dw.data)
            for (std::int64_t j = 0; j < K; ++j) {
                T s = 0;
                for (std::int64_t t = 0; t < Tn; ++t) s += dp[std::size_t(t * C + c)] * ext(t + j, c);
                dw(c, j) += s;
            }
        for (std::int64_t r = 0; r < S + Tn; ++r) {
            T g = 0;
            for (std::int64_t j = 0; j < K; ++j)
                if (r - j >= 0 && r - j < Tn) g += w(c, j) * dp[std::size_t((r - j) * C + c)];
            if (dstate_final && r >= Tn) g += dstate_final[c * S + (r - Tn)];
            if (r >= S) {
                if (dx.data) dx(r - S, c) = g;
            } else if (dstate0) {
                dstate0[c * S + r] = g;
            }
        }
    }
}

namespace detail {
template <class V>
V conv_load(const float* p) {
    if constexpr (std::is_same_v<V, float>) return *p;
    else return V::load_unaligned(p);
}
template <class V>
void conv_store(float* p, const V& v) {
    if constexpr (std::is_same_v<V, float>) *p = v;
    else v.store_unaligned(p);
}
}  // namespace detail

/// fp32 CPU kernel for the channels [c0, c1) of one problem (arguments as in causal_conv1d_backward_ref, already
/// checked with detail::check_conv1d_backward; [c0, c1) must not cut an L2 group). Writes dx and dstate0 for
/// those channels and adds their dw / dbias contributions. One pass over the tokens with xsimd over the channels:
/// p_t is recomputed, dp_t formed and dw, db and dext accumulated. Without L2 groups (and K <= 4, unit-stride dout)
/// each SIMD column of channels keeps everything in registers across the tokens; otherwise token-major rows over
/// the block with dext in a ring of K rows. Per-thread scratch only grows.
template <class Arch = xsimd::default_arch>
void causal_conv1d_backward_block(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias,
                                  const float* state0, tensor_view<const float, 2> dout, const float* dstate_final,
                                  conv_activation act, const conv_l2_groups& l2, tensor_view<float, 2> dx,
                                  tensor_view<float, 2> dw, float* dbias, float* dstate0, std::int64_t c0, std::int64_t c1) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    const std::int64_t Tn = x.dim(0), C = x.dim(1), K = w.dim(1), S = K - 1, nb = c1 - c0;
    if (c0 < 0 || c1 > C || c0 > c1)
        throw shape_error("causal_conv1d_backward_block: channel range [" + std::to_string(c0) + ", " + std::to_string(c1) +
                          ") outside [0, " + std::to_string(C) + ")");
    const std::int64_t lim = l2.group > 0 ? l2.limit(C) : 0;
    if (l2.group > 0) {
        const bool start_ok = c0 >= lim || c0 % l2.group == 0;
        const std::int64_t gl = c1 > 0 ? (c1 - 1) / l2.group * l2.group : 0;  // start of the group holding c1 − 1
        const bool end_ok = c1 == c0 || gl + l2.group > lim || c1 == gl + l2.group;
        if (!start_ok || !end_ok)
            throw value_error("causal_conv1d_backward_block: channel range [" + std::to_string(c0) + ", " + std::to_string(c1) +
                              ") cuts an L2 group of " + std::to_string(l2.group));
    }
    if (nb == 0) return;
    // scratch: wt [K, nb] tap-major weights, s0 [S, nb] state rows, ring [K, nb] dext rows, gw [K, nb], gb [nb],
    // pre [nb], gr [nb] (the upstream gradient row, then da), ds_rows, dsf_rows [S, nb]
    thread_local std::vector<float> buf;
    const std::size_t need = static_cast<std::size_t>((4 * K + 2 * S + 2) * nb);
    if (buf.size() < need) buf.resize(need);
    float* wt = buf.data();
    float* s0 = wt + K * nb;
    float* ring = s0 + S * nb;
    float* gw = ring + K * nb;
    float* gb = gw + K * nb;
    float* pre = gb + nb;
    float* gr = pre + nb;
    float* ds_rows = gr + nb;  // [S, nb] dstate0 rows (fast path), transposed into dstate0 at the end
    float* dsf_rows = ds_rows + S * nb;  // [S, nb] dstate_final rows (fast path)
    for (std::int64_t i = 0; i < nb; ++i)
        for (std::int64_t j = 0; j < K; ++j) wt[j * nb + i] = w(c0 + i, j);
    for (std::int64_t i = 0; i < nb; ++i)
        for (std::int64_t j = 0; j < S; ++j) s0[j * nb + i] = state0 ? state0[(c0 + i) * S + j] : 0.f;
    std::fill_n(ring, K * nb, 0.f);
    std::fill_n(gw, K * nb, 0.f);
    std::fill_n(gb, nb, 0.f);
    const float* ext[16];
    std::vector<const float*> ext_big;
    const float** er = ext;
    if (K > 16) {
        ext_big.resize(static_cast<std::size_t>(K));
        er = ext_big.data();
    }
    auto ext_row = [&](std::int64_t r) -> const float* { return r < S ? s0 + r * nb : &x(r - S, c0); };
    auto emit = [&](std::int64_t r, const float* d) {  // dext row r (over the block) is final
        if (r >= S) {
            if (dx.data) std::copy_n(d, nb, &dx(r - S, c0));
        } else if (dstate0) {
            for (std::int64_t i = 0; i < nb; ++i) dstate0[(c0 + i) * S + r] = d[i];
        }
    };
    const bool silu_act = act == conv_activation::silu;
    const bool use_l2 = l2.group > 0 && c0 < lim;
    const bool dout_unit = dout.strides[1] == 1 || C == 1;

    // pre-activation of lanes [i, i + width) of token t (er[] holds the K input rows)
    auto preact = [&]<class B>(std::int64_t i) {
        B p = bias ? detail::conv_load<B>(bias + c0 + i) : B(0.f);
        for (std::int64_t j = 0; j < K; ++j) p = xsimd::fma(detail::conv_load<B>(wt + j * nb + i), detail::conv_load<B>(er[j] + i), p);
        return p;
    };
    // dp from p and da, then the accumulations into gb, gw and the dext ring
    auto accumulate = [&]<class B>(std::int64_t t, std::int64_t i, B p, B g) {
        if (silu_act) {
            const B s = B(1.f) / (B(1.f) + xsimd::exp(-p));
            g = g * s * xsimd::fma(p, B(1.f) - s, B(1.f));
        }
        detail::conv_store(gb + i, detail::conv_load<B>(gb + i) + g);
        for (std::int64_t j = 0; j < K; ++j) {
            float* gwj = gw + j * nb + i;
            detail::conv_store(gwj, xsimd::fma(g, detail::conv_load<B>(er[j] + i), detail::conv_load<B>(gwj)));
            float* rr = ring + ((t + j) % K) * nb + i;
            detail::conv_store(rr, xsimd::fma(g, detail::conv_load<B>(wt + j * nb + i), detail::conv_load<B>(rr)));
        }
    };

    // General path (L2 groups, any dout strides, any K): token-major rows over the block, dext in a ring of K rows
    // (row r is complete once dp_r is known, and is then written to dx or dstate0).
    auto general_path = [&] {
        for (std::int64_t t = 0; t < Tn; ++t) {
            for (std::int64_t j = 0; j < K; ++j) er[j] = ext_row(t + j);
            const float* go = &dout(t, c0);
            if (!dout_unit) {
                for (std::int64_t i = 0; i < nb; ++i) gr[i] = dout(t, c0 + i);
                go = gr;
            }
            if (!use_l2) {  // fused single pass
                std::int64_t i = 0;
                for (; i + W <= nb; i += W)
                    accumulate.template operator()<V>(t, i, preact.template operator()<V>(i), V::load_unaligned(go + i));
                for (; i < nb; ++i) accumulate.template operator()<float>(t, i, preact.template operator()<float>(i), go[i]);
            } else {
                std::int64_t i = 0;
                for (; i + W <= nb; i += W) preact.template operator()<V>(i).store_unaligned(pre + i);
                for (; i < nb; ++i) pre[i] = preact.template operator()<float>(i);
                if (go != gr) std::copy_n(go, nb, gr);
                // L2 backward per group on the activations a = act(p): da = (g − a (a·g) / n²) / n
                for (std::int64_t g0 = c0; g0 + l2.group <= std::min(c1, lim); g0 += l2.group) {
                    const float* pg = pre + (g0 - c0);
                    float* gg = gr + (g0 - c0);
                    auto act_of = [&](float p) { return silu_act ? p / (1.f + std::exp(-p)) : p; };
                    float ss = 0.f, ag = 0.f;
                    for (std::int64_t a = 0; a < l2.group; ++a) {
                        const float av = act_of(pg[a]);
                        ss += av * av;
                        ag += av * gg[a];
                    }
                    const float inv = 1.f / std::sqrt(ss + static_cast<float>(l2.eps));
                    const float k = ag * inv * inv;
                    for (std::int64_t a = 0; a < l2.group; ++a) gg[a] = (gg[a] - act_of(pg[a]) * k) * inv;
                }
                i = 0;
                for (; i + W <= nb; i += W) accumulate.template operator()<V>(t, i, V::load_unaligned(pre + i), V::load_unaligned(gr + i));
                for (; i < nb; ++i) accumulate.template operator()<float>(t, i, pre[i], gr[i]);
            }
            float* done = ring + (t % K) * nb;  // ext row t has all its contributions
            emit(t, done);
            std::fill_n(done, nb, 0.f);
        }
        // rows T … T+S−1 are the final state: add its upstream gradient, then they are complete too
        for (std::int64_t k = 0; k < S; ++k) {
            float* row = ring + ((Tn + k) % K) * nb;
            if (dstate_final)
                for (std::int64_t i = 0; i < nb; ++i) row[i] += dstate_final[(c0 + i) * S + k];
            emit(Tn + k, row);
        }
    };
    // Fast path (no L2 groups, unit-stride dout, K <= 4): one SIMD column of channels at a time runs through all
    // tokens with the weights, the K-row input window, the pending dext rows and the dw / db sums in registers.
    auto columns = [&]<class B, int KK>(std::int64_t i) {
        constexpr int SS = KK - 1;
        B wv[KK], e[KK], d[KK], gwv[KK];
        for (int j = 0; j < KK; ++j) {
            wv[j] = detail::conv_load<B>(wt + j * nb + i);
            gwv[j] = B(0.f);
            d[j] = B(0.f);
        }
        for (int j = 0; j < SS; ++j) e[j] = detail::conv_load<B>(s0 + j * nb + i);
        const B bv = bias ? detail::conv_load<B>(bias + c0 + i) : B(0.f);
        B gbv(0.f);
        auto emit_lanes = [&](std::int64_t r, const B& v) {
            if (r >= S) {
                if (dx.data) detail::conv_store(&dx(r - S, c0 + i), v);
            } else {
                detail::conv_store(ds_rows + r * nb + i, v);
            }
        };
        for (std::int64_t t = 0; t < Tn; ++t) {
            e[SS] = detail::conv_load<B>(&x(t, c0 + i));
            B p = bv;
            for (int j = 0; j < KK; ++j) p = xsimd::fma(wv[j], e[j], p);
            B g = detail::conv_load<B>(&dout(t, c0 + i));
            if (silu_act) {
                const B sg = B(1.f) / (B(1.f) + xsimd::exp(-p));
                g = g * sg * xsimd::fma(p, B(1.f) - sg, B(1.f));
            }
            gbv = gbv + g;
            for (int j = 0; j < KK; ++j) {
                gwv[j] = xsimd::fma(g, e[j], gwv[j]);
                d[j] = xsimd::fma(wv[j], g, d[j]);  // d[j]: pending dext row t + j
            }
            emit_lanes(t, d[0]);
            for (int j = 0; j < SS; ++j) {
                d[j] = d[j + 1];
                e[j] = e[j + 1];
            }
            d[SS] = B(0.f);
        }
        for (int k = 0; k < SS; ++k) emit_lanes(Tn + k, dstate_final ? d[k] + detail::conv_load<B>(dsf_rows + k * nb + i) : d[k]);
        for (int j = 0; j < KK; ++j) detail::conv_store(gw + j * nb + i, gwv[j]);
        detail::conv_store(gb + i, gbv);
    };
    auto run_columns = [&]<int KK>() {
        if (dstate_final)
            for (std::int64_t i = 0; i < nb; ++i)
                for (std::int64_t k = 0; k < S; ++k) dsf_rows[k * nb + i] = dstate_final[(c0 + i) * S + k];
        std::int64_t i = 0;
        for (; i + W <= nb; i += W) columns.template operator()<V, KK>(i);
        for (; i < nb; ++i) columns.template operator()<float, KK>(i);
        if (dstate0)
            for (std::int64_t ii = 0; ii < nb; ++ii)
                for (std::int64_t r = 0; r < S; ++r) dstate0[(c0 + ii) * S + r] = ds_rows[r * nb + ii];
    };
    const bool fast = !use_l2 && (dout.strides[1] == 1 || nb == 1) && K <= 4;
    if (fast) {
        switch (K) {
            case 1: run_columns.template operator()<1>(); break;
            case 2: run_columns.template operator()<2>(); break;
            case 3: run_columns.template operator()<3>(); break;
            default: run_columns.template operator()<4>(); break;
        }
    } else {
        general_path();
    }
    if (dw.data)
        for (std::int64_t i = 0; i < nb; ++i)
            for (std::int64_t j = 0; j < K; ++j) dw(c0 + i, j) += gw[j * nb + i];
    if (dbias)
        for (std::int64_t i = 0; i < nb; ++i) dbias[c0 + i] += gb[i];
}

/// fp32 CPU kernel for a whole problem on the calling thread (checks the arguments first).
template <class Arch = xsimd::default_arch>
void causal_conv1d_backward(tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* bias, const float* state0,
                            tensor_view<const float, 2> dout, const float* dstate_final, conv_activation act,
                            const conv_l2_groups& l2, tensor_view<float, 2> dx, tensor_view<float, 2> dw, float* dbias,
                            float* dstate0) {
    detail::check_conv1d_backward<float>(x, w, dout, act, l2, dx, dw);
    causal_conv1d_backward_block<Arch>(x, w, bias, state0, dout, dstate_final, act, l2, dx, dw, dbias, dstate0, 0, x.dim(1));
}

}  // namespace hymix::kernels
