// Fused, streaming LM head + cross-entropy (issue 8; spec.md §5.2 for the entropy, §8 invariant 21): logits
// ℓ = h · headᵀ are made one [rows × vocab] tile at a time and never held whole. Pass 1 keeps a running max, Σ e^{ℓ−max}
// and Σ e^{ℓ−max}(ℓ − max) per row (online log-sum-exp and entropy); pass 2 recomputes each tile and turns it into
// G = s·(softmax − onehot) (the gradient of s·Σ losses w.r.t. the logits), then dh = G·head, dhead += Gᵀ·h.
// loss = LSE − ℓ_target = (max − ℓ_target) + log Σ e^{ℓ−max}; entropy H = LSE − Σ p ℓ = log Σ − Σ p (ℓ − max), with terms
// of p = 0 skipped (never 0·(−∞)), reported normalised by log V. Finite for any finite logits. CPU fp32 (Eigen tiles,
// xsimd exp); fp64 reference twin with whole rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::kernels {

/// Streaming softmax statistics of one row of logits, fed tile by tile in any tile sizes (fp32, xsimd).
/// Logits may be −∞ (they get probability 0 and add nothing); every other logit must be finite.
struct softmax_stream {
    float max = -std::numeric_limits<float>::infinity();  ///< running maximum
    float sum = 0;                                         ///< Σ exp(ℓ − max)
    float wsum = 0;                                        ///< Σ exp(ℓ − max)·(ℓ − max), over terms with exp(·) > 0

    /// Folds logits [n] into the statistics.
    template <class Arch = xsimd::default_arch>
    void add(const float* logits, std::int64_t n) {
        using V = xsimd::batch<float, Arch>;
        constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
        constexpr float neg_inf = -std::numeric_limits<float>::infinity();
        float tmax = neg_inf;
        std::int64_t i = 0;
        if (n >= W) {
            V vm(neg_inf);
            for (; i + W <= n; i += W) vm = xsimd::max(vm, V::load_unaligned(logits + i));
            alignas(64) float lanes[W];
            vm.store_aligned(lanes);
            for (std::int64_t k = 0; k < W; ++k) tmax = std::max(tmax, lanes[k]);
        }
        for (; i < n; ++i) tmax = std::max(tmax, logits[i]);
        if (!(tmax > neg_inf)) return;  // an all −∞ tile adds nothing
        const float m = std::max(max, tmax);
        if (sum > 0) {  // rescale to the new maximum: e^{ℓ−m} = e^{ℓ−max}·c, (ℓ − m) = (ℓ − max) + (max − m)
            const float c = std::exp(max - m);
            wsum = c * (wsum + (max - m) * sum);
            sum = c * sum;
        } else {
            sum = 0;
            wsum = 0;
        }
        max = m;
        const V mv(m), zero(0.f);
        V vs(0.f), vw(0.f);
        i = 0;
        for (; i + W <= n; i += W) {
            const V dv = V::load_unaligned(logits + i) - mv;
            const V e = xsimd::exp(dv);
            vs += e;
            vw += xsimd::select(e > zero, e * dv, zero);
        }
        float s = xsimd::hadd(vs), w = xsimd::hadd(vw);
        for (; i < n; ++i) {
            const float dv = logits[i] - m, e = std::exp(dv);
            s += e;
            if (e > 0) w += e * dv;
        }
        sum += s;
        wsum += w;
    }
    /// log Σ exp(ℓ − max).
    float log_sum() const { return std::log(sum); }
    /// log Σ exp(ℓ).
    float lse() const { return max + log_sum(); }
    /// −log softmax(ℓ)[target] from the target's logit: (max − ℓ_target) + log Σ (exact 0 for a one-hot row).
    float nll(float target_logit) const { return (max - target_logit) + log_sum(); }
    /// Entropy of softmax(ℓ) in nats: log Σ − Σ p (ℓ − max).
    float entropy() const { return log_sum() - wsum / sum; }
};

/// fp64 reference statistics of a whole row: log-sum-exp and entropy (nats), with p = 0 terms skipped.
template <class T>
struct softmax_stats {
    T lse, entropy;
};
template <class T>
softmax_stats<T> softmax_stats_ref(const T* logits, std::int64_t n) {
    T mx = -std::numeric_limits<T>::infinity();
    for (std::int64_t v = 0; v < n; ++v) mx = std::max(mx, logits[v]);
    T s = 0;
    for (std::int64_t v = 0; v < n; ++v) s += std::exp(logits[v] - mx);
    const T lse = mx + std::log(s);
    T pl = 0;  // Σ p ℓ over p > 0
    for (std::int64_t v = 0; v < n; ++v) {
        const T p = std::exp(logits[v] - lse);
        if (p > 0) pl += p * logits[v];
    }
    return {lse, lse - pl};
}

namespace detail {

/// Argument checks of cross_entropy (both backends).
template <class T>
void check_cross_entropy(const tensor_view<const T, 2>& h, const tensor_view<const T, 2>& head, std::span<const std::int32_t> targets,
                         std::size_t n_losses, const tensor_view<T, 2>& dh, const tensor_view<T, 2>& dhead, double grad_scale) {
    constexpr std::string_view who = "cross_entropy";
    const std::int64_t M = h.dim(0), d = h.dim(1), V = head.dim(0);
    if (V < 1) throw shape_error("cross_entropy: head has no rows (vocabulary size 0)");
    head.require_shape({V, d}, who, "head");
    if (targets.size() != static_cast<std::size_t>(M))
        throw shape_error("cross_entropy: targets has " + std::to_string(targets.size()) + " entries for " + std::to_string(M) + " rows");
    if (n_losses != static_cast<std::size_t>(M))
        throw shape_error("cross_entropy: losses has " + std::to_string(n_losses) + " entries for " + std::to_string(M) + " rows");
    hymix::detail::require_unit_stride(h, 1, who, "h", true);
    hymix::detail::require_unit_stride(head, 1, who, "head", true);
    hymix::detail::require_finite(grad_scale, who, "grad_scale");
    if (dh.data) {
        dh.require_shape({M, d}, who, "dh");
        hymix::detail::require_unit_stride(dh, 1, who, "dh", true);
        hymix::detail::require_no_self_overlap(dh, who, "dh");
        hymix::detail::require_no_overlap(dh, "dh", h, "h", who);
        hymix::detail::require_no_overlap(dh, "dh", head, "head", who);
        if (dhead.data) hymix::detail::require_no_overlap(dh, "dh", dhead, "dhead", who);
    }
    if (dhead.data) {
        dhead.require_shape({V, d}, who, "dhead");
        hymix::detail::require_unit_stride(dhead, 1, who, "dhead", true);
        hymix::detail::require_no_self_overlap(dhead, who, "dhead");
        hymix::detail::require_no_overlap(dhead, "dhead", h, "h", who);
        hymix::detail::require_no_overlap(dhead, "dhead", head, "head", who);
    }
    for (std::size_t r = 0; r < targets.size(); ++r)
        if (targets[r] < -1 || targets[r] >= V)
            throw value_error("cross_entropy: targets[" + std::to_string(r) + "] = " + std::to_string(targets[r]) + " outside [-1, " +
                              std::to_string(V) + ") (-1 = no loss)");
}

}  // namespace detail

// ---- reference (T = double) -------------------------------------------------------------------------------------

/// Reference twin with whole logit rows in T. h [M, d], head [V, d], targets [M] (−1: no loss); losses [M] (nats,
/// 0 where ignored); dh [M, d] (=, skipped when null) and dhead [V, d] (+=, skipped when null) are the gradients of
/// grad_scale·Σ losses; entropy [M] (or null) = H / log V (0 when V = 1).
template <class T>
void cross_entropy_ref(tensor_view<const T, 2> h, tensor_view<const T, 2> head, std::span<const std::int32_t> targets, T* losses,
                       tensor_view<T, 2> dh, tensor_view<T, 2> dhead, T grad_scale, T* entropy) {
    detail::check_cross_entropy(h, head, targets, targets.size(), dh, dhead, static_cast<double>(grad_scale));
    const std::int64_t M = h.dim(0), d = h.dim(1), V = head.dim(0);
    std::vector<T> logits(static_cast<std::size_t>(V));
    for (std::int64_t m = 0; m < M; ++m) {
        for (std::int64_t v = 0; v < V; ++v) {
            T s = 0;
            for (std::int64_t k = 0; k < d; ++k) s += h(m, k) * head(v, k);
            logits[static_cast<std::size_t>(v)] = s;
        }
        const auto st = softmax_stats_ref(logits.data(), V);
        const std::int32_t t = targets[static_cast<std::size_t>(m)];
        losses[m] = t < 0 ? T(0) : st.lse - logits[static_cast<std::size_t>(t)];
        if (entropy) entropy[m] = V > 1 ? st.entropy / std::log(static_cast<T>(V)) : T(0);
        if (dh.data)
            for (std::int64_t k = 0; k < d; ++k) dh(m, k) = 0;
        if (t < 0) continue;
        for (std::int64_t v = 0; v < V; ++v) {
            const T g = grad_scale * (std::exp(logits[static_cast<std::size_t>(v)] - st.lse) - (v == t ? T(1) : T(0)));
            for (std::int64_t k = 0; k < d; ++k) {
                if (dh.data) dh(m, k) += g * head(v, k);
                if (dhead.data) dhead(v, k) += g * h(m, k);
            }
        }
    }
}

// ---- CPU fp32 ---------------------------------------------------------------------------------------------------

/// Tile sizes of cross_entropy: rows of h and of head per logits tile (a [128 × 256] fp32 tile is 128 KiB).
inline constexpr std::int64_t cross_entropy_rows = 128;
inline constexpr std::int64_t cross_entropy_vocab = 256;

namespace detail {

using ce_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// L [tm, tv] = h[r0 : r0 + tm] · head[v0 : v0 + tv]ᵀ into buf (row-major, tv columns).
inline Eigen::Map<ce_matrix> ce_logits(tensor_view<const float, 2> h, tensor_view<const float, 2> head, std::int64_t r0, std::int64_t tm,
                                       std::int64_t v0, std::int64_t tv, float* buf) {
    Eigen::Map<ce_matrix> L(buf, tm, tv);
    if (h.dim(1) == 0)
        L.setZero();
    else
        L.noalias() = h.slice(r0, tm).matrix() * head.slice(v0, tv).matrix().transpose();
    return L;
}

/// In place: L [tm, tv] (logits of rows r0…, vocabulary v0…) ← s·(softmax − onehot), 0 on rows without a target.
/// shift[r] = max_r + log Σ_r (the row's LSE, kept as max and log-sum for large logits).
template <class Arch>
inline void ce_grad_tile(float* L, std::int64_t tm, std::int64_t tv, std::int64_t r0, std::int64_t v0, std::span<const std::int32_t> targets,
                         const float* row_max, const float* row_logsum, float scale) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    for (std::int64_t i = 0; i < tm; ++i) {
        float* row = L + i * tv;
        const std::int32_t t = targets[static_cast<std::size_t>(r0 + i)];
        if (t < 0) {
            std::fill_n(row, tv, 0.f);
            continue;
        }
        const float mx = row_max[r0 + i], ls = row_logsum[r0 + i];
        const V mv(mx), lv(ls), sv(scale);
        std::int64_t j = 0;
        for (; j + W <= tv; j += W) (sv * xsimd::exp((V::load_unaligned(row + j) - mv) - lv)).store_unaligned(row + j);
        for (; j < tv; ++j) row[j] = scale * std::exp((row[j] - mx) - ls);
        if (t >= v0 && t < v0 + tv) row[t - v0] -= scale;
    }
}

}  // namespace detail

/// Fused LM head + cross-entropy, fp32. h [M, d], head [V, d] (unit inner strides, any row strides); targets [M]
/// with −1 = no loss at that row. losses [M] ← nats (0 where ignored); entropy [M] (or null) ← H / log V.
/// dh [M, d] ← d(grad_scale·Σ losses)/dh (overwritten; data == nullptr: skipped); dhead [V, d] += the head's
/// gradient (or skipped). Never holds more than one [128 × 256] logits tile per task. Statistics: parallel over row
/// blocks. Gradients: parallel over row ranges (dh only, or fewer vocabulary tiles than threads: (threads − 1)
/// [V, d] dhead partials) or over one contiguous vocabulary range per thread (each task owns its dhead rows;
/// (threads − 1) [M, d] dh partials when dh is wanted); partials are summed in range order. Every result is
/// deterministic for a given thread count; losses, entropy, and dh without dhead, are bit-identical for any count.
/// Memory: two floats per row, one tile per task, and the partials above.
template <cpu_backend_type Backend>
void cross_entropy(const Backend& be, tensor_view<const float, 2> h, tensor_view<const float, 2> head, std::span<const std::int32_t> targets,
                   std::span<float> losses, tensor_view<float, 2> dh, tensor_view<float, 2> dhead, float grad_scale, float* entropy) {
    using Arch = typename Backend::arch;
    detail::check_cross_entropy(h, head, targets, losses.size(), dh, dhead, static_cast<double>(grad_scale));
    const std::int64_t M = h.dim(0), d = h.dim(1), V = head.dim(0);
    if (M == 0) return;
    constexpr std::int64_t TM = cross_entropy_rows, TV = cross_entropy_vocab;
    const std::int64_t n_rb = (M + TM - 1) / TM, n_vt = (V + TV - 1) / TV;
    const float inv_log_v = V > 1 ? 1.0f / std::log(static_cast<float>(V)) : 0.0f;
    std::vector<float> row_max(static_cast<std::size_t>(M)), row_logsum(static_cast<std::size_t>(M));

    // Pass 1: per-row statistics, the target's logit, losses and entropy.
    be.parallel_for(n_rb, 1, [&](std::int64_t b0, std::int64_t b1) {
        std::vector<float> buf(static_cast<std::size_t>(TM * TV));
        std::vector<softmax_stream> st(static_cast<std::size_t>(TM));
        std::vector<float> tl(static_cast<std::size_t>(TM));
        for (std::int64_t b = b0; b < b1; ++b) {
            const std::int64_t r0 = b * TM, tm = std::min(TM, M - r0);
            std::fill(st.begin(), st.end(), softmax_stream{});
            for (std::int64_t vt = 0; vt < n_vt; ++vt) {
                const std::int64_t v0 = vt * TV, tv = std::min(TV, V - v0);
                const auto L = detail::ce_logits(h, head, r0, tm, v0, tv, buf.data());
                for (std::int64_t i = 0; i < tm; ++i) {
                    st[static_cast<std::size_t>(i)].template add<Arch>(&L(i, 0), tv);
                    const std::int32_t t = targets[static_cast<std::size_t>(r0 + i)];
                    if (t >= v0 && t < v0 + tv) tl[static_cast<std::size_t>(i)] = L(i, t - v0);
                }
            }
            for (std::int64_t i = 0; i < tm; ++i) {
                const auto& s = st[static_cast<std::size_t>(i)];
                const auto r = static_cast<std::size_t>(r0 + i);
                row_max[r] = s.max;
                row_logsum[r] = s.log_sum();
                losses[r] = targets[r] < 0 ? 0.0f : s.nll(tl[static_cast<std::size_t>(i)]);
                if (entropy) entropy[r] = s.entropy() * inv_log_v;
            }
        }
    });
    if (!dh.data && !dhead.data) return;

    auto any_target = [&](std::int64_t r0, std::int64_t tm) {
        for (std::int64_t i = 0; i < tm; ++i)
            if (targets[static_cast<std::size_t>(r0 + i)] >= 0) return true;
        return false;
    };
    const std::int64_t threads = be.num_threads();
    if (!dhead.data || n_vt < threads) {
        // Pass 2 over P contiguous ranges of row blocks (dh only, or a vocabulary too small to split): a task owns its
        // dh rows and walks the vocabulary tiles in order; with dhead, range p > 0 accumulates into its own zeroed
        // [V, d] partial (range 0 directly into dhead), summed into dhead in range order afterwards.
        const std::int64_t P = dhead.data ? std::min(threads, n_rb) : n_rb;
        std::vector<float> partial(dhead.data ? static_cast<std::size_t>((P - 1) * V * d) : 0);  // [P − 1, V, d]
        auto dhead_part = [&](std::int64_t p) {
            return p == 0 ? dhead : tensor_view<float, 2>(partial.data() + (p - 1) * V * d, {V, d});
        };
        be.parallel_for(P, 1, [&](std::int64_t p0, std::int64_t p1) {
            std::vector<float> buf(static_cast<std::size_t>(TM * TV));
            for (std::int64_t p = p0; p < p1; ++p) {
                const auto dhp = dhead.data ? dhead_part(p) : tensor_view<float, 2>();
                for (std::int64_t b = p * n_rb / P; b < (p + 1) * n_rb / P; ++b) {
                    const std::int64_t r0 = b * TM, tm = std::min(TM, M - r0);
                    if (dh.data)
                        for (std::int64_t r = r0; r < r0 + tm; ++r) std::fill_n(&dh(r, 0), d, 0.f);
                    if (!any_target(r0, tm)) continue;
                    for (std::int64_t vt = 0; vt < n_vt; ++vt) {
                        const std::int64_t v0 = vt * TV, tv = std::min(TV, V - v0);
                        const auto L = detail::ce_logits(h, head, r0, tm, v0, tv, buf.data());
                        detail::ce_grad_tile<Arch>(buf.data(), tm, tv, r0, v0, targets, row_max.data(), row_logsum.data(), grad_scale);
                        if (d == 0) continue;
                        if (dh.data) dh.slice(r0, tm).matrix().noalias() += L * head.slice(v0, tv).matrix();
                        if (dhp.data) dhp.slice(v0, tv).matrix().noalias() += L.transpose() * h.slice(r0, tm).matrix();
                    }
                }
            }
        });
        if (dhead.data && P > 1)
            be.parallel_for(V, 64, [&](std::int64_t v0, std::int64_t v1) {
                for (std::int64_t v = v0; v < v1; ++v)
                    for (std::int64_t p = 1; p < P; ++p) {
                        const float* src = &dhead_part(p)(v, 0);
                        float* dst = &dhead(v, 0);
                        for (std::int64_t k = 0; k < d; ++k) dst[k] += src[k];
                    }
            });
        return;
    }
    // Pass 2 with dhead over a large vocabulary: P = threads contiguous ranges of vocabulary tiles, one task each; a
    // task walks its tiles in order and, per tile, the row blocks in order (its dhead rows have one owner; dh gets one
    // [M, d] partial per range, range 0 written directly, summed in range order afterwards).
    const std::int64_t P = threads;
    std::vector<float> partial(dh.data ? static_cast<std::size_t>((P - 1) * M * d) : 0);  // [P − 1, M, d]
    auto dh_part = [&](std::int64_t p) {
        return p == 0 ? dh : tensor_view<float, 2>(partial.data() + (p - 1) * M * d, {M, d});
    };
    be.parallel_for(P, 1, [&](std::int64_t p0, std::int64_t p1) {
        std::vector<float> buf(static_cast<std::size_t>(TM * TV));
        for (std::int64_t p = p0; p < p1; ++p) {
            const auto dhp = dh.data ? dh_part(p) : tensor_view<float, 2>();
            if (dhp.data)
                for (std::int64_t r = 0; r < M; ++r) std::fill_n(&dhp(r, 0), d, 0.f);
            for (std::int64_t vt = p * n_vt / P; vt < (p + 1) * n_vt / P; ++vt) {
                const std::int64_t v0 = vt * TV, tv = std::min(TV, V - v0);
                const auto ht = head.slice(v0, tv).matrix();  // [tv, d]
                auto dht = dhead.slice(v0, tv).matrix();      // [tv, d]
                for (std::int64_t b = 0; b < n_rb; ++b) {
                    const std::int64_t r0 = b * TM, tm = std::min(TM, M - r0);
                    if (!any_target(r0, tm)) continue;
                    const auto L = detail::ce_logits(h, head, r0, tm, v0, tv, buf.data());
                    detail::ce_grad_tile<Arch>(buf.data(), tm, tv, r0, v0, targets, row_max.data(), row_logsum.data(), grad_scale);
                    if (d == 0) continue;
                    if (dhp.data) dhp.slice(r0, tm).matrix().noalias() += L * ht;
                    dht.noalias() += L.transpose() * h.slice(r0, tm).matrix();
                }
            }
        }
    });
    if (dh.data && P > 1)
        be.parallel_for(M, 64, [&](std::int64_t r0, std::int64_t r1) {
            for (std::int64_t r = r0; r < r1; ++r)
                for (std::int64_t p = 1; p < P; ++p) {
                    const float* src = &dh_part(p)(r, 0);
                    float* dst = &dh(r, 0);
                    for (std::int64_t k = 0; k < d; ++k) dst[k] += src[k];
                }
        });
}

}  // namespace hymix::kernels
