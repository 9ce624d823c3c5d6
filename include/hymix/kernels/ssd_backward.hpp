// Mamba-2 SSD backward (spec.md §3.2 step 5, §3.3): gradients of y = SSD(x, Δ, A, B, C, D; h₀) w.r.t. every input
// and the initial state. Reference: BPTT through the token recurrence in fp64. CPU: the chunked backward (recompute
// the chunk states, carry the state gradient backwards across chunks, intra-chunk terms through exp(segsum)).
// Source: Dao & Gu, arXiv 2405.21060 §6–7; stage structure as state-spaces/mamba ssd_combined.py's backward.
//
// Maths, per head (group g = h / (H/G)), u_t = Δ_t x_t, a_t = Δ_t A:
//   recurrence  h_t = e^{a_t} h_{t−1} + u_t B_tᵀ,  y_t = h_t C_t + D x_t.  With dh_t the total gradient of h_t,
//               dh_t = dy_t C_tᵀ + e^{a_{t+1}} dh_{t+1};  dC_t = h_tᵀ dy_t;  du_t = dh_t B_t;  dB_t = dh_tᵀ u_t;
//               da_t = e^{a_t} ⟨dh_t, h_{t−1}⟩;  dx_t = Δ_t du_t + D dy_t;  dΔ_t = ⟨du_t, x_t⟩ + A da_t;
//               dA = Σ_t Δ_t da_t;  dD = Σ_t ⟨dy_t, x_t⟩;  dh₀ = e^{a_1} dh_1.
//   chunked     in a chunk with inclusive log-decay cumsum α_i, entering state H, leaving-state gradient dS:
//               y_i = Σ_{j≤i} (C_i·B_j) e^{α_i−α_j} u_j + e^{α_i} H C_i + D x_i,   H' = e^{α_L} H + Σ_j e^{α_L−α_j} u_j B_jᵀ.
//               dM = tril(dY Uᵀ), dCB = dM ⊙ E (E = exp(segsum)), dU = Mᵀ dY + diag(w) B dSᵀ (w_j = e^{α_L−α_j}),
//               dC = diag(e^α) dY H + tril(dCB) B,  dB = diag(w) U dS + tril(dCB)ᵀ C,
//               dH = e^{α_L} dS + (diag(e^α) dY)ᵀ C  (the state gradient carried to the previous chunk),
//               dα_i = Σ_j (dM ⊙ M)_ij − Σ_k (dM ⊙ M)_ki + e^{α_i}⟨(dY H)_i, C_i⟩ − w_i⟨(U dS)_i, B_i⟩
//                      (+ Σ_j w_j⟨(U dS)_j, B_j⟩ + e^{α_L}⟨dS, H⟩ at the last row; w_i⟨(U dS)_i, B_i⟩ = ⟨u_i, w_i dS B_i⟩
//                      is read off the dU term, so the per-head U dS is only needed summed over a group's heads),
//               and α_i = A Σ_{m≤i} Δ_m gives dΔ_m += A Σ_{i≥m} dα_i, dA += Σ_m Δ_m Σ_{i≥m} dα_i.
//   Every exponent is α or a difference α_i − α_j (j ≤ i) clamped to ≤ 0, so every exp factor is ≤ 1 and masked
//   entries are never exponentiated (spec.md §8.12).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <Eigen/Core>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/chunk_layout.hpp"
#include "hymix/kernels/linear_backward.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/kernels/tile_product.hpp"
#include "hymix/kernels/view_checks.hpp"

namespace hymix::kernels {

/// One sequence of an SSD backward call: token rows [start, start + length), the state its forward started from and
/// where its gradient goes. The pointers must not alias each other or the other sequences' states.
template <class T>
struct ssd_backward_sequence {
    std::int64_t start = 0;
    std::int64_t length = 0;
    const T* state0 = nullptr;        // [H, P, N] initial state of the forward; null: zeros
    T* dstate0 = nullptr;             // [H, P, N] its gradient, overwritten; null: not needed
    const T* dstate_final = nullptr;  // [H, P, N] upstream gradient of the final state; null: zero (state discarded)
};

/// Gradients of an SSD call. Input gradients (dx, ddt, dB, dC) are overwritten on every row (zero on rows outside all
/// sequences); parameter gradients (dA, dD) are accumulated. A null view / pointer is not computed.
template <class T>
struct ssd_grads {
    tensor_view<T, 3> dx;   // [R, H, P]  =
    tensor_view<T, 2> ddt;  // [R, H]     =  w.r.t. Δ (after softplus and clamp)
    tensor_view<T, 3> dB;   // [R, G, N]  =
    tensor_view<T, 3> dC;   // [R, G, N]  =
    T* dA = nullptr;        // [H]        += w.r.t. A = −exp(A_log)
    T* dD = nullptr;        // [H], or [H·P] when the inputs' D is per channel; +=
};

namespace detail {

/// Every check of an SSD backward entry point: the forward's input checks, dy and each present gradient's shape and
/// strides, the sequences (inside [0, R), sharing neither rows nor a dstate0), Δ on the sequences' rows.
template <class T>
void ssd_backward_check(const ssd_inputs<T>& in, std::span<const ssd_backward_sequence<T>> seqs, tensor_view<const T, 3> dy,
                        const ssd_grads<T>& g, std::string_view who) {
    ssd_check_inputs(in, who);
    const std::int64_t R = in.n_rows(), H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    dy.require_shape({R, H, P}, who, "dy [R, H, P]");
    require_unit_inner_stride(dy, who, "dy [R, H, P]");
    if (g.dx.data) {
        g.dx.require_shape({R, H, P}, who, "dx [R, H, P]");
        require_unit_inner_stride(g.dx, who, "dx [R, H, P]");
    }
    if (g.ddt.data) g.ddt.require_shape({R, H}, who, "ddt [R, H]");
    if (g.dB.data) {
        g.dB.require_shape({R, G, N}, who, "dB [R, G, N]");
        require_unit_inner_stride(g.dB, who, "dB [R, G, N]");
    }
    if (g.dC.data) {
        g.dC.require_shape({R, G, N}, who, "dC [R, G, N]");
        require_unit_inner_stride(g.dC, who, "dC [R, G, N]");
    }
    std::vector<ssd_sequence<T>> as_fwd;  // rows and written states: the forward's sequence checks apply as they are
    as_fwd.reserve(seqs.size());
    for (const auto& s : seqs) as_fwd.push_back({s.start, s.length, s.dstate0});
    ssd_check_seqs(std::span<const ssd_sequence<T>>(as_fwd), R, H * P * N, who);
    for (const auto& s : seqs) ssd_check_dt_rows(in, s.start, s.length, who);
}

/// Zeroes the input gradients on rows that belong to no sequence (their inputs do not reach any output).
template <class T>
void ssd_backward_zero_free_rows(std::span<const ssd_backward_sequence<T>> seqs, const ssd_grads<T>& g, std::int64_t R) {
    std::vector<unsigned char> used(static_cast<std::size_t>(R), 0);
    for (const auto& s : seqs) std::fill(used.begin() + s.start, used.begin() + s.start + s.length, 1);
    for (std::int64_t r = 0; r < R; ++r) {
        if (used[static_cast<std::size_t>(r)]) continue;
        if (g.dx.data)
            for (std::int64_t h = 0; h < g.dx.dim(1); ++h)
                for (std::int64_t p = 0; p < g.dx.dim(2); ++p) g.dx(r, h, p) = T(0);
        if (g.ddt.data)
            for (std::int64_t h = 0; h < g.ddt.dim(1); ++h) g.ddt(r, h) = T(0);
        for (const auto* v : {&g.dB, &g.dC})
            if (v->data)
                for (std::int64_t k = 0; k < v->dim(1); ++k)
                    for (std::int64_t n = 0; n < v->dim(2); ++n) (*v)(r, k, n) = T(0);
    }
}

}  // namespace detail

/// Reference SSD backward in T (fp64 in practice): BPTT through the token recurrence of spec.md §3.2 step 5 (the
/// formulas at the top of this file), every state of every sequence kept (O(T·H·P·N): a reference, not a kernel).
/// dy [R, H, P] is the upstream gradient of y; each sequence's dstate_final that of its final state. Throws like the
/// forward (shape_error, value_error).
template <class T>
void ssd_backward_ref(const ssd_inputs<T>& in, std::span<const ssd_backward_sequence<T>> seqs, tensor_view<const T, 3> dy,
                      const ssd_grads<T>& g) {
    detail::ssd_backward_check(in, seqs, dy, g, "ssd_backward_ref");
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state(), hpg = H / G;
    detail::ssd_backward_zero_free_rows(seqs, g, in.n_rows());
    for (const auto& s : seqs)  // the rows of every sequence are accumulated into below
        for (std::int64_t t = s.start; t < s.start + s.length; ++t) {
            for (std::int64_t h = 0; h < H; ++h) {
                if (g.ddt.data) g.ddt(t, h) = T(0);
                for (std::int64_t p = 0; p < P && g.dx.data; ++p) g.dx(t, h, p) = T(0);
            }
            for (std::int64_t k = 0; k < G; ++k)
                for (std::int64_t n = 0; n < N; ++n) {
                    if (g.dB.data) g.dB(t, k, n) = T(0);
                    if (g.dC.data) g.dC(t, k, n) = T(0);
                }
        }
    const auto PN = static_cast<std::size_t>(P * N);
    std::vector<T> hist, dh(PN);
    for (const auto& s : seqs)
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t gi = h / hpg, T0 = s.start, L = s.length;
            const T A = in.A[h];
            // Forward: hist[t] = h_t for t = 0..L (h_0 the initial state).
            hist.assign(PN * static_cast<std::size_t>(L + 1), T(0));
            if (s.state0) std::copy(s.state0 + h * P * N, s.state0 + (h + 1) * P * N, hist.begin());
            for (std::int64_t t = 0; t < L; ++t) {
                const T delta = in.dt(T0 + t, h), decay = std::exp(delta * A);
                const T* prev = hist.data() + static_cast<std::size_t>(t) * PN;
                T* cur = hist.data() + static_cast<std::size_t>(t + 1) * PN;
                for (std::int64_t p = 0; p < P; ++p)
                    for (std::int64_t n = 0; n < N; ++n)
                        cur[p * N + n] = decay * prev[p * N + n] + delta * in.x(T0 + t, h, p) * in.B(T0 + t, gi, n);
            }
            // Backward through time.
            for (std::size_t e = 0; e < PN; ++e) dh[e] = s.dstate_final ? s.dstate_final[h * P * N + static_cast<std::int64_t>(e)] : T(0);
            T dA = 0;
            std::vector<T> dD(static_cast<std::size_t>(P), T(0));
            for (std::int64_t t = L - 1; t >= 0; --t) {
                const std::int64_t r = T0 + t;
                const T delta = in.dt(r, h), decay = std::exp(delta * A);
                const T* prev = hist.data() + static_cast<std::size_t>(t) * PN;
                const T* cur = hist.data() + static_cast<std::size_t>(t + 1) * PN;
                T ddelta = 0, da = 0;
                for (std::int64_t p = 0; p < P; ++p) {
                    const T dyp = dy(r, h, p), xp = in.x(r, h, p);
                    dD[static_cast<std::size_t>(p)] += dyp * xp;
                    T du = 0;
                    for (std::int64_t n = 0; n < N; ++n) {
                        T& d = dh[static_cast<std::size_t>(p * N + n)];
                        d += dyp * in.C(r, gi, n);  // y_t = h_t C_t
                        if (g.dC.data) g.dC(r, gi, n) += dyp * cur[p * N + n];
                        du += d * in.B(r, gi, n);
                        if (g.dB.data) g.dB(r, gi, n) += d * delta * xp;
                        da += d * prev[p * N + n];
                    }
                    ddelta += du * xp;
                    if (g.dx.data) g.dx(r, h, p) = delta * du + detail::skip_coef(in, h, p) * dyp;
                }
                da *= decay;  // ∂h_t/∂a_t = e^{a_t} h_{t−1}
                if (g.ddt.data) g.ddt(r, h) = ddelta + A * da;
                dA += delta * da;
                for (auto& d : dh) d *= decay;  // dh_{t−1} gets e^{a_t} dh_t
            }
            if (s.dstate0) std::copy(dh.begin(), dh.end(), s.dstate0 + h * P * N);
            if (g.dA) g.dA[h] += dA;
            if (g.dD) {
                if (in.D_per_channel)
                    for (std::int64_t p = 0; p < P; ++p) g.dD[h * P + p] += dD[static_cast<std::size_t>(p)];
                else
                    for (std::int64_t p = 0; p < P; ++p) g.dD[h] += dD[static_cast<std::size_t>(p)];
            }
        }
}

namespace detail {

/// Scratch of one (chunk, group) task of the chunked backward, for chunks of up to W rows.
struct ssd_bwd_scratch {
    std::vector<double> alpha, dalpha;              // [W]
    Eigen::VectorXf dtl, eal, wl, rows, dvec;       // [W] Δ, e^α, e^{α_L − α}, row sums; [P] skip coefficients
    Eigen::RowVectorXf cols;                        // [W] column sums
    ssd_row_matrix CB, E, M, dM, dCB;               // [W, W]
    ssd_row_matrix U, dU;                           // [W, P]
    ssd_row_matrix T1, Bw, dCt;                     // [W, N]
    ssd_row_matrix UW;                              // [W, hpg·P] diag(w) U of every head of the group, side by side
    ssd_row_matrix bt, ut, dst;                     // [N, W] Bᵀ, [P, W] Uᵀ, [N, P] dSᵀ: transposed operands as rows
    ssd_bwd_scratch(std::int64_t W, std::int64_t P, std::int64_t N, std::int64_t hpg)
        : alpha(static_cast<std::size_t>(W)), dalpha(static_cast<std::size_t>(W)), dtl(W), eal(W), wl(W), rows(W), dvec(P),
          cols(W), CB(W, W), E(W, W), M(W, W), dM(W, W), dCB(W, W), U(W, P),
          dU(W, P), T1(W, N), Bw(W, N), dCt(W, N), UW(W, hpg * P), bt(N, W), ut(P, W), dst(N, P), dims{W, P, N, hpg} {}
    /// The calling thread's scratch for these sizes, kept between calls (a phase-2 task never runs another one
    /// inside it, so one per thread suffices; megabytes of fresh pages per call would cost page faults).
    static ssd_bwd_scratch& for_thread(std::int64_t W, std::int64_t P, std::int64_t N, std::int64_t hpg) {
        thread_local std::unique_ptr<ssd_bwd_scratch> s;
        if (!s || s->dims != std::array<std::int64_t, 4>{W, P, N, hpg}) s = std::make_unique<ssd_bwd_scratch>(W, P, N, hpg);
        return *s;
    }

private:
    std::array<std::int64_t, 4> dims;
};

/// The per-chunk states and state gradients of one backward call: a buffer per calling thread, kept at the largest
/// size seen (fresh pages for megabytes of states cost more than the backward's own GEMMs), or a private allocation
/// when the thread's buffer is in use (a nested call).
class ssd_bwd_workspace {
public:
    explicit ssd_bwd_workspace(std::size_t n) {
        auto& ws = tls();
        if (!ws.in_use) {
            ws.in_use = true;
            owner_ = &ws;
            if (ws.buf.size() < n) ws.buf = std::vector<float>(n);
            data_ = ws.buf.data();
        } else {
            own_ = std::make_unique_for_overwrite<float[]>(std::max<std::size_t>(n, 1));
            data_ = own_.get();
        }
    }
    ~ssd_bwd_workspace() {
        if (owner_) owner_->in_use = false;
    }
    ssd_bwd_workspace(const ssd_bwd_workspace&) = delete;
    ssd_bwd_workspace& operator=(const ssd_bwd_workspace&) = delete;
    float* data() const noexcept { return data_; }
    /// Frees the calling thread's buffer (unless a call on this thread is using it).
    static void release() {
        auto& ws = tls();
        if (!ws.in_use) std::vector<float>().swap(ws.buf);
    }

private:
    struct per_thread {
        std::vector<float> buf;
        bool in_use = false;
    };
    static per_thread& tls() {
        thread_local per_thread ws;
        return ws;
    }
    per_thread* owner_ = nullptr;
    std::unique_ptr<float[]> own_;
    float* data_ = nullptr;
};

/// Phase 1 of the chunked backward, one (sequence, head): the forward sweep stores the state entering every chunk
/// (states [n_chunks, H, P, N]); the backward sweep stores the gradient of the state leaving every chunk
/// (dstates [n_chunks, H, P, N]) and writes dstate0. One GEMM of P·N·L per chunk and sweep; each result is written
/// straight into its slot (the last chunk's leaving state and, without dstate0, the first chunk's entering-state
/// gradient are never needed, so never computed).
template <class Arch>
void ssd_bwd_state_sweep(const ssd_inputs<float>& in, const chunk_layout& chunks, std::int64_t s, std::int64_t h,
                                const ssd_backward_sequence<float>& seq, tensor_view<const float, 3> dy, float* states,
                                float* dstates, ssd_scratch& w) {
    const std::int64_t H = in.n_heads(), P = in.head_dim(), N = in.d_state(), PN = P * N, g = h / (H / in.n_groups());
    const std::int64_t k0 = chunks.first_chunk(s), k1 = chunks.first_chunk(s + 1);
    const auto slot = [&](float* base, std::int64_t k) { return base + (k * H + h) * PN; };
    const auto init = [&](float* dst, const float* src) {
        if (src)
            std::copy(src + h * PN, src + (h + 1) * PN, dst);
        else
            std::fill(dst, dst + PN, 0.f);
    };
    if (k0 == k1) {  // no tokens: the final state is the initial state
        if (seq.dstate0) init(seq.dstate0 + h * PN, seq.dstate_final);
        return;
    }
    init(slot(states, k0), seq.state0);
    for (std::int64_t k = k0; k + 1 < k1; ++k) {  // H_{k+1} = e^{α_L} H_k + S_k
        const std::int64_t r = chunks.row(k), L = chunks.length(k);
        ssd_cumsum_tile(in, h, r, L, w.alpha.data());
        ssd_chunk_state_tile<Arch>(in, h, r, L, w.alpha.data(), slot(states, k + 1), false, w);
        ssd_map(slot(states, k + 1), P, N, Eigen::OuterStride<>(N)) +=
            state_decay(w.alpha[static_cast<std::size_t>(L - 1)]) * ssd_cmap(slot(states, k), P, N, Eigen::OuterStride<>(N));
    }
    init(slot(dstates, k1 - 1), seq.dstate_final);
    for (std::int64_t k = k1 - 1; k >= k0; --k) {  // dH_k = e^{α_L} dS_k + (diag(e^α) dY)ᵀ C
        float* out = k > k0 ? slot(dstates, k - 1) : seq.dstate0 ? seq.dstate0 + h * PN : nullptr;
        if (!out) break;
        const std::int64_t r = chunks.row(k), L = chunks.length(k);
        ssd_cumsum_tile(in, h, r, L, w.alpha.data());
        for (std::int64_t t = 0; t < L; ++t) w.decay[t] = static_cast<float>(std::exp(std::min(w.alpha[static_cast<std::size_t>(t)], 0.0)));
        const ssd_cmap dYm(&dy(r, h, 0), L, P, Eigen::OuterStride<>(dy.strides[0]));
        auto Yd = w.Tmp.topRows(L);
        Yd.noalias() = w.decay.head(L).asDiagonal() * dYm;
        // dH [P, N] = Ydᵀ C: A(p, t) = Yd[t, p], B = C's rows (tile_product: no packing).
        tile_product<Arch>(Yd.data(), 1, Yd.outerStride(), &in.C(r, g, 0), in.C.strides[0], out, N, P, N, L, false);
        ssd_map dH(out, P, N, Eigen::OuterStride<>(N));
        dH += state_decay(w.alpha[static_cast<std::size_t>(L - 1)]) * ssd_cmap(slot(dstates, k), P, N, Eigen::OuterStride<>(N));
    }
}

/// Phase 2 of the chunked backward, one (chunk k, group g): every gradient on the chunk's rows for the heads of the
/// group (in head order), from the entering state and the leaving-state gradient of phase 1 (h_zero: the entering
/// state is a sequence's zero initial state; ds_zero: the leaving state is a sequence's final state without gradient). dA_part [n_chunks, H] and
/// dD_part [n_chunks, H or H·P] receive this chunk's contributions (reduced over chunks in a fixed order afterwards).
template <class Arch>
void ssd_bwd_chunk_group(const ssd_inputs<float>& in, const chunk_layout& chunks, std::int64_t k, std::int64_t g,
                         tensor_view<const float, 3> dy, const float* states, const float* dstates, bool h_zero, bool ds_zero,
                         const ssd_grads<float>& gr, double* dA_part, double* dD_part, ssd_bwd_scratch& w) {
    const std::int64_t H = in.n_heads(), P = in.head_dim(), N = in.d_state(), hpg = H / in.n_groups(), PN = P * N;
    const std::int64_t r = chunks.row(k), L = chunks.length(k), nD = in.D_per_channel ? P : 1;
    const ssd_cmap Bm(&in.B(r, g, 0), L, N, Eigen::OuterStride<>(in.B.strides[0]));
    const ssd_cmap Cm(&in.C(r, g, 0), L, N, Eigen::OuterStride<>(in.C.strides[0]));
    auto CB = w.CB.topLeftCorner(L, L);
    auto E = w.E.topLeftCorner(L, L);
    auto M = w.M.topLeftCorner(L, L);
    auto dM = w.dM.topLeftCorner(L, L);
    auto dCB = w.dCB.topLeftCorner(L, L);
    auto U = w.U.topRows(L), dU = w.dU.topRows(L);
    auto T1 = w.T1.topRows(L), Bw = w.Bw.topRows(L), dCt = w.dCt.topRows(L), UW = w.UW.topRows(L);
    // C Bᵀ on and below the diagonal (the only part M reads), against Bᵀ copied once per chunk; every product of this
    // function is a register-tile product (tile_product.hpp).
    transpose_rows(Bm.data(), in.B.strides[0], L, N, w.bt.data(), w.bt.cols());
    tile_product_lower_part<Arch>(Cm.data(), in.C.strides[0], 1, w.bt.data(), w.bt.cols(), w.CB.data(), w.CB.cols(), L, N);
    dCB.setZero();
    dCt.setZero();
    for (std::int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
        const double A = in.A[h];
        double* alpha = w.alpha.data();
        double* da = w.dalpha.data();
        ssd_cumsum_tile(in, h, r, L, alpha);
        const double a_last = alpha[L - 1];
        for (std::int64_t t = 0; t < L; ++t) {
            w.dtl[t] = in.dt(r + t, h);
            w.eal[t] = static_cast<float>(std::exp(std::min(alpha[t], 0.0)));
            w.wl[t] = static_cast<float>(std::exp(std::min(a_last - alpha[t], 0.0)));
        }
        // E = exp(segsum) (zero above the diagonal), M = C·Bᵀ ⊙ E on and below it.
        for (std::int64_t i = 0; i < L; ++i) {
            segsum_exp_row<Arch>(alpha, i, L, nullptr, &E(i, 0));
            for (std::int64_t j = 0; j <= i; ++j) M(i, j) = E(i, j) * CB(i, j);  // read on and below the diagonal only
        }
        const ssd_cmap Xm(&in.x(r, h, 0), L, P, Eigen::OuterStride<>(in.x.strides[0]));
        const ssd_cmap dYm(&dy(r, h, 0), L, P, Eigen::OuterStride<>(dy.strides[0]));
        const ssd_cmap Hk(states + (k * H + h) * PN, P, N, Eigen::OuterStride<>(N));
        const ssd_cmap dS(dstates + (k * H + h) * PN, P, N, Eigen::OuterStride<>(N));
        U.noalias() = w.dtl.head(L).asDiagonal() * Xm;
        // Intra-chunk: dM = tril(dY Uᵀ) (its lower part, against Uᵀ); dCB += dM ⊙ E; dα from dM ⊙ M (row minus column
        // sums, the diagonal cancels), all on and below the diagonal only.
        transpose_rows(U.data(), P, L, P, w.ut.data(), w.ut.cols());
        tile_product_lower_part<Arch>(dYm.data(), dy.strides[0], 1, w.ut.data(), w.ut.cols(), w.dM.data(), w.dM.cols(), L, P);
        w.cols.head(L).setZero();
        for (std::int64_t i = 0; i < L; ++i) {
            float row = 0.f;
            for (std::int64_t j = 0; j <= i; ++j) {
                const float d = dM(i, j), dm = d * M(i, j);
                dCB(i, j) += d * E(i, j);
                row += dm;
                w.cols[j] += dm;
            }
            w.rows[i] = row;
        }
        // Chunk state (H' = e^{α_L} H + Σ_j w_j u_j B_jᵀ): du_j = w_j dS B_j, and ∂/∂α_j of w_j's term is
        // −⟨u_j, du_j⟩ (its dB term, Σ_h diag(w) U dS, is one GEMM over the group below). Inter-chunk output
        // (e^{α_i} H C_i): dC_i += e^{α_i} (dY H)_i, ∂/∂α_i = e^{α_i} ⟨(dY H)_i, C_i⟩. Both vanish (and are skipped)
        // when dS, respectively H, is known to be zero.
        for (std::int64_t i = 0; i < L; ++i) da[i] = static_cast<double>(w.rows[i]) - static_cast<double>(w.cols[i]);
        if (!ds_zero) {
            Bw.noalias() = w.wl.head(L).asDiagonal() * Bm;
            transpose_rows(dS.data(), N, P, N, w.dst.data(), P);
            tile_product<Arch>(Bw.data(), N, 1, w.dst.data(), P, dU.data(), P, L, P, N, false);  // diag(w) B dSᵀ
            double sw = 0;
            for (std::int64_t i = 0; i < L; ++i) {
                const double c2 = U.row(i).dot(dU.row(i));
                da[i] -= c2;
                sw += c2;
            }
            da[L - 1] += sw;
            UW.middleCols((h - g * hpg) * P, P).noalias() = w.wl.head(L).asDiagonal() * U;
        }
        if (!h_zero) {
            tile_product<Arch>(dYm.data(), dy.strides[0], 1, Hk.data(), N, T1.data(), T1.outerStride(), L, N, P, false);  // dY H
            for (std::int64_t i = 0; i < L; ++i) da[i] += static_cast<double>(w.eal[i]) * T1.row(i).dot(Cm.row(i));
            if (!ds_zero) da[L - 1] += static_cast<double>(state_decay(a_last)) * static_cast<double>((dS.cwiseProduct(Hk)).sum());
            dCt.noalias() += w.eal.head(L).asDiagonal() * T1;
        }
        // dU (+)= tril(M)ᵀ dY (overwrites dU when dS is zero).
        tile_product_lower_transposed<Arch>(w.M.data(), w.M.cols(), 1, dYm.data(), dy.strides[0], dU.data(), P, L, P, !ds_zero);
        // u = Δ x: dx = Δ du + D dy, dΔ = ⟨du, x⟩ + A Σ_{i≥m} dα_i; dA = Σ_m Δ_m Σ_{i≥m} dα_i.
        double acc = 0, dA_k = 0;
        for (std::int64_t t = L - 1; t >= 0; --t) {
            acc += da[t];
            dA_k += acc * static_cast<double>(w.dtl[t]);
            if (gr.ddt.data) gr.ddt(r + t, h) = static_cast<float>(static_cast<double>(dU.row(t).dot(Xm.row(t))) + A * acc);
        }
        dA_part[k * H + h] = dA_k;
        if (gr.dx.data) {
            ssd_map dXm(&gr.dx(r, h, 0), L, P, Eigen::OuterStride<>(gr.dx.strides[0]));
            dXm.noalias() = w.dtl.head(L).asDiagonal() * dU;
            if (in.D) {
                for (std::int64_t p = 0; p < P; ++p) w.dvec[p] = skip_coef(in, h, p);
                dXm.noalias() += dYm * w.dvec.asDiagonal();
            }
        }
        double* dDk = dD_part + (k * H + h) * nD;
        w.dvec.transpose() = dYm.cwiseProduct(Xm).colwise().sum();  // Σ_t dy·x per channel
        if (in.D_per_channel)
            for (std::int64_t p = 0; p < P; ++p) dDk[p] = w.dvec[p];
        else
            dDk[0] = w.dvec.template cast<double>().sum();
    }
    // The group's B and C rows: per-head terms plus the intra-chunk C·Bᵀ gradient summed over the group's heads.
    if (gr.dC.data) {
        ssd_map dCm(&gr.dC(r, g, 0), L, N, Eigen::OuterStride<>(gr.dC.strides[0]));
        dCm = dCt;
        tile_product_lower<Arch>(w.dCB.data(), w.dCB.cols(), 1, Bm.data(), in.B.strides[0], dCm.data(), gr.dC.strides[0], L, N, true);
    }
    if (gr.dB.data) {
        ssd_map dBm(&gr.dB(r, g, 0), L, N, Eigen::OuterStride<>(gr.dB.strides[0]));
        const ssd_cmap dS_group(dstates + (k * H + g * hpg) * PN, hpg * P, N, Eigen::OuterStride<>(N));  // [hpg·P, N]
        if (!ds_zero)
            tile_product<Arch>(UW.data(), UW.outerStride(), 1, dS_group.data(), N, dBm.data(), gr.dB.strides[0], L, N, hpg * P,
                               false);  // UW dS_group
        // dB (+)= tril(dCB)ᵀ C (overwrites dB when dS is zero).
        tile_product_lower_transposed<Arch>(w.dCB.data(), w.dCB.cols(), 1, Cm.data(), in.C.strides[0], dBm.data(), gr.dB.strides[0], L, N,
                                            !ds_zero);
    }
}

}  // namespace detail

/// Chunked SSD backward (spec.md §3.3), fp32, for many sequences at once: the gradients of ssd_chunked's outputs y
/// w.r.t. x, Δ, A, B, C, D and each sequence's initial state, given dy [R, H, P]. Memory beyond the gradients: the
/// state entering and the state gradient leaving every chunk (2·n_chunks·H·P·N floats), never per-token states.
/// Phase 1 is parallel over (sequence, head), phase 2 over (chunk, B/C group); dA and dD are reduced over chunks in
/// chunk order, so every result is identical for any thread count. Throws like ssd_chunked (shape_error,
/// value_error, config_error when chunk < 1).
template <cpu_backend_type Backend>
void ssd_chunked_backward(const Backend& be, const ssd_inputs<float>& in, std::span<const ssd_backward_sequence<float>> seqs,
                          std::int64_t chunk, tensor_view<const float, 3> dy, const ssd_grads<float>& grads) {
    using Arch = typename Backend::arch;
    constexpr std::string_view who = "ssd_chunked_backward";
    detail::ssd_backward_check(in, seqs, dy, grads, who);
    if (chunk < 1) throw config_error(std::string(who) + ": chunk size must be >= 1, found " + std::to_string(chunk));
    std::vector<std::int64_t> starts, lengths;
    for (const auto& s : seqs) {
        starts.push_back(s.start);
        lengths.push_back(s.length);
    }
    const chunk_layout chunks(in.n_rows(), chunk, starts, lengths);
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state(), W = chunks.width();
    const std::int64_t n_chunks = chunks.n_chunks(), nD = in.D_per_channel ? P : 1;
    detail::ssd_backward_zero_free_rows(seqs, grads, in.n_rows());

    // Phase 1 writes every entry of both before phase 2 reads it: uninitialised, reused across calls.
    detail::ssd_bwd_workspace ws(static_cast<std::size_t>(2 * n_chunks * H * P * N));
    float* const states = ws.data();
    float* const dstates = states + n_chunks * H * P * N;
    be.parallel_for(chunks.n_seq() * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::ssd_scratch w(std::max<std::int64_t>(W, 1), P, N);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t s = i / H, h = i % H;
            detail::ssd_bwd_state_sweep<Arch>(in, chunks, s, h, seqs[static_cast<std::size_t>(s)], dy, states, dstates, w);
        }
    });
    if (n_chunks == 0) return;

    std::vector<double> dA_part(static_cast<std::size_t>(n_chunks * H)), dD_part(static_cast<std::size_t>(n_chunks * H * nD));
    be.parallel_for(n_chunks * G, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::ssd_bwd_scratch& w = detail::ssd_bwd_scratch::for_thread(W, P, N, H / G);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / G, s = chunks.seq(k);
            const bool h_zero = k == chunks.first_chunk(s) && !seqs[static_cast<std::size_t>(s)].state0;
            const bool ds_zero = k + 1 == chunks.first_chunk(s + 1) && !seqs[static_cast<std::size_t>(s)].dstate_final;
            detail::ssd_bwd_chunk_group<Arch>(in, chunks, k, i % G, dy, states, dstates, h_zero, ds_zero, grads, dA_part.data(),
                                              dD_part.data(), w);
        }
    });
    for (std::int64_t h = 0; h < H; ++h) {
        if (grads.dA) {
            double acc = 0;
            for (std::int64_t k = 0; k < n_chunks; ++k) acc += dA_part[static_cast<std::size_t>(k * H + h)];
            grads.dA[h] += static_cast<float>(acc);
        }
        if (grads.dD)
            for (std::int64_t e = 0; e < nD; ++e) {
                double acc = 0;
                for (std::int64_t k = 0; k < n_chunks; ++k) acc += dD_part[static_cast<std::size_t>((k * H + h) * nD + e)];
                grads.dD[h * nD + e] += static_cast<float>(acc);
            }
    }
}

}  // namespace hymix::kernels
