// Backward pass of causal softmax attention (spec.md §2; invariant 21 of §8): the flash-attention-2 scheme with
// recomputation. With s_ij = scale·q_i·k_j over the visible keys, P_ij = exp(s_ij − lse_i), o_i = Σ_j P_ij v_j:
//   D_i = Σ_c do_ic·o_ic = Σ_j P_ij dP_ij,  dP_ij = do_i·v_j,  dS_ij = P_ij (dP_ij − D_i)   (softmax Jacobian)
//   dv_j = Σ_i P_ij do_i,   dq_i = scale Σ_j dS_ij k_j,   dk_j = scale Σ_i dS_ij q_i
// summed over the H/H_kv query heads of each KV head for dk, dv. P is rebuilt tile by tile from q, k and the forward's
// LSE, so nothing of size [Tq, Tk] is ever stored. Rows with no visible key (LSE −∞) contribute nothing: their dq is 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/attention.hpp"

namespace hymix::kernels {

/// One sequence's attention backward problem: the forward's attention_problem (same shapes, masks and GQA mapping)
/// plus its outputs and the upstream gradient. Input gradients are overwritten; a view with data == nullptr is not
/// computed.
template <class T>
struct attention_backward_problem {
    tensor_view<const T, 3> q;     // [Tq, H, d_h]     unit stride along d_h (as every [.., d_h] view below)
    tensor_view<const T, 3> k;     // [Tk, H_kv, d_h]
    tensor_view<const T, 3> v;     // [Tk, H_kv, d_h]
    tensor_view<const T, 3> o;     // [Tq, H, d_h]     the forward's output
    tensor_view<const T, 2> lse;   // [Tq, H]          the forward's natural-log LSE of the scaled scores (−∞: no key)
    tensor_view<const T, 3> dout;  // [Tq, H, d_h]     dL/do (the upstream gradient "do")
    tensor_view<T, 3> dq;          // [Tq, H, d_h]     dL/dq, overwritten (or data == nullptr: not needed)
    tensor_view<T, 3> dk;          // [Tk, H_kv, d_h]  dL/dk summed over each KV head's query heads, overwritten (or null)
    tensor_view<T, 3> dv;          // [Tk, H_kv, d_h]  dL/dv likewise (or null)
};

namespace detail {

// Shapes, GQA divisibility, unit strides along d_h, outputs that overlap neither themselves, each other nor any input.
// Checked in every build (a few dozen comparisons per problem); values are not checked (NaN propagates).
template <class T>
void attention_backward_check(const attention_backward_problem<T>& p, const char* who) {
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
    const std::string_view w(who);
    using hymix::detail::require_no_overlap;
    using hymix::detail::require_no_self_overlap;
    using hymix::detail::require_unit_stride;
    p.k.require_shape({Tk, Hkv, dh}, w, "k");
    p.v.require_shape({Tk, Hkv, dh}, w, "v");
    p.o.require_shape({Tq, H, dh}, w, "o");
    p.lse.require_shape({Tq, H}, w, "lse");
    p.dout.require_shape({Tq, H, dh}, w, "do");
    if (p.dq.data) p.dq.require_shape({Tq, H, dh}, w, "dq");
    if (p.dk.data) p.dk.require_shape({Tk, Hkv, dh}, w, "dk");
    if (p.dv.data) p.dv.require_shape({Tk, Hkv, dh}, w, "dv");
    if (Hkv <= 0 || H % Hkv != 0)
        throw shape_error(std::string(w) + ": query heads " + std::to_string(H) + " not a multiple of key/value heads " + std::to_string(Hkv));
    if (dh < 1) throw shape_error(std::string(w) + ": head_dim must be >= 1, found " + std::to_string(dh));
    if (Tq * H > 0 && !p.lse.data) throw shape_error(std::string(w) + ": lse is required (the forward's LSE, [Tq, H])");
    require_unit_stride(p.q, 2, w, "q");
    require_unit_stride(p.k, 2, w, "k");
    require_unit_stride(p.v, 2, w, "v");
    require_unit_stride(p.o, 2, w, "o");
    require_unit_stride(p.dout, 2, w, "do");
    auto check_out = [&](const tensor_view<T, 3>& g, const char* name) {
        if (!g.data) return;
        require_unit_stride(g, 2, w, name);
        require_no_self_overlap(g, w, name);
        require_no_overlap(g, name, p.q, "q", w);
        require_no_overlap(g, name, p.k, "k", w);
        require_no_overlap(g, name, p.v, "v", w);
        require_no_overlap(g, name, p.o, "o", w);
        require_no_overlap(g, name, p.lse, "lse", w);
        require_no_overlap(g, name, p.dout, "do", w);
    };
    check_out(p.dq, "dq");
    check_out(p.dk, "dk");
    check_out(p.dv, "dv");
    if (p.dq.data && p.dk.data) require_no_overlap(p.dq, "dq", p.dk, "dk", w);
    if (p.dq.data && p.dv.data) require_no_overlap(p.dq, "dq", p.dv, "dv", w);
    if (p.dk.data && p.dv.data) require_no_overlap(p.dk, "dk", p.dv, "dv", w);
}

/// Query rows [qlo, qhi) of a problem that see at least one key of [j0, j1) (the inverse of visible_keys).
inline void seeing_queries(std::int64_t j0, std::int64_t j1, std::int64_t Tq, std::int64_t Tk, std::int64_t window,
                           std::int64_t& qlo, std::int64_t& qhi) {
    const std::int64_t off = Tk - Tq;  // query i sees keys (off + i − w, off + i]
    qlo = std::max<std::int64_t>(0, j0 - off);
    qhi = window > 0 ? std::min(Tq, j1 - off + window - 1) : Tq;
    if (j1 <= j0 || qhi < qlo) qhi = qlo;
}

inline constexpr std::int64_t bwd_tile_k = 64;  // keys per block: the lanes of every score tile
inline constexpr std::int64_t bwd_tile_q = 64;  // query rows per tile

/// C[r, :] (+)= Σ_κ A(r, κ) · B[κ, :] for R rows and NV SIMD vectors of columns over K terms, with A(r, κ) at
/// A[r·a_r + κ·a_k] (broadcast) and rows of B, C at stride b_k, c_r. One register tile of R × NV accumulators. All
/// five products of the backward are this kernel: S = Q·(scale K)ᵀ and dP = dO·Vᵀ (κ = channel), dVᵀ += dOᵀ·P and
/// dKᵀ += Qᵀ·dS (κ = query), dQ += dS·(scale K) (κ = key).
template <class Arch, int NV, int R, bool Acc>
inline void micro_tile(std::int64_t K, const float* A, std::int64_t a_r, std::int64_t a_k, const float* B, std::int64_t b_k,
                       float* C, std::int64_t c_r) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n] = Acc ? V::load_unaligned(C + r * c_r + n * W) : V(0.f);
    for (std::int64_t kk = 0; kk < K; ++kk) {
        V b[NV];
        for (int n = 0; n < NV; ++n) b[n] = V::load_unaligned(B + kk * b_k + n * W);
        for (int r = 0; r < R; ++r) {
            const V a(A[r * a_r + kk * a_k]);
            for (int n = 0; n < NV; ++n) acc[r][n] = xsimd::fma(a, b[n], acc[r][n]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n].store_unaligned(C + r * c_r + n * W);
}

template <class Arch, int R, bool Acc>
inline void micro_cols(std::int64_t nv, std::int64_t K, const float* A, std::int64_t a_r, std::int64_t a_k, const float* B,
                       std::int64_t b_k, float* C, std::int64_t c_r) {
    switch (nv) {
        case 1: micro_tile<Arch, 1, R, Acc>(K, A, a_r, a_k, B, b_k, C, c_r); break;
        case 2: micro_tile<Arch, 2, R, Acc>(K, A, a_r, a_k, B, b_k, C, c_r); break;
        case 3: micro_tile<Arch, 3, R, Acc>(K, A, a_r, a_k, B, b_k, C, c_r); break;
        default: micro_tile<Arch, 4, R, Acc>(K, A, a_r, a_k, B, b_k, C, c_r); break;
    }
}

/// C[M, N] (+)= A[M, K] · B[K, N] with A(r, κ) = A[r·a_r + κ·a_k], N a multiple of the SIMD width (padded buffers),
/// in register tiles of 6 (then 4, 1) rows × 4 vectors with AVX-512 (24 accumulators of its 32 registers; 6 rows ran
/// the backward about 1.3× faster than 4), 4 rows with narrower SIMD.
template <class Arch, bool Acc>
inline void gemm_panel(std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t a_r, std::int64_t a_k,
                       const float* B, std::int64_t b_k, float* C, std::int64_t c_r) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    const std::int64_t nvec = N / W;
    for (std::int64_t n0 = 0; n0 < nvec; n0 += 4) {
        const std::int64_t nv = std::min<std::int64_t>(4, nvec - n0);
        std::int64_t r = 0;
        if constexpr (W >= 16)
            for (; r + 6 <= M; r += 6) micro_cols<Arch, 6, Acc>(nv, K, A + r * a_r, a_r, a_k, B + n0 * W, b_k, C + r * c_r + n0 * W, c_r);
        for (; r + 4 <= M; r += 4) micro_cols<Arch, 4, Acc>(nv, K, A + r * a_r, a_r, a_k, B + n0 * W, b_k, C + r * c_r + n0 * W, c_r);
        for (; r < M; ++r) micro_cols<Arch, 1, Acc>(nv, K, A + r * a_r, a_r, a_k, B + n0 * W, b_k, C + r * c_r + n0 * W, c_r);
    }
}

/// Per-thread scratch of the backward, grown on demand and kept.
struct attention_bwd_scratch {
    std::vector<float> buf;
    static attention_bwd_scratch& get() {
        thread_local attention_bwd_scratch sc;
        return sc;
    }
    /// n floats starting at a 64-byte boundary.
    float* floats(std::size_t n) {
        if (buf.size() < n + 16) buf.resize(n + 16);
        const auto a = reinterpret_cast<std::uintptr_t>(buf.data());
        return reinterpret_cast<float*>((a + 63) / 64 * 64);
    }
};

/// Buffers of one call (dq partial sums, effective LSE, D), kept by the calling thread so that repeated calls neither
/// allocate nor page-fault (a fresh 16 MiB buffer per call cost a fifth of the run time on a virtual machine).
struct attention_bwd_call_buffers {
    std::vector<float> dq, lse_eff, D;
    static attention_bwd_call_buffers& get() {
        thread_local attention_bwd_call_buffers b;
        return b;
    }
};

/// One work item: key blocks [kb0, kb1) of KV head hk of problem p. Its dq contributions go to its own buffer
/// (query rows [qrow0, qrow0 + nrows), g heads, dhp padded channels), summed over items in a fixed order afterwards.
struct attention_bwd_item {
    std::int64_t p, hk, kb0, kb1, qrow0, nrows;
    std::size_t dq_off;
    double work;
};

/// Runs one item: for every key block, transposed (and scaled) K and V tiles; for every query head of the group and
/// every tile of the queries that see the block, the scores and dP are rebuilt and dS formed; dVᵀ, dKᵀ accumulate in
/// the block's transposed tiles, dQ in the item's buffer. lse_eff holds +∞ where the forward's LSE is −∞, so such
/// rows get P = exp(s − ∞) = 0 without a branch; masked entries get s = −∞ → P = 0.
template <class Arch>
void attention_bwd_run(const attention_backward_problem<float>& p, const attention_bwd_item& it, const float* lse_eff,
                       const float* Drow, float* dqbuf, float scale, std::int64_t window) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    constexpr std::int64_t Bk = bwd_tile_k, Bq = bwd_tile_q;
    static_assert(Bk % W == 0, "key tile must be a multiple of the SIMD width");
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
    const std::int64_t g = H / Hkv, hk = it.hk, off = Tk - Tq;
    const std::int64_t dhp = (dh + W - 1) / W * W;
    const bool need_dq = p.dq.data != nullptr, need_dk = p.dk.data != nullptr, need_dv = p.dv.data != nullptr;
    const bool need_ds = need_dq || need_dk;
    auto& sc = attention_bwd_scratch::get();
    const auto tile = static_cast<std::size_t>(dh * Bk);
    float* Kt = sc.floats(5 * tile + static_cast<std::size_t>(Bk * dhp + 2 * Bq * Bk + 2 * Bq * dh));  // [d_h, Bk] scale·Kᵀ
    float* Vt = Kt + tile;                                                                  // [d_h, Bk] Vᵀ
    float* dKt = Vt + tile;                                                                 // [d_h, Bk] Σ Qᵀ·dS
    float* dVt = dKt + tile;                                                                // [d_h, Bk] Σ dOᵀ·P
    float* Ks = dVt + tile;                                                                 // [Bk, dhp] scale·K
    float* S = Ks + Bk * dhp;                                                               // [Bq, Bk] scores, then P
    float* dS = S + Bq * Bk;                                                                // [Bq, Bk] dP, then dS
    float* Qp = dS + Bq * Bk;                                                               // [Bq, d_h] packed q rows
    float* dOp = Qp + Bq * dh;                                                              // [Bq, d_h] packed do rows
    if (need_dq) std::fill(dqbuf, dqbuf + it.nrows * g * dhp, 0.f);
    const float ninf = -std::numeric_limits<float>::infinity();
    alignas(64) float iota[W];
    for (std::int64_t w = 0; w < W; ++w) iota[w] = static_cast<float>(w);
    const V lane = V::load_aligned(iota);

    for (std::int64_t kb = it.kb0; kb < it.kb1; ++kb) {
        const std::int64_t j0 = kb * Bk, nk = std::min(Bk, Tk - j0);
        for (std::int64_t c = 0; c < dh; ++c) {
            for (std::int64_t j = 0; j < nk; ++j) {
                Kt[c * Bk + j] = scale * p.k(j0 + j, hk, c);
                Vt[c * Bk + j] = p.v(j0 + j, hk, c);
            }
            for (std::int64_t j = nk; j < Bk; ++j) Kt[c * Bk + j] = Vt[c * Bk + j] = 0.f;
        }
        for (std::int64_t j = 0; j < Bk; ++j)
            for (std::int64_t c = 0; c < dhp; ++c) Ks[j * dhp + c] = j < nk && c < dh ? scale * p.k(j0 + j, hk, c) : 0.f;
        std::fill(dKt, dKt + 2 * tile, 0.f);  // dKt and dVt
        std::int64_t qlo, qhi;
        seeing_queries(j0, j0 + nk, Tq, Tk, window, qlo, qhi);
        for (std::int64_t h = hk * g; h < hk * g + g; ++h) {
            for (std::int64_t i0 = qlo; i0 < qhi; i0 += Bq) {
                const std::int64_t m = std::min(Bq, qhi - i0);
                // Packed copies of the tile's q and do rows: in the tensors, rows of one head lie H·d_h apart (often a
                // multiple of 4 KiB, so a tile's rows would all compete for the same L1 sets).
                for (std::int64_t r = 0; r < m; ++r) {
                    const float* qr = &p.q(i0 + r, h, 0);
                    const float* dor = &p.dout(i0 + r, h, 0);
                    for (std::int64_t c = 0; c < dh; ++c) {
                        Qp[r * dh + c] = qr[c];
                        dOp[r * dh + c] = dor[c];
                    }
                }
                gemm_panel<Arch, false>(m, Bk, dh, Qp, dh, 1, Kt, Bk, S, Bk);    // S = Q · (scale K)ᵀ
                if (need_ds) gemm_panel<Arch, false>(m, Bk, dh, dOp, dh, 1, Vt, Bk, dS, Bk);  // dP = dO · Vᵀ
                for (std::int64_t r = 0; r < m; ++r) {
                    const std::int64_t i = i0 + r;
                    const V l(lse_eff[i * H + h]), Dv(Drow[i * H + h]);
                    // Columns visible to row i: last = off + i − j0 and, with a window, > last − w.
                    const std::int64_t last = off + i - j0;
                    const bool full = last >= Bk - 1 && (window == 0 || last - window < 0);
                    for (std::int64_t n = 0; n < Bk / W; ++n) {
                        V s = V::load_aligned(S + r * Bk + n * W);
                        if (!full) {
                            const V idx = lane + V(static_cast<float>(n * W));
                            auto vis = idx <= V(static_cast<float>(last));
                            if (window > 0) vis = vis && (idx > V(static_cast<float>(last - window)));
                            s = xsimd::select(vis, s, V(ninf));
                        }
                        const V pr = xsimd::exp(s - l);
                        pr.store_aligned(S + r * Bk + n * W);
                        if (need_ds) (pr * (V::load_aligned(dS + r * Bk + n * W) - Dv)).store_aligned(dS + r * Bk + n * W);
                    }
                }
                if (need_dv) gemm_panel<Arch, true>(dh, Bk, m, dOp, 1, dh, S, Bk, dVt, Bk);  // dVᵀ += dOᵀ · P
                if (need_dk) gemm_panel<Arch, true>(dh, Bk, m, Qp, 1, dh, dS, Bk, dKt, Bk);  // dKᵀ += Qᵀ · dS
                if (need_dq) {                                                               // dQ += dS · (scale K)
                    float* dq0 = dqbuf + ((i0 - it.qrow0) * g + (h - hk * g)) * dhp;
                    gemm_panel<Arch, true>(m, dhp, nk, dS, Bk, 1, Ks, dhp, dq0, g * dhp);
                }
            }
        }
        for (std::int64_t j = 0; j < nk; ++j) {
            if (need_dk) {
                float* dk = &p.dk(j0 + j, hk, 0);
                for (std::int64_t c = 0; c < dh; ++c) dk[c] = scale * dKt[c * Bk + j];
            }
            if (need_dv) {
                float* dv = &p.dv(j0 + j, hk, 0);
                for (std::int64_t c = 0; c < dh; ++c) dv[c] = dVt[c * Bk + j];
            }
        }
    }
}

}  // namespace detail

/// Backward of attention_prefill over a batch of independent problems. Work items are (problem, KV head, range of
/// 64-key blocks): each owns its keys' dk, dv rows (written once, =) and accumulates dq into a buffer of its own; the
/// buffers of one (problem, KV head) are summed in a fixed order. The ranges depend only on the problem's own shape,
/// so results are the same bits for any thread count and whatever else is in the batch. Extra memory: O(Tq·H·d_h)
/// for the dq buffers (at most 4 per KV head, each over the query rows that see its keys) and O(tile) per thread.
/// Throws shape_error on inconsistent shapes or views that break the rules of attention_backward_problem, value_error
/// on a non-finite scale or a negative window.
template <cpu_backend_type Backend>
void attention_prefill_backward(const Backend& be, std::span<const attention_backward_problem<float>> problems,
                                const attention_params& prm) {
    using Arch = typename Backend::arch;
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    constexpr std::int64_t Bk = detail::bwd_tile_k;
    const char* who = "attention_prefill_backward";
    detail::attention_check_params(prm, who);
    for (const auto& p : problems) detail::attention_backward_check(p, who);

    // Items (canonical order: problem, KV head, key range) and the offsets of their dq buffers and row data.
    std::vector<detail::attention_bwd_item> items;
    std::vector<std::size_t> row_off(problems.size() + 1, 0);  // into lse_eff / D: Σ Tq·H of earlier problems
    std::vector<std::size_t> first_item(problems.size() + 1, 0);
    std::size_t dq_total = 0;
    for (std::size_t pi = 0; pi < problems.size(); ++pi) {
        const auto& p = problems[pi];
        const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
        const std::int64_t g = H / Hkv, dhp = (dh + W - 1) / W * W, nb = (Tk + Bk - 1) / Bk;
        row_off[pi + 1] = row_off[pi] + static_cast<std::size_t>(Tq * H);
        first_item[pi] = items.size();
        if (nb == 0) {
            first_item[pi + 1] = items.size();
            continue;
        }
        // Work of each key block (query rows that see it), then up to 4 splits of about equal work: fewer with many
        // KV heads (they give the parallelism) or little work.
        std::vector<double> cum(static_cast<std::size_t>(nb + 1), 0.0);
        for (std::int64_t b = 0; b < nb; ++b) {
            std::int64_t qlo, qhi;
            detail::seeing_queries(b * Bk, std::min(Tk, (b + 1) * Bk), Tq, Tk, prm.window, qlo, qhi);
            cum[static_cast<std::size_t>(b + 1)] = cum[static_cast<std::size_t>(b)] + static_cast<double>(qhi - qlo + 1);
        }
        const double total = cum.back();
        const auto by_work = static_cast<std::int64_t>(total * static_cast<double>(Bk) / 32768.0);
        const std::int64_t splits = std::max<std::int64_t>(1, std::min({std::int64_t{4}, (8 + Hkv - 1) / Hkv, nb, by_work}));
        for (std::int64_t hk = 0; hk < Hkv; ++hk) {
            std::int64_t kb = 0;
            for (std::int64_t s = 0; s < splits; ++s) {
                // Blocks [kb, kend): up to the first cumulative work of at least (s + 1)/splits of the total, leaving
                // one block at least for each later split.
                std::int64_t kend = kb + 1;
                const double goal = total * static_cast<double>(s + 1) / static_cast<double>(splits);
                if (s == splits - 1)
                    kend = nb;
                else
                    while (kend < nb - (splits - 1 - s) && cum[static_cast<std::size_t>(kend)] < goal) ++kend;
                std::int64_t qlo, qhi;
                detail::seeing_queries(kb * Bk, std::min(Tk, kend * Bk), Tq, Tk, prm.window, qlo, qhi);
                detail::attention_bwd_item it{static_cast<std::int64_t>(pi), hk, kb, kend, qlo, qhi - qlo, dq_total,
                                              (cum[static_cast<std::size_t>(kend)] - cum[static_cast<std::size_t>(kb)]) * static_cast<double>(g)};
                if (p.dq.data) dq_total += static_cast<std::size_t>((qhi - qlo) * g * dhp);
                items.push_back(it);
                kb = kend;
            }
        }
        first_item[pi + 1] = items.size();
    }

    // Row data: lse_eff (+∞ where the LSE is −∞) and D = rowsum(do ⊙ o), [Σ Tq·H] each. The dq buffers are zeroed by
    // their items.
    auto& bufs = detail::attention_bwd_call_buffers::get();
    detail::grow(bufs.lse_eff, row_off.back());
    detail::grow(bufs.D, row_off.back());
    detail::grow(bufs.dq, dq_total);
    float* const lse_eff = bufs.lse_eff.data();
    float* const Drow = bufs.D.data();
    float* const dqbuf = bufs.dq.data();
    {
        std::vector<std::pair<std::int64_t, std::int64_t>> blocks;  // (problem, first row)
        for (std::size_t pi = 0; pi < problems.size(); ++pi)
            for (std::int64_t r = 0; r < problems[pi].q.dim(0); r += 64) blocks.emplace_back(static_cast<std::int64_t>(pi), r);
        be.parallel_for(static_cast<std::int64_t>(blocks.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
            for (std::int64_t b = b0; b < b1; ++b) {
                const auto [pi, r0] = blocks[static_cast<std::size_t>(b)];
                const auto& p = problems[static_cast<std::size_t>(pi)];
                const std::int64_t H = p.q.dim(1), dh = p.q.dim(2);
                float* le = lse_eff + row_off[static_cast<std::size_t>(pi)];
                float* D = Drow + row_off[static_cast<std::size_t>(pi)];
                for (std::int64_t i = r0; i < std::min(p.q.dim(0), r0 + 64); ++i)
                    for (std::int64_t h = 0; h < H; ++h) {
                        const float l = p.lse(i, h);
                        le[i * H + h] = l == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity() : l;
                        D[i * H + h] = detail::dot<Arch>(&p.dout(i, h, 0), &p.o(i, h, 0), dh);
                    }
            }
        });
    }

    // Expensive items first (their order changes no result: each item writes only its own outputs).
    std::vector<std::size_t> order(items.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return items[a].work > items[b].work; });
    be.parallel_for(static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
            const auto& it = items[order[static_cast<std::size_t>(b)]];
            const auto pi = static_cast<std::size_t>(it.p);
            const auto& p = problems[pi];
            const auto scale = static_cast<float>(detail::attention_scale(prm, p.q.dim(2)));
            detail::attention_bwd_run<Arch>(p, it, lse_eff + row_off[pi], Drow + row_off[pi], dqbuf + it.dq_off, scale, prm.window);
        }
    });

    // dq = Σ over the items of each (problem, KV head), in item order.
    std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
    for (std::size_t pi = 0; pi < problems.size(); ++pi)
        if (problems[pi].dq.data)
            for (std::int64_t r = 0; r < problems[pi].q.dim(0); r += 64) blocks.emplace_back(static_cast<std::int64_t>(pi), r);
    be.parallel_for(static_cast<std::int64_t>(blocks.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b) {
            const auto [pi, r0] = blocks[static_cast<std::size_t>(b)];
            const auto& p = problems[static_cast<std::size_t>(pi)];
            const std::int64_t H = p.q.dim(1), dh = p.q.dim(2), g = H / p.k.dim(1), dhp = (dh + W - 1) / W * W;
            const std::int64_t r1 = std::min(p.q.dim(0), r0 + 64);
            for (std::int64_t i = r0; i < r1; ++i)
                for (std::int64_t h = 0; h < H; ++h) std::fill(&p.dq(i, h, 0), &p.dq(i, h, 0) + dh, 0.f);
            for (std::size_t ii = first_item[static_cast<std::size_t>(pi)]; ii < first_item[static_cast<std::size_t>(pi) + 1]; ++ii) {
                const auto& it = items[ii];
                const std::int64_t lo = std::max(r0, it.qrow0), hi = std::min(r1, it.qrow0 + it.nrows);
                for (std::int64_t i = lo; i < hi; ++i)
                    for (std::int64_t r = 0; r < g; ++r) {
                        const float* src = dqbuf + it.dq_off + static_cast<std::size_t>(((i - it.qrow0) * g + r) * dhp);
                        float* dst = &p.dq(i, it.hk * g + r, 0);
                        for (std::int64_t c = 0; c < dh; ++c) dst[c] += src[c];
                    }
            }
        }
    });
}

/// Reference backward: per query row, the softmax over its visible keys is recomputed from q and k (max-subtracted,
/// as attention_ref), o_i = Σ_j P_ij v_j with it, then the formulas at the top of this file in plain loops in T.
/// Independent of the o and lse passed (their shapes are checked). A row with no visible key gets dq = 0 and adds
/// nothing to dk, dv.
template <class T>
void attention_backward_ref(const attention_backward_problem<T>& p, const attention_params& prm) {
    const char* who = "attention_backward_ref";
    detail::attention_backward_check(p, who);
    detail::attention_check_params(prm, who);
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
    const T scale = static_cast<T>(detail::attention_scale(prm, dh));
    const T ninf = -std::numeric_limits<T>::infinity();
    auto zero = [](const tensor_view<T, 3>& t) {
        if (!t.data) return;
        for (std::int64_t a = 0; a < t.dim(0); ++a)
            for (std::int64_t b = 0; b < t.dim(1); ++b)
                for (std::int64_t c = 0; c < t.dim(2); ++c) t(a, b, c) = T(0);
    };
    zero(p.dq);
    zero(p.dk);
    zero(p.dv);
    std::vector<T> P(static_cast<std::size_t>(Tk)), o(static_cast<std::size_t>(dh));
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t hk = h / (H / Hkv);
        for (std::int64_t i = 0; i < Tq; ++i) {
            std::int64_t lo, hi;
            detail::visible_keys(i, Tq, Tk, prm.window, lo, hi);
            T mx = ninf;
            for (std::int64_t j = lo; j < hi; ++j) {
                T s = 0;
                for (std::int64_t c = 0; c < dh; ++c) s += p.q(i, h, c) * p.k(j, hk, c);
                P[static_cast<std::size_t>(j)] = scale * s;
                mx = std::max(mx, scale * s);
            }
            if (hi <= lo || mx == ninf) continue;  // no visible key (or every score −∞): no contribution
            T sum = 0;
            for (std::int64_t j = lo; j < hi; ++j) sum += (P[static_cast<std::size_t>(j)] = std::exp(P[static_cast<std::size_t>(j)] - mx));
            std::fill(o.begin(), o.end(), T(0));
            for (std::int64_t j = lo; j < hi; ++j) {
                P[static_cast<std::size_t>(j)] /= sum;
                for (std::int64_t c = 0; c < dh; ++c) o[static_cast<std::size_t>(c)] += P[static_cast<std::size_t>(j)] * p.v(j, hk, c);
            }
            T D = 0;
            for (std::int64_t c = 0; c < dh; ++c) D += p.dout(i, h, c) * o[static_cast<std::size_t>(c)];
            for (std::int64_t j = lo; j < hi; ++j) {
                const T pij = P[static_cast<std::size_t>(j)];
                T dp = 0;
                for (std::int64_t c = 0; c < dh; ++c) dp += p.dout(i, h, c) * p.v(j, hk, c);
                const T ds = pij * (dp - D);
                for (std::int64_t c = 0; c < dh; ++c) {
                    if (p.dv.data) p.dv(j, hk, c) += pij * p.dout(i, h, c);
                    if (p.dq.data) p.dq(i, h, c) += scale * ds * p.k(j, hk, c);
                    if (p.dk.data) p.dk(j, hk, c) += scale * ds * p.q(i, h, c);
                }
            }
        }
    }
}

}  // namespace hymix::kernels
