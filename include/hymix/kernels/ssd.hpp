// Mamba-2 state-space duality (SSD) core: the fp64 reference recurrence (spec.md §3.2 step 5), the chunked prefill
// algorithm (§3.3) as named stages, each with an fp64 twin, and the one-token decode step (§3.4).
// Source: Dao & Gu, "Transformers are SSMs", arXiv 2405.21060 §6–7; stage split as in state-spaces/mamba ssd_combined.py.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/chunk_layout.hpp"
#include "hymix/kernels/lane_sum.hpp"
#include "hymix/kernels/tile_product.hpp"
#include "hymix/kernels/view_checks.hpp"

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

// Argument checks. Every public entry point (whole-call kernels, stages and their fp64 twins) checks, in release
// builds: shapes and stride assumptions of every view (shape_error naming it), A finite and ≤ 0, Δ ≥ 0 and not +∞ on
// the rows it reads (value_error), sequences inside the rows and sharing neither rows nor states. Together these cost
// O(R·H + H + n_seq) compares: 1/(P·N) of the decode step's own work, so the decode path keeps them too.
// Skipped on every path, on purpose: the finiteness of x, B, C, D and of the states (as many reads as the decode step's
// own work; a NaN there, like a NaN Δ, propagates to its own sequence's outputs and state only, which is the documented
// behaviour, spec.md §8 16), whether a state pointer really holds [H, P, N] values (a raw pointer carries no size), and
// aliasing between y and the inputs. The tile functions below are internal and check nothing.

/// Shapes, strides and parameter values of the inputs, checked by every SSD entry point (shape_error / value_error
/// naming the argument). x, B and C rows are mapped as Eigen matrices: their last dimension needs unit stride; dt is
/// read element by element (any strides).
template <class T>
void ssd_check_inputs(const ssd_inputs<T>& in, std::string_view who) {
    const std::int64_t R = in.n_rows(), H = in.n_heads(), G = in.n_groups(), N = in.d_state();
    in.dt.require_shape({R, H}, who, "dt [R, H]");
    in.B.require_shape({R, -1, -1}, who, "B [R, G, N]");
    in.C.require_shape({R, G, N}, who, "C [R, G, N]");
    if (G <= 0 || H % G != 0)
        throw shape_error(std::string(who) + ": " + std::to_string(H) + " heads are not divisible into " + std::to_string(G) + " B/C groups");
    if (!in.A) throw shape_error(std::string(who) + ": A is null");
    require_unit_inner_stride(in.x, who, "x [R, H, P]");
    require_unit_inner_stride(in.B, who, "B [R, G, N]");
    require_unit_inner_stride(in.C, who, "C [R, G, N]");
    // A = −exp(A_log) ≤ 0: the chunked form clamps every segment sum of Δ·A to ≤ 0, exact only for A ≤ 0. H values.
    for (std::int64_t h = 0; h < H; ++h)
        if (!(in.A[h] <= T(0)) || !std::isfinite(in.A[h]))
            throw value_error(std::string(who) + ": A[" + std::to_string(h) + "] = " + std::to_string(in.A[h]) +
                              "; A = -exp(A_log) must be finite and <= 0");
}

/// Δ on rows [r0, r0 + len): ≥ 0 and not +∞ (value_error), as softplus and the dt clamp produce. A NaN is let
/// through on purpose: like a NaN in x it stays in its own sequence's outputs and state (spec.md §8, 16), while
/// rejecting it would fail every other sequence of the batch. Cost: one compare per (row, head).
template <class T>
void ssd_check_dt_rows(const ssd_inputs<T>& in, std::int64_t r0, std::int64_t len, std::string_view who) {
    const std::int64_t H = in.n_heads();
    for (std::int64_t t = r0; t < r0 + len; ++t)
        for (std::int64_t h = 0; h < H; ++h) {
            const T d = in.dt(t, h);
            if (d < T(0) || d == std::numeric_limits<T>::infinity())
                throw value_error(std::string(who) + ": dt[" + std::to_string(t) + ", " + std::to_string(h) + "] = " + std::to_string(d) +
                                  "; the step size must be >= 0 and finite");
        }
}

/// The sequences of one call: rows inside [0, R), no two sharing a row or any part of a state ([H, P, N] each),
/// since both would be written by two tasks at once. Pairwise for up to 64 sequences (no allocation on the decode
/// path), sorted otherwise.
template <class T>
void ssd_check_seqs(std::span<const ssd_sequence<T>> seqs, std::int64_t R, std::int64_t state_size, std::string_view who) {
    for (const auto& s : seqs)
        if (s.start < 0 || s.length < 0 || s.start + s.length > R)
            throw shape_error(std::string(who) + ": sequence rows [" + std::to_string(s.start) + ", " + std::to_string(s.start + s.length) +
                              ") outside [0, " + std::to_string(R) + ")");
    const auto overlap_rows = [](const ssd_sequence<T>& a, const ssd_sequence<T>& b) {
        return a.length > 0 && b.length > 0 && a.start < b.start + b.length && b.start < a.start + a.length;
    };
    const auto overlap_state = [&](const ssd_sequence<T>& a, const ssd_sequence<T>& b) {
        return a.state && b.state && state_size > 0 && a.state < b.state + state_size && b.state < a.state + state_size;
    };
    const auto fail = [&](bool rows) {
        throw shape_error(std::string(who) + (rows ? ": two sequences of one call share token rows" : ": two sequences of one call share a state"));
    };
    const std::size_t n = seqs.size();
    if (n <= 64) {
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = i + 1; j < n; ++j) {
                if (overlap_rows(seqs[i], seqs[j])) fail(true);
                if (overlap_state(seqs[i], seqs[j])) fail(false);
            }
        return;
    }
    std::vector<std::pair<std::int64_t, std::int64_t>> rows;
    std::vector<const T*> states;
    for (const auto& s : seqs) {
        if (s.length > 0) rows.emplace_back(s.start, s.start + s.length);
        if (s.state) states.push_back(s.state);
    }
    std::sort(rows.begin(), rows.end());
    for (std::size_t i = 1; i < rows.size(); ++i)
        if (rows[i].first < rows[i - 1].second) fail(true);
    std::sort(states.begin(), states.end());
    for (std::size_t i = 1; i < states.size(); ++i)
        if (states[i] < states[i - 1] + state_size) fail(false);
}

/// Every check of a whole-call entry point (ssd_ref, ssd_chunked, ssd_step).
template <class T>
void ssd_check(const ssd_inputs<T>& in, std::span<const ssd_sequence<T>> seqs, tensor_view<T, 3> y, std::string_view who) {
    ssd_check_inputs(in, who);
    y.require_shape({in.n_rows(), in.n_heads(), in.head_dim()}, who, "y [R, H, P]");
    require_unit_inner_stride(y, who, "y [R, H, P]");
    ssd_check_seqs(seqs, in.n_rows(), in.n_heads() * in.head_dim() * in.d_state(), who);
    for (const auto& s : seqs) ssd_check_dt_rows(in, s.start, s.length, who);
}

/// Checks of a stage: the inputs, the layout made for them and (when the stage reads dt) Δ on the chunk rows.
template <class T>
void ssd_check_stage(const ssd_inputs<T>& in, const chunk_layout& chunks, bool reads_dt, std::string_view who) {
    ssd_check_inputs(in, who);
    chunks.require_rows(in.n_rows(), who, "x");
    if (reads_dt)
        for (std::int64_t k = 0; k < chunks.n_chunks(); ++k) ssd_check_dt_rows(in, chunks.row(k), chunks.length(k), who);
}

/// The sequences handed to a state-passing stage must be those the layout was made from.
template <class T>
void ssd_check_layout_seqs(std::span<const ssd_sequence<T>> seqs, const chunk_layout& chunks, std::string_view who) {
    bool same = static_cast<std::int64_t>(seqs.size()) == chunks.n_seq();
    for (std::size_t s = 0; same && s < seqs.size(); ++s)
        same = seqs[s].start == chunks.seq_start(static_cast<std::int64_t>(s)) && seqs[s].length == chunks.seq_length(static_cast<std::int64_t>(s));
    if (!same)
        throw shape_error(std::string(who) + ": the sequences differ from those the chunk layout was made from (" +
                          std::to_string(seqs.size()) + " sequences, layout of " + std::to_string(chunks.n_seq()) + ")");
}

template <class T>
T skip_coef(const ssd_inputs<T>& in, std::int64_t h, std::int64_t p) {
    if (!in.D) return T(0);
    return in.D_per_channel ? in.D[h * in.head_dim() + p] : in.D[h];
}

/// out[j] = float(min(α_i − α_j, 0)) for j ≤ i: the segment sums of row i, differences taken in fp64 and rounded
/// once to fp32, with std::min's semantics (a NaN difference stays NaN). In SIMD where Arch has a packed fp64 → fp32
/// conversion (AVX-512, AVX; the compiler leaves this loop scalar: the comparison is control flow to it); each entry
/// takes the same two operations, so the bits are the scalar loop's. A template on Arch, like the kernels that call
/// it, so that translation units built for different architectures never share one copy.
template <class Arch>
void segsum_row(const double* alpha, std::int64_t i, float* out) {
    const double ai = alpha[i];
    std::int64_t j = 0;
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
        const __m512d va = _mm512_set1_pd(ai), zero = _mm512_setzero_pd();
        for (; j + 8 <= i + 1; j += 8)  // min(0, d) is 0 < d ? 0 : d, which is std::min(d, 0.0), NaN included
            _mm256_storeu_ps(out + j, _mm512_cvtpd_ps(_mm512_min_pd(zero, _mm512_sub_pd(va, _mm512_loadu_pd(alpha + j)))));
    }
#endif
#if defined(__AVX__)
    if constexpr (std::is_base_of_v<xsimd::avx, Arch> && !std::is_base_of_v<xsimd::avx512f, Arch>) {
        const __m256d va = _mm256_set1_pd(ai), zero = _mm256_setzero_pd();
        for (; j + 4 <= i + 1; j += 4)
            _mm_storeu_ps(out + j, _mm256_cvtpd_ps(_mm256_min_pd(zero, _mm256_sub_pd(va, _mm256_loadu_pd(alpha + j)))));
    }
#endif
    for (; j <= i; ++j) out[j] = static_cast<float>(std::min(ai - alpha[j], 0.0));
}

/// Row i of exp(segsum), optionally times scale[j]: out[j] = exp(min(α_i − α_j, 0)) · scale[j] for j ≤ i and
/// exactly 0 for j > i (left as they were without `zero_above`, for callers that read the lower triangle only), with
/// α the inclusive cumsum (fp64, so differences inside a chunk do not cancel). The exponent is never positive and
/// masked entries are never exponentiated (spec.md §3.3).
template <class Arch>
void segsum_exp_row(const double* alpha, std::int64_t i, std::int64_t L, const float* scale, float* out, bool zero_above = true) {
    using Bf = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
    segsum_row<Arch>(alpha, i, out);
    std::int64_t j = 0;
    if (scale) {
        for (; j + W <= i + 1; j += W)
            (xsimd::exp(Bf::load_unaligned(out + j)) * Bf::load_unaligned(scale + j)).store_unaligned(out + j);
        for (; j <= i; ++j) out[j] = std::exp(out[j]) * scale[j];
    } else {
        for (; j + W <= i + 1; j += W) xsimd::exp(Bf::load_unaligned(out + j)).store_unaligned(out + j);
        for (; j <= i; ++j) out[j] = std::exp(out[j]);
    }
    if (zero_above) std::fill(out + i + 1, out + L, 0.0f);
}

}  // namespace detail

/// exp(segsum(a)) for one chunk: out[i, j] = exp(Σ_{m=j+1}^{i} a_m) for j ≤ i (1 on the diagonal), 0 above it.
/// a [L] (log-decays, ≤ 0 expected), out [L, L] fp32. Finite for any finite a ≤ 0 (spec.md §3.3, invariant 12).
template <class Arch = xsimd::default_arch>
void ssd_segsum_exp(std::span<const float> a, tensor_view<float, 2> out) {
    const auto L = static_cast<std::int64_t>(a.size());
    out.require_shape({L, L}, "ssd_segsum_exp", "out [L, L]");
    detail::require_unit_inner_stride(out, "ssd_segsum_exp", "out [L, L]");
    for (std::int64_t i = 0; i < L; ++i)  // the clamp of α_i − α_j to ≤ 0 is exact only for a ≤ 0; NaN passes
        if (a[static_cast<std::size_t>(i)] > 0.f)
            throw value_error("ssd_segsum_exp: a[" + std::to_string(i) + "] = " + std::to_string(a[static_cast<std::size_t>(i)]) +
                              " is positive; log-decays must be <= 0");
    std::vector<double> alpha(a.size());
    double acc = 0;
    for (std::int64_t i = 0; i < L; ++i) alpha[i] = acc += a[i];
    for (std::int64_t i = 0; i < L; ++i) detail::segsum_exp_row<Arch>(alpha.data(), i, L, nullptr, &out(i, 0));
}

/// Reference SSD in double precision, the recurrence as written (spec.md §3.2 step 5), one sequence:
///   h_t = exp(Δ_t A) h_{t−1} + Δ_t x_t B_tᵀ,   y_t = h_t C_t + D x_t.
/// Rows [seq.start, seq.start + seq.length) of `in` are consumed; seq.state [H, P, N] is updated in place
/// (null: zeros). y [R, H, P] receives those rows only. Throws shape_error on inconsistent shapes, value_error on A > 0
/// or a negative / infinite Δ.
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

// ---------------------------------------------------------------------------------------------------------------
// The chunked algorithm (spec.md §3.3) as named stages over a chunk_layout (every sequence cut into chunks of at most
// Q tokens; W = chunks.width() the longest). Each stage has a public fp32 form, parallel over its independent work
// items through the backend, and an fp64 twin `<stage>_ref` written as plain loops:
//   ssd_chunk_cumsum   α = Σ_{m≤t} Δ_m A per chunk and head, in fp64             → dA_cumsum  [R, H] (fp64)
//   ssd_chunk_cb       C·Bᵀ per chunk and B/C group                              → cb         [n_chunks, G, W, W]
//   ssd_chunk_state    each chunk's final state from its own inputs (zero start) → states     [n_chunks, H, P, N]
//   ssd_state_passing  H_{c+1} = exp(α_last) H_c + S_c from each sequence's own initial state
//                                                                                → chunk_init [n_chunks, H, P, N], final state
//   ssd_chunk_scan     y = (C·Bᵀ ⊙ exp(segsum)) (Δ x) + exp(α) C·H_c + D x         → y          [R, H, P]
// The cumsum is kept in fp64 because segment sums α_i − α_j are differences of two such sums (one value per token and
// head, so the cost is nil). ssd_chunked runs ssd_chunk_cb as such and the other four stages' own per-(chunk, head)
// tile code fused per (sequence, head), so the running state stays in cache, and adds each chunk's state onto the
// decayed running state inside the chunk-state GEMM; its results equal the composition of the five public stages to
// fp32 rounding. A device backend implements the five stages.
// ---------------------------------------------------------------------------------------------------------------

/// The chunk layout of an SSD call: sequence s of `seqs` in chunks of at most `chunk` tokens.
/// Throws config_error when chunk < 1, shape_error when a sequence lies outside [0, n_rows).
template <class T>
chunk_layout ssd_chunk_layout(std::span<const ssd_sequence<T>> seqs, std::int64_t n_rows, std::int64_t chunk) {
    std::vector<std::int64_t> starts, lengths;
    starts.reserve(seqs.size());
    lengths.reserve(seqs.size());
    for (const auto& s : seqs) {
        starts.push_back(s.start);
        lengths.push_back(s.length);
    }
    return chunk_layout(n_rows, chunk, starts, lengths);
}

namespace detail {

using ssd_row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ssd_cmap = Eigen::Map<const ssd_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ssd_map = Eigen::Map<ssd_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Scratch of one task of the fp32 stages, for chunks of up to W rows.
struct ssd_scratch {
    std::vector<double> alpha;                      // [W]    α of the chunk
    Eigen::VectorXf dtl, decay, dvec;               // [W]    Δ, exp(α); [P] skip coefficients
    ssd_row_matrix M, Tmp, Xw;                      // [W, W] [W, P] [W, P]
    std::vector<float> st;                          // [N, P] a state transposed (the layout the scan's products read)
    ssd_scratch(std::int64_t W, std::int64_t P, std::int64_t N)
        : alpha(static_cast<std::size_t>(W)), dtl(W), decay(W), dvec(P), M(W, W), Tmp(W, P), Xw(W, P), st(static_cast<std::size_t>(N * P)) {}
};

/// exp(α_last), the decay of a state over a whole chunk (α ≤ 0).
inline float state_decay(double a_last) { return static_cast<float>(std::exp(std::min(a_last, 0.0))); }

/// Stage ssd_chunk_cumsum, one (chunk, head): α_t = Σ_{m≤t} Δ_m A_h over the L rows from row r, in fp64.
inline void ssd_cumsum_tile(const ssd_inputs<float>& in, std::int64_t h, std::int64_t r, std::int64_t L, double* alpha) {
    const double A = in.A[h];
    double acc = 0;
    for (std::int64_t t = 0; t < L; ++t) alpha[t] = acc += static_cast<double>(in.dt(r + t, h)) * A;
}

/// Stage ssd_chunk_cb, one (chunk, group): out [L, L] (row stride ld) = C_chunk · B_chunkᵀ, as C · (Bᵀ) with Bᵀ
/// copied into bt [N, L] (so B's columns are rows of the register-tile product).
template <class Arch>
void ssd_cb_tile(const ssd_inputs<float>& in, std::int64_t g, std::int64_t r, std::int64_t L, float* out, std::int64_t ld,
                 std::vector<float>& bt) {
    const std::int64_t N = in.d_state();
    bt.resize(static_cast<std::size_t>(N * L));
    transpose_rows(&in.B(r, g, 0), in.B.strides[0], L, N, bt.data(), L);
    tile_product<Arch>(&in.C(r, g, 0), in.C.strides[0], 1, bt.data(), L, out, ld, L, L, N, false);
}

/// Xw [L, P] (row stride P, in w.Xw) = diag(exp(α_last − α) Δ) x of one (chunk, head): the inputs the chunk's state
/// update multiplies with B, shared by both state layouts.
inline float* ssd_state_inputs(const ssd_inputs<float>& in, std::int64_t h, std::int64_t r, std::int64_t L, const double* alpha,
                               ssd_scratch& w) {
    const std::int64_t P = in.head_dim();
    const double a_last = alpha[L - 1];
    float* xw = w.Xw.data();
    for (std::int64_t t = 0; t < L; ++t) {
        const float s = static_cast<float>(std::exp(std::min(a_last - alpha[t], 0.0))) * in.dt(r + t, h);
        const float* x = &in.x(r + t, h, 0);
        for (std::int64_t p = 0; p < P; ++p) xw[t * P + p] = s * x[p];
    }
    return xw;
}

/// Stage ssd_chunk_state, one (chunk, head): S_c = Σ_t exp(α_last − α_t) Δ_t x_t B_tᵀ (the chunk's final state from a
/// zero initial state) into out [P, N]: one register-tile product (Xwᵀ · B, Xw = diag(exp(α_last − α) Δ) x). With
/// `onto`, out holds the state entering the chunk and becomes stage ssd_state_passing's update exp(α_last)·out + S_c
/// (how the fused kernel runs stages 3 and 4): out is scaled first, then S_c is added, one pass of
/// tile_product_terms tokens at a time (once for chunks up to that length).
template <class Arch>
void ssd_chunk_state_tile(const ssd_inputs<float>& in, std::int64_t h, std::int64_t r, std::int64_t L, const double* alpha, float* out,
                          bool onto, ssd_scratch& w) {
    const std::int64_t P = in.head_dim(), N = in.d_state(), g = h / (in.n_heads() / in.n_groups());
    const double a_last = alpha[L - 1];
    float* xw = ssd_state_inputs(in, h, r, L, alpha, w);
    if (onto) {
        const float d = state_decay(a_last);
        for (std::int64_t i = 0; i < P * N; ++i) out[i] *= d;
    }
    // S [P, N] (+)= Xwᵀ B: A(p, t) = xw[t·P + p], B = the chunk's B rows.
    tile_product<Arch>(xw, 1, P, &in.B(r, g, 0), in.B.strides[0], out, N, P, N, L, onto);
}

/// ssd_chunk_state_tile's update with the state held transposed, st [N, P] (row stride P): st ← exp(α_last)·st + S_cᵀ,
/// S_cᵀ = Bᵀ Xw. Each entry takes the same terms in the same order, with the same rounding, as ssd_chunk_state_tile's,
/// so both give the same bits. The fused kernel keeps a sequence's state in this layout across its chunks.
template <class Arch>
void ssd_chunk_state_tile_t(const ssd_inputs<float>& in, std::int64_t h, std::int64_t r, std::int64_t L, const double* alpha, float* st,
                            ssd_scratch& w) {
    const std::int64_t P = in.head_dim(), N = in.d_state(), g = h / (in.n_heads() / in.n_groups());
    const double a_last = alpha[L - 1];
    float* xw = ssd_state_inputs(in, h, r, L, alpha, w);
    const float d = state_decay(a_last);
    for (std::int64_t i = 0; i < P * N; ++i) st[i] *= d;
    // stᵀ [N, P] += Bᵀ Xw: A(n, t) = B[t, n] (down the chunk's B rows), B-operand = Xw's rows.
    tile_product<Arch>(&in.B(r, g, 0), 1, in.B.strides[0], xw, P, st, P, N, P, L, true);
}

/// Copies a [rows, cols] row-major matrix into dst as [cols, rows].
inline void transpose_into(const float* src, std::int64_t rows, std::int64_t cols, float* dst) {
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

/// Stage ssd_state_passing, one chunk of one (sequence, head): H ← exp(α_last) H + S_c over the n = P·N entries.
/// When h_in is given it first receives H, the state entering the chunk; it may alias sc.
inline void ssd_state_pass_tile(float* hs, const float* sc, float* h_in, std::int64_t n, double a_last) {
    const float d = state_decay(a_last);
    if (h_in) {
        for (std::int64_t i = 0; i < n; ++i) {
            const float s = sc[i];
            h_in[i] = hs[i];
            hs[i] = d * hs[i] + s;
        }
    } else {
        for (std::int64_t i = 0; i < n; ++i) hs[i] = d * hs[i] + sc[i];
    }
}

/// Stage ssd_chunk_scan, one (chunk, head): rows r.. r+L−1 of y [R, H, P] for head h from the state entering the
/// chunk, given transposed as h0t [N, P] (row stride P), and cb [L, L] (row stride ld_cb) of the head's group:
///   Y = tril(C Bᵀ ⊙ exp(segsum)) (Δ x) + diag(exp α) C h0ᵀ + x diag(D).
/// Register-tile products (tile_product.hpp) reading x, C and h0t where they lie: the read-out of the entering state
/// C·h0ᵀ (skipped when h0_zero), scaled by exp(α) per row, then the intra-chunk term added by the lower-triangular
/// product with Δ folded into M's columns (entries above the diagonal neither written nor read); y is written in
/// place. (Packing x's rows, which lie H·P floats apart, was measured and made nothing faster: docs/scaling_16core.md.)
template <class Arch>
void ssd_chunk_scan_tile(const ssd_inputs<float>& in, std::int64_t h, std::int64_t r, std::int64_t L, const float* cb,
                         std::int64_t ld_cb, const double* alpha, const float* h0t, bool h0_zero, tensor_view<float, 3> y,
                         ssd_scratch& w) {
    const std::int64_t P = in.head_dim(), N = in.d_state(), g = h / (in.n_heads() / in.n_groups());
    float* yr = &y(r, h, 0);
    const std::int64_t ldy = y.strides[0];
    for (std::int64_t t = 0; t < L; ++t) {
        w.dtl[t] = in.dt(r + t, h);
        w.decay[t] = static_cast<float>(std::exp(std::min(alpha[t], 0.0)));
    }
    // M = (C Bᵀ) ⊙ exp(segsum) · diag(Δ), lower triangular (tile_product_lower reads nothing above the diagonal, so
    // it is not zeroed).
    const std::int64_t ldm = w.M.cols();
    const float* dtl = w.dtl.data();
    for (std::int64_t t = 0; t < L; ++t) {
        float* m = w.M.data() + t * ldm;
        segsum_exp_row<Arch>(alpha, t, L, cb + t * ld_cb, m, false);
        for (std::int64_t j = 0; j <= t; ++j) m[j] *= dtl[j];
    }
    // Inter-chunk Y_off = diag(exp α) C h0ᵀ, then the intra-chunk M x added, then the skip D·x.
    if (!h0_zero) {
        tile_product<Arch>(&in.C(r, g, 0), in.C.strides[0], 1, h0t, P, yr, ldy, L, P, N, false);
        for (std::int64_t t = 0; t < L; ++t) {
            const float d = w.decay[t];
            float* yt = yr + t * ldy;
            for (std::int64_t p = 0; p < P; ++p) yt[p] *= d;
        }
    }
    tile_product_lower<Arch>(w.M.data(), ldm, 1, &in.x(r, h, 0), in.x.strides[0], yr, ldy, L, P, !h0_zero);  // overwrites y when h0 = 0
    if (in.D) {
        for (std::int64_t p = 0; p < P; ++p) w.dvec[p] = skip_coef(in, h, p);
        const float* dv = w.dvec.data();
        for (std::int64_t t = 0; t < L; ++t) {
            const float* x = &in.x(r + t, h, 0);
            float* yt = yr + t * ldy;
            for (std::int64_t p = 0; p < P; ++p) yt[p] += x[p] * dv[p];
        }
    }
}

/// α of chunk k, head h, gathered from dA_cumsum [R, H] into a contiguous buffer.
template <class T>
void gather_alpha(tensor_view<const T, 2> dA, const chunk_layout& chunks, std::int64_t k, std::int64_t h, double* alpha) {
    for (std::int64_t t = 0; t < chunks.length(k); ++t) alpha[t] = dA(chunks.row(k) + t, h);
}

template <class T>
void ssd_check_cb(const tensor_view<T, 4>& cb, const ssd_inputs<std::remove_const_t<T>>& in, const chunk_layout& chunks, std::string_view who) {
    cb.require_shape({chunks.n_chunks(), in.n_groups(), chunks.width(), chunks.width()}, who, "cb [n_chunks, G, W, W]");
    require_unit_inner_stride(cb, who, "cb [n_chunks, G, W, W]");
}

template <class T>
void ssd_check_states(const tensor_view<T, 4>& st, const ssd_inputs<std::remove_const_t<T>>& in, const chunk_layout& chunks,
                      std::string_view who, std::string_view name) {
    st.require_shape({chunks.n_chunks(), in.n_heads(), in.head_dim(), in.d_state()}, who, name);
    require_dense_matrices(st, who, name);
}

}  // namespace detail

/// Stage 1, fp32 inputs: dA_cumsum [R, H] (fp64) = the inclusive cumsum of Δ·A within each chunk, on the rows of the
/// layout's chunks (other rows untouched). Parallel over (chunk, head).
template <cpu_backend_type Backend>
void ssd_chunk_cumsum(const Backend& be, const ssd_inputs<float>& in, const chunk_layout& chunks,
                      tensor_view<double, 2> dA_cumsum) {  // [R, H]
    constexpr std::string_view who = "ssd_chunk_cumsum";
    detail::ssd_check_stage(in, chunks, true, who);
    const std::int64_t H = in.n_heads();
    dA_cumsum.require_shape({in.n_rows(), H}, who, "dA_cumsum [R, H]");
    be.parallel_for(chunks.n_chunks() * H, 16, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<double> alpha(static_cast<std::size_t>(chunks.width()));
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / H, h = i % H, r = chunks.row(k), L = chunks.length(k);
            detail::ssd_cumsum_tile(in, h, r, L, alpha.data());
            for (std::int64_t t = 0; t < L; ++t) dA_cumsum(r + t, h) = alpha[static_cast<std::size_t>(t)];
        }
    });
}

/// Stage 2: cb [n_chunks, G, W, W], block (k, g) = C·Bᵀ of chunk k's rows for group g (its length(k) × length(k)
/// corner; the rest of the block is zero). Shared by the H/G heads of the group. Parallel over (chunk, group).
template <cpu_backend_type Backend>
void ssd_chunk_cb(const Backend& be, const ssd_inputs<float>& in, const chunk_layout& chunks,
                  tensor_view<float, 4> cb) {  // [n_chunks, G, W, W]
    using Arch = typename Backend::arch;
    constexpr std::string_view who = "ssd_chunk_cb";
    detail::ssd_check_stage(in, chunks, false, who);
    detail::ssd_check_cb(cb, in, chunks, who);
    const std::int64_t G = in.n_groups(), W = chunks.width();
    be.parallel_for(chunks.n_chunks() * G, 1, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> bt;
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / G, g = i % G, L = chunks.length(k);
            float* blk = &cb(k, g, 0, 0);
            detail::ssd_cb_tile<Arch>(in, g, chunks.row(k), L, blk, cb.strides[2], bt);
            if (L < W)
                for (std::int64_t a = 0; a < W; ++a) std::fill(blk + a * cb.strides[2] + (a < L ? L : 0), blk + a * cb.strides[2] + W, 0.f);
        }
    });
}

/// Stage 3: states [n_chunks, H, P, N], (k, h) = Σ_t exp(α_last − α_t) Δ_t x_t B_tᵀ over chunk k: its final state from a
/// zero initial state. dA_cumsum from stage 1. Parallel over (chunk, head).
template <cpu_backend_type Backend>
void ssd_chunk_state(const Backend& be, const ssd_inputs<float>& in, const chunk_layout& chunks,
                     tensor_view<const double, 2> dA_cumsum,  // [R, H]
                     tensor_view<float, 4> states) {          // [n_chunks, H, P, N]
    using Arch = typename Backend::arch;
    constexpr std::string_view who = "ssd_chunk_state";
    detail::ssd_check_stage(in, chunks, true, who);
    const std::int64_t H = in.n_heads();
    dA_cumsum.require_shape({in.n_rows(), H}, who, "dA_cumsum [R, H]");
    detail::ssd_check_states(states, in, chunks, who, "states [n_chunks, H, P, N]");
    be.parallel_for(chunks.n_chunks() * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::ssd_scratch w(chunks.width(), in.head_dim(), in.d_state());
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / H, h = i % H;
            detail::gather_alpha(dA_cumsum, chunks, k, h, w.alpha.data());
            detail::ssd_chunk_state_tile<Arch>(in, h, chunks.row(k), chunks.length(k), w.alpha.data(), &states(k, h, 0, 0), false, w);
        }
    });
}

/// Stage 4: for each sequence s and head, through its chunks in order from its initial state seqs[s].state [H, P, N]
/// (null: zeros): chunk_init (k, h) = H (the state entering chunk k), then H ← exp(α_last) H + states (k, h). The final
/// H is written back to seqs[s].state. `seqs` must be the sequences the layout was made from; chunk_init may be the
/// same tensor as states (updated in place). Parallel over (sequence, head).
template <cpu_backend_type Backend>
void ssd_state_passing(const Backend& be, std::span<const ssd_sequence<float>> seqs, const chunk_layout& chunks,
                       tensor_view<const double, 2> dA_cumsum,  // [R, H]
                       tensor_view<const float, 4> states,      // [n_chunks, H, P, N] from ssd_chunk_state
                       tensor_view<float, 4> chunk_init) {      // [n_chunks, H, P, N]
    constexpr std::string_view who = "ssd_state_passing";
    const std::int64_t H = states.dim(1), P = states.dim(2), N = states.dim(3);
    states.require_shape({chunks.n_chunks(), -1, -1, -1}, who, "states [n_chunks, H, P, N]");
    detail::require_dense_matrices(states, who, "states [n_chunks, H, P, N]");
    chunk_init.require_shape({chunks.n_chunks(), H, P, N}, who, "chunk_init [n_chunks, H, P, N]");
    detail::require_dense_matrices(chunk_init, who, "chunk_init [n_chunks, H, P, N]");
    dA_cumsum.require_shape({chunks.n_rows(), H}, who, "dA_cumsum [R, H]");
    detail::ssd_check_layout_seqs(seqs, chunks, who);
    detail::ssd_check_seqs(seqs, chunks.n_rows(), H * P * N, who);
    const std::int64_t n_seq = chunks.n_seq();
    be.parallel_for(n_seq * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> zero;
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t s = i / H, h = i % H;
            if (chunks.first_chunk(s) == chunks.first_chunk(s + 1)) continue;
            float* hs = seqs[static_cast<std::size_t>(s)].state;
            if (hs) {
                hs += h * P * N;
            } else {
                zero.assign(static_cast<std::size_t>(P * N), 0.f);
                hs = zero.data();
            }
            for (std::int64_t k = chunks.first_chunk(s); k < chunks.first_chunk(s + 1); ++k)
                detail::ssd_state_pass_tile(hs, &states(k, h, 0, 0), &chunk_init(k, h, 0, 0), P * N,
                                            dA_cumsum(chunks.row(k) + chunks.length(k) - 1, h));
        }
    });
}

/// Stage 5: the rows of every chunk of y [R, H, P] (other rows untouched) from cb (stage 2), dA_cumsum (stage 1) and
/// the state entering each chunk (stage 4): Y = tril(C·Bᵀ ⊙ exp(segsum)) (Δ x) + exp(α) C·H_c + D x.
/// Parallel over (chunk, head).
template <cpu_backend_type Backend>
void ssd_chunk_scan(const Backend& be, const ssd_inputs<float>& in, const chunk_layout& chunks,
                    tensor_view<const float, 4> cb,          // [n_chunks, G, W, W]
                    tensor_view<const double, 2> dA_cumsum,  // [R, H]
                    tensor_view<const float, 4> chunk_init,  // [n_chunks, H, P, N]
                    tensor_view<float, 3> y) {               // [R, H, P]
    using Arch = typename Backend::arch;
    constexpr std::string_view who = "ssd_chunk_scan";
    detail::ssd_check_stage(in, chunks, true, who);
    const std::int64_t H = in.n_heads(), G = in.n_groups();
    detail::ssd_check_cb(cb, in, chunks, who);
    dA_cumsum.require_shape({in.n_rows(), H}, who, "dA_cumsum [R, H]");
    detail::ssd_check_states(chunk_init, in, chunks, who, "chunk_init [n_chunks, H, P, N]");
    y.require_shape({in.n_rows(), H, in.head_dim()}, who, "y [R, H, P]");
    detail::require_unit_inner_stride(y, who, "y [R, H, P]");
    be.parallel_for(chunks.n_chunks() * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::ssd_scratch w(chunks.width(), in.head_dim(), in.d_state());
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t k = i / H, h = i % H, g = h / (H / G);
            detail::gather_alpha(dA_cumsum, chunks, k, h, w.alpha.data());
            detail::transpose_into(&chunk_init(k, h, 0, 0), in.head_dim(), in.d_state(), w.st.data());
            detail::ssd_chunk_scan_tile<Arch>(in, h, chunks.row(k), chunks.length(k), &cb(k, g, 0, 0), cb.strides[2], w.alpha.data(),
                                              w.st.data(), false, y, w);
        }
    });
}

// ---- fp64 twins of the stages: same arguments (no backend), plain loops -----------------------------------------

/// Twin of ssd_chunk_cumsum.
inline void ssd_chunk_cumsum_ref(const ssd_inputs<double>& in, const chunk_layout& chunks, tensor_view<double, 2> dA_cumsum) {
    constexpr std::string_view who = "ssd_chunk_cumsum_ref";
    detail::ssd_check_stage(in, chunks, true, who);
    dA_cumsum.require_shape({in.n_rows(), in.n_heads()}, who, "dA_cumsum [R, H]");
    for (std::int64_t k = 0; k < chunks.n_chunks(); ++k)
        for (std::int64_t h = 0; h < in.n_heads(); ++h) {
            double acc = 0;
            for (std::int64_t t = chunks.row(k); t < chunks.row(k) + chunks.length(k); ++t) {
                acc += in.dt(t, h) * in.A[h];
                dA_cumsum(t, h) = acc;
            }
        }
}

/// Twin of ssd_chunk_cb.
inline void ssd_chunk_cb_ref(const ssd_inputs<double>& in, const chunk_layout& chunks, tensor_view<double, 4> cb) {
    constexpr std::string_view who = "ssd_chunk_cb_ref";
    detail::ssd_check_stage(in, chunks, false, who);
    cb.require_shape({chunks.n_chunks(), in.n_groups(), chunks.width(), chunks.width()}, who, "cb [n_chunks, G, W, W]");
    for (std::int64_t k = 0; k < chunks.n_chunks(); ++k)
        for (std::int64_t g = 0; g < in.n_groups(); ++g)
            for (std::int64_t i = 0; i < chunks.width(); ++i)
                for (std::int64_t j = 0; j < chunks.width(); ++j) {
                    double acc = 0;
                    if (i < chunks.length(k) && j < chunks.length(k))
                        for (std::int64_t n = 0; n < in.d_state(); ++n) acc += in.C(chunks.row(k) + i, g, n) * in.B(chunks.row(k) + j, g, n);
                    cb(k, g, i, j) = acc;
                }
}

/// Twin of ssd_chunk_state.
inline void ssd_chunk_state_ref(const ssd_inputs<double>& in, const chunk_layout& chunks, tensor_view<const double, 2> dA_cumsum,
                                tensor_view<double, 4> states) {
    constexpr std::string_view who = "ssd_chunk_state_ref";
    detail::ssd_check_stage(in, chunks, true, who);
    const std::int64_t H = in.n_heads(), P = in.head_dim(), N = in.d_state(), hpg = H / in.n_groups();
    dA_cumsum.require_shape({in.n_rows(), H}, who, "dA_cumsum [R, H]");
    states.require_shape({chunks.n_chunks(), H, P, N}, who, "states [n_chunks, H, P, N]");
    for (std::int64_t k = 0; k < chunks.n_chunks(); ++k) {
        const std::int64_t r = chunks.row(k), last = r + chunks.length(k) - 1;
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t p = 0; p < P; ++p)
                for (std::int64_t n = 0; n < N; ++n) {
                    double acc = 0;
                    for (std::int64_t t = r; t <= last; ++t)
                        acc += std::exp(dA_cumsum(last, h) - dA_cumsum(t, h)) * in.dt(t, h) * in.x(t, h, p) * in.B(t, h / hpg, n);
                    states(k, h, p, n) = acc;
                }
    }
}

/// Twin of ssd_state_passing.
inline void ssd_state_passing_ref(std::span<const ssd_sequence<double>> seqs, const chunk_layout& chunks,
                                  tensor_view<const double, 2> dA_cumsum, tensor_view<const double, 4> states,
                                  tensor_view<double, 4> chunk_init) {
    constexpr std::string_view who = "ssd_state_passing_ref";
    const std::int64_t H = states.dim(1), P = states.dim(2), N = states.dim(3);
    states.require_shape({chunks.n_chunks(), -1, -1, -1}, who, "states [n_chunks, H, P, N]");
    chunk_init.require_shape({chunks.n_chunks(), H, P, N}, who, "chunk_init [n_chunks, H, P, N]");
    dA_cumsum.require_shape({chunks.n_rows(), H}, who, "dA_cumsum [R, H]");
    detail::ssd_check_layout_seqs(seqs, chunks, who);
    detail::ssd_check_seqs(seqs, chunks.n_rows(), H * P * N, who);
    std::vector<double> cur(static_cast<std::size_t>(P * N));
    for (std::int64_t s = 0; s < chunks.n_seq(); ++s)
        for (std::int64_t h = 0; h < H; ++h) {
            double* s0 = seqs[static_cast<std::size_t>(s)].state;
            for (std::int64_t e = 0; e < P * N; ++e) cur[static_cast<std::size_t>(e)] = s0 ? s0[h * P * N + e] : 0.0;
            for (std::int64_t k = chunks.first_chunk(s); k < chunks.first_chunk(s + 1); ++k) {
                const double decay = std::exp(dA_cumsum(chunks.row(k) + chunks.length(k) - 1, h));
                for (std::int64_t p = 0; p < P; ++p)
                    for (std::int64_t n = 0; n < N; ++n) {
                        double& c = cur[static_cast<std::size_t>(p * N + n)];
                        const double sc = states(k, h, p, n);
                        chunk_init(k, h, p, n) = c;
                        c = decay * c + sc;
                    }
            }
            if (s0 && chunks.first_chunk(s) < chunks.first_chunk(s + 1)) std::copy(cur.begin(), cur.end(), s0 + h * P * N);
        }
}

/// Twin of ssd_chunk_scan. The exponents α_i − α_j (j ≤ i) and α_i are ≤ 0 as Δ ≥ 0 and A ≤ 0 (both checked).
inline void ssd_chunk_scan_ref(const ssd_inputs<double>& in, const chunk_layout& chunks, tensor_view<const double, 4> cb,
                               tensor_view<const double, 2> dA_cumsum, tensor_view<const double, 4> chunk_init,
                               tensor_view<double, 3> y) {
    constexpr std::string_view who = "ssd_chunk_scan_ref";
    detail::ssd_check_stage(in, chunks, true, who);
    const std::int64_t H = in.n_heads(), P = in.head_dim(), N = in.d_state(), hpg = H / in.n_groups();
    cb.require_shape({chunks.n_chunks(), in.n_groups(), chunks.width(), chunks.width()}, who, "cb [n_chunks, G, W, W]");
    dA_cumsum.require_shape({in.n_rows(), H}, who, "dA_cumsum [R, H]");
    chunk_init.require_shape({chunks.n_chunks(), H, P, N}, who, "chunk_init [n_chunks, H, P, N]");
    y.require_shape({in.n_rows(), H, P}, who, "y [R, H, P]");
    for (std::int64_t k = 0; k < chunks.n_chunks(); ++k) {
        const std::int64_t r = chunks.row(k), L = chunks.length(k);
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < L; ++i)
                for (std::int64_t p = 0; p < P; ++p) {
                    double intra = 0, inter = 0;
                    for (std::int64_t j = 0; j <= i; ++j)
                        intra += cb(k, h / hpg, i, j) * std::exp(dA_cumsum(r + i, h) - dA_cumsum(r + j, h)) * in.dt(r + j, h) * in.x(r + j, h, p);
                    for (std::int64_t n = 0; n < N; ++n) inter += in.C(r + i, h / hpg, n) * chunk_init(k, h, p, n);
                    y(r + i, h, p) = intra + std::exp(dA_cumsum(r + i, h)) * inter + detail::skip_coef(in, h, p) * in.x(r + i, h, p);
                }
    }
}

namespace detail {

/// The decode step of one (sequence, head) in fp32 (spec.md §3.4): S ← S·exp(Δ A) + Δ (x ⊗ B), y = S·C + D x for
/// the sequence's single token at row seq.start. SIMD over the state width N with 4 accumulator chains per row of
/// head_dim (one chain would be bound by FMA latency), rows in memory order. A null state is a zero state
/// (`local` holds it; it is not written back). Shared by ssd_step and by ssd_chunked's one-token sequences, so a
/// sequence's bits do not depend on which entry point (or which batch) it went through.
template <class Arch>
void ssd_step_head(const ssd_inputs<float>& in, const ssd_sequence<float>& seq, std::int64_t h, tensor_view<float, 3> y,
                   std::vector<float>& local) {
    using Bf = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(Bf::size);
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state();
    const std::int64_t Nv = N / W * W, g = h / (H / G), t = seq.start;
    float* S = seq.state ? seq.state + h * P * N : nullptr;
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
    std::int64_t p = 0;
    // d_state of 4 to 8 SIMD widths (128 with AVX-512, 64 with AVX2: the real models'): B_t and C_t stay in registers
    // for all rows, so a row costs only the loads and stores of its own state. Same arithmetic as the loop below
    // (vector v of a row goes to chain v mod 4).
    if (Nv == N && N >= 4 * W && N <= 8 * W) {
        with_constant<8>(static_cast<int>(N / W), [&](auto nv) {
            constexpr int NV = decltype(nv)::value;
            if constexpr (NV >= 4) {
                Bf bv[NV], cv[NV];
                static_for<NV>([&](auto v) {
                    bv[v] = Bf::load_unaligned(Bt + v * W);
                    cv[v] = Bf::load_unaligned(Ct + v * W);
                });
                for (; p < P; ++p) {
                    float* sp = S + p * N;
                    const Bf vdx(delta * xt[p]);
                    Bf acc[4] = {Bf(0.0f), Bf(0.0f), Bf(0.0f), Bf(0.0f)};
                    static_for<NV>([&](auto v) {
                        const Bf sv = xsimd::fma(Bf::load_unaligned(sp + v * W), vdA, vdx * bv[v]);
                        sv.store_unaligned(sp + v * W);
                        acc[v % 4] = xsimd::fma(sv, cv[v], acc[v % 4]);
                    });
                    yt[p] = xsimd::hadd((acc[0] + acc[1]) + (acc[2] + acc[3])) + skip_coef(in, h, p) * xt[p];
                }
            }
        });
    }
    if (Nv == N && Nv >= 4 * W)  // rows in memory order, 4 accumulator chains per row (not 1 latency-bound chain)
        for (; p < P; ++p) {
            float* sp = S + p * N;
            const Bf vdx(delta * xt[p]);
            std::array<Bf, 4> acc{Bf(0.0f), Bf(0.0f), Bf(0.0f), Bf(0.0f)};
            std::int64_t n = 0;
            for (; n + 4 * W <= N; n += 4 * W)
                for (std::size_t u = 0; u < 4; ++u) {
                    const std::int64_t o = n + static_cast<std::int64_t>(u) * W;
                    const Bf sv = xsimd::fma(Bf::load_unaligned(sp + o), vdA, vdx * Bf::load_unaligned(Bt + o));
                    sv.store_unaligned(sp + o);
                    acc[u] = xsimd::fma(sv, Bf::load_unaligned(Ct + o), acc[u]);
                }
            for (std::size_t u = 0; n < N; n += W, ++u) {
                const Bf sv = xsimd::fma(Bf::load_unaligned(sp + n), vdA, vdx * Bf::load_unaligned(Bt + n));
                sv.store_unaligned(sp + n);
                acc[u] = xsimd::fma(sv, Bf::load_unaligned(Ct + n), acc[u]);
            }
            yt[p] = xsimd::hadd((acc[0] + acc[1]) + (acc[2] + acc[3])) + skip_coef(in, h, p) * xt[p];
        }
    for (; p < P; ++p) {
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
        yt[p] = r + skip_coef(in, h, p) * xt[p];
    }
}

}  // namespace detail

/// Chunked SSD (spec.md §3.3), fp32, for many sequences at once: the composition of the five stages above. Chunk c
/// of a sequence covers its tokens [cQ, min(len, (c+1)Q)); every sequence starts from its own state. y [R, H, P]
/// receives the rows of every sequence (other rows are not written). Parallel over (chunk, group) for C·Bᵀ, then
/// over (sequence, head) for the fused rest. A one-token sequence takes the decode step's arithmetic
/// (detail::ssd_step_head), so its result is the same bits whether it shares a call with longer sequences or goes
/// through ssd_step (batch invariance, spec.md §0). Throws shape_error on inconsistent shapes, strides or overlapping
/// sequences, value_error on A > 0 or a negative / infinite Δ, config_error when chunk < 1.
template <cpu_backend_type Backend>
void ssd_chunked(const Backend& be, const ssd_inputs<float>& in, std::span<const ssd_sequence<float>> seqs,
                 std::int64_t chunk, tensor_view<float, 3> y) {
    using Arch = typename Backend::arch;
    detail::ssd_check(in, seqs, y, "ssd_chunked");
    if (chunk < 1) throw config_error("ssd_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
    const chunk_layout chunks = ssd_chunk_layout(seqs, in.n_rows(), chunk);
    const std::int64_t n_chunks = chunks.n_chunks();
    if (n_chunks == 0) return;
    const std::int64_t H = in.n_heads(), P = in.head_dim(), G = in.n_groups(), N = in.d_state(), W = chunks.width();
    const std::int64_t n_seq = chunks.n_seq();

    // Stage ssd_chunk_cb as such: C·Bᵀ of every (chunk, group), shared by the heads of the group.
    std::vector<float> cb(static_cast<std::size_t>(n_chunks * G * W * W));
    ssd_chunk_cb(be, in, chunks, tensor_view<float, 4>(cb.data(), {n_chunks, G, W, W}));

    // Stages cumsum → scan → chunk state + state passing, per (sequence, head) through its chunks in order with the
    // stages' own tile code; the running state H is the sequence's state slot (read, then overwritten).
    be.parallel_for(n_seq * H, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::ssd_scratch w(W, P, N);
        std::vector<float> local;
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t s = i / H, h = i % H, g = h / (H / G);
            if (chunks.first_chunk(s) == chunks.first_chunk(s + 1)) continue;
            if (seqs[static_cast<std::size_t>(s)].length == 1) {
                detail::ssd_step_head<Arch>(in, seqs[static_cast<std::size_t>(s)], h, y, local);
                continue;
            }
            // The running state, transposed to [N, P] for the chunk's products: read from the sequence's slot [P, N]
            // (or zeros), carried across the chunks, written back after the last.
            float* hs = seqs[static_cast<std::size_t>(s)].state;
            float* st = w.st.data();
            if (hs) {
                hs += h * P * N;
                detail::transpose_into(hs, P, N, st);
            } else {
                std::fill(st, st + P * N, 0.f);
            }
            bool zero = std::all_of(st, st + P * N, [](float v) { return v == 0.f; });
            const std::int64_t k1 = chunks.first_chunk(s + 1);
            for (std::int64_t k = chunks.first_chunk(s); k < k1; ++k) {
                const std::int64_t r = chunks.row(k), L = chunks.length(k);
                detail::ssd_cumsum_tile(in, h, r, L, w.alpha.data());
                detail::ssd_chunk_scan_tile<Arch>(in, h, r, L, cb.data() + (k * G + g) * W * W, W, w.alpha.data(), st, zero, y, w);
                if (k + 1 < k1 || hs) detail::ssd_chunk_state_tile_t<Arch>(in, h, r, L, w.alpha.data(), st, w);  // stages 3 and 4
                zero = false;
            }
            if (hs) detail::transpose_into(st, N, P, hs);
        }
    });
}

/// Decode step (spec.md §3.4), fp32: every sequence holds exactly one token (shape_error otherwise);
///   state ← state · exp(Δ A) + Δ (x ⊗ B),  y = state · C + D x   (detail::ssd_step_head).
/// Parallel over (sequence, head) with a fixed (sequence, head) → thread map (parallel_for_static, so a head's state
/// stays in the cache of the core that updated it last step). Throws like ssd_chunked.
template <cpu_backend_type Backend>
void ssd_step(const Backend& be, const ssd_inputs<float>& in, std::span<const ssd_sequence<float>> seqs,
              tensor_view<float, 3> y) {
    detail::ssd_check(in, seqs, y, "ssd_step");
    for (std::size_t s = 0; s < seqs.size(); ++s)
        if (seqs[s].length != 1)
            throw shape_error("ssd_step: sequence " + std::to_string(s) + " has " + std::to_string(seqs[s].length) +
                              " tokens, the decode step takes exactly 1");
    const std::int64_t H = in.n_heads(), n_seq = static_cast<std::int64_t>(seqs.size());
    // At least 128 KiB of state per thread (about 1.7 µs of work, as long as a fork and join of warm threads; measured
    // with bench_mamba2 BM_ssd_step_core: a 4-head step of 64 × 128 heads took 1.7 µs inline and 2.1 µs split over 2
    // threads, a 24-head one 10–13 µs inline and 6–8 µs split); a head's state is P · N floats.
    const std::int64_t head_bytes = 4 * in.head_dim() * in.d_state();
    const std::int64_t min_items = items_per_task(head_bytes, std::int64_t{128} << 10);
    be.parallel_for_static(n_seq * H, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> local;
        for (std::int64_t i = i0; i < i1; ++i)
            detail::ssd_step_head<typename Backend::arch>(in, seqs[static_cast<std::size_t>(i / H)], i % H, y, local);
    }, min_items);
}

}  // namespace hymix::kernels
