// AMOR's fitted router (spec.md §5.6, inference only): a small fp32 regressor that predicts a block's normalised
// head entropy H from the same normalised input ĥ the gate sees,
//     Ĥ = W₂ silu(W₁ ĥ + b₁) + b₂ + w_sᵀ ĥ        W₁ [hidden, d], b₁ [hidden], W₂ [1, hidden], b₂ [1], w_s [d],
// so that an entropy_ema gate can fire on Ĥ > τ (the same frozen τ) without the d × V LM-head pass. It pays where the
// head is wide: per row the exact gate costs 2·d·V multiply-adds' worth of FLOPs and reads d·V head weights, the
// router 2·d·(hidden + 1) + 2·hidden and d·(hidden + 1) weights, so it is cheaper once V > hidden + 1 (513 with the
// default width): byte-level models (V = 256) keep the exact gate, 32K–150K-token vocabularies do 60–290× less gate
// work. (The exact gate's `plus_eps` form passes over the head twice, which halves the break-even.) The router is a
// function of the gate's input only: it stands in for one backbone's LM head, whatever AMOR blocks feed it. Fitting is in train/router_fit.hpp, the per-block file in models/amor_router.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/linear.hpp"

namespace hymix {
// (router_samples::add reserves max_rows rows on first use: keep max_rows near what will be recorded.)

/// The router's parameters, PyTorch nn.Linear layouts: fc1 [hidden, d] + bias [hidden], fc2 [1, hidden] + bias [1],
/// skip [d] (a linear skip without bias). All fp32.
struct entropy_router_weights {
    tensor<float> fc1_weight, fc1_bias, fc2_weight, fc2_bias, skip_weight;
};

namespace detail {
/// The router's forward on rows x [n, d] (shapes checked by the callers): a = fc1(x) [n, hidden], s = silu(a), and
/// out[r] = fc2(s)[r] + skip·x[r] (fp32, on B's linear op). `a` and `s` may be the same vector: the activations then
/// overwrite the pre-activations (prediction); the fit's backward keeps both.
template <host_backend B>
void router_forward(const B& be, const entropy_router_weights& w, tensor_view<const float, 2> x, std::vector<float>& a, std::vector<float>& s,
                    std::span<float> out) {
    const std::int64_t n = x.dim(0), d = w.fc1_weight.dim(1), hid = w.fc1_weight.dim(0);
    a.resize(static_cast<std::size_t>(n * hid));
    ops::linear(be, x, w.fc1_weight.view<2>(), w.fc1_bias.data(), tensor_view<float, 2>(a.data(), {n, hid}));
    s.resize(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) s[i] = silu(a[i]);
    std::vector<float> y(static_cast<std::size_t>(n)), k(y.size());
    ops::linear(be, tensor_view<const float, 2>(s.data(), {n, hid}), w.fc2_weight.view<2>(), w.fc2_bias.data(), tensor_view<float, 2>(y.data(), {n, 1}));
    ops::linear(be, x, tensor_view<const float, 2>(w.skip_weight.data(), {1, d}), nullptr, tensor_view<float, 2>(k.data(), {n, 1}));
    for (std::size_t r = 0; r < y.size(); ++r) out[r] = y[r] + k[r];
}
}  // namespace detail

/// A fitted entropy router (immutable once built). Thread-safe to share between gates and calls.
class entropy_router {
public:
    static constexpr std::int64_t default_hidden = 512;  ///< spec.md §5.6: W₁ [512, d]

    /// Takes the weights after checking their shapes against each other (shape_error naming the tensor, expected
    /// and found) and that every value is finite (nonfinite_error naming the tensor).
    explicit entropy_router(entropy_router_weights w) : w_(std::move(w)) {
        if (w_.fc1_weight.rank() != 2) throw shape_error("entropy_router: fc1.weight must be [hidden, d], found " + shape_string(w_.fc1_weight.shape()));
        const std::int64_t h = w_.fc1_weight.dim(0), d = w_.fc1_weight.dim(1);
        if (h < 1 || d < 1) throw shape_error("entropy_router: fc1.weight " + shape_string(w_.fc1_weight.shape()) + " is empty");
        const auto need = [](const tensor<float>& t, std::vector<std::int64_t> s, const char* name) {
            if (t.shape() != s)
                throw shape_error(std::string("entropy_router: ") + name + " has shape " + shape_string(t.shape()) + ", expected " + shape_string(s));
        };
        need(w_.fc1_bias, {h}, "fc1.bias");
        need(w_.fc2_weight, {1, h}, "fc2.weight");
        need(w_.fc2_bias, {1}, "fc2.bias");
        need(w_.skip_weight, {d}, "skip.weight");
        const auto finite = [](const tensor<float>& t, const char* name) {
            for (float v : t.span())
                if (!std::isfinite(v)) throw nonfinite_error(std::string("entropy_router: ") + name + " holds " + std::to_string(v));
        };
        finite(w_.fc1_weight, "fc1.weight"), finite(w_.fc1_bias, "fc1.bias"), finite(w_.fc2_weight, "fc2.weight");
        finite(w_.fc2_bias, "fc2.bias"), finite(w_.skip_weight, "skip.weight");
    }

    std::int64_t d_model() const noexcept { return w_.fc1_weight.dim(1); }
    std::int64_t hidden() const noexcept { return w_.fc1_weight.dim(0); }
    const entropy_router_weights& weights() const noexcept { return w_; }
    /// Multiply-adds per row (the gate's cost with the router, against d·V for the head).
    std::int64_t macs_per_row() const noexcept { return d_model() * (hidden() + 1) + hidden(); }

    /// Ĥ[r] for every row of h [n, d] (fp32, unit inner stride), on backend B's linear op. Throws shape_error when
    /// h's width is not d or out has not n entries.
    template <host_backend B>
    void predict(const B& be, tensor_view<const float, 2> h, std::span<float> out) const {
        const std::int64_t n = h.dim(0), d = d_model();
        if (h.dim(1) != d) throw shape_error("entropy_router::predict: rows of width " + std::to_string(h.dim(1)) + ", the router takes d = " + std::to_string(d));
        if (n > 0 && d > 1 && h.strides[1] != 1)
            throw shape_error("entropy_router::predict: h must have a unit inner stride, found " + std::to_string(h.strides[1]));
        if (static_cast<std::int64_t>(out.size()) != n)
            throw shape_error("entropy_router::predict: out has " + std::to_string(out.size()) + " entries for " + std::to_string(n) + " rows");
        if (n == 0) return;
        std::vector<float> a;
        detail::router_forward(be, w_, h, a, a, out);  // silu in place: the pre-activations are not needed
    }

    /// The same in double precision with plain loops (the reference the tests compare predict with).
    std::vector<double> predict_reference(tensor_view<const float, 2> h) const {
        const std::int64_t n = h.dim(0), d = d_model(), hid = hidden();
        if (h.dim(1) != d)
            throw shape_error("entropy_router::predict_reference: rows of width " + std::to_string(h.dim(1)) + ", the router takes d = " + std::to_string(d));
        std::vector<double> out(static_cast<std::size_t>(n));
        for (std::int64_t r = 0; r < n; ++r) {
            double y = w_.fc2_bias[0];
            for (std::int64_t j = 0; j < hid; ++j) {
                double a = w_.fc1_bias[j];
                for (std::int64_t k = 0; k < d; ++k) a += static_cast<double>(w_.fc1_weight[j * d + k]) * h(r, k);
                y += static_cast<double>(w_.fc2_weight[j]) * (a / (1.0 + std::exp(-a)));
            }
            for (std::int64_t k = 0; k < d; ++k) y += static_cast<double>(w_.skip_weight[k]) * h(r, k);
            out[static_cast<std::size_t>(r)] = y;
        }
        return out;
    }

private:
    entropy_router_weights w_;
};

/// (ĥ, H) pairs recorded by an entropy_ema gate at inference (entropy_ema::set_sample_tap), the data a router is
/// fitted on: every live row is kept with probability `keep` (a seeded draw), until `max_rows` rows are held. Not
/// synchronised: one forward at a time may write to it (gates that share a tap, e.g. copies of a stack, must not run
/// concurrently).
struct router_samples {
    std::int64_t d_model = 0;  ///< set by the first add
    std::vector<float> h;      ///< [rows, d_model], row-major
    std::vector<float> H;      ///< [rows] exact normalised entropies
    std::int64_t max_rows = 1 << 16;
    double keep = 1.0;
    bool record_inputs = true;  ///< false: only H is kept (h stays empty; for calibration, not for a router fit). Set
                                ///< it before the first add and keep it: h and H would fall out of step
    std::mt19937_64 rng{0};

    std::int64_t rows() const noexcept { return static_cast<std::int64_t>(H.size()); }
    bool full() const noexcept { return rows() >= max_rows; }
    /// Records the live rows of x [n, d] with their entropies H [n] (live: n flags, or empty for all rows). Throws
    /// shape_error when d changes between calls or the sizes disagree, value_error for `keep` outside (0, 1].
    void add(tensor_view<const float, 2> x, std::span<const float> Hs, std::span<const unsigned char> live) {
        if (d_model == 0) d_model = x.dim(1);
        if (x.dim(1) != d_model)
            throw shape_error("router_samples: rows of width " + std::to_string(x.dim(1)) + " after rows of width " + std::to_string(d_model));
        const auto n = static_cast<std::size_t>(x.dim(0));
        if (Hs.size() != n || (!live.empty() && live.size() != n))
            throw shape_error("router_samples: " + std::to_string(n) + " rows with " + std::to_string(Hs.size()) + " entropies and " +
                              std::to_string(live.size()) + " live flags");
        if (!(keep > 0 && keep <= 1)) throw value_error("router_samples: keep must lie in (0, 1], found " + std::to_string(keep));
        if (H.empty() && max_rows > 0) {
            if (record_inputs) h.reserve(static_cast<std::size_t>(max_rows * d_model));
            H.reserve(static_cast<std::size_t>(max_rows));
        }
        std::bernoulli_distribution take(keep);
        for (std::int64_t r = 0; r < x.dim(0) && !full(); ++r) {
            if (!live.empty() && !live[static_cast<std::size_t>(r)]) continue;
            if (keep < 1.0 && !take(rng)) continue;
            if (record_inputs)
                for (std::int64_t k = 0; k < d_model; ++k) h.push_back(x(r, k));
            H.push_back(Hs[static_cast<std::size_t>(r)]);
        }
    }
};

}  // namespace hymix
