// Next-token sampling from logits: repetition penalty, then greedy (temperature 0) or temperature softmax with
// top-k, top-p (nucleus) and min-p filtering, in that order, with a seeded generator so runs are reproducible.
// The penalty follows the CTRL paper (Keskar et al. 2019, §4.1): a positive logit is divided by it, a negative one multiplied.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"

namespace hymix {

struct sampling_params {
    float temperature = 1.0f;      ///< 0 = greedy (argmax)
    std::int64_t top_k = 0;        ///< 0 = no top-k filter
    float top_p = 1.0f;            ///< 1 = no nucleus filter; keeps the smallest set with probability mass >= top_p
    float min_p = 0.0f;            ///< 0 = off; keeps tokens with probability >= min_p × the most likely one's
    float repeat_penalty = 1.0f;   ///< 1 = off; applied to the logits of tokens among the last repeat_last_n
    std::int64_t repeat_last_n = 64;  ///< how many recent tokens the penalty looks at (-1 = all it is given)
    std::uint64_t seed = 0;

    /// Throws config_error naming the parameter, its valid range and the value found.
    void validate() const {
        if (!(temperature >= 0.0f) || !std::isfinite(temperature))
            throw config_error("sampling: temperature must be finite and >= 0, found " + std::to_string(temperature));
        if (top_k < 0) throw config_error("sampling: top_k must be >= 0, found " + std::to_string(top_k));
        if (!(top_p > 0.0f && top_p <= 1.0f)) throw config_error("sampling: top_p must be in (0, 1], found " + std::to_string(top_p));
        if (!(min_p >= 0.0f && min_p <= 1.0f)) throw config_error("sampling: min_p must be in [0, 1], found " + std::to_string(min_p));
        if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty))
            throw config_error("sampling: repeat_penalty must be finite and > 0, found " + std::to_string(repeat_penalty));
        if (repeat_last_n < -1) throw config_error("sampling: repeat_last_n must be >= -1, found " + std::to_string(repeat_last_n));
    }
};

/// A seed from the operating system's entropy source (for runs that are meant to differ; print it to repeat one).
inline std::uint64_t random_seed() {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
}

/// Index of the largest logit (lowest index on ties). Throws shape_error when empty, nonfinite_error on NaN.
inline std::int32_t argmax(std::span<const float> logits) {
    if (logits.empty()) throw shape_error("argmax: empty logits");
    for (std::size_t i = 0; i < logits.size(); ++i)
        if (std::isnan(logits[i])) throw nonfinite_error("argmax: logits[" + std::to_string(i) + "] = NaN");
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

class sampler {
public:
    explicit sampler(sampling_params p) : p_(p), rng_(p.seed) { p_.validate(); }

    const sampling_params& params() const noexcept { return p_; }

    /// Draws one token id from logits [V]; `recent` holds the previous tokens (oldest first) for the repetition
    /// penalty. Throws nonfinite_error when a logit is NaN or +Inf, or when none is finite (−Inf alone means
    /// "never this token" and is allowed).
    std::int32_t sample(std::span<const float> logits, std::span<const std::int32_t> recent = {}) {
        const std::size_t V = logits.size();
        if (V == 0) throw shape_error("sampling: empty logits");
        bool any_finite = false;
        for (std::size_t i = 0; i < V; ++i) {
            const float v = logits[i];
            if (std::isnan(v) || (std::isinf(v) && v > 0))
                throw nonfinite_error("sampling: logits[" + std::to_string(i) + "] = " + nonfinite_name(v) +
                                      " (the model produced a non-finite logit)");
            any_finite = any_finite || std::isfinite(v);
        }
        if (!any_finite) throw nonfinite_error("sampling: every logit is -Inf (no token can be drawn)");

        work_.assign(logits.begin(), logits.end());
        penalise(recent);
        const std::span<const float> w(work_);
        if (p_.temperature == 0.0f) return argmax(w);

        idx_.resize(V);
        std::iota(idx_.begin(), idx_.end(), 0);
        std::size_t keep = V;
        if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < V) keep = static_cast<std::size_t>(p_.top_k);
        std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(keep), idx_.end(),
                          [&](std::int32_t a, std::int32_t b) { return w[static_cast<std::size_t>(a)] > w[static_cast<std::size_t>(b)]; });
        idx_.resize(keep);
        // Softmax over the kept logits at the given temperature, in double (the largest is finite: see above).
        prob_.resize(keep);
        const double mx = w[static_cast<std::size_t>(idx_[0])];
        double sum = 0;
        for (std::size_t i = 0; i < keep; ++i)
            sum += prob_[i] = std::exp((w[static_cast<std::size_t>(idx_[i])] - mx) / p_.temperature);
        for (auto& q : prob_) q /= sum;
        if (p_.top_p < 1.0f) {
            double acc = 0;
            std::size_t n = 0;
            while (n < keep && acc < p_.top_p) acc += prob_[n++];
            keep = std::max<std::size_t>(n, 1);
        }
        if (p_.min_p > 0.0f) {  // prob_ is sorted in decreasing order; prob_[0] is the most likely token
            const double floor = static_cast<double>(p_.min_p) * prob_[0];
            std::size_t n = 1;
            while (n < keep && prob_[n] >= floor) ++n;
            keep = n;
        }
        prob_.resize(keep);
        std::discrete_distribution<std::size_t> d(prob_.begin(), prob_.end());
        return idx_[d(rng_)];
    }

private:
    /// Repetition penalty on work_ for each distinct token among the last repeat_last_n of `recent`.
    void penalise(std::span<const std::int32_t> recent) {
        if (p_.repeat_penalty == 1.0f || p_.repeat_last_n == 0 || recent.empty()) return;
        std::size_t n = recent.size();
        if (p_.repeat_last_n > 0) n = std::min(n, static_cast<std::size_t>(p_.repeat_last_n));
        seen_.assign(work_.size(), 0);
        for (std::size_t i = recent.size() - n; i < recent.size(); ++i) {
            const auto t = recent[i];
            if (t < 0 || static_cast<std::size_t>(t) >= work_.size() || seen_[static_cast<std::size_t>(t)]) continue;
            seen_[static_cast<std::size_t>(t)] = 1;
            float& l = work_[static_cast<std::size_t>(t)];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
        }
    }

    sampling_params p_;
    std::mt19937_64 rng_;
    std::vector<float> work_;
    std::vector<std::int32_t> idx_;
    std::vector<double> prob_;
    std::vector<unsigned char> seen_;
};

}  // namespace hymix
