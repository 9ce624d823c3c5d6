// The gated delta rule core of Gated DeltaNet (spec.md §4.1, §4.3; arXiv 2412.06464): the token-by-token
// recurrence in the hymix state form (state [d_k, d_v], decay before the delta update), a chunked WY/UT prefill
// (chunk 64 by default) and a one-token decode step, over batches of sequences described by a hymix::seq_batch.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

/// Log-decay of one gate value (spec.md §4.2 step 4, §8 invariant 11), in the precision of T (fp32 in the
/// fast paths): g = min(−exp(A_log) · softplus(a + dt_bias), −floor). floor = 0 (the default) is no clamp,
/// as in fla and Qwen3.5. The result is ≤ 0, so exp(g) ∈ (0, 1] (or 0 after underflow).
template <class T>
inline T gdn_log_decay(T a, T dt_bias, T a_log, T floor = T(0)) noexcept {
    const T g = -std::exp(a_log) * softplus(a + dt_bias);
    return std::min(g, -floor);
}

/// β from the raw projection b (spec.md §4.2 step 4): σ(b), or 2σ(b) when negative eigenvalues are allowed.
template <class T>
inline T gdn_beta(T b, bool allow_neg_eigval) noexcept {
    const T s = sigmoid(b);
    return allow_neg_eigval ? T(2) * s : s;
}

namespace detail {

/// Shape checks shared by the three kernels. Throws shape_error / config_error naming the tensor.
template <class TQ, class TS, class TO>
void check_gated_delta_args(const seq_batch& batch, const TQ& q, const TQ& k, const TQ& v, const auto& g,
                            const auto& beta, const TS& state, const TO& o, const char* who) {
    const std::string_view w(who);
    const std::int64_t n = batch.n_rows, Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
    q.require_shape({n, -1, -1}, w, "q [n_rows, H_k, d_k]");
    k.require_shape({n, Hk, dk}, w, "k [n_rows, H_k, d_k]");
    v.require_shape({n, -1, -1}, w, "v [n_rows, H_v, d_v]");
    g.require_shape({n, Hv}, w, "g [n_rows, H_v]");
    beta.require_shape({n, Hv}, w, "beta [n_rows, H_v]");
    o.require_shape({n, Hv, dv}, w, "o [n_rows, H_v, d_v]");
    state.require_shape({-1, Hv, dk, dv}, w, "state [S, H_v, d_k, d_v]");
    if (Hk <= 0 || Hv % Hk != 0)
        throw config_error(std::string(w) + ": value heads (" + std::to_string(Hv) + ") must be a positive multiple of key heads (" +
                           std::to_string(Hk) + ")");
    if (q.strides[2] != 1 || k.strides[2] != 1 || v.strides[2] != 1 || o.strides[2] != 1)
        throw shape_error(std::string(w) + ": q, k, v and o need unit inner stride");
    if (state.strides[3] != 1 || state.strides[2] != dv)
        throw shape_error(std::string(w) + ": each state matrix [d_k, d_v] must be contiguous, found strides " +
                          shape_string(state.strides));
    batch.validate(state.dim(0));
}

/// o rows that belong to no valid sequence (padding, slot −1) are set to zero.
template <class T>
void zero_uncovered_rows(const seq_batch& batch, tensor_view<T, 3> o) {
    std::vector<char> covered(static_cast<std::size_t>(batch.n_rows), 0);
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0)
            std::fill_n(covered.begin() + batch.starts[s], batch.lengths[s], char(1));
    for (std::int64_t r = 0; r < batch.n_rows; ++r)
        if (!covered[static_cast<std::size_t>(r)])
            for (std::int64_t h = 0; h < o.dim(1); ++h)
                for (std::int64_t i = 0; i < o.dim(2); ++i) o(r, h, i) = T(0);
}

}  // namespace detail

/// Reference recurrence (spec.md §4.1, hymix form), one token at a time with obvious loops, in the precision of T
/// (use double). For every sequence i of `batch` with slot s = batch.slots[i] ≥ 0 and each value head j (key
/// head j / (H_v/H_k)), starting from state[s, j] and for each of its tokens t:
///   S ← exp(g_t)·S;  u = β_t (v_t − Sᵀk_t);  S ← S + k_t uᵀ;  o_t = Sᵀ(scale · q_t).
/// q, k are used as given (the caller L2-normalises them). Rows outside valid sequences get o = 0.
/// Throws shape_error on inconsistent shapes, config_error when H_v is not a multiple of H_k.
template <class T>
void gated_delta_rule_ref(const seq_batch& batch,
                          tensor_view<const T, 3> q,     // [n_rows, H_k, d_k]
                          tensor_view<const T, 3> k,     // [n_rows, H_k, d_k]
                          tensor_view<const T, 3> v,     // [n_rows, H_v, d_v]
                          tensor_view<const T, 2> g,     // [n_rows, H_v] log-decay ≤ 0
                          tensor_view<const T, 2> beta,  // [n_rows, H_v]
                          T scale,
                          tensor_view<T, 4> state,  // [S, H_v, d_k, d_v] in/out
                          tensor_view<T, 3> o) {    // [n_rows, H_v, d_v]
    detail::check_gated_delta_args(batch, q, k, v, g, beta, state, o, "gated_delta_rule_ref");
    const std::int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2), r = Hv / Hk;
    detail::zero_uncovered_rows(batch, o);
    std::vector<T> u(static_cast<std::size_t>(dv));
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const std::int64_t slot = batch.slots[s];
        if (slot < 0) continue;
        for (std::int64_t j = 0; j < Hv; ++j) {
            const std::int64_t hk = j / r;
            auto S = state[slot][j];  // [d_k, d_v]
            for (std::int64_t t = batch.starts[s]; t < batch.starts[s] + batch.lengths[s]; ++t) {
                const T decay = std::exp(g(t, j));
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) S(a, b) *= decay;
                for (std::int64_t b = 0; b < dv; ++b) {
                    T sk = 0;
                    for (std::int64_t a = 0; a < dk; ++a) sk += S(a, b) * k(t, hk, a);
                    u[b] = beta(t, j) * (v(t, j, b) - sk);
                }
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) S(a, b) += k(t, hk, a) * u[b];
                for (std::int64_t b = 0; b < dv; ++b) {
                    T acc = 0;
                    for (std::int64_t a = 0; a < dk; ++a) acc += S(a, b) * (scale * q(t, hk, a));
                    o(t, j, b) = acc;
                }
            }
        }
    }
}

namespace detail {

/// Decay exponents below this give factors < 1e-26 that are flushed to exactly 0: their contribution is far below
/// fp32 resolution, and keeping them would feed subnormal numbers (very slow on x86) into the products.
inline constexpr float decay_flush_exponent = -60.f;

/// exp(x) for a decay exponent x ≤ 0, with factors below e^−60 flushed to 0.
inline float decay_factor(float x) noexcept { return x < decay_flush_exponent ? 0.f : std::exp(x); }

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using row_map = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

using const_row_map = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Scratch of one (sequence, head) task of the chunked kernel, sized for chunk length C.
struct gated_delta_scratch {
    row_matrix kq;    // [2C, d_k]: rows 0..n−1 K ⊙ e^γ, rows n..2n−1 scale · Q ⊙ e^γ (n = rows of the chunk)
    row_matrix kgs;   // [2C, d_v]: (K ⊙ e^γ) S | scale · (Q ⊙ e^γ) S
    row_matrix vn;    // [C, d_v]: right-hand side, then V_new
    row_matrix kd;    // [C, d_k]: K ⊙ exp(γ_last − γ)
    row_matrix kk;    // [C, 2C]: K Kᵀ | K Qᵀ
    row_matrix gt;    // [C, C]: gt(j, i) = Γ_ij = exp(γ_i − γ_j) for i ≥ j, else 0 (transposed decay mask)
    row_matrix at;    // [C, C]: (I + A)ᵀ, unit upper-triangular
    row_matrix pt;    // [C, C]: (scale · tril(Q Kᵀ) ⊙ Γ)ᵀ
    std::vector<float> eg, bet;  // [C] exp(γ) (γ the inclusive cumsum of g in the chunk), β
    gated_delta_scratch(std::int64_t C, std::int64_t dk, std::int64_t dv)
        : kq(2 * C, dk), kgs(2 * C, dv), vn(C, dv), kd(C, dk), kk(C, 2 * C), gt(C, C), at(C, C), pt(C, C),
          eg(static_cast<std::size_t>(C)), bet(static_cast<std::size_t>(C)) {}
};

/// One value head of one sequence through the chunked WY/UT form (spec.md §4.3), rows t0..t0+len−1 of the inputs.
/// K, Q, V are read in place (any row stride); O is written in place.
inline void gated_delta_chunked_head(gated_delta_scratch& w, tensor_view<const float, 3> q, tensor_view<const float, 3> k,
                                     tensor_view<const float, 3> v, tensor_view<const float, 2> g,
                                     tensor_view<const float, 2> beta, float scale,
                                     float* state,  // [d_k, d_v] contiguous
                                     tensor_view<float, 3> o, std::int64_t t0, std::int64_t len, std::int64_t hv,
                                     std::int64_t hk, std::int64_t C) {
    const std::int64_t dk = q.dim(2), dv = v.dim(2);
    Eigen::Map<row_matrix> S(state, dk, dv);
    for (std::int64_t c0 = 0; c0 < len; c0 += C) {
        const std::int64_t n = std::min(C, len - c0), t = t0 + c0;
        const const_row_map K(&k(t, hk, 0), n, dk, Eigen::OuterStride<>(k.strides[0]));
        const const_row_map Q(&q(t, hk, 0), n, dk, Eigen::OuterStride<>(q.strides[0]));
        const const_row_map V(&v(t, hv, 0), n, dv, Eigen::OuterStride<>(v.strides[0]));
        row_map O(&o(t, hv, 0), n, dv, Eigen::OuterStride<>(o.strides[0]));
        float run = 0.f;
        for (std::int64_t i = 0; i < n; ++i) {
            assert(!(g(t + i, hv) > 0.f) && "gated delta rule: log-decay g must be <= 0 (decay factor in (0, 1])");
            run += g(t + i, hv);
            w.eg[i] = decay_factor(run);  // run ≤ 0
            w.bet[i] = beta(t + i, hv);
        }
        // Transposed decay mask: gt(j, i) = exp(Σ_{m=j+1..i} g_m) for i ≥ j, built by index from partial sums of g
        // over the span (accurate even when γ itself is large), 0 above. Exponents are ≤ 0 wherever exp is taken.
        for (std::int64_t j = n - 1; j >= 0; --j) {
            float* row = &w.gt(j, 0);
            std::fill_n(row, j + 1, 0.f);
            if (j + 1 < n) {
                const float gj1 = g(t + j + 1, hv);
                const float* below = &w.gt(j + 1, 0);  // still holds exponents (exp is applied after the loop)
                for (std::int64_t i = j + 1; i < n; ++i) row[i] = below[i] + gj1;
            }
        }
        auto GT = w.gt.topLeftCorner(n, n);
        GT = (GT.array() < decay_flush_exponent).select(0.f, GT.array().max(decay_flush_exponent).exp()).matrix();
        // K Kᵀ and K Qᵀ: kk(j, i) = k_j·k_i, kk(j, C + i) = k_j·q_i.
        w.kk.topLeftCorner(n, n).noalias() = K * K.transpose();
        w.kk.block(0, C, n, n).noalias() = K * Q.transpose();
        // (I + A)ᵀ with A_ij = β_i (k_i·k_j) Γ_ij for i > j; Pᵀ with P_ij = scale (q_i·k_j) Γ_ij for i ≥ j.
        // Entries are set by index: zero above/below the diagonal as the mask says.
        for (std::int64_t j = 0; j < n; ++j) {
            const float* kkj = &w.kk(j, 0);
            const float* kqj = &w.kk(j, C);
            const float* gtj = &w.gt(j, 0);
            float* atj = &w.at(j, 0);
            float* ptj = &w.pt(j, 0);
            std::fill_n(atj, j, 0.f);
            std::fill_n(ptj, j, 0.f);
            atj[j] = 1.f;
            ptj[j] = scale * kqj[j];  // Γ_jj = 1
            for (std::int64_t i = j + 1; i < n; ++i) {
                atj[i] = w.bet[i] * kkj[i] * gtj[i];
                ptj[i] = scale * kqj[i] * gtj[i];
            }
        }
        // Decayed keys and scaled, decayed queries in one block; one product gives both (·)S.
        for (std::int64_t i = 0; i < n; ++i) {
            w.kq.row(i) = w.eg[i] * K.row(i);
            w.kq.row(n + i) = (scale * w.eg[i]) * Q.row(i);
        }
        w.kgs.topRows(2 * n).noalias() = w.kq.topRows(2 * n) * S;
        // V_new = (I + A)⁻¹ diag(β) (V − (K ⊙ e^γ) S)  ==  U − W S of §4.3.
        auto Vn = w.vn.topRows(n);
        for (std::int64_t i = 0; i < n; ++i) Vn.row(i) = w.bet[i] * (V.row(i) - w.kgs.row(i));
        w.at.topLeftCorner(n, n).transpose().triangularView<Eigen::UnitLower>().solveInPlace(Vn);
        // O = (Q ⊙ e^γ) S + (tril(Q Kᵀ) ⊙ Γ) V_new, written in place.
        O = w.kgs.middleRows(n, n);
        O.noalias() += w.pt.topLeftCorner(n, n).transpose() * Vn;
        // S ← exp(γ_last) S + (K ⊙ exp(γ_last − γ))ᵀ V_new; exp(γ_last − γ_j) = Γ_{last, j} = gt(j, last).
        for (std::int64_t i = 0; i < n; ++i) w.kd.row(i) = w.gt(i, n - 1) * K.row(i);
        S *= w.eg[n - 1];
        S.noalias() += w.kd.topRows(n).transpose() * Vn;
    }
}

/// Parallel loop over (sequence, value head) pairs of the valid sequences of a batch.
template <class Backend, class F>
void for_each_seq_head(const Backend& be, const seq_batch& batch, std::int64_t Hv, F&& f) {
    std::vector<std::int64_t> seqs;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0 && batch.lengths[s] > 0) seqs.push_back(s);
    const std::int64_t n = static_cast<std::int64_t>(seqs.size()) * Hv;
    be.parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) f(seqs[static_cast<std::size_t>(i / Hv)], i % Hv);
    });
}

}  // namespace detail

/// Chunked prefill (spec.md §4.3) in fp32: same maths and arguments as gated_delta_rule_ref, processed in chunks of
/// `chunk` tokens per sequence (the last chunk shorter), parallel over (sequence, value head). The state is read
/// and written in place per slot; sequences with slot −1 touch nothing and their rows of o are zero.
/// Throws shape_error / config_error like the reference, and config_error when chunk < 1.
template <cpu_backend_type Backend>
void gated_delta_rule_chunked(const Backend& be, const seq_batch& batch,
                              tensor_view<const float, 3> q,     // [n_rows, H_k, d_k]
                              tensor_view<const float, 3> k,     // [n_rows, H_k, d_k]
                              tensor_view<const float, 3> v,     // [n_rows, H_v, d_v]
                              tensor_view<const float, 2> g,     // [n_rows, H_v]
                              tensor_view<const float, 2> beta,  // [n_rows, H_v]
                              float scale,
                              tensor_view<float, 4> state,  // [S, H_v, d_k, d_v] in/out
                              tensor_view<float, 3> o,      // [n_rows, H_v, d_v]
                              std::int64_t chunk = 64) {
    detail::check_gated_delta_args(batch, q, k, v, g, beta, state, o, "gated_delta_rule_chunked");
    if (chunk < 1) throw config_error("gated_delta_rule_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
    const std::int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2), r = Hv / Hk;
    detail::zero_uncovered_rows(batch, o);
    detail::for_each_seq_head(be, batch, Hv, [&](std::int64_t s, std::int64_t j) {
        const std::int64_t C = std::min(chunk, batch.lengths[s]);
        detail::gated_delta_scratch w(C, dk, dv);
        detail::gated_delta_chunked_head(w, q, k, v, g, beta, scale, &state(batch.slots[s], j, 0, 0), o,
                                         batch.starts[s], batch.lengths[s], j, j / r, C);
    });
}

namespace detail {

/// One decode token for one value head: two passes over the state [d_k, d_v].
/// Pass 1 (read): sk = Sᵀk, sq = Sᵀq of the old state. Then with α = e^g: u = β(v − α·sk),
/// o = α·sq + u (k·q) (= Sᵀq of the updated state). Pass 2 (read + write): S ← αS + k uᵀ.
template <class Arch>
void gated_delta_step_head(float* S,  // [d_k, d_v]
                           const float* qs,  // [d_k] scaled query
                           const float* kt,  // [d_k]
                           const float* vt,  // [d_v]
                           float g, float bt, std::int64_t dk, std::int64_t dv,
                           float* sk, float* sq,  // [d_v] scratch
                           float* ot) {           // [d_v]
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    const std::int64_t dvv = dv / W * W;
    std::fill_n(sk, dv, 0.f);
    std::fill_n(sq, dv, 0.f);
    for (std::int64_t a = 0; a < dk; ++a) {
        const float* row = S + a * dv;
        const B ka(kt[a]), qa(qs[a]);
        for (std::int64_t b = 0; b < dvv; b += W) {
            const B x = B::load_unaligned(row + b);
            xsimd::fma(ka, x, B::load_unaligned(sk + b)).store_unaligned(sk + b);
            xsimd::fma(qa, x, B::load_unaligned(sq + b)).store_unaligned(sq + b);
        }
        for (std::int64_t b = dvv; b < dv; ++b) {
            sk[b] += kt[a] * row[b];
            sq[b] += qs[a] * row[b];
        }
    }
    assert(!(g > 0.f) && "gated delta rule: log-decay g must be <= 0 (decay factor in (0, 1])");
    const float alpha = decay_factor(g);
    float kq = 0.f;
    for (std::int64_t a = 0; a < dk; ++a) kq += kt[a] * qs[a];
    for (std::int64_t b = 0; b < dv; ++b) {
        const float u = bt * (vt[b] - alpha * sk[b]);
        ot[b] = alpha * sq[b] + u * kq;
        sk[b] = u;  // sk now holds u
    }
    const B al(alpha);
    for (std::int64_t a = 0; a < dk; ++a) {
        float* row = S + a * dv;
        const B ka(kt[a]);
        for (std::int64_t b = 0; b < dvv; b += W)
            xsimd::fma(ka, B::load_unaligned(sk + b), al * B::load_unaligned(row + b)).store_unaligned(row + b);
        for (std::int64_t b = dvv; b < dv; ++b) row[b] = alpha * row[b] + kt[a] * sk[b];
    }
}

}  // namespace detail

/// Recurrent decode step (spec.md §4.1, §4.4): every sequence of `batch` must hold exactly one token (else
/// shape_error, even for slot −1 entries). Same arguments and semantics as gated_delta_rule_chunked.
template <cpu_backend_type Backend>
void gated_delta_rule_step(const Backend& be, const seq_batch& batch,
                           tensor_view<const float, 3> q,     // [n_rows, H_k, d_k]
                           tensor_view<const float, 3> k,     // [n_rows, H_k, d_k]
                           tensor_view<const float, 3> v,     // [n_rows, H_v, d_v]
                           tensor_view<const float, 2> g,     // [n_rows, H_v]
                           tensor_view<const float, 2> beta,  // [n_rows, H_v]
                           float scale,
                           tensor_view<float, 4> state,  // [S, H_v, d_k, d_v] in/out
                           tensor_view<float, 3> o) {    // [n_rows, H_v, d_v]
    detail::check_gated_delta_args(batch, q, k, v, g, beta, state, o, "gated_delta_rule_step");
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.lengths[s] != 1)
            throw shape_error("gated_delta_rule_step: sequence " + std::to_string(s) + " has " +
                              std::to_string(batch.lengths[s]) + " tokens, a decode step takes exactly 1");
    const std::int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2), r = Hv / Hk;
    detail::zero_uncovered_rows(batch, o);
    detail::for_each_seq_head(be, batch, Hv, [&](std::int64_t s, std::int64_t j) {
        const std::int64_t t = batch.starts[s], hk = j / r;
        std::vector<float> scratch(static_cast<std::size_t>(2 * dv + dk));
        float* qs = scratch.data() + 2 * dv;
        for (std::int64_t a = 0; a < dk; ++a) qs[a] = scale * q(t, hk, a);
        detail::gated_delta_step_head<typename Backend::arch>(&state(batch.slots[s], j, 0, 0), qs, &k(t, hk, 0),
                                                              &v(t, j, 0), g(t, j), beta(t, j), dk, dv, scratch.data(),
                                                              scratch.data() + dv, &o(t, j, 0));
    });
}

}  // namespace hymix::kernels
