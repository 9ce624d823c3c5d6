// The gated delta rule core of Gated DeltaNet (spec.md §4.1, §4.3; arXiv 2412.06464): the token-by-token recurrence
// (state [d_k, d_v], decay before the delta update), the chunked WY/UT prefill as named stages with fp64 twins (the
// stage split of fla-org/flash-linear-attention ops/gated_delta_rule) and a one-token decode step, over a seq_batch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/chunk_layout.hpp"
#include "hymix/kernels/tile_product.hpp"
#include "hymix/kernels/view_checks.hpp"

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

// Argument checks. Every public entry point (whole-call kernels, stages and their fp64 twins) checks, in release
// builds: shapes and stride assumptions of every view (shape_error naming it), H_v a multiple of H_k (config_error),
// the batch against the state's slots, and g ≤ 0 on the rows of valid sequences (value_error). Together these cost
// O(n_rows·H_v + n_seq) compares: 1/(d_k·d_v) of the decode step's own work, so the decode path keeps them too.
// Skipped on every path, on purpose: that q and k are L2-normalised (as many reads as the decode step's own work, and
// the kernels are exact for any keys; normalisation only bounds the state, spec.md §8 15), β's range (any β gives a
// unit-triangular, invertible I + A), the finiteness of q, k, v, β and of the state (a NaN, like a NaN g, propagates to
// its own sequence's outputs and state only, spec.md §8 16), and aliasing between o and the inputs. The tile functions
// below are internal and check nothing.

/// g ≤ 0 on rows [r0, r0 + len) of value head columns (value_error naming the row and head). A positive log-decay is a
/// decay factor > 1, which the model never produces (g = −exp(A_log)·softplus(·), spec.md §4.2) and which would
/// overflow the chunked form's decay masks. A NaN is let through on purpose: like a NaN in v it stays in its own
/// sequence's outputs and state (spec.md §8, 16). Cost: one compare per (row, head).
template <class T>
void check_log_decay_rows(tensor_view<const T, 2> g, std::int64_t r0, std::int64_t len, std::string_view who) {
    for (std::int64_t t = r0; t < r0 + len; ++t)
        for (std::int64_t h = 0; h < g.dim(1); ++h)
            if (g(t, h) > T(0))
                throw value_error(std::string(who) + ": g[" + std::to_string(t) + ", " + std::to_string(h) + "] = " + std::to_string(g(t, h)) +
                                  " is a positive log-decay; g must be <= 0 (decay factor in (0, 1])");
}

/// Checks shared by the three whole-call kernels: shapes (shape_error / config_error naming the tensor), stride
/// assumptions (q, k, v and o rows are mapped as matrices: unit stride in the last dimension; each state matrix
/// [d_k, d_v] is read and written through one pointer: dense; g and β are read element by element: any strides),
/// the batch against the state's slots, and g ≤ 0 on the rows of valid sequences (padding rows are not read).
template <class T>
void check_gated_delta_args(const seq_batch& batch, tensor_view<const T, 3> q, tensor_view<const T, 3> k, tensor_view<const T, 3> v,
                            tensor_view<const T, 2> g, tensor_view<const T, 2> beta, tensor_view<T, 4> state, tensor_view<T, 3> o,
                            std::string_view w) {
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
    require_unit_inner_stride(q, w, "q [n_rows, H_k, d_k]");
    require_unit_inner_stride(k, w, "k [n_rows, H_k, d_k]");
    require_unit_inner_stride(v, w, "v [n_rows, H_v, d_v]");
    require_unit_inner_stride(o, w, "o [n_rows, H_v, d_v]");
    require_dense_matrices(state, w, "state [S, H_v, d_k, d_v]");
    batch.validate(state.dim(0));
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0) check_log_decay_rows(g, batch.starts[s], batch.lengths[s], w);
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
/// Throws shape_error on inconsistent shapes or strides, config_error when H_v is not a multiple of H_k, value_error on
/// a positive g in a valid sequence.
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
    detail::check_gated_delta_args<T>(batch, q, k, v, g, beta, state, o, "gated_delta_rule_ref");
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

// ---------------------------------------------------------------------------------------------------------------
// The chunked WY/UT form (spec.md §4.3) as named stages over a chunk_layout (every valid sequence cut into chunks of
// at most C tokens; W = chunks.width() the longest). Each stage has a public fp32 form, parallel over its independent
// work items through the backend, and an fp64 twin `<stage>_ref` written as plain loops. Per-token tensors keep the
// row layout of the inputs ([n_rows, H_v, ·]); row i of a chunk holds that chunk's row i of a per-chunk matrix.
//   gdn_chunk_cumsum       γ = Σ_{m≤i} g_m within each chunk (fp32)                    → gamma [n_rows, H_v]
//   gdn_wy_prepare         A = strict_lower(diag(β) K Kᵀ ⊙ Γ)                          → A     [n_rows, H_v, W]
//   gdn_intra_chunk_solve  W = (I + A)⁻¹ diag(β)(K ⊙ e^γ),  U = (I + A)⁻¹ diag(β) V     → W [n_rows, H_v, d_k], U [n_rows, H_v, d_v]
//   gdn_state_pass         per sequence, chunks in order: S_c = S; V_new = U − W S;
//                          S ← e^{γ_last} S + (K ⊙ e^{γ_last − γ})ᵀ V_new             → chunk_states [n_chunks, H_v, d_k, d_v],
//                                                                                          v_new [n_rows, H_v, d_v], final state
//   gdn_chunk_output       O = (scale·Q ⊙ e^γ) S_c + (scale·tril(Q Kᵀ) ⊙ Γ) V_new       → o     [n_rows, H_v, d_v]
// Γ_ij = exp(Σ_{m=j+1..i} g_m) (j ≤ i, else 0) is rebuilt from g by the stages that need it, by index from partial
// sums of g, never from differences of γ. gated_delta_rule_chunked runs the stages' own per-(chunk, head) tile code
// fused per (sequence, value head), so the running state stays in cache; its results equal the composition of the five
// public stages bit for bit (every product is a register-tile product whose order of terms depends on the sizes only),
// except on one-token sequences, which take the decode step's arithmetic (batch invariance).
// A device backend implements the five stages.
// ---------------------------------------------------------------------------------------------------------------

/// The chunk layout of a gated delta call: each sequence of `batch` with a valid slot in chunks of at most `chunk`
/// tokens; sequences with slot −1 get none. Throws config_error when chunk < 1, shape_error on bad ranges.
inline chunk_layout gdn_chunk_layout(const seq_batch& batch, std::int64_t chunk) {
    std::vector<std::int64_t> lengths(batch.lengths);
    for (std::size_t s = 0; s < lengths.size(); ++s)
        if (batch.slots[s] < 0) lengths[s] = 0;
    return chunk_layout(batch.n_rows, chunk, batch.starts, lengths);
}

namespace detail {

/// Decay exponents below this give factors < 1e-26 that are flushed to exactly 0: their contribution is far below
/// fp32 resolution, and keeping them would feed subnormal numbers (very slow on x86) into the products.
inline constexpr float decay_flush_exponent = -60.f;

/// exp(x) for a decay exponent x ≤ 0, with factors below e^−60 flushed to 0.
inline float decay_factor(float x) noexcept { return x < decay_flush_exponent ? 0.f : std::exp(x); }

/// Rows of (I + A)⁻¹ scratch are padded to a multiple of this many floats: whole SIMD vectors for every width up to
/// AVX-512's 16 (unit_lower_inverse).
inline constexpr std::int64_t inverse_row_pad = 16;

/// A row length n rounded up to inverse_row_pad.
constexpr std::int64_t inverse_row_length(std::int64_t n) { return (n + inverse_row_pad - 1) / inverse_row_pad * inverse_row_pad; }

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using row_map = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using const_row_map = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Rows [t, t + n) of head h of a [n_rows, H, d] view as an n × d matrix (unit inner stride checked by the caller).
inline const_row_map rows_of(tensor_view<const float, 3> x, std::int64_t t, std::int64_t h, std::int64_t n) {
    return const_row_map(&x(t, h, 0), n, x.dim(2), Eigen::OuterStride<>(x.strides[0]));
}
inline row_map rows_of(tensor_view<float, 3> x, std::int64_t t, std::int64_t h, std::int64_t n) {
    return row_map(&x(t, h, 0), n, x.dim(2), Eigen::OuterStride<>(x.strides[0]));
}
/// The read-only map of the same memory.
inline const_row_map as_const(const row_map& m) { return const_row_map(m.data(), m.rows(), m.cols(), Eigen::OuterStride<>(m.outerStride())); }

/// Scratch of one task of the fp32 stages, for chunks of up to C rows. A stage allocates only the parts it uses (a
/// `gdn_parts` mask; the fused kernel takes them all); the others stay empty.
enum gdn_parts : unsigned {
    gdn_vectors = 1u << 0,  // gamma, eg, bet
    gdn_mask = 1u << 1,     // gm
    gdn_kk = 1u << 2,       // kk
    gdn_a = 1u << 3,        // a
    gdn_t = 1u << 4,        // t
    gdn_p = 1u << 5,        // p
    gdn_kt = 1u << 6,       // kt
    gdn_w = 1u << 7,        // w
    gdn_kd = 1u << 8,       // kd
    gdn_u = 1u << 9,        // u
    gdn_vn = 1u << 10,      // vn
    gdn_all = (1u << 11) - 1,
};
struct gdn_scratch {
    std::vector<float> gamma, eg, bet;  // [C] γ, exp(γ) (flushed), β
    row_matrix gm;                      // [C, C] Γ
    row_matrix kk;                      // [C, C] K Kᵀ, then Q Kᵀ
    row_matrix a;                       // [C, C] A
    row_matrix t;                       // [C, inverse_row_length(C)] (I + A)⁻¹
    row_matrix p;                       // [C, C] scale·tril(Q Kᵀ) ⊙ Γ
    row_matrix kt;                      // [d_k, C] Kᵀ of the chunk (the keys' columns as contiguous rows)
    row_matrix w, kd;                   // [C, d_k] W; scaled or decayed keys / scaled decayed queries
    row_matrix u, vn;                   // [C, d_v] U; β V, then V_new
    gdn_scratch() = default;
    gdn_scratch(std::int64_t C, std::int64_t dk, std::int64_t dv, unsigned parts = gdn_all) { ensure(C, dk, dv, parts); }
    /// Sizes the parts for chunk width C; a part already of that size keeps its memory (no allocation).
    void ensure(std::int64_t C, std::int64_t dk, std::int64_t dv, unsigned parts = gdn_all) {
        const auto has = [&](gdn_parts x) { return (parts & x) != 0; };
        if (has(gdn_vectors)) {
            gamma.resize(static_cast<std::size_t>(C));
            eg.resize(gamma.size());
            bet.resize(gamma.size());
        }
        const auto fit = [](row_matrix& m, std::int64_t r, std::int64_t c) {
            if (m.rows() != r || m.cols() != c) m.resize(r, c);
        };
        if (has(gdn_mask)) fit(gm, C, C);
        if (has(gdn_kk)) fit(kk, C, C);
        if (has(gdn_a)) fit(a, C, C);
        if (has(gdn_t)) fit(t, C, inverse_row_length(C));
        if (has(gdn_p)) fit(p, C, C);
        if (has(gdn_kt)) fit(kt, dk, C);
        if (has(gdn_w)) fit(w, C, dk);
        if (has(gdn_kd)) fit(kd, C, dk);
        if (has(gdn_u)) fit(u, C, dv);
        if (has(gdn_vn)) fit(vn, C, dv);
    }
};

/// Stage gdn_chunk_cumsum, one (chunk, head): gamma[i] = Σ_{m≤i} g(t + m, hv), fp32.
inline void gdn_cumsum_tile(tensor_view<const float, 2> g, std::int64_t t, std::int64_t hv, std::int64_t n, float* gamma) {
    float run = 0.f;
    for (std::int64_t i = 0; i < n; ++i) gamma[i] = run += g(t + i, hv);
}

/// exp(γ) (flushed) and β of one chunk, from γ and β in any layout.
template <class Gamma>
void gdn_decays(const Gamma& gamma, tensor_view<const float, 2> beta, std::int64_t t, std::int64_t hv, std::int64_t n, gdn_scratch& w) {
    for (std::int64_t i = 0; i < n; ++i) {
        w.eg[static_cast<std::size_t>(i)] = decay_factor(gamma(i));  // γ ≤ 0
        w.bet[static_cast<std::size_t>(i)] = beta(t + i, hv);
    }
}

/// Γ of one chunk, used by stages 2, 4 and 5: gm(i, j) = exp(Σ_{m=j+1..i} g_m) for j ≤ i (1 on the diagonal), 0 above.
/// Row i's exponents are row i−1's plus g_i (partial sums over the segment: accurate even when γ itself is large);
/// exponents are ≤ 0 wherever exp is taken, and factors below e^−60 are flushed to 0. The exponentials are taken on
/// the lower triangle only, once every exponent is formed, in blocks of up to 64 (Eigen's vectorised exp).
inline void gdn_decay_mask_tile(tensor_view<const float, 2> g, std::int64_t t, std::int64_t hv, std::int64_t n, row_matrix& gm) {
    for (std::int64_t i = 0; i < n; ++i) {
        float* row = &gm(i, 0);
        if (i > 0) {
            const float gi = g(t + i, hv);
            const float* prev = &gm(i - 1, 0);
            for (std::int64_t j = 0; j < i; ++j) row[j] = prev[j] + gi;
        }
        row[i] = 0.f;
        std::fill(row + i + 1, row + n, 0.f);
    }
    constexpr std::int64_t block = 64;
    alignas(64) float e[block];
    for (std::int64_t i = n - 1; i > 0; --i) {
        float* row = &gm(i, 0);
        for (std::int64_t j0 = 0; j0 < i; j0 += block) {
            const std::int64_t m = std::min(block, i - j0);
            Eigen::Map<Eigen::ArrayXf>(e, m) = Eigen::Map<const Eigen::ArrayXf>(row + j0, m).max(decay_flush_exponent).exp();
            for (std::int64_t j = 0; j < m; ++j) row[j0 + j] = row[j0 + j] < decay_flush_exponent ? 0.f : e[j];
        }
        row[i] = 1.f;
    }
    if (n > 0) gm(0, 0) = 1.f;
}

/// Kᵀ [d_k, n] of one chunk's keys K [n, d_k] into kt: the right-hand operand of the chunk's K Kᵀ and Q Kᵀ, whose rows
/// the register-tile product reads contiguously.
inline void gdn_keys_transposed(const_row_map K, row_matrix& kt) {
    transpose_rows(K.data(), K.outerStride(), K.rows(), K.cols(), kt.data(), kt.cols());
}

/// Stage gdn_wy_prepare, one (chunk, head): A [n, n] with A_ij = β_i (k_i·k_j) Γ_ij for j < i and 0 for j ≥ i. The lower
/// triangle of K Kᵀ is a register-tile product (tile_product_lower_part) against kt = Kᵀ (gdn_keys_transposed).
template <class Arch>
void gdn_wy_tile(const_row_map K, const row_matrix& kt, const float* bet, const row_matrix& gm, row_map A, row_matrix& kk) {
    const std::int64_t n = K.rows();
    tile_product_lower_part<Arch>(K.data(), K.outerStride(), 1, kt.data(), kt.cols(), kk.data(), kk.cols(), n, K.cols());
    for (std::int64_t i = 0; i < n; ++i) {
        const float* kki = &kk(i, 0);
        const float* gmi = &gm(i, 0);
        float* ai = &A(i, 0);
        for (std::int64_t j = 0; j < i; ++j) ai[j] = bet[i] * kki[j] * gmi[j];
        std::fill(ai + i, ai + n, 0.f);
    }
}

/// T = (I + A)⁻¹ for A [n, n] strictly lower (diagonal and upper part not read), by forward substitution on the rows:
/// T_i = e_i − Σ_{j<i} A_ij T_j. T's rows hold whole SIMD vectors (T.cols() ≥ inverse_row_length(n)); each
/// vector of row i is summed in registers from the rows j that reach it (j at or past its first column), the even and the
/// odd j in two chains added at the end. Above the diagonal T holds zeros (or NaN where a NaN in A reached the row);
/// row i depends on rows ≤ i of A only.
template <class Arch>
void unit_lower_inverse(const const_row_map& A, row_matrix& T) {
    using B = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(B::size);
    static_assert(inverse_row_pad % W == 0, "unit_lower_inverse: rows padded to inverse_row_pad must hold whole SIMD vectors");
    const std::int64_t n = A.rows(), ld = T.cols();
    if (ld < inverse_row_length(n))
        throw shape_error("unit_lower_inverse: T has rows of " + std::to_string(ld) + " floats, needs " + std::to_string(inverse_row_length(n)));
    for (std::int64_t i = 0; i < n; ++i) {
        float* ti = T.data() + i * ld;
        const float* ai = A.data() + i * A.outerStride();
        for (std::int64_t c0 = 0; c0 < n; c0 += W) {
            if (c0 > i) {
                B(0.f).store_unaligned(ti + c0);
                continue;
            }
            alignas(64) float unit[W] = {};
            if (i < c0 + W) unit[i - c0] = 1.f;
            B s0 = B::load_aligned(unit), s1(0.f);
            std::int64_t j = c0;
            for (; j + 1 < i; j += 2) {
                s0 = xsimd::fnma(B(ai[j]), B::load_unaligned(T.data() + j * ld + c0), s0);
                s1 = xsimd::fnma(B(ai[j + 1]), B::load_unaligned(T.data() + (j + 1) * ld + c0), s1);
            }
            if (j < i) s0 = xsimd::fnma(B(ai[j]), B::load_unaligned(T.data() + j * ld + c0), s0);
            (s0 + s1).store_unaligned(ti + c0);
        }
    }
}

/// Stage gdn_intra_chunk_solve, one (chunk, head): W = (I + A)⁻¹ diag(β)(K ⊙ e^γ) and U = (I + A)⁻¹ diag(β) V, with
/// A's diagonal and upper part not read. T = (I + A)⁻¹ is formed once (unit_lower_inverse, into w.t); W and U are then
/// lower-triangular register-tile products of T with the scaled keys (in w.kd) and values (in w.vn), so row i of W and U
/// depends on rows ≤ i only. W and U must not share memory with w.
template <class Arch>
void gdn_solve_tile(const_row_map A, const_row_map K, const_row_map V, const float* bet, const float* eg, row_map W, row_map U,
                    gdn_scratch& w) {
    const std::int64_t n = K.rows(), dk = K.cols(), dv = V.cols();
    unit_lower_inverse<Arch>(A, w.t);
    for (std::int64_t i = 0; i < n; ++i) {
        w.kd.row(i) = (bet[i] * eg[i]) * K.row(i);
        w.vn.row(i) = bet[i] * V.row(i);
    }
    const std::int64_t ldt = w.t.cols();
    tile_product_lower<Arch>(w.t.data(), ldt, 1, w.kd.data(), w.kd.cols(), W.data(), W.outerStride(), n, dk, false);
    tile_product_lower<Arch>(w.t.data(), ldt, 1, w.vn.data(), w.vn.cols(), U.data(), U.outerStride(), n, dv, false);
}

/// Stage gdn_state_pass, first half for one chunk: V_new = U − W S, S [d_k, d_v] the state entering the chunk. W·S is
/// a register-tile product (tile_product.hpp) reading W's rows and S's rows where they lie, written into Vn before U
/// is read: Vn must not share memory with U or W.
template <class Arch>
void gdn_new_values_tile(const_row_map W, const_row_map U, const float* S, row_map Vn) {
    const std::int64_t n = W.rows(), dk = W.cols(), dv = U.cols();
    tile_product<Arch>(W.data(), W.outerStride(), 1, S, dv, Vn.data(), Vn.outerStride(), n, dv, dk, false);
    for (std::int64_t i = 0; i < n; ++i) {
        const float* u = U.data() + i * U.outerStride();
        float* vn = &Vn(i, 0);
        for (std::int64_t j = 0; j < dv; ++j) vn[j] = u[j] - vn[j];
    }
}

/// Stage gdn_state_pass, second half: S ← e^{γ_last} S + (K ⊙ Γ_{last, ·})ᵀ V_new (exp(γ_last − γ_j) = Γ_{last, j}).
/// The product reads the decayed keys down their columns (Aᵀ at no cost) against V_new's rows; it is summed from zero
/// and added to the scaled state once.
template <class Arch>
void gdn_state_update_tile(float* S, const_row_map K, const row_matrix& gm, float eg_last, const_row_map Vn, row_matrix& kd) {
    const std::int64_t n = K.rows(), dk = K.cols(), dv = Vn.cols();
    for (std::int64_t i = 0; i < n; ++i) kd.row(i) = gm(n - 1, i) * K.row(i);
    for (std::int64_t i = 0; i < dk * dv; ++i) S[i] *= eg_last;
    tile_product<Arch>(kd.data(), 1, kd.outerStride(), Vn.data(), Vn.outerStride(), S, dv, dk, dv, n, true);
}

/// Stage gdn_chunk_output, one (chunk, head): O = (scale·Q ⊙ e^γ) S + (scale·tril(Q Kᵀ) ⊙ Γ) V_new, written in place,
/// S [d_k, d_v] the state entering the chunk. The read-out of S and the intra-chunk term are register-tile products
/// (the second lower-triangular: entries above the diagonal never read), and so is the lower triangle of Q Kᵀ, against
/// w.kt = Kᵀ of the chunk (gdn_keys_transposed, filled by the caller).
template <class Arch>
void gdn_output_tile(const_row_map Q, const row_matrix& gm, const float* eg, float scale, const float* S, const_row_map Vn, row_map O,
                     gdn_scratch& w) {
    const std::int64_t n = Q.rows(), dk = Q.cols(), dv = Vn.cols();
    for (std::int64_t i = 0; i < n; ++i) w.kd.row(i) = (scale * eg[i]) * Q.row(i);
    tile_product<Arch>(w.kd.data(), w.kd.outerStride(), 1, S, dv, O.data(), O.outerStride(), n, dv, dk, false);
    tile_product_lower_part<Arch>(Q.data(), Q.outerStride(), 1, w.kt.data(), w.kt.cols(), w.kk.data(), w.kk.cols(), n, dk);
    for (std::int64_t i = 0; i < n; ++i) {
        const float* qki = &w.kk(i, 0);
        const float* gmi = &gm(i, 0);
        float* pi = &w.p(i, 0);
        for (std::int64_t j = 0; j <= i; ++j) pi[j] = scale * qki[j] * gmi[j];
    }
    tile_product_lower<Arch>(w.p.data(), w.p.outerStride(), 1, Vn.data(), Vn.outerStride(), O.data(), O.outerStride(), n, dv, true);
}

/// The head dimensions of a stage call, from its q/k and v views; H_v a positive multiple of H_k (config_error).
struct gdn_dims {
    std::int64_t R, Hk, Hv, dk, dv;
};

/// Shape, stride and value checks common to the stages. k is [R, H_k, d_k]; every other per-row tensor has H_v heads.
inline gdn_dims gdn_check_stage(const chunk_layout& chunks, tensor_view<const float, 3> k, std::int64_t Hv, std::int64_t dv,
                                std::string_view who) {
    const gdn_dims d{chunks.n_rows(), k.dim(1), Hv, k.dim(2), dv};
    chunks.require_rows(k.dim(0), who, "k");
    require_unit_inner_stride(k, who, "k [n_rows, H_k, d_k]");
    if (d.Hk <= 0 || d.Hv % d.Hk != 0)
        throw config_error(std::string(who) + ": value heads (" + std::to_string(d.Hv) + ") must be a positive multiple of key heads (" +
                           std::to_string(d.Hk) + ")");
    return d;
}

template <class T, std::size_t N>
void gdn_require(const tensor_view<T, N>& x, const typename tensor_view<T, N>::index_array& shape, bool rows_as_matrix,
                 std::string_view who, std::string_view name) {
    x.require_shape(shape, who, name);
    if (rows_as_matrix) require_unit_inner_stride(x, who, name);
}

inline void gdn_check_g_rows(const chunk_layout& chunks, tensor_view<const float, 2> g, std::string_view who) {
    for (std::int64_t c = 0; c < chunks.n_chunks(); ++c) check_log_decay_rows(g, chunks.row(c), chunks.length(c), who);
}

/// The layout handed to gdn_state_pass must be the one made from its batch (gdn_chunk_layout).
inline void gdn_check_layout_batch(const seq_batch& batch, const chunk_layout& chunks, std::string_view who) {
    bool same = batch.n_seq() == chunks.n_seq() && batch.n_rows == chunks.n_rows();
    for (std::int64_t s = 0; same && s < batch.n_seq(); ++s)
        same = chunks.seq_start(s) == batch.starts[s] && chunks.seq_length(s) == (batch.slots[s] >= 0 ? batch.lengths[s] : 0);
    if (!same) throw shape_error(std::string(who) + ": the chunk layout was not made from this batch (use gdn_chunk_layout)");
}

/// Parallel loop over (sequence, value head) pairs of the valid sequences of a batch, with a fixed pair → thread
/// map (parallel_for_static: a decode step finds each head's state in the cache of the core that updated it last):
/// f(begin, end, item) with item(i) = (sequence, value head), so each task can set up its scratch once. Each thread
/// takes at least `min_items` pairs (parallel_for_static: fewer threads, or inline, for a small step).
template <class Backend, class F>
void for_each_seq_head(const Backend& be, const seq_batch& batch, std::int64_t Hv, F&& f, std::int64_t min_items = 1) {
    std::vector<std::int64_t> seqs;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.slots[s] >= 0 && batch.lengths[s] > 0) seqs.push_back(s);
    be.parallel_for_static(static_cast<std::int64_t>(seqs.size()) * Hv, [&](std::int64_t b, std::int64_t e) {
        f(b, e, [&](std::int64_t i) { return std::pair{seqs[static_cast<std::size_t>(i / Hv)], i % Hv}; });
    }, min_items);
}

/// Valid (slot ≥ 0, non-empty) sequences × value heads of a chunk layout, in parallel: f(begin, end, item) with
/// item(i) = (sequence, value head), so each task can set up its scratch once.
template <class Backend, class F>
void for_each_chunked_seq_head(const Backend& be, const chunk_layout& chunks, std::int64_t Hv, F&& f) {
    std::vector<std::int64_t> seqs;
    for (std::int64_t s = 0; s < chunks.n_seq(); ++s)
        if (chunks.first_chunk(s) < chunks.first_chunk(s + 1)) seqs.push_back(s);
    be.parallel_for(static_cast<std::int64_t>(seqs.size()) * Hv, 1, [&](std::int64_t b, std::int64_t e) {
        f(b, e, [&](std::int64_t i) { return std::pair{seqs[static_cast<std::size_t>(i / Hv)], i % Hv}; });
    });
}

}  // namespace detail

/// Stage 1: gamma [n_rows, H_v] = inclusive cumsum of g within each chunk, fp32 (chunk rows only). Parallel over (chunk, head).
template <cpu_backend_type Backend>
void gdn_chunk_cumsum(const Backend& be, const chunk_layout& chunks,
                      tensor_view<const float, 2> g,  // [n_rows, H_v] log-decay ≤ 0
                      tensor_view<float, 2> gamma) {  // [n_rows, H_v]
    constexpr std::string_view who = "gdn_chunk_cumsum";
    const std::int64_t Hv = g.dim(1);
    chunks.require_rows(g.dim(0), who, "g");
    gamma.require_shape({chunks.n_rows(), Hv}, who, "gamma [n_rows, H_v]");
    detail::gdn_check_g_rows(chunks, g, who);
    be.parallel_for(chunks.n_chunks() * Hv, 16, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> run(static_cast<std::size_t>(chunks.width()));
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t c = i / Hv, h = i % Hv, t = chunks.row(c);
            detail::gdn_cumsum_tile(g, t, h, chunks.length(c), run.data());
            for (std::int64_t j = 0; j < chunks.length(c); ++j) gamma(t + j, h) = run[static_cast<std::size_t>(j)];
        }
    });
}

/// Stage 2 (the WY/UT preparation): A [n_rows, H_v, W], row i of chunk c holding A_ij = β_i (k_i·k_j) Γ_ij for j < i and
/// 0 for j ≥ i (W entries; those past the chunk's length are 0). Parallel over (chunk, value head).
template <cpu_backend_type Backend>
void gdn_wy_prepare(const Backend& be, const chunk_layout& chunks,
                    tensor_view<const float, 3> k,     // [n_rows, H_k, d_k]
                    tensor_view<const float, 2> g,     // [n_rows, H_v]
                    tensor_view<const float, 2> beta,  // [n_rows, H_v]
                    tensor_view<float, 3> A) {         // [n_rows, H_v, W]
    constexpr std::string_view who = "gdn_wy_prepare";
    const auto d = detail::gdn_check_stage(chunks, k, g.dim(1), 0, who);
    const std::int64_t Wd = chunks.width();
    detail::gdn_require(g, {d.R, d.Hv}, false, who, "g [n_rows, H_v]");
    detail::gdn_require(beta, {d.R, d.Hv}, false, who, "beta [n_rows, H_v]");
    detail::gdn_require(A, {d.R, d.Hv, Wd}, true, who, "A [n_rows, H_v, W]");
    detail::gdn_check_g_rows(chunks, g, who);
    using Arch = typename Backend::arch;
    be.parallel_for(chunks.n_chunks() * d.Hv, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::gdn_scratch w(Wd, d.dk, 0, detail::gdn_vectors | detail::gdn_mask | detail::gdn_kt | detail::gdn_kk);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t c = i / d.Hv, hv = i % d.Hv, t = chunks.row(c), n = chunks.length(c);
            for (std::int64_t j = 0; j < n; ++j) w.bet[static_cast<std::size_t>(j)] = beta(t + j, hv);
            detail::gdn_decay_mask_tile(g, t, hv, n, w.gm);
            const detail::const_row_map K = detail::rows_of(k, t, hv / (d.Hv / d.Hk), n);
            detail::gdn_keys_transposed(K, w.kt);
            detail::gdn_wy_tile<Arch>(K, w.kt, w.bet.data(), w.gm, detail::row_map(&A(t, hv, 0), n, n, Eigen::OuterStride<>(A.strides[0])),
                                      w.kk);
            for (std::int64_t j = 0; j < n; ++j) std::fill(&A(t + j, hv, 0) + n, &A(t + j, hv, 0) + Wd, 0.f);
        }
    });
}

/// Stage 3 (the intra-chunk solve): W [n_rows, H_v, d_k] = (I + A)⁻¹ diag(β)(K ⊙ e^γ) and U [n_rows, H_v, d_v] =
/// (I + A)⁻¹ diag(β) V per chunk, from A (stage 2) and gamma (stage 1). Parallel over (chunk, value head).
template <cpu_backend_type Backend>
void gdn_intra_chunk_solve(const Backend& be, const chunk_layout& chunks,
                           tensor_view<const float, 3> k,      // [n_rows, H_k, d_k]
                           tensor_view<const float, 3> v,      // [n_rows, H_v, d_v]
                           tensor_view<const float, 2> beta,   // [n_rows, H_v]
                           tensor_view<const float, 2> gamma,  // [n_rows, H_v]
                           tensor_view<const float, 3> A,      // [n_rows, H_v, W]
                           tensor_view<float, 3> W,            // [n_rows, H_v, d_k]
                           tensor_view<float, 3> U) {          // [n_rows, H_v, d_v]
    constexpr std::string_view who = "gdn_intra_chunk_solve";
    const auto d = detail::gdn_check_stage(chunks, k, v.dim(1), v.dim(2), who);
    detail::gdn_require(v, {d.R, d.Hv, d.dv}, true, who, "v [n_rows, H_v, d_v]");
    detail::gdn_require(beta, {d.R, d.Hv}, false, who, "beta [n_rows, H_v]");
    detail::gdn_require(gamma, {d.R, d.Hv}, false, who, "gamma [n_rows, H_v]");
    detail::gdn_require(A, {d.R, d.Hv, chunks.width()}, true, who, "A [n_rows, H_v, W]");
    detail::gdn_require(W, {d.R, d.Hv, d.dk}, true, who, "W [n_rows, H_v, d_k]");
    detail::gdn_require(U, {d.R, d.Hv, d.dv}, true, who, "U [n_rows, H_v, d_v]");
    using Arch = typename Backend::arch;
    be.parallel_for(chunks.n_chunks() * d.Hv, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::gdn_scratch w(chunks.width(), d.dk, d.dv, detail::gdn_vectors | detail::gdn_t | detail::gdn_kd | detail::gdn_vn);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t c = i / d.Hv, hv = i % d.Hv, t = chunks.row(c), n = chunks.length(c);
            detail::gdn_decays([&](std::int64_t j) { return gamma(t + j, hv); }, beta, t, hv, n, w);
            const detail::const_row_map Am(&A(t, hv, 0), n, n, Eigen::OuterStride<>(A.strides[0]));
            detail::gdn_solve_tile<Arch>(Am, detail::rows_of(k, t, hv / (d.Hv / d.Hk), n), detail::rows_of(v, t, hv, n), w.bet.data(),
                                         w.eg.data(), detail::rows_of(W, t, hv, n), detail::rows_of(U, t, hv, n), w);
        }
    });
}

/// Stage 4 (the inter-chunk state pass): for each valid sequence s of `batch` and value head, through its chunks in
/// order from state[slot_s]: chunk_states (c, h) = S (the state entering chunk c), V_new = U − W S (rows of chunk c of
/// v_new), S ← e^{γ_last} S + (K ⊙ e^{γ_last − γ})ᵀ V_new; the final S is written back to state[slot_s]. `chunks` must be
/// gdn_chunk_layout(batch, ·). Parallel over (sequence, value head).
template <cpu_backend_type Backend>
void gdn_state_pass(const Backend& be, const seq_batch& batch, const chunk_layout& chunks,
                    tensor_view<const float, 3> k,        // [n_rows, H_k, d_k]
                    tensor_view<const float, 2> g,        // [n_rows, H_v]
                    tensor_view<const float, 2> gamma,    // [n_rows, H_v]
                    tensor_view<const float, 3> W,        // [n_rows, H_v, d_k]
                    tensor_view<const float, 3> U,        // [n_rows, H_v, d_v]
                    tensor_view<float, 4> state,          // [S, H_v, d_k, d_v] in/out
                    tensor_view<float, 4> chunk_states,   // [n_chunks, H_v, d_k, d_v]
                    tensor_view<float, 3> v_new) {        // [n_rows, H_v, d_v]
    constexpr std::string_view who = "gdn_state_pass";
    const auto d = detail::gdn_check_stage(chunks, k, U.dim(1), U.dim(2), who);
    detail::gdn_require(g, {d.R, d.Hv}, false, who, "g [n_rows, H_v]");
    detail::gdn_require(gamma, {d.R, d.Hv}, false, who, "gamma [n_rows, H_v]");
    detail::gdn_require(W, {d.R, d.Hv, d.dk}, true, who, "W [n_rows, H_v, d_k]");
    detail::gdn_require(U, {d.R, d.Hv, d.dv}, true, who, "U [n_rows, H_v, d_v]");
    detail::gdn_require(v_new, {d.R, d.Hv, d.dv}, true, who, "v_new [n_rows, H_v, d_v]");
    // v_new is written (W·S first) before U is read: it may share memory with neither U nor W.
    hymix::detail::require_no_overlap(v_new, "v_new", U, "U", who);
    hymix::detail::require_no_overlap(v_new, "v_new", W, "W", who);
    state.require_shape({-1, d.Hv, d.dk, d.dv}, who, "state [S, H_v, d_k, d_v]");
    detail::require_dense_matrices(state, who, "state [S, H_v, d_k, d_v]");
    chunk_states.require_shape({chunks.n_chunks(), d.Hv, d.dk, d.dv}, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    detail::require_dense_matrices(chunk_states, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    batch.validate(state.dim(0));
    detail::gdn_check_layout_batch(batch, chunks, who);
    detail::gdn_check_g_rows(chunks, g, who);
    using Arch = typename Backend::arch;
    detail::for_each_chunked_seq_head(be, chunks, d.Hv, [&](std::int64_t b, std::int64_t e, auto item) {
        detail::gdn_scratch w(chunks.width(), d.dk, 0, detail::gdn_mask | detail::gdn_kd);
        for (std::int64_t i = b; i < e; ++i) {
            const auto [s, hv] = item(i);
            float* S = &state(batch.slots[static_cast<std::size_t>(s)], hv, 0, 0);
            for (std::int64_t c = chunks.first_chunk(s); c < chunks.first_chunk(s + 1); ++c) {
                const std::int64_t t = chunks.row(c), n = chunks.length(c);
                std::copy_n(S, d.dk * d.dv, &chunk_states(c, hv, 0, 0));
                detail::gdn_decay_mask_tile(g, t, hv, n, w.gm);
                detail::gdn_new_values_tile<Arch>(detail::rows_of(W, t, hv, n), detail::rows_of(U, t, hv, n), S, detail::rows_of(v_new, t, hv, n));
                detail::gdn_state_update_tile<Arch>(S, detail::rows_of(k, t, hv / (d.Hv / d.Hk), n), w.gm, detail::decay_factor(gamma(t + n - 1, hv)),
                                              detail::rows_of(tensor_view<const float, 3>(v_new), t, hv, n), w.kd);
            }
        }
    });
}

/// Stage 5: rows of every chunk of o [n_rows, H_v, d_v] (other rows untouched): O = (scale·Q ⊙ e^γ) S_c + (scale·tril(Q Kᵀ)
/// ⊙ Γ) V_new, from gamma (stage 1), chunk_states and v_new (stage 4). Parallel over (chunk, value head).
template <cpu_backend_type Backend>
void gdn_chunk_output(const Backend& be, const chunk_layout& chunks,
                      tensor_view<const float, 3> q,             // [n_rows, H_k, d_k]
                      tensor_view<const float, 3> k,             // [n_rows, H_k, d_k]
                      tensor_view<const float, 2> g,             // [n_rows, H_v]
                      tensor_view<const float, 2> gamma,         // [n_rows, H_v]
                      tensor_view<const float, 4> chunk_states,  // [n_chunks, H_v, d_k, d_v]
                      tensor_view<const float, 3> v_new,         // [n_rows, H_v, d_v]
                      float scale,
                      tensor_view<float, 3> o) {                 // [n_rows, H_v, d_v]
    constexpr std::string_view who = "gdn_chunk_output";
    const auto d = detail::gdn_check_stage(chunks, k, v_new.dim(1), v_new.dim(2), who);
    detail::gdn_require(q, {d.R, d.Hk, d.dk}, true, who, "q [n_rows, H_k, d_k]");
    detail::gdn_require(g, {d.R, d.Hv}, false, who, "g [n_rows, H_v]");
    detail::gdn_require(gamma, {d.R, d.Hv}, false, who, "gamma [n_rows, H_v]");
    detail::gdn_require(v_new, {d.R, d.Hv, d.dv}, true, who, "v_new [n_rows, H_v, d_v]");
    detail::gdn_require(o, {d.R, d.Hv, d.dv}, true, who, "o [n_rows, H_v, d_v]");
    chunk_states.require_shape({chunks.n_chunks(), d.Hv, d.dk, d.dv}, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    detail::require_dense_matrices(chunk_states, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    detail::gdn_check_g_rows(chunks, g, who);
    using Arch = typename Backend::arch;
    be.parallel_for(chunks.n_chunks() * d.Hv, 1, [&](std::int64_t i0, std::int64_t i1) {
        detail::gdn_scratch w(chunks.width(), d.dk, 0,
                              detail::gdn_vectors | detail::gdn_mask | detail::gdn_kt | detail::gdn_kd | detail::gdn_kk | detail::gdn_p);
        for (std::int64_t i = i0; i < i1; ++i) {
            const std::int64_t c = i / d.Hv, hv = i % d.Hv, hk = hv / (d.Hv / d.Hk), t = chunks.row(c), n = chunks.length(c);
            for (std::int64_t j = 0; j < n; ++j) w.eg[static_cast<std::size_t>(j)] = detail::decay_factor(gamma(t + j, hv));
            detail::gdn_decay_mask_tile(g, t, hv, n, w.gm);
            detail::gdn_keys_transposed(detail::rows_of(k, t, hk, n), w.kt);
            detail::gdn_output_tile<Arch>(detail::rows_of(q, t, hk, n), w.gm, w.eg.data(), scale, &chunk_states(c, hv, 0, 0),
                                          detail::rows_of(v_new, t, hv, n), detail::rows_of(o, t, hv, n), w);
        }
    });
}

// ---- fp64 twins of the stages: same arguments (no backend), plain loops -----------------------------------------

namespace detail {
/// Γ_ij = exp(Σ_{m=j+1..i} g_m) for j ≤ i (the definition, summed directly), else 0.
inline double gdn_gamma_ref(tensor_view<const double, 2> g, std::int64_t t0, std::int64_t h, std::int64_t i, std::int64_t j) {
    if (j > i) return 0.0;
    double seg = 0;
    for (std::int64_t m = j + 1; m <= i; ++m) seg += g(t0 + m, h);
    return std::exp(seg);
}
}  // namespace detail

/// Twin of gdn_chunk_cumsum.
inline void gdn_chunk_cumsum_ref(const chunk_layout& chunks, tensor_view<const double, 2> g, tensor_view<double, 2> gamma) {
    constexpr std::string_view who = "gdn_chunk_cumsum_ref";
    chunks.require_rows(g.dim(0), who, "g");
    gamma.require_shape({chunks.n_rows(), g.dim(1)}, who, "gamma [n_rows, H_v]");
    for (std::int64_t c = 0; c < chunks.n_chunks(); ++c) {
        detail::check_log_decay_rows(g, chunks.row(c), chunks.length(c), who);
        for (std::int64_t h = 0; h < g.dim(1); ++h) {
            double acc = 0;
            for (std::int64_t t = chunks.row(c); t < chunks.row(c) + chunks.length(c); ++t) gamma(t, h) = acc += g(t, h);
        }
    }
}

/// Twin of gdn_wy_prepare.
inline void gdn_wy_prepare_ref(const chunk_layout& chunks, tensor_view<const double, 3> k, tensor_view<const double, 2> g,
                               tensor_view<const double, 2> beta, tensor_view<double, 3> A) {
    constexpr std::string_view who = "gdn_wy_prepare_ref";
    const std::int64_t R = chunks.n_rows(), Hk = k.dim(1), dk = k.dim(2), Hv = g.dim(1), Wd = chunks.width();
    chunks.require_rows(k.dim(0), who, "k");
    g.require_shape({R, Hv}, who, "g [n_rows, H_v]");
    beta.require_shape({R, Hv}, who, "beta [n_rows, H_v]");
    A.require_shape({R, Hv, Wd}, who, "A [n_rows, H_v, W]");
    if (Hk <= 0 || Hv % Hk != 0) throw config_error(std::string(who) + ": value heads must be a positive multiple of key heads");
    for (std::int64_t c = 0; c < chunks.n_chunks(); ++c) {
        const std::int64_t t0 = chunks.row(c), n = chunks.length(c);
        detail::check_log_decay_rows(g, t0, n, who);
        for (std::int64_t h = 0; h < Hv; ++h)
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t j = 0; j < Wd; ++j) {
                    double kk = 0;
                    if (j < i)
                        for (std::int64_t a = 0; a < dk; ++a) kk += k(t0 + i, h / (Hv / Hk), a) * k(t0 + j, h / (Hv / Hk), a);
                    A(t0 + i, h, j) = j < i ? beta(t0 + i, h) * kk * detail::gdn_gamma_ref(g, t0, h, i, j) : 0.0;
                }
    }
}

/// Twin of gdn_intra_chunk_solve: forward substitution X_i = RHS_i − Σ_{j<i} A_ij X_j.
inline void gdn_intra_chunk_solve_ref(const chunk_layout& chunks, tensor_view<const double, 3> k, tensor_view<const double, 3> v,
                                      tensor_view<const double, 2> beta, tensor_view<const double, 2> gamma,
                                      tensor_view<const double, 3> A, tensor_view<double, 3> W, tensor_view<double, 3> U) {
    constexpr std::string_view who = "gdn_intra_chunk_solve_ref";
    const std::int64_t R = chunks.n_rows(), Hk = k.dim(1), dk = k.dim(2), Hv = v.dim(1), dv = v.dim(2);
    chunks.require_rows(k.dim(0), who, "k");
    v.require_shape({R, Hv, dv}, who, "v [n_rows, H_v, d_v]");
    beta.require_shape({R, Hv}, who, "beta [n_rows, H_v]");
    gamma.require_shape({R, Hv}, who, "gamma [n_rows, H_v]");
    A.require_shape({R, Hv, chunks.width()}, who, "A [n_rows, H_v, W]");
    W.require_shape({R, Hv, dk}, who, "W [n_rows, H_v, d_k]");
    U.require_shape({R, Hv, dv}, who, "U [n_rows, H_v, d_v]");
    if (Hk <= 0 || Hv % Hk != 0) throw config_error(std::string(who) + ": value heads must be a positive multiple of key heads");
    for (std::int64_t c = 0; c < chunks.n_chunks(); ++c) {
        const std::int64_t t0 = chunks.row(c), n = chunks.length(c);
        for (std::int64_t h = 0; h < Hv; ++h)
            for (std::int64_t i = 0; i < n; ++i) {
                const std::int64_t t = t0 + i;
                for (std::int64_t a = 0; a < dk; ++a) W(t, h, a) = beta(t, h) * std::exp(gamma(t, h)) * k(t, h / (Hv / Hk), a);
                for (std::int64_t b = 0; b < dv; ++b) U(t, h, b) = beta(t, h) * v(t, h, b);
                for (std::int64_t j = 0; j < i; ++j) {
                    const double aij = A(t, h, j);
                    for (std::int64_t a = 0; a < dk; ++a) W(t, h, a) -= aij * W(t0 + j, h, a);
                    for (std::int64_t b = 0; b < dv; ++b) U(t, h, b) -= aij * U(t0 + j, h, b);
                }
            }
    }
}

/// Twin of gdn_state_pass.
inline void gdn_state_pass_ref(const seq_batch& batch, const chunk_layout& chunks, tensor_view<const double, 3> k,
                               tensor_view<const double, 2> g, tensor_view<const double, 2> gamma, tensor_view<const double, 3> W,
                               tensor_view<const double, 3> U, tensor_view<double, 4> state, tensor_view<double, 4> chunk_states,
                               tensor_view<double, 3> v_new) {
    constexpr std::string_view who = "gdn_state_pass_ref";
    const std::int64_t R = chunks.n_rows(), Hk = k.dim(1), dk = k.dim(2), Hv = U.dim(1), dv = U.dim(2);
    chunks.require_rows(k.dim(0), who, "k");
    g.require_shape({R, Hv}, who, "g [n_rows, H_v]");
    gamma.require_shape({R, Hv}, who, "gamma [n_rows, H_v]");
    W.require_shape({R, Hv, dk}, who, "W [n_rows, H_v, d_k]");
    v_new.require_shape({R, Hv, dv}, who, "v_new [n_rows, H_v, d_v]");
    state.require_shape({-1, Hv, dk, dv}, who, "state [S, H_v, d_k, d_v]");
    chunk_states.require_shape({chunks.n_chunks(), Hv, dk, dv}, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    if (Hk <= 0 || Hv % Hk != 0) throw config_error(std::string(who) + ": value heads must be a positive multiple of key heads");
    batch.validate(state.dim(0));
    detail::gdn_check_layout_batch(batch, chunks, who);
    for (std::int64_t s = 0; s < chunks.n_seq(); ++s)
        for (std::int64_t h = 0; h < Hv; ++h)
            for (std::int64_t c = chunks.first_chunk(s); c < chunks.first_chunk(s + 1); ++c) {
                auto S = state[batch.slots[static_cast<std::size_t>(s)]][h];  // [d_k, d_v]
                const std::int64_t t0 = chunks.row(c), n = chunks.length(c), last = n - 1;
                detail::check_log_decay_rows(g, t0, n, who);
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) chunk_states(c, h, a, b) = S(a, b);
                for (std::int64_t i = 0; i < n; ++i)
                    for (std::int64_t b = 0; b < dv; ++b) {
                        double ws = 0;
                        for (std::int64_t a = 0; a < dk; ++a) ws += W(t0 + i, h, a) * S(a, b);
                        v_new(t0 + i, h, b) = U(t0 + i, h, b) - ws;
                    }
                const double decay_all = std::exp(gamma(t0 + last, h));
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) {
                        double acc = decay_all * S(a, b);
                        for (std::int64_t i = 0; i < n; ++i)
                            acc += k(t0 + i, h / (Hv / Hk), a) * detail::gdn_gamma_ref(g, t0, h, last, i) * v_new(t0 + i, h, b);
                        S(a, b) = acc;
                    }
            }
}

/// Twin of gdn_chunk_output.
inline void gdn_chunk_output_ref(const chunk_layout& chunks, tensor_view<const double, 3> q, tensor_view<const double, 3> k,
                                 tensor_view<const double, 2> g, tensor_view<const double, 2> gamma,
                                 tensor_view<const double, 4> chunk_states, tensor_view<const double, 3> v_new, double scale,
                                 tensor_view<double, 3> o) {
    constexpr std::string_view who = "gdn_chunk_output_ref";
    const std::int64_t R = chunks.n_rows(), Hk = k.dim(1), dk = k.dim(2), Hv = v_new.dim(1), dv = v_new.dim(2);
    chunks.require_rows(k.dim(0), who, "k");
    q.require_shape({R, Hk, dk}, who, "q [n_rows, H_k, d_k]");
    g.require_shape({R, Hv}, who, "g [n_rows, H_v]");
    gamma.require_shape({R, Hv}, who, "gamma [n_rows, H_v]");
    chunk_states.require_shape({chunks.n_chunks(), Hv, dk, dv}, who, "chunk_states [n_chunks, H_v, d_k, d_v]");
    o.require_shape({R, Hv, dv}, who, "o [n_rows, H_v, d_v]");
    if (Hk <= 0 || Hv % Hk != 0) throw config_error(std::string(who) + ": value heads must be a positive multiple of key heads");
    for (std::int64_t c = 0; c < chunks.n_chunks(); ++c) {
        const std::int64_t t0 = chunks.row(c), n = chunks.length(c);
        detail::check_log_decay_rows(g, t0, n, who);
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t hk = h / (Hv / Hk);
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t b = 0; b < dv; ++b) {
                    double inter = 0, intra = 0;
                    for (std::int64_t a = 0; a < dk; ++a) inter += q(t0 + i, hk, a) * chunk_states(c, h, a, b);
                    for (std::int64_t j = 0; j <= i; ++j) {
                        double qk = 0;
                        for (std::int64_t a = 0; a < dk; ++a) qk += q(t0 + i, hk, a) * k(t0 + j, hk, a);
                        intra += qk * detail::gdn_gamma_ref(g, t0, h, i, j) * v_new(t0 + j, h, b);
                    }
                    o(t0 + i, h, b) = scale * (std::exp(gamma(t0 + i, h)) * inter + intra);
                }
        }
    }
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
    // Pass 1 in column tiles of TB SIMD widths (128 columns with AVX-512: one sweep over a d_v = 128 state), the
    // tile's sk and sq in registers across all rows a (2·TB independent FMA chains, within the register file);
    // every element is still the sum over a in ascending order.
    constexpr std::int64_t TB = W >= 16 ? 8 : 4;
    std::int64_t b0 = 0;
    for (; b0 + TB * W <= dvv; b0 += TB * W) {
        std::array<B, TB> ak, aq;
        ak.fill(B(0.f));
        aq.fill(B(0.f));
        for (std::int64_t a = 0; a < dk; ++a) {
            const float* row = S + a * dv + b0;
            const B ka(kt[a]), qa(qs[a]);
            for (std::size_t u = 0; u < TB; ++u) {
                const B x = B::load_unaligned(row + static_cast<std::int64_t>(u) * W);
                ak[u] = xsimd::fma(ka, x, ak[u]);
                aq[u] = xsimd::fma(qa, x, aq[u]);
            }
        }
        for (std::size_t u = 0; u < TB; ++u) {
            ak[u].store_unaligned(sk + b0 + static_cast<std::int64_t>(u) * W);
            aq[u].store_unaligned(sq + b0 + static_cast<std::int64_t>(u) * W);
        }
    }
    std::fill(sk + b0, sk + dv, 0.f);
    std::fill(sq + b0, sq + dv, 0.f);
    for (std::int64_t a = 0; a < dk; ++a) {
        const float* row = S + a * dv;
        const B ka(kt[a]), qa(qs[a]);
        for (std::int64_t b = b0; b < dvv; b += W) {
            const B x = B::load_unaligned(row + b);
            xsimd::fma(ka, x, B::load_unaligned(sk + b)).store_unaligned(sk + b);
            xsimd::fma(qa, x, B::load_unaligned(sq + b)).store_unaligned(sq + b);
        }
        for (std::int64_t b = dvv; b < dv; ++b) {
            sk[b] += kt[a] * row[b];
            sq[b] += qs[a] * row[b];
        }
    }
    const float alpha = decay_factor(g);  // g ≤ 0 was checked by the entry point
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

/// The decode step of value head hv for the token at row t (key head hk): q scaled into scratch, then
/// gated_delta_step_head on the state S [d_k, d_v]. scratch: 2·d_v + d_k floats. Shared by gated_delta_rule_step and
/// the one-token sequences of gated_delta_rule_chunked, so both give the same bits.
template <class Arch>
void gated_delta_step_token(tensor_view<const float, 3> q, tensor_view<const float, 3> k, tensor_view<const float, 3> v,
                            tensor_view<const float, 2> g, tensor_view<const float, 2> beta, float scale, float* S,
                            tensor_view<float, 3> o, std::int64_t t, std::int64_t hk, std::int64_t hv, float* scratch) {
    const std::int64_t dk = q.dim(2), dv = v.dim(2);
    float* qs = scratch + 2 * dv;
    for (std::int64_t a = 0; a < dk; ++a) qs[a] = scale * q(t, hk, a);
    gated_delta_step_head<Arch>(S, qs, &k(t, hk, 0), &v(t, hv, 0), g(t, hv), beta(t, hv), dk, dv, scratch, scratch + dv,
                                &o(t, hv, 0));
}

}  // namespace detail

/// Chunked prefill (spec.md §4.3) in fp32: the composition of the five stages above, with the same maths and arguments
/// as gated_delta_rule_ref, in chunks of `chunk` tokens per sequence (the last chunk shorter), parallel over (sequence,
/// value head). The state is read and written in place per slot; sequences with slot −1 touch nothing and their rows of
/// o are zero. A one-token sequence takes the decode step's arithmetic (detail::gated_delta_step_token), so its result
/// is the same bits here and in gated_delta_rule_step, whatever else shares the call (batch invariance, spec.md §0).
/// Throws shape_error / config_error like the reference, value_error on a positive g, and config_error when chunk < 1.
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
    using Arch = typename Backend::arch;
    detail::check_gated_delta_args<float>(batch, q, k, v, g, beta, state, o, "gated_delta_rule_chunked");
    if (chunk < 1) throw config_error("gated_delta_rule_chunked: chunk size must be >= 1, found " + std::to_string(chunk));
    const std::int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2), r = Hv / Hk;
    detail::zero_uncovered_rows(batch, o);
    const chunk_layout chunks = gdn_chunk_layout(batch, chunk);
    // The five stages per (sequence, value head), chunks in order, with the stages' own tile code; S is the slot's state.
    detail::for_each_chunked_seq_head(be, chunks, Hv, [&](std::int64_t b, std::int64_t e, auto item) {
        // Each thread keeps its scratch between calls (about 240 KiB for chunks of 64 and 128-wide heads) instead of
        // allocating and freeing it in every task of every layer's call. Not measured on its own.
        thread_local detail::gdn_scratch w;
        w.ensure(chunks.width(), dk, dv);
        std::vector<float> one;  // a one-token sequence's scratch: sk, sq [d_v], scaled q [d_k]
        for (std::int64_t i = b; i < e; ++i) {
            const auto [s, hv] = item(i);
            const std::int64_t hk = hv / r;
            float* S = &state(batch.slots[static_cast<std::size_t>(s)], hv, 0, 0);
            if (batch.lengths[static_cast<std::size_t>(s)] == 1) {  // the decode step's arithmetic (batch invariance)
                one.resize(static_cast<std::size_t>(2 * dv + dk));
                detail::gated_delta_step_token<typename Backend::arch>(q, k, v, g, beta, scale, S, o,
                                                                       batch.starts[static_cast<std::size_t>(s)], hk, hv, one.data());
                continue;
            }
            for (std::int64_t c = chunks.first_chunk(s); c < chunks.first_chunk(s + 1); ++c) {
                const std::int64_t t = chunks.row(c), n = chunks.length(c);
                const detail::const_row_map K = detail::rows_of(k, t, hk, n), Q = detail::rows_of(q, t, hk, n);
                const detail::row_map A(w.a.data(), n, n, Eigen::OuterStride<>(w.a.cols()));
                const detail::row_map Wm(w.w.data(), n, dk, Eigen::OuterStride<>(dk)), U(w.u.data(), n, dv, Eigen::OuterStride<>(dv)),
                    Vn(w.vn.data(), n, dv, Eigen::OuterStride<>(dv));
                detail::gdn_cumsum_tile(g, t, hv, n, w.gamma.data());
                detail::gdn_decays([&](std::int64_t j) { return w.gamma[static_cast<std::size_t>(j)]; }, beta, t, hv, n, w);
                detail::gdn_decay_mask_tile(g, t, hv, n, w.gm);
                detail::gdn_keys_transposed(K, w.kt);
                detail::gdn_wy_tile<Arch>(K, w.kt, w.bet.data(), w.gm, A, w.kk);
                detail::gdn_solve_tile<Arch>(detail::as_const(A), K, detail::rows_of(v, t, hv, n), w.bet.data(), w.eg.data(), Wm, U, w);
                detail::gdn_new_values_tile<Arch>(detail::as_const(Wm), detail::as_const(U), S, Vn);
                detail::gdn_output_tile<Arch>(Q, w.gm, w.eg.data(), scale, S, detail::as_const(Vn), detail::rows_of(o, t, hv, n), w);
                detail::gdn_state_update_tile<Arch>(S, K, w.gm, w.eg[static_cast<std::size_t>(n - 1)], detail::as_const(Vn), w.kd);
            }
        }
    });
}


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
    detail::check_gated_delta_args<float>(batch, q, k, v, g, beta, state, o, "gated_delta_rule_step");
    for (std::int64_t s = 0; s < batch.n_seq(); ++s)
        if (batch.lengths[s] != 1)
            throw shape_error("gated_delta_rule_step: sequence " + std::to_string(s) + " has " +
                              std::to_string(batch.lengths[s]) + " tokens, a decode step takes exactly 1");
    const std::int64_t Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2), r = Hv / Hk;
    detail::zero_uncovered_rows(batch, o);
    // At least 48 KiB of state per thread (about 1.7 µs of work, as long as a fork and join of warm threads; measured
    // with bench_gated_deltanet BM_gdn_step_core: a 2-head step of 128 × 128 heads took 4.4 µs inline and 3.4 µs split
    // over 2 threads); a head's state is d_k · d_v floats (64 × 64 heads: 3 per thread, 128 × 128: 1).
    const std::int64_t min_items = items_per_task(4 * dk * dv, std::int64_t{48} << 10);
    detail::for_each_seq_head(be, batch, Hv, [&](std::int64_t b, std::int64_t e, auto item) {
        std::vector<float> scratch(static_cast<std::size_t>(2 * dv + dk));
        for (std::int64_t i = b; i < e; ++i) {
            const auto [s, j] = item(i);
            detail::gated_delta_step_token<typename Backend::arch>(q, k, v, g, beta, scale, &state(batch.slots[s], j, 0, 0), o,
                                                                   batch.starts[s], j / r, j, scratch.data());
        }
    }, min_items);
}

}  // namespace hymix::kernels
