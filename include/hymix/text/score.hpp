// Bits per byte of a causal language model over a slice of text, with the protocol of
// ../shared/models/README.md: windows of L bytes start at s = 0, L, 2L, … while s < n_bytes − L; each window is one
// fresh sequence (positions from 0) fed bytes [s, s+L) and scored on its predictions of bytes [s+1, s+L];
// bits/byte = Σ cross-entropy (nats) / scored bytes / ln 2. Several windows run as one batch.
#pragma once

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
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix {

/// A causal LM over token ids with per-sequence caches (hymix::auto_model and compiled stacks satisfy it).
template <class M>
concept causal_lm = requires(const M& m, typename M::cache& c, const seq_batch& b, std::span<const std::int32_t> t,
                             tensor_view<float, 2> logits, std::int64_t n) {
    { m.make_cache(n) } -> std::same_as<typename M::cache>;
    m.forward(c, b, t, logits);
    { m.info().vocab_size } -> std::convertible_to<std::int64_t>;
};

struct score_result {
    double bits_per_byte = 0;
    double total_nats = 0;
    std::int64_t scored_bytes = 0;
    std::int64_t windows = 0;
    double seconds = 0;
};

/// Cross-entropy in nats of one row of logits [V] against `target`, via a numerically safe log-sum-exp in double.
inline double cross_entropy(std::span<const float> logits, std::int32_t target) {
    double mx = -std::numeric_limits<double>::infinity();
    for (float v : logits) mx = std::max(mx, static_cast<double>(v));
    if (!std::isfinite(mx)) throw value_error("cross_entropy: logits hold no finite value");
    double s = 0;
    for (float v : logits) s += std::exp(static_cast<double>(v) - mx);
    return mx + std::log(s) - static_cast<double>(logits[static_cast<std::size_t>(target)]);
}

/// Scores `text[offset, offset + n_bytes)` with windows of `window` bytes, `batch` windows per forward call.
/// `progress(done, total)` is called after each batch (may be empty). Throws config_error on bad arguments.
template <causal_lm M>
score_result score_bits_per_byte(const M& model, std::span<const std::uint8_t> text, std::int64_t offset,
                                 std::int64_t n_bytes, std::int64_t window, std::int64_t batch = 8,
                                 const std::function<void(std::int64_t, std::int64_t)>& progress = {}) {
    const auto size = static_cast<std::int64_t>(text.size());
    if (offset < 0 || n_bytes <= 0 || offset > size || n_bytes > size - offset)  // no overflow for huge values
        throw config_error("score: " + std::to_string(n_bytes) + " bytes from offset " + std::to_string(offset) +
                           " do not fit in the text of " + std::to_string(size) + " bytes");
    if (window < 1 || window >= n_bytes)
        throw config_error("score: window " + std::to_string(window) + " must be in [1, " + std::to_string(n_bytes) + ")");
    if (batch < 1) throw config_error("score: batch must be >= 1");
    const std::int64_t V = model.info().vocab_size;
    std::vector<std::int64_t> starts;
    for (std::int64_t s = 0; s < n_bytes - window; s += window) starts.push_back(s);
    const std::int64_t total = static_cast<std::int64_t>(starts.size());

    const auto t0 = std::chrono::steady_clock::now();
    score_result r;
    batch = std::min(batch, std::max<std::int64_t>(total, 1));  // never allocate rows for windows that do not exist
    tensor<float> logits({batch * window, V});
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * window));
    for (std::int64_t w0 = 0; w0 < total; w0 += batch) {
        const std::int64_t nb = std::min(batch, total - w0);
        auto cache = model.make_cache(nb);
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t i = 0; i < window; ++i)
                tokens[static_cast<std::size_t>(b * window + i)] = text[static_cast<std::size_t>(offset + starts[w0 + b] + i)];
        auto lv = tensor_view<float, 2>(logits.data(), {nb * window, V});
        model.forward(cache, seq_batch::dense(nb, window), std::span<const std::int32_t>(tokens.data(), nb * window), lv);
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t i = 0; i < window; ++i) {
                const std::int32_t target = text[static_cast<std::size_t>(offset + starts[w0 + b] + i + 1)];
                r.total_nats += cross_entropy({&lv(b * window + i, 0), static_cast<std::size_t>(V)}, target);
            }
        r.scored_bytes += nb * window;
        r.windows += nb;
        if (progress) progress(r.windows, total);
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.bits_per_byte = r.total_nats / static_cast<double>(r.scored_bytes) / std::log(2.0);
    return r;
}

}  // namespace hymix
