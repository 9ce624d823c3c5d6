// Bits per byte of a causal language model over a slice of text, after ../shared/models/README.md: windows of L
// bytes start at s = 0, L, 2L, …; each window is one fresh sequence (positions from 0) fed bytes [s, s+len) and
// scored on its predictions of bytes [s+1, s+len]; bits/byte = Σ cross-entropy (nats) / scored bytes / ln 2.
// By default the last window is shortened so that every byte but the first is scored (n − 1 bytes); with
// `full_windows_only` only whole windows with s < n − L run (the README's protocol). Several windows run as one batch.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/mode_schedule.hpp"

namespace hymix {

/// A causal LM over token ids with per-sequence caches (hymix::auto_model and compiled stacks satisfy it).
template <class M>
concept causal_lm = requires(const M& m, typename M::cache& c, const seq_batch& b, std::span<const std::int32_t> t,
                             tensor_view<float, 2> logits, std::int64_t n) {
    { m.make_cache(n) } -> std::same_as<typename M::cache>;
    m.forward(c, b, t, logits);
    { m.info().vocab_size } -> std::convertible_to<std::int64_t>;
};

struct score_options {
    std::int64_t window = 512;       ///< window length L (a fresh sequence each)
    std::int64_t batch = 8;          ///< windows per forward call (memory grows with batch × window × vocab)
    bool full_windows_only = false;  ///< true: only whole windows with s < n − L (shared/models/README.md)
};

/// Where a scoring run stands; bits_per_byte and std_error are the running estimate over the bytes so far.
struct score_progress {
    std::int64_t windows_done = 0, windows_total = 0, scored_bytes = 0;
    double bits_per_byte = 0, std_error = 0;
};

struct score_result {
    double bits_per_byte = 0;
    double std_error = 0;  ///< standard error of bits_per_byte over the scored bytes (0 with fewer than 2 bytes)
    double total_nats = 0;
    std::int64_t scored_bytes = 0;
    std::int64_t windows = 0;
    double seconds = 0;
};

/// Cross-entropy in nats of one row of logits [V] against `target`, via a numerically safe log-sum-exp in double.
/// Throws shape_error for an empty row or a target outside [0, V), nonfinite_error when a logit is NaN or +Inf,
/// when every logit is −Inf, or when the target's logit is −Inf (probability 0: infinite cross-entropy).
inline double cross_entropy(std::span<const float> logits, std::int32_t target) {
    const std::size_t V = logits.size();
    if (V == 0) throw shape_error("cross_entropy: empty logits");
    if (target < 0 || static_cast<std::size_t>(target) >= V)
        throw shape_error("cross_entropy: target " + std::to_string(target) + " outside [0, " + std::to_string(V) + ")");
    double mx = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < V; ++i) {
        const double v = logits[i];
        if (std::isnan(v) || v == std::numeric_limits<double>::infinity())
            throw nonfinite_error("cross_entropy: logits[" + std::to_string(i) + "] = " + nonfinite_name(v));
        mx = v > mx ? v : mx;
    }
    if (!std::isfinite(mx)) throw nonfinite_error("cross_entropy: every logit is -Inf");
    const double t = logits[static_cast<std::size_t>(target)];
    if (!std::isfinite(t))
        throw nonfinite_error("cross_entropy: the target " + std::to_string(target) +
                              " has logit -Inf (probability 0, infinite cross-entropy)");
    double s = 0;
    for (float v : logits) s += std::exp(static_cast<double>(v) - mx);
    return mx + std::log(s) - t;
}

namespace detail {

/// Running mean and standard error of per-byte cross-entropies (nats in, bits out), by Welford's update
/// (no cancellation: equal losses give a standard error of exactly 0).
struct ce_stats {
    double sum = 0, mean = 0, m2 = 0;  // m2: Σ (x − mean)²
    std::int64_t n = 0;
    void add(double nats) {
        sum += nats;
        ++n;
        const double d = nats - mean;
        mean += d / static_cast<double>(n);
        m2 += d * (nats - mean);
    }
    double bits() const { return n > 0 ? sum / static_cast<double>(n) / std::log(2.0) : 0.0; }
    double std_error_bits() const {
        if (n < 2) return 0.0;
        const double N = static_cast<double>(n);
        return std::sqrt(m2 / (N - 1) / N) / std::log(2.0);
    }
};

}  // namespace detail

/// Scores `text[offset, offset + n_bytes)` (see the file comment). `progress` is called after each forward call
/// (may be empty). Throws config_error on bad arguments, nonfinite_error naming the byte when the model's logits
/// are not finite, and whatever the model throws.
template <causal_lm M>
score_result score_bits_per_byte(const M& model, std::span<const std::uint8_t> text, std::int64_t offset, std::int64_t n_bytes,
                                 const score_options& opt,
                                 const std::function<void(const score_progress&)>& progress = {}) {
    const auto size = static_cast<std::int64_t>(text.size());
    const std::int64_t L = opt.window;
    if (offset < 0 || n_bytes <= 0 || offset > size || n_bytes > size - offset)  // no overflow for huge values
        throw config_error("score: " + std::to_string(n_bytes) + " bytes from offset " + std::to_string(offset) +
                           " do not fit in the text of " + std::to_string(size) + " bytes");
    if (n_bytes < 2) throw config_error("score: at least 2 bytes are needed (the first byte has nothing to predict it)");
    if (L < 1) throw config_error("score: window " + std::to_string(L) + " must be >= 1");
    if (opt.full_windows_only && L >= n_bytes)
        throw config_error("score: whole windows of " + std::to_string(L) + " bytes need more than " + std::to_string(L) +
                           " bytes, the slice has " + std::to_string(n_bytes));
    if (opt.batch < 1) throw config_error("score: batch must be >= 1, found " + std::to_string(opt.batch));

    // Windows: start s and length len; they feed bytes [s, s+len) and predict bytes [s+1, s+len].
    struct win {
        std::int64_t s, len;
    };
    std::vector<win> full, partial;
    const std::int64_t stop = opt.full_windows_only ? n_bytes - L : n_bytes - 1;
    for (std::int64_t s = 0; s < stop; s += L) {
        const std::int64_t len = std::min(L, n_bytes - 1 - s);
        (len == L ? full : partial).push_back({s, len});
    }
    const std::int64_t total = static_cast<std::int64_t>(full.size() + partial.size());
    const std::int64_t V = model.info().vocab_size;

    const auto t0 = std::chrono::steady_clock::now();
    score_result r;
    detail::ce_stats st;
    const std::int64_t batch = std::min(opt.batch, std::max<std::int64_t>(static_cast<std::int64_t>(full.size()), 1));
    tensor<float> logits({batch * L, V});
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * L));
    // Runs windows w[0..nb) of one length as one batch and adds their cross-entropies.
    auto run = [&](const win* w, std::int64_t nb) {
        const std::int64_t len = w[0].len;
        auto cache = model.make_cache(nb);
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t i = 0; i < len; ++i)
                tokens[static_cast<std::size_t>(b * len + i)] = text[static_cast<std::size_t>(offset + w[b].s + i)];
        auto lv = tensor_view<float, 2>(logits.data(), {nb * len, V});
        const auto b = seq_batch::dense(nb, len);
        const std::span<const std::int32_t> tv(tokens.data(), static_cast<std::size_t>(nb * len));
        if constexpr (requires { model.forward(cache, b, tv, lv, call_phase::prefill); })
            model.forward(cache, b, tv, lv, call_phase::prefill);  // windows are prompts, whatever their length
        else
            model.forward(cache, b, tv, lv);
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t i = 0; i < len; ++i) {
                const std::int64_t at = offset + w[b].s + i + 1;  // the predicted byte
                const std::int32_t target = text[static_cast<std::size_t>(at)];
                try {
                    st.add(cross_entropy({&lv(b * len + i, 0), static_cast<std::size_t>(V)}, target));
                } catch (const nonfinite_error& e) {
                    throw nonfinite_error("score: predicting the byte at offset " + std::to_string(at) + " (window from " +
                                          std::to_string(offset + w[b].s) + "): " + e.what());
                }
            }
        r.windows += nb;
        if (progress) progress({r.windows, total, st.n, st.bits(), st.std_error_bits()});
    };
    for (std::size_t w0 = 0; w0 < full.size(); w0 += static_cast<std::size_t>(batch))
        run(&full[w0], std::min<std::int64_t>(batch, static_cast<std::int64_t>(full.size() - w0)));
    for (const auto& w : partial) run(&w, 1);

    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.scored_bytes = st.n;
    r.total_nats = st.sum;
    r.bits_per_byte = st.bits();
    r.std_error = st.std_error_bits();
    if (!std::isfinite(r.bits_per_byte) || !std::isfinite(r.std_error))
        throw nonfinite_error("score: the sum of cross-entropies overflowed (" + nonfinite_name(r.bits_per_byte) + ")");
    return r;
}

/// The protocol of shared/models/README.md as before score_options existed: whole windows only (s < n − L).
/// `progress(done, total)` is called after each batch.
template <causal_lm M>
score_result score_bits_per_byte(const M& model, std::span<const std::uint8_t> text, std::int64_t offset,
                                 std::int64_t n_bytes, std::int64_t window, std::int64_t batch = 8,
                                 const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
    std::function<void(const score_progress&)> p;
    if (progress) p = [&](const score_progress& s) { progress(s.windows_done, s.windows_total); };
    return score_bits_per_byte(model, text, offset, n_bytes, {.window = window, .batch = batch, .full_windows_only = true}, p);
}

}  // namespace hymix
