// Backward of the gated delta rule (spec.md §4.1, §4.3; issue 8): gradients of o = GDN(q, k, v, g, β, S₀) w.r.t. q, k,
// v, the log-decay g, β and the initial state S₀, as a plain fp64 BPTT through the token recurrence (the reference twin)
// and as a chunked fp32 kernel through the WY/UT form (the structure of fla's chunk_gated_delta_rule backward).
//
// Maths. Per value head, token t, state S [d_k, d_v] (hymix form, decay before the delta update):
//   S̃_t = e^{g_t} S_{t−1},  u_t = β_t (v_t − S̃_tᵀ k_t),  S_t = S̃_t + k_t u_tᵀ,  o_t = scale · S_tᵀ q_t.
// Reverse mode with dS the gradient of S_t (from the future) plus scale·q_t do_tᵀ:
//   dq_t = scale·S_t do_t;  du = dSᵀ k_t;  dk_t = dS u_t − S̃_t (β_t du);  dv_t = β_t du;  dβ_t = du·(v_t − S̃_tᵀ k_t);
//   dS̃ = dS − k_t (β_t du)ᵀ;  dg_t = ⟨S̃_t, dS̃⟩;  dS_{t−1} = e^{g_t} dS̃;  dS₀ is what is left after the first token.
// Chunked (chunk of n rows, S the state entering it, γ the in-chunk cumsum of g, Γ_ij = e^{γ_i − γ_j} for j ≤ i):
//   R = diag(β)(V − (K ⊙ e^γ) S),  U = (I + A)⁻¹ R  (U = the per-token u; A = strict_lower(diag(β) K Kᵀ ⊙ Γ)),
//   O = scale·(Q ⊙ e^γ) S + P U  with P = scale·tril(Q Kᵀ) ⊙ Γ,   S' = e^{γ_last} S + (K ⊙ Γ_last,·)ᵀ U.
// Given dO and dS' (the gradient of the state leaving the chunk):
//   dU = Pᵀ dO + (K ⊙ Γ_last,·) dS';   dR = (I + A)⁻ᵀ dU;   dA = −strict_lower(dR Uᵀ)   (from U = T R, T = (I + A)⁻¹);
//   dQ = scale·e^γ ⊙ (dO Sᵀ) + (dP ⊙ scale·Γ) K,  dP = tril(dO Uᵀ);
//   dK = (dP ⊙ scale·Γ)ᵀ Q + Γ_last,· ⊙ (U dS'ᵀ) − β e^γ ⊙ (dR Sᵀ) + (M + Mᵀ) K,  M = dA ⊙ β_i Γ;
//   dV = diag(β) dR;  dβ_i = dR_i·v_i − e^{γ_i} k_i·(S dR_i) + Σ_j dA_ij (K Kᵀ ⊙ Γ)_ij;
//   dS = e^{γ_last} dS' + (scale·Q ⊙ e^γ)ᵀ dO − (K ⊙ β e^γ)ᵀ dR;
//   dγ_i collects every e^{γ_i} and Γ_i· / Γ_·i factor (the log-derivative of each masked factor is its product with its
//   own gradient), and dg_m = Σ_{i ≥ m in the chunk} dγ_i.
// The forward sweep recomputes the states entering each chunk and keeps, per chunk, S, U and K Kᵀ ⊙ Γ (per (sequence,
// head) task: O(n_chunks·d_k·d_v + T·(C + d_v)) floats, never O(T·d_k·d_v)); the backward sweep carries dS across chunks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/chunk_layout.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/kernels/view_checks.hpp"

namespace hymix::kernels {

namespace detail {

/// Argument checks of the two backward entry points. Inputs as the forward (shape_error / config_error naming the
/// tensor, g ≤ 0 on valid rows: value_error); state0 and every gradient output may be null (data == nullptr: zeros /
/// not needed), else their shapes must match; state0 and dstate0 must agree on the slot count, which bounds the slots
/// of the batch. Views mapped as matrices need a unit inner stride; state matrices must be dense.
template <class T>
void check_gated_delta_backward_args(const seq_batch& batch, tensor_view<const T, 3> q, tensor_view<const T, 3> k,
                                     tensor_view<const T, 3> v, tensor_view<const T, 2> g, tensor_view<const T, 2> beta,
                                     tensor_view<const T, 4> state0, tensor_view<const T, 3> d_o, tensor_view<T, 3> dq,
                                     tensor_view<T, 3> dk, tensor_view<T, 3> dv, tensor_view<T, 2> dg, tensor_view<T, 2> dbeta,
                                     tensor_view<T, 4> dstate0, std::string_view w) {
    const std::int64_t n = batch.n_rows, Hk = q.dim(1), dkk = q.dim(2), Hv = v.dim(1), dvv = v.dim(2);
    q.require_shape({n, -1, -1}, w, "q [n_rows, H_k, d_k]");
    k.require_shape({n, Hk, dkk}, w, "k [n_rows, H_k, d_k]");
    v.require_shape({n, -1, -1}, w, "v [n_rows, H_v, d_v]");
    g.require_shape({n, Hv}, w, "g [n_rows, H_v]");
    beta.require_shape({n, Hv}, w, "beta [n_rows, H_v]");
    d_o.require_shape({n, Hv, dvv}, w, "d_o [n_rows, H_v, d_v]");
    if (Hk <= 0 || Hv % Hk != 0)
        throw config_error(std::string(w) + ": value heads (" + std::to_string(Hv) + ") must be a positive multiple of key heads (" +
                           std::to_string(Hk) + ")");
    require_unit_inner_stride(q, w, "q [n_rows, H_k, d_k]");
    require_unit_inner_stride(k, w, "k [n_rows, H_k, d_k]");
    require_unit_inner_stride(v, w, "v [n_rows, H_v, d_v]");
    require_unit_inner_stride(d_o, w, "d_o [n_rows, H_v, d_v]");
    if (dq.data) {
        dq.require_shape({n, Hk, dkk}, w, "dq [n_rows, H_k, d_k]");
        require_unit_inner_stride(dq, w, "dq [n_rows, H_k, d_k]");
    }
    if (dk.data) {
        dk.require_shape({n, Hk, dkk}, w, "dk [n_rows, H_k, d_k]");
        require_unit_inner_stride(dk, w, "dk [n_rows, H_k, d_k]");
    }
    if (dv.data) {
        dv.require_shape({n, Hv, dvv}, w, "dv [n_rows, H_v, d_v]");
        require_unit_inner_stride(dv, w, "dv [n_rows, H_v, d_v]");
    }
    if (dg.data) dg.require_shape({n, Hv}, w, "dg [n_rows, H_v]");
    if (dbeta.data) dbeta.require_shape({n, Hv}, w, "dbeta [n_rows, H_v]");
    std::int64_t slots = -1;
    if (state0.data) {
        state0.require_shape({-1, Hv, dkk, dvv}, w, "state0 [S, H_v, d_k, d_v]");
        require_dense_matrices(state0, w, "state0 [S, H_v, d_k, d_v]");
        slots = state0.dim(0);
    }
    if (dstate0.data) {
        dstate0.require_shape({slots, Hv, dkk, dvv}, w, "dstate0 [S, H_v, d_k, d_v] (S as state0)");
        require_dense_matrices(dstate0, w, "dstate0 [S, H_v, d_k, d_v]");
        slots = dstate0.dim(0);
    }
    batch.validate(slots);
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0) check_log_decay_rows(g, batch.starts[s], batch.lengths[s], w);
}

/// Zeroes rows of a [n_rows, H, ·] or [n_rows, H] gradient that belong to no valid sequence (null views: nothing).
template <class V>
void zero_uncovered_grad_rows(const seq_batch& batch, const V& x) {
    if (!x.data) return;
    std::vector<char> covered(static_cast<std::size_t>(batch.n_rows), 0);
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0) std::fill_n(covered.begin() + batch.starts[s], batch.lengths[s], char(1));
    using T = typename V::value_type;
    for (std::int64_t r = 0; r < batch.n_rows; ++r) {
        if (covered[static_cast<std::size_t>(r)]) continue;
        for (std::int64_t h = 0; h < x.dim(1); ++h) {
            if constexpr (V::rank == 2) {
                x(r, h) = T(0);
            } else {
                for (std::int64_t i = 0; i < x.dim(2); ++i) x(r, h, i) = T(0);
            }
        }
    }
}

/// Every entry of a rank-4 view set to zero (null: nothing).
template <class T>
void zero_all(tensor_view<T, 4> x) {
    if (!x.data) return;
    for (std::int64_t a = 0; a < x.dim(0); ++a)
        for (std::int64_t b = 0; b < x.dim(1); ++b)
            for (std::int64_t c = 0; c < x.dim(2); ++c)
                for (std::int64_t d = 0; d < x.dim(3); ++d) x(a, b, c, d) = T(0);
}

}  // namespace detail

/// Reference backward (the twin): BPTT through the token-by-token recurrence of gated_delta_rule_ref, in the precision of
/// T (use double), with obvious loops. It keeps every state of a (sequence, head) — O(T·d_k·d_v), fine for a reference.
/// For each valid sequence of `batch` (slot s ≥ 0) the forward starts from state0[s] (zeros when state0 is null). Given
/// d_o = dL/do, writes (=) dq, dk ([n_rows, H_k, d_k], summed over the value heads of each key head), dv, dg, dbeta and
/// dstate0 ([S, H_v, d_k, d_v]; slots no sequence uses get 0); rows outside valid sequences get 0. Any output may be null.
/// Throws shape_error / config_error / value_error like gated_delta_rule_ref.
template <class T>
void gated_delta_backward_ref(const seq_batch& batch,
                              tensor_view<const T, 3> q,       // [n_rows, H_k, d_k]
                              tensor_view<const T, 3> k,       // [n_rows, H_k, d_k]
                              tensor_view<const T, 3> v,       // [n_rows, H_v, d_v]
                              tensor_view<const T, 2> g,       // [n_rows, H_v] log-decay ≤ 0
                              tensor_view<const T, 2> beta,    // [n_rows, H_v]
                              T scale,
                              tensor_view<const T, 4> state0,  // [S, H_v, d_k, d_v] or null (zeros)
                              tensor_view<const T, 3> d_o,     // [n_rows, H_v, d_v]
                              tensor_view<T, 3> dq,            // [n_rows, H_k, d_k] or null
                              tensor_view<T, 3> dk,            // [n_rows, H_k, d_k] or null
                              tensor_view<T, 3> dv,            // [n_rows, H_v, d_v] or null
                              tensor_view<T, 2> dg,            // [n_rows, H_v] or null
                              tensor_view<T, 2> dbeta,         // [n_rows, H_v] or null
                              tensor_view<T, 4> dstate0) {     // [S, H_v, d_k, d_v] or null
    detail::check_gated_delta_backward_args<T>(batch, q, k, v, g, beta, state0, d_o, dq, dk, dv, dg, dbeta, dstate0,
                                               "gated_delta_backward_ref");
    const std::int64_t Hk = q.dim(1), Dk = q.dim(2), Hv = v.dim(1), Dv = v.dim(2), r = Hv / Hk;
    // Every output starts at zero: dq and dk accumulate over the value heads of a key head.
    for (std::int64_t t = 0; t < batch.n_rows; ++t) {
        for (std::int64_t h = 0; h < Hk; ++h)
            for (std::int64_t a = 0; a < Dk; ++a) {
                if (dq.data) dq(t, h, a) = T(0);
                if (dk.data) dk(t, h, a) = T(0);
            }
        for (std::int64_t h = 0; h < Hv; ++h) {
            if (dg.data) dg(t, h) = T(0);
            if (dbeta.data) dbeta(t, h) = T(0);
            if (dv.data)
                for (std::int64_t b = 0; b < Dv; ++b) dv(t, h, b) = T(0);
        }
    }
    detail::zero_all(dstate0);
    const auto M = static_cast<std::size_t>(Dk * Dv);
    std::vector<T> states, dS(M), dSt(M), du(static_cast<std::size_t>(Dv)), x(du.size()), u;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const std::int64_t slot = batch.slots[s], t0 = batch.starts[s], len = batch.lengths[s];
        if (slot < 0) continue;
        for (std::int64_t j = 0; j < Hv; ++j) {
            const std::int64_t hk = j / r;
            // Forward: states[i] = S after i tokens (states[0] = S₀), u per token.
            states.assign(static_cast<std::size_t>(len + 1) * M, T(0));
            u.assign(static_cast<std::size_t>(len * Dv), T(0));
            auto St = [&](std::int64_t i, std::int64_t a, std::int64_t b) -> T& {
                return states[static_cast<std::size_t>(i) * M + static_cast<std::size_t>(a * Dv + b)];
            };
            if (state0.data)
                for (std::int64_t a = 0; a < Dk; ++a)
                    for (std::int64_t b = 0; b < Dv; ++b) St(0, a, b) = state0(slot, j, a, b);
            for (std::int64_t i = 0; i < len; ++i) {
                const std::int64_t t = t0 + i;
                const T e = std::exp(g(t, j));
                for (std::int64_t b = 0; b < Dv; ++b) {
                    T sk = 0;
                    for (std::int64_t a = 0; a < Dk; ++a) sk += e * St(i, a, b) * k(t, hk, a);
                    u[static_cast<std::size_t>(i * Dv + b)] = beta(t, j) * (v(t, j, b) - sk);
                }
                for (std::int64_t a = 0; a < Dk; ++a)
                    for (std::int64_t b = 0; b < Dv; ++b) St(i + 1, a, b) = e * St(i, a, b) + k(t, hk, a) * u[static_cast<std::size_t>(i * Dv + b)];
            }
            // Backward, last token first; dS is the gradient of S after token i.
            std::fill(dS.begin(), dS.end(), T(0));
            for (std::int64_t i = len - 1; i >= 0; --i) {
                const std::int64_t t = t0 + i;
                const T e = std::exp(g(t, j)), bt = beta(t, j);
                auto dSab = [&](std::int64_t a, std::int64_t b) -> T& { return dS[static_cast<std::size_t>(a * Dv + b)]; };
                // o_t = scale·S_tᵀ q_t.
                for (std::int64_t a = 0; a < Dk; ++a)
                    for (std::int64_t b = 0; b < Dv; ++b) dSab(a, b) += scale * q(t, hk, a) * d_o(t, j, b);
                if (dq.data)
                    for (std::int64_t a = 0; a < Dk; ++a) {
                        T acc = 0;
                        for (std::int64_t b = 0; b < Dv; ++b) acc += St(i + 1, a, b) * d_o(t, j, b);
                        dq(t, hk, a) += scale * acc;
                    }
                // S_t = S̃ + k uᵀ.
                for (std::int64_t b = 0; b < Dv; ++b) {
                    T acc = 0;
                    for (std::int64_t a = 0; a < Dk; ++a) acc += dSab(a, b) * k(t, hk, a);
                    du[static_cast<std::size_t>(b)] = acc;
                }
                // u = β (v − S̃ᵀ k), S̃ = e·S_{t−1}.
                T db = 0;
                for (std::int64_t b = 0; b < Dv; ++b) {
                    T sk = 0;
                    for (std::int64_t a = 0; a < Dk; ++a) sk += e * St(i, a, b) * k(t, hk, a);
                    x[static_cast<std::size_t>(b)] = v(t, j, b) - sk;
                    db += du[static_cast<std::size_t>(b)] * x[static_cast<std::size_t>(b)];
                }
                if (dbeta.data) dbeta(t, j) = db;
                if (dv.data)
                    for (std::int64_t b = 0; b < Dv; ++b) dv(t, j, b) = bt * du[static_cast<std::size_t>(b)];
                if (dk.data)
                    for (std::int64_t a = 0; a < Dk; ++a) {
                        T acc = 0;
                        for (std::int64_t b = 0; b < Dv; ++b)
                            acc += dSab(a, b) * u[static_cast<std::size_t>(i * Dv + b)] - e * St(i, a, b) * bt * du[static_cast<std::size_t>(b)];
                        dk(t, hk, a) += acc;
                    }
                // dS̃ = dS − k (β du)ᵀ; dg = ⟨S̃, dS̃⟩; dS_{t−1} = e·dS̃.
                T dgt = 0;
                for (std::int64_t a = 0; a < Dk; ++a)
                    for (std::int64_t b = 0; b < Dv; ++b) {
                        const T d = dSab(a, b) - k(t, hk, a) * bt * du[static_cast<std::size_t>(b)];
                        dgt += e * St(i, a, b) * d;
                        dSab(a, b) = e * d;
                    }
                if (dg.data) dg(t, j) = dgt;
            }
            if (dstate0.data)
                for (std::int64_t a = 0; a < Dk; ++a)
                    for (std::int64_t b = 0; b < Dv; ++b) dstate0(slot, j, a, b) = dS[static_cast<std::size_t>(a * Dv + b)];
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The chunked fp32 backward.
// ---------------------------------------------------------------------------------------------------------------

namespace detail {

using aligned_floats = std::vector<float, Eigen::aligned_allocator<float>>;

/// Scratch of one task of the chunked backward (one (sequence, value head) at a time), for chunks of up to C rows:
/// the per-chunk store of the forward sweep and the tiles of one backward chunk (the products' order of terms depends
/// on their sizes only, and the Eigen expressions left are element-wise, so no result depends on where the scratch
/// lies); kept per thread and reused across calls, so repeated calls neither allocate nor touch fresh pages.
struct gdn_bwd_scratch {
    std::int64_t C, dk, dv;
    Eigen::VectorXf s_store, u_store, kg_store, gm_store;  // per chunk: S entering [d_k, d_v], U [C, d_v], K Kᵀ ⊙ Γ strictly
                                                           // lower [C, C], Γ [C, C]
    Eigen::VectorXf eg_store, bet_store;                   // per chunk: e^γ, β [C]
    std::vector<float> gamma, eg, bet, dgam;     // [C]; dgam ends as dg of the chunk's rows
    std::vector<float> dbet, col;                // [C] dβ of the chunk's rows; pair-term column suffix sums
    row_matrix gm, kk, a, p, dp, da;             // [C, C]; kk, p, dp and da are read on and below the diagonal only
    row_matrix t;                                // [C, inverse_row_length(C)] (I + A)⁻¹
    row_matrix kd, kl, qc, kc;                   // [C, d_k]; qc, kc: the chunk's Q and K rows, gathered
    row_matrix kt, ut;                           // [d_k, C], [d_v, C]: Kᵀ and Uᵀ of the chunk
    row_matrix r;                                // [C, d_v]: R in the forward sweep, dU in the backward sweep
    row_matrix st, dst;                          // [d_v, d_k]: Sᵀ and dS'ᵀ
    row_matrix y;                                // [2C, d_v]: dO rows, then dR rows
    row_matrix z, lhs;                           // [2C, d_k]: Y Sᵀ; [scale·Q ⊙ e^γ ; −K ⊙ β e^γ]
    row_matrix uds;                              // [C, d_k]: U dSᵀ
    row_matrix dqc, dkc, dvc;                    // [C, d_k], [C, d_k], [C, d_v]
    row_matrix ds, ds_prev;                      // [d_k, d_v]: dS and its update
    gdn_bwd_scratch(std::int64_t C_, std::int64_t dk_, std::int64_t dv_)
        : C(C_), dk(dk_), dv(dv_), gamma(static_cast<std::size_t>(C_)), eg(gamma.size()), bet(gamma.size()), dgam(gamma.size()),
          dbet(gamma.size()), col(gamma.size()), gm(C_, C_), kk(C_, C_), a(C_, C_), p(C_, C_), dp(C_, C_), da(C_, C_),
          t(C_, inverse_row_length(C_)), kd(C_, dk_), kl(C_, dk_), qc(C_, dk_), kc(C_, dk_), kt(dk_, C_), ut(dv_, C_), r(C_, dv_), st(dv_, dk_),
          dst(dv_, dk_), y(2 * C_, dv_), z(2 * C_, dk_), lhs(2 * C_, dk_), uds(C_, dk_), dqc(C_, dk_), dkc(C_, dk_), dvc(C_, dv_),
          ds(dk_, dv_), ds_prev(dk_, dv_) {}
    /// Room for the per-chunk store of a sequence of nc chunks (grows only; contents are not initialised).
    void reserve_chunks(std::int64_t nc) {
        const auto grow = [&](Eigen::VectorXf& x, std::int64_t per) {
            if (x.size() < nc * per) x.resize(nc * per);
        };
        grow(s_store, dk * dv);
        grow(u_store, C * dv);
        grow(kg_store, C * C);
        grow(gm_store, C * C);
        grow(eg_store, C);
        grow(bet_store, C);
    }
    Eigen::Map<row_matrix> S_of(std::int64_t i) { return Eigen::Map<row_matrix>(s_store.data() + i * dk * dv, dk, dv); }
    row_map U_of(std::int64_t i, std::int64_t n) { return row_map(u_store.data() + i * C * dv, n, dv, Eigen::OuterStride<>(dv)); }
    row_map KG_of(std::int64_t i, std::int64_t n) { return row_map(kg_store.data() + i * C * C, n, n, Eigen::OuterStride<>(C)); }
    row_map GM_of(std::int64_t i, std::int64_t n) { return row_map(gm_store.data() + i * C * C, n, n, Eigen::OuterStride<>(C)); }
    /// e^γ and β of chunk i, saved by the forward sweep, back into eg and bet.
    void load_decays(std::int64_t i, std::int64_t n) {
        std::copy_n(eg_store.data() + i * C, n, eg.begin());
        std::copy_n(bet_store.data() + i * C, n, bet.begin());
    }
};

/// This thread's backward scratch for chunks of up to C rows and heads d_k × d_v (rebuilt when the head sizes change or
/// longer chunks come).
inline gdn_bwd_scratch& gdn_bwd_workspace(std::int64_t C, std::int64_t dk, std::int64_t dv) {
    thread_local std::optional<gdn_bwd_scratch> w;
    if (!w || w->C < C || w->dk != dk || w->dv != dv) w.emplace(C, dk, dv);
    return *w;
}

/// Σ_i a_i b_i in a fixed order (four SIMD registers of partial sums over the full vectors from index 0, a scalar tail,
/// then a fixed reduction), whatever the alignment of a and b: Eigen's own reductions peel to alignment, so their
/// rounding would follow the addresses of the inputs.
inline float dot_fixed(const float* a, const float* b, std::int64_t n) {
    using B = xsimd::batch<float>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    B s0(0.f), s1(0.f), s2(0.f), s3(0.f);
    std::int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        s0 = xsimd::fma(B::load_unaligned(a + i), B::load_unaligned(b + i), s0);
        s1 = xsimd::fma(B::load_unaligned(a + i + W), B::load_unaligned(b + i + W), s1);
        s2 = xsimd::fma(B::load_unaligned(a + i + 2 * W), B::load_unaligned(b + i + 2 * W), s2);
        s3 = xsimd::fma(B::load_unaligned(a + i + 3 * W), B::load_unaligned(b + i + 3 * W), s3);
    }
    for (; i + W <= n; i += W) s0 = xsimd::fma(B::load_unaligned(a + i), B::load_unaligned(b + i), s0);
    float tail = 0.f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return xsimd::hadd((s0 + s1) + (s2 + s3)) + tail;
}

/// Σ_i a_i in a fixed order (as dot_fixed).
inline float sum_fixed(const float* a, std::int64_t n) {
    using B = xsimd::batch<float>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    B s0(0.f), s1(0.f);
    std::int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        s0 += B::load_unaligned(a + i);
        s1 += B::load_unaligned(a + i + W);
    }
    for (; i + W <= n; i += W) s0 += B::load_unaligned(a + i);
    float tail = 0.f;
    for (; i < n; ++i) tail += a[i];
    return xsimd::hadd(s0 + s1) + tail;
}

/// The per-chunk quantities of the forward sweep from g and β: γ, e^γ (flushed) and β (kept for the backward sweep, as
/// is the mask Γ).
inline void gdn_bwd_decays(tensor_view<const float, 2> g, tensor_view<const float, 2> beta, std::int64_t t, std::int64_t hv,
                           std::int64_t n, gdn_bwd_scratch& w) {
    gdn_cumsum_tile(g, t, hv, n, w.gamma.data());
    for (std::int64_t i = 0; i < n; ++i) {
        w.eg[static_cast<std::size_t>(i)] = decay_factor(w.gamma[static_cast<std::size_t>(i)]);
        w.bet[static_cast<std::size_t>(i)] = beta(t + i, hv);
    }
}

/// Forward sweep, one chunk (rows [t, t + n) of value head hv) of a sequence of nc chunks: from the state S entering it
/// (slot i of the store), stores e^γ, β, Γ, KG = strict_lower(K Kᵀ ⊙ Γ) and U = (I + A)⁻¹ R, R = diag(β)(V − (K ⊙ e^γ) S),
/// in slot i, and the state leaving it in slot i + 1 (when there is a next chunk). Every product is a register-tile
/// product (tile_product.hpp), U through T = (I + A)⁻¹ as in the forward kernel.
template <class Arch>
void gdn_bwd_forward_chunk(tensor_view<const float, 2> g, std::int64_t t, std::int64_t hv, const_row_map K_in, const_row_map V,
                           std::int64_t i, std::int64_t nc, std::int64_t n, gdn_bwd_scratch& w) {
    const std::int64_t dk = w.dk, dv = w.dv;
    // The chunk's keys gathered into contiguous rows: rows of one head in a [n_rows, H, d] tensor lie H·d floats apart,
    // a power-of-two stride whose rows fall into the same cache sets.
    w.kc.topRows(n) = K_in;
    const const_row_map K(w.kc.data(), n, dk, Eigen::OuterStride<>(dk));
    gdn_decay_mask_tile(g, t, hv, n, w.gm);
    w.GM_of(i, n) = w.gm.topLeftCorner(n, n);
    std::copy_n(w.eg.begin(), n, w.eg_store.data() + i * w.C);
    std::copy_n(w.bet.begin(), n, w.bet_store.data() + i * w.C);
    const Eigen::Map<row_matrix> S = w.S_of(i);
    row_map KG = w.KG_of(i, n), U = w.U_of(i, n);
    row_map A(w.a.data(), n, n, Eigen::OuterStride<>(w.a.cols()));
    transpose_rows(w.kc.data(), dk, n, dk, w.kt.data(), w.kt.cols());
    tile_product_lower_part<Arch>(w.kc.data(), dk, 1, w.kt.data(), w.kt.cols(), w.kk.data(), w.kk.cols(), n, w.kt.rows());
    for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t c = 0; c < r; ++c) {
            KG(r, c) = w.kk(r, c) * w.gm(r, c);
            A(r, c) = w.bet[static_cast<std::size_t>(r)] * KG(r, c);
        }
        for (std::int64_t c = r; c < n; ++c) KG(r, c) = 0.f;
        w.kd.row(r) = w.eg[static_cast<std::size_t>(r)] * K.row(r);
    }
    // R = diag(β)(V − (K ⊙ e^γ) S), then U = T R.
    tile_product<Arch>(w.kd.data(), dk, 1, S.data(), dv, w.r.data(), dv, n, dv, dk, false);
    for (std::int64_t r = 0; r < n; ++r) w.r.row(r) = w.bet[static_cast<std::size_t>(r)] * (V.row(r) - w.r.row(r));
    unit_lower_inverse<Arch>(as_const(A), w.t);
    tile_product_lower<Arch>(w.t.data(), w.t.cols(), 1, w.r.data(), dv, U.data(), dv, n, dv, false);
    if (i + 1 == nc) return;  // the state after the last chunk is not needed
    // S' = e^{γ_last} S + (K ⊙ Γ_last,·)ᵀ U.
    Eigen::Map<row_matrix> Sn = w.S_of(i + 1);
    for (std::int64_t r = 0; r < n; ++r) w.kd.row(r) = w.gm(n - 1, r) * K.row(r);
    Sn = w.eg[static_cast<std::size_t>(n - 1)] * S;
    tile_product<Arch>(w.kd.data(), 1, dk, U.data(), dv, Sn.data(), dv, dk, dv, n, true);
}

/// Backward sweep, one chunk (slot i of the store; w.ds holds dS', the gradient of the state leaving the chunk, and
/// becomes the gradient of the state entering it). Writes the chunk's dV into dV, and dQ, dK (of this value head), dβ and
/// dg into w.dqc, w.dkc, w.dbet and w.dgam. The products are register-tile products (tile_product.hpp); the transposed
/// operands they need as rows (Kᵀ, Uᵀ, Sᵀ, dS'ᵀ) are copied once per chunk.
template <class Arch>
void gdn_bwd_backward_chunk(const_row_map Q_in, const_row_map K_in, const_row_map V, const_row_map dO_in, float scale,
                                   std::int64_t i, std::int64_t n, row_map dV, gdn_bwd_scratch& w) {
    const auto sz = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    w.gm.topLeftCorner(n, n) = w.GM_of(i, n);
    const Eigen::Map<row_matrix> S = w.S_of(i);
    row_map U = w.U_of(i, n), KG = w.KG_of(i, n);
    const std::int64_t last = n - 1, dk = w.dk, dv = w.dv;
    const float eg_last = w.eg[sz(last)];
    auto P = w.p.topLeftCorner(n, n), dP = w.dp.topLeftCorner(n, n), DA = w.da.topLeftCorner(n, n);
    row_map A(w.a.data(), n, n, Eigen::OuterStride<>(w.a.cols()));
    row_map Y(w.y.data(), 2 * n, w.dv, Eigen::OuterStride<>(w.dv));
    row_map Z(w.z.data(), 2 * n, dk, Eigen::OuterStride<>(dk)), L(w.lhs.data(), 2 * n, dk, Eigen::OuterStride<>(dk));
    auto dR = Y.bottomRows(n);
    // Q, K and dO gathered into contiguous rows (see gdn_bwd_forward_chunk); dO is the top half of Y.
    w.qc.topRows(n) = Q_in;
    w.kc.topRows(n) = K_in;
    Y.topRows(n) = dO_in;
    const const_row_map Q(w.qc.data(), n, dk, Eigen::OuterStride<>(dk)), K(w.kc.data(), n, dk, Eigen::OuterStride<>(dk));
    transpose_rows(w.kc.data(), dk, n, dk, w.kt.data(), w.kt.cols());
    transpose_rows(U.data(), dv, n, dv, w.ut.data(), w.ut.cols());
    transpose_rows(S.data(), dv, dk, dv, w.st.data(), dk);
    transpose_rows(w.ds.data(), dv, dk, dv, w.dst.data(), dk);
    // P = scale·tril(Q Kᵀ) ⊙ Γ; dP = tril(dO Uᵀ); A = diag(β) KG.
    tile_product_lower_part<Arch>(w.qc.data(), dk, 1, w.kt.data(), w.kt.cols(), w.kk.data(), w.kk.cols(), n, w.kt.rows());
    tile_product_lower_part<Arch>(Y.data(), dv, 1, w.ut.data(), w.ut.cols(), w.dp.data(), w.dp.cols(), n, w.ut.rows());
    for (std::int64_t r = 0; r < n; ++r) {
        for (std::int64_t c = 0; c <= r; ++c) P(r, c) = scale * w.kk(r, c) * w.gm(r, c);
        for (std::int64_t c = 0; c < r; ++c) A(r, c) = w.bet[sz(r)] * KG(r, c);
        w.kl.row(r) = w.gm(last, r) * K.row(r);
    }
    // dU = Pᵀ dO + (K ⊙ Γ_last) dS' (into w.r), then dR = (I + A)⁻ᵀ dU = Tᵀ dU (into the dR rows of Y); U dS'ᵀ for dK
    // and dγ.
    tile_product_lower_transposed<Arch>(w.p.data(), w.p.cols(), 1, Y.data(), dv, w.r.data(), dv, n, dv, false);
    tile_product<Arch>(w.kl.data(), dk, 1, w.ds.data(), dv, w.r.data(), dv, n, dv, dk, true);
    unit_lower_inverse<Arch>(as_const(A), w.t);
    tile_product_lower_transposed<Arch>(w.t.data(), w.t.cols(), 1, w.r.data(), dv, dR.data(), dv, n, dv, false);
    tile_product<Arch>(U.data(), dv, 1, w.dst.data(), dk, w.uds.data(), dk, n, dk, dv, false);
    // dA = −strict_lower(dR Uᵀ): DA holds dR Uᵀ (on and below the diagonal).
    tile_product_lower_part<Arch>(dR.data(), dv, 1, w.ut.data(), w.ut.cols(), w.da.data(), w.da.cols(), n, w.ut.rows());
    // Z = [dO; dR] Sᵀ: rows S do_i and S dR_i.
    tile_product<Arch>(Y.data(), dv, 1, w.st.data(), dk, Z.data(), dk, 2 * n, dk, dv, false);
    // Per-row scalars. dβ; the log-decay terms split as single terms y_r (factors e^{γ_r}: they reach g_m for m ≤ r) and
    // pair terms X_rc, c < r (factors Γ_rc = e^{γ_r − γ_c}: they reach g_m for c < m ≤ r), each the product of a masked
    // factor with its own gradient. Diagonal pairs (Γ_rr = 1) reach no g_m and are never formed, so dg has no
    // cancellation between large terms (a strong decay makes dg tiny while P's diagonal stays O(1)). X overwrites DA,
    // P becomes dL/d(Q Kᵀ) = dP ⊙ scale·Γ, A becomes M = dA ⊙ β_r Γ.
    for (std::int64_t r = 0; r < n; ++r) {
        const float br = w.bet[sz(r)], er = w.eg[sz(r)];
        const float kz = dot_fixed(K.row(r).data(), Z.row(n + r).data(), dk);  // k_r·(S dR_r)
        w.dbet[sz(r)] = dot_fixed(dR.row(r).data(), V.row(r).data(), w.dv) - er * kz - dot_fixed(&DA(r, 0), &KG(r, 0), r);
        w.dgam[sz(r)] = scale * er * dot_fixed(Q.row(r).data(), Z.row(r).data(), dk) - br * er * kz;
        float* __restrict x = &DA(r, 0);
        float* __restrict m = &A(r, 0);
        float* __restrict pr = &P(r, 0);
        const float* __restrict dpr = &dP(r, 0);
        const float* __restrict kgr = &KG(r, 0);
        const float* __restrict gmr = &w.gm(r, 0);
        for (std::int64_t c = 0; c < r; ++c) {  // dA = −DA
            const float dA = -x[c];
            x[c] = dpr[c] * pr[c] + dA * br * kgr[c];
            m[c] = dA * br * gmr[c];
        }
        for (std::int64_t c = 0; c <= r; ++c) pr[c] = scale * dpr[c] * gmr[c];
        std::fill(m + r, m + n, 0.f);
    }
    // The state leaving the chunk: e^{γ_last}⟨S, dS'⟩ (single) and Γ_last,c k_c·(dS' u_c) (pairs (last, c)).
    w.dgam[sz(last)] += eg_last * dot_fixed(S.data(), w.ds.data(), dk * w.dv);
    for (std::int64_t c = 0; c < last; ++c) DA(last, c) += w.gm(last, c) * dot_fixed(K.row(c).data(), w.uds.row(c).data(), dk);
    // dg_m = Σ_{r ≥ m} y_r + Σ_{c < m} F_mc with F_mc = Σ_{r ≥ m} X_rc: rows added bottom-up into column suffix sums.
    std::fill_n(w.col.begin(), n, 0.f);
    float run = 0.f;
    for (std::int64_t r = last; r >= 0; --r) {
        float* __restrict col = w.col.data();
        const float* __restrict x = &DA(r, 0);
        for (std::int64_t c = 0; c < r; ++c) col[c] += x[c];
        run += w.dgam[sz(r)];
        w.dgam[sz(r)] = run + sum_fixed(col, r);
    }
    // dQ = scale·e^γ ⊙ (S do) + Dp K;  dK = Dpᵀ Q + Γ_last ⊙ (U dS'ᵀ) − β e^γ ⊙ (S dR) + (M + Mᵀ) K.
    auto dQ = w.dqc.topRows(n), dK = w.dkc.topRows(n);
    for (std::int64_t r = 0; r < n; ++r) {
        dQ.row(r) = (scale * w.eg[sz(r)]) * Z.row(r);
        dK.row(r) = w.gm(last, r) * w.uds.row(r) - (w.bet[sz(r)] * w.eg[sz(r)]) * Z.row(n + r);
    }
    for (std::int64_t r = 0; r < n; ++r)  // A ← M + Mᵀ (M strictly lower, zero elsewhere)
        for (std::int64_t c = 0; c < r; ++c) A(c, r) = A(r, c);
    tile_product_lower<Arch>(w.p.data(), w.p.cols(), 1, w.kc.data(), dk, dQ.data(), dk, n, dk, true);
    tile_product_lower_transposed<Arch>(w.p.data(), w.p.cols(), 1, w.qc.data(), dk, dK.data(), dk, n, dk, true);
    tile_product<Arch>(w.a.data(), w.a.cols(), 1, w.kc.data(), dk, dK.data(), dk, n, dk, n, true);  // (M + Mᵀ) K, one dense product
    for (std::int64_t r = 0; r < n; ++r) dV.row(r) = w.bet[sz(r)] * dR.row(r);
    // dS = e^{γ_last} dS' + [scale·Q ⊙ e^γ ; −K ⊙ β e^γ]ᵀ [dO; dR].
    for (std::int64_t r = 0; r < n; ++r) {
        L.row(r) = (scale * w.eg[sz(r)]) * Q.row(r);
        L.row(n + r) = (-w.bet[sz(r)] * w.eg[sz(r)]) * K.row(r);
    }
    w.ds_prev = eg_last * w.ds;
    tile_product<Arch>(L.data(), 1, dk, Y.data(), dv, w.ds_prev.data(), dv, dk, dv, 2 * n, true);
    w.ds.swap(w.ds_prev);
}

}  // namespace detail

/// Chunked backward (spec.md §4.3) in fp32: the same gradients as gated_delta_backward_ref, through the WY/UT form in
/// chunks of `chunk` tokens per sequence, parallel over (sequence, value head); each task runs a forward sweep (the
/// states entering its chunks, recomputed from state0) and a backward sweep carrying dS. The result does not depend on
/// the thread count or the scheduling. dq and dk sum the value heads of a key head in a fixed order (staged through a
/// [n_rows, H_v, d_k] buffer when H_v > H_k). Throws like the reference, and config_error when chunk < 1.
template <cpu_backend_type Backend>
void gated_delta_rule_chunked_backward(const Backend& be, const seq_batch& batch,
                                       tensor_view<const float, 3> q,       // [n_rows, H_k, d_k]
                                       tensor_view<const float, 3> k,       // [n_rows, H_k, d_k]
                                       tensor_view<const float, 3> v,       // [n_rows, H_v, d_v]
                                       tensor_view<const float, 2> g,       // [n_rows, H_v] log-decay ≤ 0
                                       tensor_view<const float, 2> beta,    // [n_rows, H_v]
                                       float scale,
                                       tensor_view<const float, 4> state0,  // [S, H_v, d_k, d_v] or null (zeros)
                                       tensor_view<const float, 3> d_o,     // [n_rows, H_v, d_v]
                                       tensor_view<float, 3> dq,            // [n_rows, H_k, d_k] or null
                                       tensor_view<float, 3> dk,            // [n_rows, H_k, d_k] or null
                                       tensor_view<float, 3> dv,            // [n_rows, H_v, d_v] or null
                                       tensor_view<float, 2> dg,            // [n_rows, H_v] or null
                                       tensor_view<float, 2> dbeta,         // [n_rows, H_v] or null
                                       tensor_view<float, 4> dstate0,       // [S, H_v, d_k, d_v] or null
                                       std::int64_t chunk = 64) {
    constexpr std::string_view who = "gated_delta_rule_chunked_backward";
    detail::check_gated_delta_backward_args<float>(batch, q, k, v, g, beta, state0, d_o, dq, dk, dv, dg, dbeta, dstate0, who);
    if (chunk < 1) throw config_error(std::string(who) + ": chunk size must be >= 1, found " + std::to_string(chunk));
    const std::int64_t n = batch.n_rows, Hk = q.dim(1), Dk = q.dim(2), Hv = v.dim(1), Dv = v.dim(2), r = Hv / Hk;
    for (const auto& x : {dq, dk}) detail::zero_uncovered_grad_rows(batch, x);
    detail::zero_uncovered_grad_rows(batch, dv);
    detail::zero_uncovered_grad_rows(batch, dg);
    detail::zero_uncovered_grad_rows(batch, dbeta);
    detail::zero_all(dstate0);
    const chunk_layout chunks = gdn_chunk_layout(batch, chunk);
    using Arch = typename Backend::arch;
    // With grouped value heads, dq and dk are staged per value head and summed afterwards in head order.
    const bool staged = r > 1 && (dq.data || dk.data);
    detail::aligned_floats stage(staged ? static_cast<std::size_t>(2 * n * Hv * Dk) : 0);
    // (No offset from the empty stage's null pointer when unstaged: that is undefined behaviour even if never read.)
    const tensor_view<float, 3> dq_v(stage.data(), {n, Hv, Dk}), dk_v(staged ? stage.data() + n * Hv * Dk : nullptr, {n, Hv, Dk});
    detail::for_each_chunked_seq_head(be, chunks, Hv, [&](std::int64_t b, std::int64_t e, auto item) {
        detail::gdn_bwd_scratch& w = detail::gdn_bwd_workspace(std::max<std::int64_t>(chunks.width(), 1), Dk, Dv);
        for (std::int64_t it = b; it < e; ++it) {
            const auto [s, hv] = item(it);
            const std::int64_t hk = hv / r, slot = batch.slots[static_cast<std::size_t>(s)];
            const std::int64_t c0 = chunks.first_chunk(s), nc = chunks.first_chunk(s + 1) - c0;
            w.reserve_chunks(nc);
            // Forward sweep: the state entering every chunk, U, K Kᵀ ⊙ Γ, Γ, e^γ and β.
            if (state0.data)
                w.S_of(0) = Eigen::Map<const detail::row_matrix>(&state0(slot, hv, 0, 0), Dk, Dv);
            else
                w.S_of(0).setZero();
            for (std::int64_t ci = 0; ci < nc; ++ci) {
                const std::int64_t t = chunks.row(c0 + ci), len = chunks.length(c0 + ci);
                detail::gdn_bwd_decays(g, beta, t, hv, len, w);
                detail::gdn_bwd_forward_chunk<Arch>(g, t, hv, detail::rows_of(k, t, hk, len), detail::rows_of(v, t, hv, len), ci, nc, len, w);
            }
            // Backward sweep, last chunk first, dS' = 0 after the last token.
            w.ds.setZero();
            for (std::int64_t ci = nc - 1; ci >= 0; --ci) {
                const std::int64_t t = chunks.row(c0 + ci), len = chunks.length(c0 + ci);
                w.load_decays(ci, len);
                const detail::row_map dV = dv.data ? detail::rows_of(dv, t, hv, len)
                                                   : detail::row_map(w.dvc.data(), len, Dv, Eigen::OuterStride<>(Dv));
                detail::gdn_bwd_backward_chunk<Arch>(detail::rows_of(q, t, hk, len), detail::rows_of(k, t, hk, len),
                                               detail::rows_of(v, t, hv, len), detail::rows_of(d_o, t, hv, len), scale, ci, len, dV, w);
                for (std::int64_t j = 0; j < len; ++j) {
                    if (dbeta.data) dbeta(t + j, hv) = w.dbet[static_cast<std::size_t>(j)];
                    if (dg.data) dg(t + j, hv) = w.dgam[static_cast<std::size_t>(j)];
                }
                const auto put = [&](const tensor_view<float, 3>& dst, const detail::row_matrix& src, std::int64_t head) {
                    if (dst.data) detail::rows_of(dst, t, head, len) = src.topRows(len);
                };
                if (staged) {
                    put(dq.data ? dq_v : tensor_view<float, 3>{}, w.dqc, hv);
                    put(dk.data ? dk_v : tensor_view<float, 3>{}, w.dkc, hv);
                } else {
                    put(dq, w.dqc, hk);
                    put(dk, w.dkc, hk);
                }
            }
            if (dstate0.data) Eigen::Map<detail::row_matrix>(&dstate0(slot, hv, 0, 0), Dk, Dv) = w.ds;
        }
    });
    if (!staged) return;
    // dq, dk of key head h = Σ over its value heads h·r … h·r + r − 1, in that order.
    be.parallel_for(n, 64, [&](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t t = r0; t < r1; ++t)
            for (std::int64_t h = 0; h < Hk; ++h)
                for (const auto& [dst, src] : {std::pair{dq, dq_v}, std::pair{dk, dk_v}}) {
                    if (!dst.data) continue;
                    for (std::int64_t a = 0; a < Dk; ++a) {
                        float acc = 0.f;
                        for (std::int64_t j = h * r; j < (h + 1) * r; ++j) acc += src(t, j, a);
                        dst(t, h, a) = acc;
                    }
                }
    });
}

}  // namespace hymix::kernels
