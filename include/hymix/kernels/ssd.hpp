// Mamba-2 state-space duality (SSD) core: the fp64 reference recurrence (spec.md §3.2 step 5), the chunked
// prefill algorithm with a safe segment sum (§3.3) and the one-token decode step (§3.4).
// Source: Dao & Gu, "Transformers are SSMs", arXiv 2405.21060 §6–7; state-spaces/mamba ssd_minimal.py.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

/// One sequence of an SSD call: token rows [start, start + length) of the activations, and its SSM state
/// [H, P, N] (fp32, read as the initial state, overwritten with the final state). A null state means a zero
/// initial state whose final value is discarded.
template <class T>
struct ssd_sequence {
    std::int64_t start = 0;
    std::int64_t length = 0;
    T* state = nullptr;  // [H, P, N]
};

/// The per-token inputs of one SSD call; head h uses B/C group h / (H / G).
template <class T>
struct ssd_inputs {
    tensor_view<const T, 3> x;   // [R, H, P]   post-conv x
    tensor_view<const T, 2> dt;  // [R, H]      Δ (softplus, bias and clamp already applied)
    const T* A = nullptr;        // [H]         A = −exp(A_log)
    tensor_view<const T, 3> B;   // [R, G, N]
    tensor_view<const T, 3> C;   // [R, G, N]
    const T* D = nullptr;        // [H], or [H·P] when D_per_channel; null: no skip term
    bool D_per_channel = false;

    std::int64_t n_rows() const { return x.dim(0); }
    std::int64_t n_heads() const { return x.dim(1); }
    std::int64_t head_dim() const { return x.dim(2); }
    std::int64_t n_groups() const { return B.dim(1); }
    std::int64_t d_state() const { return B.dim(2); }
};

namespace detail {

/// Shape checks shared by every SSD entry point; throws shape_error naming the tensor.
template <class T, class Seq>
void ssd_check(const ssd_inputs<T>& in, std::span<const Seq> seqs, tensor_view<T, 3> y, const char* who) {
    const std::int64_t R = in.n_rows(), H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    const std::string_view w(who);
    in.dt.require_shape({R, H}, w, "dt");
    in.B.require_shape({R, -1, -1}, w, "B");
    in.C.require_shape({R, G, N}, w, "C");
    y.require_shape({R, H, P}, w, "y");
    if (G <= 0 || H % G != 0)
        throw shape_error(std::string(w) + ": " + std::to_string(H) + " heads are not divisible into " + std::to_string(G) + " B/C groups");
    if (!in.A) throw shape_error(std::string(w) + ": A is null");
    if (in.x.strides[2] != 1 || in.B.strides[2] != 1 || in.C.strides[2] != 1 || y.strides[2] != 1)
        throw shape_error(std::string(w) + ": x, B, C and y need unit inner stride");
    for (const auto& s : seqs)
        if (s.start < 0 || s.length < 0 || s.start + s.length > R)
            throw shape_error(std::string(w) + ": sequence rows [" + std::to_string(s.start) + ", " + std::to_string(s.start + s.length) +
                              ") outside [0, " + std::to_string(R) + ")");
}

template <class T>
T skip_coef(const ssd_inputs<T>& in, std::int64_t h, std::int64_t p) {
    if (!in.D) return T(0);
    return in.D_per_channel ? in.D[h * in.head_dim() + p] : in.D[h];
}

/// Row i of exp(segsum), optionally times scale[j]: out[j] = exp(min(α_i − α_j, 0)) · scale[j] for j ≤ i and
/// exactly 0 for j > i, with α the inclusive cumsum (fp64, so differences inside a chunk do not cancel). The
/// exponent is never positive and masked entries are never exponentiated (spec.md §3.3).
template <class Arch>
void segsum_exp_row(const double* alpha, std::int64_t i, std::int64_t L, const float* scale, float* out) {
    using Bf = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
    const double ai = alpha[i];
    for (std::int64_t j = 0; j <= i; ++j) out[j] = static_cast<float>(std::min(ai - alpha[j], 0.0));
    std::int64_t j = 0;
    if (scale) {
        for (; j + W <= i + 1; j += W)
            (xsimd::exp(Bf::load_unaligned(out + j)) * Bf::load_unaligned(scale + j)).store_unaligned(out + j);
        for (; j <= i; ++j) out[j] = std::exp(out[j]) * scale[j];
    } else {
        for (; j + W <= i + 1; j += W) xsimd::exp(Bf::load_unaligned(out + j)).store_unaligned(out + j);
        for (; j <= i; ++j) out[j] = std::exp(out[j]);
    }
    std::fill(out + i + 1, out + L, 0.0f);
}

}  // namespace detail

/// exp(segsum(a)) for one chunk: out[i, j] = exp(Σ_{m=j+1}^{i} a_m) for j ≤ i (1 on the diagonal), 0 above it.
/// a [L] (log-decays, ≤ 0 expected), out [L, L] fp32. Finite for any finite a ≤ 0 (spec.md §3.3, invariant 12).
template <class Arch = xsimd::default_arch>
void ssd_segsum_exp(std::span<const float> a, tensor_view<float, 2> out) {
    const auto L = static_cast<std::int64_t>(a.size());
    out.require_shape({L, L}, "ssd_segsum_exp: out");
    if (out.strides[1] != 1) throw shape_error("ssd_segsum_exp: out needs unit inner stride");
    std::vector<double> alpha(a.size());
    double acc = 0;
    for (std::int64_t i = 0; i < L; ++i) alpha[i] = acc += a[i];
    for (std::int64_t i = 0; i < L; ++i) detail::segsum_exp_row<Arch>(alpha.data(), i, L, nullptr, &out(i, 0));
}

/// Reference SSD in double precision, the recurrence as written (spec.md §3.2 step 5), one sequence:
///   h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ,   y_t = h_t C_t + D x_t.
/// Rows [seq.start, seq.start + seq.length) of `in` are consumed; seq.state [H, P, N] is updated in place
/// (null: zeros). y [R, H, P] receives those rows only. Throws shape_error on inconsistent shapes.
inline void ssd_ref(const ssd_inputs<double>& in, const ssd_sequence<double>& seq, tensor_view<double, 3> y) {
    detail::ssd_check(in, std::span<const ssd_sequence<double>>(&seq, 1), y, "ssd_ref");
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    std::vector<double> local;
    double* S = seq.state;
    if (!S) {
        local.assign(static_cast<std::size_t>(H * P * N), 0.0);
        S = local.data();
    }
    for (std::int64_t t = seq.start; t < seq.start + seq.length; ++t)
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t g = h / (H / G);
            const double delta = in.dt(t, h);
            const double dA = std::exp(delta * in.A[h]);
            for (std::int64_t p = 0; p < P; ++p) {
                double* s = S + (h * P + p) * N;
                double acc = 0;
                for (std::int64_t n = 0; n < N; ++n) {
                    s[n] = dA * s[n] + delta * in.x(t, h, p) * in.B(t, g, n);
                    acc += s[n] * in.C(t, g, n);
                }
                y(t, h, p) = acc + detail::skip_coef(in, h, p) * in.x(t, h, p);
            }
        }
}

/// Chunked SSD (spec.md §3.3), fp32, for many sequences at once. Chunk c of a sequence covers its tokens
/// [cQ, min(len, (c+1)Q)); every sequence starts from its own state. y [R, H, P] receives the rows of every
/// sequence (other rows are not written). Parallel over (chunk, group) for C·Bᵀ, then over (sequence, head).
/// Throws shape_error on inconsistent shapes, config_error when chunk < 1.
template <cpu_backend_type Backend>
void ssd_chunked(const Backend& be, const ssd_inputs<float>& in, std::span<const ssd_sequence<float>> seqs,
                 std::int64_t chunk, tensor_view<float, 3> y) {
    using Arch = typename Backend::arch;
    using RM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using CMap = Eigen::Map<const RM, Eigen::Unaligned, Eigen::OuterStride<>>;
    using MMap = Eigen::Map<RM, Eigen::Unaligned, Eigen::OuterStride<>>;
    detail::ssd_check(in, seqs, y, "ssd_chunked");
    if (chunk < 1) throw config_error("ssd_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    const std::int64_t heads_per_group = H / G;
    const std::int64_t n_seq = static_cast<std::int64_t>(seqs.size());

    // Chunk table: (row start, length) of every chunk of every sequence; first_chunk[s] indexes it.
    struct chunk_info {
        std::int64_t row, len;
    };
    std::vector<chunk_info> chunks;
    std::vector<std::int64_t> first_chunk(static_cast<std::size_t>(n_seq + 1), 0);
    for (std::int64_t s = 0; s < n_seq; ++s) {
        first_chunk[s] = static_cast<std::int64_t>(chunks.size());
        for (std::int64_t c0 = 0; c0 < seqs[s].length; c0 += chunk)
            chunks.push_back({seqs[s].start + c0, std::min(chunk, seqs[s].length - c0)});
    }
    first_chunk[n_seq] = static_cast<std::int64_t>(chunks.size());
    const std::int64_t n_chunks = first_chunk[n_seq];
    if (n_chunks == 0) return;
    const std::int64_t Q = std::min<std::int64_t>(chunk, std::max_element(chunks.begin(), chunks.end(), [](auto a, auto b) {
                                                        return a.len < b.len;
                                                    })->len);

    // Stage 1: CB[k, g] = C_chunk · B_chunkᵀ  [L, L], shared by the heads of group g.
    std::vector<float> cb(static_cast<std::size_t>(n_chunks * G * Q * Q));
    be.parallel_for(n_chunks * G, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / G, g = i % G, L = chunks[k].len, r = chunks[k].row;
            CMap Cm(&in.C(r, g, 0), L, N, Eigen::OuterStride<>(in.C.strides[0]));
            CMap Bm(&in.B(r, g, 0), L, N, Eigen::OuterStride<>(in.B.strides[0]));
            MMap out(cb.data() + i * Q * Q, L, L, Eigen::OuterStride<>(Q));
            out.noalias() = Cm * Bm.transpose();
        }
    });

    // Stage 2: per (sequence, head), chunks in order: intra-chunk, inter-chunk, state passing. Every product is
    // an Eigen GEMM on strided maps; y is written in place.
    using Vec = Eigen::Matrix<float, Eigen::Dynamic, 1>;
    be.parallel_for(n_seq * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<double> alpha(static_cast<std::size_t>(Q));
        Vec dtl(Q), decay(Q), to_end(Q), Dvec(P);
        RM M(Q, Q), Xd(Q, P), Xw(Q, P), Tmp(Q, P), local_state(P, N);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t s = i / H, h = i % H, g = h / heads_per_group;
            if (seqs[s].length == 0) continue;
            float* state_ptr = seqs[s].state ? seqs[s].state + h * P * N : local_state.data();
            if (!seqs[s].state) local_state.setZero();
            MMap Hs(state_ptr, P, N, Eigen::OuterStride<>(N));
            const double A = in.A[h];
            for (std::int64_t p = 0; p < P; ++p) Dvec[p] = detail::skip_coef(in, h, p);
            for (std::int64_t k = first_chunk[s]; k < first_chunk[s + 1]; ++k) {
                const std::int64_t r = chunks[k].row, L = chunks[k].len;
                CMap Xm(&in.x(r, h, 0), L, P, Eigen::OuterStride<>(in.x.strides[0]));
                CMap Bm(&in.B(r, g, 0), L, N, Eigen::OuterStride<>(in.B.strides[0]));
                CMap Cm(&in.C(r, g, 0), L, N, Eigen::OuterStride<>(in.C.strides[0]));
                MMap Ym(&y(r, h, 0), L, P, Eigen::OuterStride<>(y.strides[0]));
                double acc = 0;
                for (std::int64_t t = 0; t < L; ++t) {
                    dtl[t] = in.dt(r + t, h);
                    alpha[t] = acc += static_cast<double>(dtl[t]) * A;
                }
                const double a_last = alpha[L - 1];
                for (std::int64_t t = 0; t < L; ++t) {
                    decay[t] = static_cast<float>(std::exp(std::min(alpha[t], 0.0)));
                    to_end[t] = static_cast<float>(std::exp(std::min(a_last - alpha[t], 0.0))) * dtl[t];
                }
                // M = (C Bᵀ) ⊙ exp(segsum), lower triangular.
                const float* cbk = cb.data() + (k * G + g) * Q * Q;
                for (std::int64_t t = 0; t < L; ++t) detail::segsum_exp_row<Arch>(alpha.data(), t, L, cbk + t * Q, &M(t, 0));
                auto Xb = Xd.topRows(L);
                Xb.noalias() = dtl.head(L).asDiagonal() * Xm;
                // Intra-chunk, then inter-chunk Y_off_t = exp(α_t) · H C_t, then the skip D·x.
                Ym.noalias() = M.topLeftCorner(L, L).template triangularView<Eigen::Lower>() * Xb;
                auto Tb = Tmp.topRows(L);
                Tb.noalias() = Cm * Hs.transpose();
                Ym.noalias() += decay.head(L).asDiagonal() * Tb;
                if (in.D) Ym.noalias() += Xm * Dvec.asDiagonal();
                // State passing: H ← exp(α_last) H + Σ_t exp(α_last − α_t) Δ_t x_t B_tᵀ.
                auto Xwb = Xw.topRows(L);
                Xwb.noalias() = to_end.head(L).asDiagonal() * Xm;
                Hs *= static_cast<float>(std::exp(std::min(a_last, 0.0)));
                Hs.noalias() += Xwb.transpose() * Bm;
            }
        }
    });
}

/// Decode step (spec.md §3.4), fp32: every sequence holds exactly one token (shape_error otherwise);
///   state ← state · exp(Δ A) + Δ (x ⊗ B),  y = state · C + D x.
/// Parallel over (sequence, head); SIMD over the state width N.
template <cpu_backend_type Backend>
void ssd_step(const Backend& be, const ssd_inputs<float>& in, std::span<const ssd_sequence<float>> seqs,
              tensor_view<float, 3> y) {
    using Bf = xsimd::batch<float, typename Backend::arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
    detail::ssd_check(in, seqs, y, "ssd_step");
    for (std::size_t s = 0; s < seqs.size(); ++s)
        if (seqs[s].length != 1)
            throw shape_error("ssd_step: sequence " + std::to_string(s) + " has " + std::to_string(seqs[s].length) +
                              " tokens, the decode step takes exactly 1");
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    const std::int64_t heads_per_group = H / G, Nv = N / W * W;
    const std::int64_t n_seq = static_cast<std::int64_t>(seqs.size());
    be.parallel_for(n_seq * H, std::max<std::int64_t>(1, 4096 / (P * N)), [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> local;
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t s = i / H, h = i % H, g = h / heads_per_group, t = seqs[s].start;
            float* S = seqs[s].state ? seqs[s].state + h * P * N : nullptr;
            if (!S) {
                local.assign(static_cast<std::size_t>(P * N), 0.0f);
                S = local.data();
            }
            const float delta = in.dt(t, h);
            const float dA = std::exp(delta * in.A[h]);
            const float* Bt = &in.B(t, g, 0);
            const float* Ct = &in.C(t, g, 0);
            const float* xt = &in.x(t, h, 0);
            float* yt = &y(t, h, 0);
            const Bf vdA(dA);
            for (std::int64_t p = 0; p < P; ++p) {
                float* sp = S + p * N;
                const float dx = delta * xt[p];
                const Bf vdx(dx);
                Bf acc(0.0f);
                std::int64_t n = 0;
                for (; n < Nv; n += W) {
                    const Bf sv = xsimd::fma(Bf::load_unaligned(sp + n), vdA, vdx * Bf::load_unaligned(Bt + n));
                    sv.store_unaligned(sp + n);
                    acc = xsimd::fma(sv, Bf::load_unaligned(Ct + n), acc);
                }
                float r = xsimd::hadd(acc);
                for (; n < N; ++n) {
                    sp[n] = sp[n] * dA + dx * Bt[n];
                    r += sp[n] * Ct[n];
                }
                yt[p] = r + detail::skip_coef(in, h, p) * xt[p];
            }
        }
    });
}

}  // namespace hymix::kernels
