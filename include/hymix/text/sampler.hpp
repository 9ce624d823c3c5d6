// Next-token sampling from logits: greedy (temperature 0), temperature, top-k and top-p (nucleus) filtering,
// with a seeded generator so runs are reproducible. Filtering order follows common practice: top-k, then top-p.
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

namespace hymix {

struct sampling_params {
    float temperature = 1.0f;  ///< 0 = greedy (argmax)
    std::int64_t top_k = 0;    ///< 0 = no top-k filter
    float top_p = 1.0f;        ///< 1 = no nucleus filter; keeps the smallest set with probability mass >= top_p
    std::uint64_t seed = 0;

    void validate() const {
        if (!(temperature >= 0.0f) || !std::isfinite(temperature))
            throw config_error("sampling: temperature must be finite and >= 0, found " + std::to_string(temperature));
        if (top_k < 0) throw config_error("sampling: top_k must be >= 0, found " + std::to_string(top_k));
        if (!(top_p > 0.0f && top_p <= 1.0f)) throw config_error("sampling: top_p must be in (0, 1], found " + std::to_string(top_p));
    }
};

/// Index of the largest logit (lowest index on ties).
inline std::int32_t argmax(std::span<const float> logits) {
    if (logits.empty()) throw shape_error("argmax: empty logits");
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

class sampler {
public:
    explicit sampler(sampling_params p) : p_(p), rng_(p.seed) { p_.validate(); }

    /// Draws one token id from logits [V]. Throws value_error if the logits hold NaN.
    std::int32_t sample(std::span<const float> logits) {
        for (float v : logits)
            if (std::isnan(v)) throw value_error("sampling: logits contain NaN");
        if (p_.temperature == 0.0f) return argmax(logits);
        const std::size_t V = logits.size();
        idx_.resize(V);
        std::iota(idx_.begin(), idx_.end(), 0);
        std::size_t keep = V;
        if (p_.top_k > 0 && static_cast<std::size_t>(p_.top_k) < V) keep = static_cast<std::size_t>(p_.top_k);
        std::partial_sort(idx_.begin(), idx_.begin() + static_cast<std::ptrdiff_t>(keep), idx_.end(),
                          [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b]; });
        idx_.resize(keep);
        // Softmax over the kept logits at the given temperature, in double.
        prob_.resize(keep);
        const double mx = logits[idx_[0]];
        double sum = 0;
        for (std::size_t i = 0; i < keep; ++i) sum += prob_[i] = std::exp((logits[idx_[i]] - mx) / p_.temperature);
        for (auto& q : prob_) q /= sum;
        if (p_.top_p < 1.0f) {
            double acc = 0;
            std::size_t n = 0;
            while (n < keep && acc < p_.top_p) acc += prob_[n++];
            keep = std::max<std::size_t>(n, 1);
            prob_.resize(keep);
        }
        std::discrete_distribution<std::size_t> d(prob_.begin(), prob_.end());
        return idx_[d(rng_)];
    }

private:
    sampling_params p_;
    std::mt19937_64 rng_;
    std::vector<std::int32_t> idx_;
    std::vector<double> prob_;
};

}  // namespace hymix
