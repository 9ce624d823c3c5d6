// AMOR's entropy gate (spec.md §5.2; arXiv 2602.13215, HaoranZhengRaul/AMOR `amor.py`): a block attends only at
// tokens where the backbone is uncertain, measured as the normalised entropy H ∈ [0, 1] of the LM head's softmax
// on the block's own normalised input, against a threshold τ = m̄ + κ·s̄ built from exponential moving averages of
// the batch median and (unbiased) standard deviation of H. Training advances the averages once per forward, before
// τ is formed; inference freezes them. The entropy streams over the vocabulary in tiles (online log-sum-exp and
// Σ p·ℓ, fused with the head GEMM tile by tile), so no [T, V] logits matrix is ever built.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/gate/entropy_router.hpp"
#include "hymix/ops/linear.hpp"

namespace hymix {

/// How τ is formed from the running statistics.
enum class amor_offset_mode { adaptive, fixed };

/// Which entropy: the stable LSE − Σ p·ℓ (default) or the reference's −Σ p·log(p + 1e−10) (exact parity with the
/// PyTorch code; a second pass over the head). They differ by at most about 1e−10·V / log V.
enum class entropy_form { stable, plus_eps };

struct entropy_ema_config {
    float kappa = 0.2f;            ///< offset_k: τ = m̄ + κ·s̄
    float momentum = 0.99f;        ///< μ (ema_momentum)
    float init_threshold = 0.3f;   ///< initial m̄ (gate.running_threshold)
    float init_std = 0.1f;         ///< initial s̄ (gate.running_std)
    amor_offset_mode offset_mode = amor_offset_mode::adaptive;
    float gate_offset = 0.03f;     ///< τ = m̄ + gate_offset in fixed mode
    entropy_form form = entropy_form::stable;
    std::int64_t vocab_tile = 4096;  ///< head rows per tile of the streaming entropy
    std::int64_t row_tile = 64;      ///< input rows per tile
    bool always_on = false;          ///< every token fires (no entropy is computed, the statistics never move):
                                     ///< the always-on comparison with the same parameters, selectable from a file

    void validate() const {
        if (!(momentum >= 0 && momentum < 1)) throw config_error("entropy_ema: momentum must lie in [0, 1), found " + std::to_string(momentum));
        if (!std::isfinite(kappa)) throw config_error("entropy_ema: kappa must be finite");
        if (!std::isfinite(init_threshold) || !std::isfinite(init_std)) throw config_error("entropy_ema: initial statistics must be finite");
        if (vocab_tile <= 0 || row_tile <= 0) throw config_error("entropy_ema: tiles must be positive");
    }
};

namespace detail {
/// Lower middle element (spec.md §5.2) of v (copied, partially sorted).
inline double lower_median(std::vector<float> v) {
    if (v.empty()) return 0.0;
    const std::size_t k = (v.size() - 1) / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    return v[k];
}
/// Unbiased standard deviation (n − 1), in double; 0 for fewer than 2 values.
inline double unbiased_std(std::span<const float> v) {
    if (v.size() < 2) return 0.0;
    double mean = 0;
    for (float x : v) mean += x;
    mean /= static_cast<double>(v.size());
    double s = 0;
    for (float x : v) s += (x - mean) * (x - mean);
    return std::sqrt(s / static_cast<double>(v.size() - 1));
}
}  // namespace detail

/// Normalised entropy of softmax(h · headᵀ) for every row: H[r] = (LSE(ℓ) − Σ p·ℓ) / log V (or the +1e−10 form),
/// ℓ = h[r] · headᵀ [V]. h [n, d] fp32, head [V, d] fp32, H [n] out. Streams over the vocabulary in tiles of
/// `vocab_tile` head rows with an online log-sum-exp: memory O(row_tile · vocab_tile). Rows whose logits are all
/// −∞ or hold NaN give NaN (callers check). Throws shape_error on mismatched shapes. The head may be bf16 / f16 (TW,
/// given explicitly; widened exactly in the projection), or a linear_weight (the overload below).
namespace detail {
/// Head rows [v0, v0 + n) as the projection reads them.
template <class TW>
tensor_view<const TW, 2> head_rows(tensor_view<const TW, 2> head, std::int64_t v0, std::int64_t n) {
    return tensor_view<const TW, 2>(head.data + v0 * head.strides[0], {n, head.dim(1)}, {head.strides[0], head.strides[1]});
}
inline q8_view head_rows(q8_view head, std::int64_t v0, std::int64_t n) { return head.rows(v0, n); }
inline void require_head_shape(q8_view head, std::int64_t V, std::int64_t d) { head.q.require_shape({V, d}, "head_entropy: head"); }
template <class TW>
void require_head_shape(tensor_view<const TW, 2> head, std::int64_t V, std::int64_t d) { head.require_shape({V, d}, "head_entropy: head"); }

template <backend B, class Head>
void head_entropy_impl(const B& be, tensor_view<const float, 2> h, Head head, std::span<float> H, entropy_form form,
                       std::int64_t vocab_tile, std::int64_t row_tile);
}  // namespace detail

template <backend B, class TW = float>
void head_entropy(const B& be, tensor_view<const float, 2> h, std::type_identity_t<tensor_view<const TW, 2>> head, std::span<float> H,
                  entropy_form form = entropy_form::stable, std::int64_t vocab_tile = 4096, std::int64_t row_tile = 64) {
    detail::head_entropy_impl(be, h, head, H, form, vocab_tile, row_tile);
}
/// The same with an 8-bit head (q8_view, host backends).
template <host_backend B>
void head_entropy(const B& be, tensor_view<const float, 2> h, q8_view head, std::span<float> H, entropy_form form = entropy_form::stable,
                  std::int64_t vocab_tile = 4096, std::int64_t row_tile = 64) {
    detail::head_entropy_impl(be, h, head, H, form, vocab_tile, row_tile);
}

template <backend B, class Head>
void detail::head_entropy_impl(const B& be, tensor_view<const float, 2> h, Head head, std::span<float> H, entropy_form form,
                               std::int64_t vocab_tile, std::int64_t row_tile) {
    const std::int64_t n = h.dim(0), d = h.dim(1), V = head.dim(0);
    require_head_shape(head, V, d);
    if (static_cast<std::int64_t>(H.size()) != n)
        throw shape_error("head_entropy: H has " + std::to_string(H.size()) + " entries for " + std::to_string(n) + " rows");
    if (V < 2) throw shape_error("head_entropy: a vocabulary of " + std::to_string(V) + " has no entropy to normalise");
    const double logV = std::log(static_cast<double>(V));
    const std::int64_t vt = std::min(vocab_tile, V), rt = std::min(row_tile, std::max<std::int64_t>(n, 1));
    std::vector<float> buf(static_cast<std::size_t>(rt * vt));
    std::vector<double> mx(static_cast<std::size_t>(rt)), se(static_cast<std::size_t>(rt)), spl(static_cast<std::size_t>(rt));
    for (std::int64_t r0 = 0; r0 < n; r0 += rt) {
        const std::int64_t rn = std::min(rt, n - r0);
        std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
        std::fill(se.begin(), se.end(), 0.0);
        std::fill(spl.begin(), spl.end(), 0.0);
        const tensor_view<const float, 2> hb(h.data + r0 * h.strides[0], {rn, d}, {h.strides[0], h.strides[1]});
        for (std::int64_t v0 = 0; v0 < V; v0 += vt) {
            const std::int64_t vn = std::min(vt, V - v0);
            tensor_view<float, 2> lt(buf.data(), {rn, vn});
            ops::linear(be, hb, head_rows(head, v0, vn), nullptr, lt);
            for (std::int64_t r = 0; r < rn; ++r) {
                const float* l = &lt(r, 0);
                double m = mx[r];
                for (std::int64_t j = 0; j < vn; ++j) m = std::max(m, static_cast<double>(l[j]));
                if (m == -std::numeric_limits<double>::infinity()) continue;  // a tile with no finite logit adds nothing
                const double scale = mx[r] == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(mx[r] - m);
                double s = se[r] * scale, t = spl[r] * scale;
                for (std::int64_t j = 0; j < vn; ++j) {
                    const double e = std::exp(static_cast<double>(l[j]) - m);
                    s += e;
                    if (e > 0) t += e * static_cast<double>(l[j]);
                }
                mx[r] = m, se[r] = s, spl[r] = t;
            }
        }
        for (std::int64_t r = 0; r < rn; ++r) {
            const double lse = mx[r] + std::log(se[r]);
            H[static_cast<std::size_t>(r0 + r)] = static_cast<float>((lse - spl[r] / se[r]) / logV);
        }
        if (form == entropy_form::plus_eps) {
            std::vector<double> acc(static_cast<std::size_t>(rn), 0.0);
            for (std::int64_t v0 = 0; v0 < V; v0 += vt) {
                const std::int64_t vn = std::min(vt, V - v0);
                tensor_view<float, 2> lt(buf.data(), {rn, vn});
                ops::linear(be, hb, head_rows(head, v0, vn), nullptr, lt);
                for (std::int64_t r = 0; r < rn; ++r) {
                    const double lse = mx[r] + std::log(se[r]);
                    for (std::int64_t j = 0; j < vn; ++j) {
                        const double p = std::exp(static_cast<double>(lt(r, j)) - lse);
                        acc[static_cast<std::size_t>(r)] -= p * std::log(p + 1e-10);
                    }
                }
            }
            for (std::int64_t r = 0; r < rn; ++r) H[static_cast<std::size_t>(r0 + r)] = static_cast<float>(acc[static_cast<std::size_t>(r)] / logV);
        }
    }
}

/// head_entropy with the LM head as a model stores it (f32, bf16, f16 or i8).
template <host_backend B, std::same_as<linear_weight> W>
void head_entropy(const B& be, tensor_view<const float, 2> h, const W& head, std::span<float> H,
                  entropy_form form = entropy_form::stable, std::int64_t vocab_tile = 4096, std::int64_t row_tile = 64) {
    head.template visit_stored<2>([&]<class V>(V hv)
        requires dispatchable_op<ops::linear_op, B, tensor_view<const float, 2>, V, const float*, tensor_view<float, 2>>
    { detail::head_entropy_impl(be, h, hv, H, form, vocab_tile, row_tile); });
}

/// The entropy-EMA gate of one AMOR block: fires iff H > τ (strict); at inference H may come from a fitted router
/// (set_router, spec.md §5.6) instead of the LM head. Statistics `running_threshold` (m̄) and
/// `running_std` (s̄) are the checkpoint buffers `gate.running_threshold` / `gate.running_std`.
class entropy_ema {
public:
    static constexpr const char* name = "entropy_ema";
    static constexpr bool fires_all = false;
    static constexpr bool fires_none = false;

    entropy_ema() : entropy_ema(entropy_ema_config{}) {}
    explicit entropy_ema(entropy_ema_config cfg) : cfg_(cfg), m_(cfg.init_threshold), s_(cfg.init_std) { cfg_.validate(); }

    const entropy_ema_config& config() const noexcept { return cfg_; }
    float running_threshold() const noexcept { return m_; }
    float running_std() const noexcept { return s_; }
    void set_statistics(float m, float s) {
        if (!std::isfinite(m) || !std::isfinite(s))
            throw value_error("entropy_ema: statistics must be finite, found " + std::to_string(m) + ", " + std::to_string(s));
        m_ = m, s_ = s;
    }
    /// Moves the gate's operating point without touching the learned statistics: τ = m̄ + κ·s̄ in the adaptive mode
    /// (this is how a trained block is swept over fire rates at inference, e.g. `hymix amor-sweep`); `always_on` makes
    /// every token fire. Throws config_error for a non-finite κ, or for κ on a gate in the fixed offset mode (its knob
    /// is gate_offset, left as trained).
    void set_kappa(float kappa) {
        if (!std::isfinite(kappa)) throw config_error("entropy_ema: kappa must be finite, found " + std::to_string(kappa));
        if (cfg_.offset_mode != amor_offset_mode::adaptive)
            throw config_error("entropy_ema: kappa applies in the adaptive offset mode only; this gate uses the fixed offset " +
                               std::to_string(cfg_.gate_offset));
        cfg_.kappa = kappa;
    }
    void set_always_on(bool on) noexcept { cfg_.always_on = on; }
    /// Inference fires on a fitted router's Ĥ > τ instead of the head's H (spec.md §5.6; null: the exact gate again).
    /// The statistics and τ are unchanged; training (decide_train) always uses the exact entropy. The per-row scores
    /// a call reports (block_stats::score) are then Ĥ. Throws shape_error at the next call if the router's d differs
    /// from the block's.
    void set_router(std::shared_ptr<const entropy_router> r) noexcept { router_ = std::move(r); }
    const std::shared_ptr<const entropy_router>& router() const noexcept { return router_; }
    /// Inference records (ĥ, exact H) of its live rows into `s` (null: stops), the data fit_entropy_router takes.
    /// Rows are recorded only while no router is set (the exact entropy is needed).
    void set_sample_tap(std::shared_ptr<router_samples> s) noexcept { tap_ = std::move(s); }
    const std::shared_ptr<router_samples>& sample_tap() const noexcept { return tap_; }
    /// τ from the current statistics.
    float threshold() const noexcept {
        return cfg_.offset_mode == amor_offset_mode::adaptive ? m_ + cfg_.kappa * s_ : m_ + cfg_.gate_offset;
    }
    /// One EMA step from the entropies of every position of a training batch (spec.md §5.2): m̄ ← μ m̄ + (1−μ)
    /// median(H), s̄ ← μ s̄ + (1−μ) std(H); s̄ is left unchanged for a single value; nothing changes for none.
    void observe(std::span<const float> H) {
        if (H.empty()) return;
        const double mu = cfg_.momentum;
        m_ = static_cast<float>(mu * m_ + (1 - mu) * detail::lower_median(std::vector<float>(H.begin(), H.end())));
        if (H.size() > 1) s_ = static_cast<float>(mu * s_ + (1 - mu) * detail::unbiased_std(H));
    }
    /// Post-hoc calibration (no training step): m̄ = lower median and s̄ = unbiased std of the entropies H of many
    /// positions: approximately where the EMA of spec.md §5.2 settles when every batch is drawn from the same
    /// distribution (it averages each batch's median and std; large batches make the two agree).
    /// For blocks whose statistics never moved in training (always-on runs), so that κ can gate them at inference
    /// (models/amor_calibrate.hpp records H). Throws value_error for fewer than 2 values, nonfinite_error (a value_error)
    /// for a non-finite one.
    void calibrate(std::span<const float> H) {
        if (H.size() < 2) throw value_error("entropy_ema: calibration needs at least 2 entropies, found " + std::to_string(H.size()));
        require_finite(H, "entropy_ema::calibrate: entropies");
        set_statistics(static_cast<float>(detail::lower_median(std::vector<float>(H.begin(), H.end()))), static_cast<float>(detail::unbiased_std(H)));
    }
    /// fire[r] = H[r] > τ.
    void fire_from(std::span<const float> H, std::span<unsigned char> fire) const {
        const float tau = threshold();
        for (std::size_t r = 0; r < fire.size() && r < H.size(); ++r) fire[r] = H[r] > tau ? 1 : 0;
    }

    /// Inference (frozen statistics): entropies of h's rows under the context's LM head, left in ctx.ws.score.
    template <class Ctx>
    void decide(const Ctx& ctx, tensor_view<const float, 2> h, std::span<unsigned char> fire) const {
        if (cfg_.always_on) return std::fill(fire.begin(), fire.end(), static_cast<unsigned char>(1));
        auto& H = ctx.ws.score;
        H.assign(static_cast<std::size_t>(h.dim(0)), 0.0f);
        if (router_) {
            router_->predict(ctx.be, h, std::span<float>(H));
        } else {
            head_entropy(ctx.be, h, ctx.head, std::span<float>(H), cfg_.form, cfg_.vocab_tile, cfg_.row_tile);
            if (tap_) tap_->add(h, H, ctx.batch.live());
        }
        fire_from(H, fire);
        ctx.ws.score_threshold = threshold();
    }
    /// Training: the EMA step over the live rows' entropies, then the decision with the updated τ.
    template <class Ctx>
    void decide_train(const Ctx& ctx, tensor_view<const float, 2> h, std::span<unsigned char> fire) {
        if (cfg_.always_on) return std::fill(fire.begin(), fire.end(), static_cast<unsigned char>(1));
        auto& H = ctx.ws.score;
        H.assign(static_cast<std::size_t>(h.dim(0)), 0.0f);
        head_entropy(ctx.be, h, ctx.head, std::span<float>(H), cfg_.form, cfg_.vocab_tile, cfg_.row_tile);
        std::vector<float> live_h;
        const auto live = ctx.batch.live();
        for (std::size_t r = 0; r < H.size(); ++r)
            if (live[r]) live_h.push_back(H[r]);
        observe(live_h);
        fire_from(H, fire);
        ctx.ws.score_threshold = threshold();
    }

private:
    entropy_ema_config cfg_;
    float m_, s_;
    std::shared_ptr<const entropy_router> router_;
    std::shared_ptr<router_samples> tap_;
};

}  // namespace hymix
