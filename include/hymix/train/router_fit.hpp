// Fitting AMOR's entropy router (spec.md §5.6) to (ĥ, H) pairs recorded from a trained model at inference
// (router_samples, filled by entropy_ema::set_sample_tap): mean squared error, minibatch AdamW, a seeded shuffle and
// held-out split, forward and backward on the backend's linear ops (the same ops as the model's training). The
// result is deterministic for a given seed and thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/gate/entropy_router.hpp"
#include "hymix/ops/linear.hpp"
#include "hymix/ops/linear_backward.hpp"
#include "hymix/train/optimizer.hpp"

namespace hymix::train {

struct router_fit_options {
    std::int64_t hidden = entropy_router::default_hidden;
    std::int64_t epochs = 8;
    std::int64_t batch = 256;         ///< rows per AdamW step
    double lr = 1e-3;                 ///< peak learning rate; cosine decay to lr / 10 over the steps
    double weight_decay = 0.0;        ///< on fc1 / fc2 (matrices); never on biases and the skip vector
    double heldout_fraction = 0.1;    ///< of the samples (after the seeded shuffle), never trained on
    std::uint64_t seed = 0;
    /// Called after every epoch with (epoch from 1, train MSE of the epoch's batches, held-out MSE).
    std::function<void(std::int64_t, double, double)> progress;

    void validate() const {
        if (hidden < 1) throw config_error("fit_entropy_router: hidden must be positive, found " + std::to_string(hidden));
        if (epochs < 1 || batch < 1) throw config_error("fit_entropy_router: epochs and batch must be positive");
        if (!(lr > 0) || !std::isfinite(lr)) throw config_error("fit_entropy_router: lr must be positive and finite");
        if (!(weight_decay >= 0) || !std::isfinite(weight_decay)) throw config_error("fit_entropy_router: weight_decay must be >= 0");
        if (!(heldout_fraction >= 0 && heldout_fraction < 1)) throw config_error("fit_entropy_router: heldout_fraction must lie in [0, 1)");
    }
};

struct router_fit_result {
    entropy_router router;
    std::int64_t n_train = 0, n_heldout = 0;
    double train_mse = 0;    ///< over the training rows, after the last epoch
    double heldout_mse = 0;  ///< over the held-out rows (0 when there are none)
    double heldout_var = 0;  ///< variance of H over the held-out rows: 1 − mse / var is the R² of the fit
};

namespace detail {

/// Zero-filled tensors of the router's shapes (gradients, or fresh weights).
inline entropy_router_weights router_zeros(std::int64_t d, std::int64_t hidden) {
    return {tensor<float>({hidden, d}), tensor<float>({hidden}), tensor<float>({1, hidden}), tensor<float>({1}), tensor<float>({d})};
}

/// Mean squared error of the router `w` on rows x [n, d] against targets H [n], and its gradient accumulated (+=) into
/// g (same shapes as w). Forward and backward run on B's linear / linear_backward ops; silu' in fp32.
template <host_backend B>
double router_loss_grad(const B& be, const entropy_router_weights& w, tensor_view<const float, 2> x, std::span<const float> H,
                        entropy_router_weights& g) {
    const std::int64_t n = x.dim(0), hid = w.fc1_weight.dim(0), d = w.fc1_weight.dim(1);
    if (x.dim(1) != d || static_cast<std::int64_t>(H.size()) != n)
        throw shape_error("router_loss_grad: rows " + shape_string(std::vector<std::int64_t>{x.dim(0), x.dim(1)}) + " and " + std::to_string(H.size()) + " targets for d " +
                          std::to_string(d));
    if (n == 0) return 0.0;
    std::vector<float> a, s, pred(static_cast<std::size_t>(n)), dy(pred.size());
    hymix::detail::router_forward(be, w, x, a, s, pred);
    double loss = 0;
    for (std::size_t r = 0; r < pred.size(); ++r) {
        const double e = static_cast<double>(pred[r]) - H[r];
        loss += e * e;
        dy[r] = static_cast<float>(2.0 * e / static_cast<double>(n));
    }
    std::vector<float> ds(a.size());
    const tensor_view<const float, 2> sv(s.data(), {n, hid});
    const tensor_view<float, 2> dsv(ds.data(), {n, hid});
    const tensor_view<const float, 2> skip(w.skip_weight.data(), {1, d});
    const tensor_view<const float, 2> dyv(dy.data(), {n, 1});
    ops::linear_backward(be, sv, w.fc2_weight.view<2>(), dyv, dsv, g.fc2_weight.view<2>(), g.fc2_bias.data());
    ops::linear_backward(be, x, skip, dyv, tensor_view<float, 2>(), tensor_view<float, 2>(g.skip_weight.data(), {1, d}), nullptr);
    for (std::size_t i = 0; i < a.size(); ++i) {
        const float sg = sigmoid(a[i]);
        ds[i] *= sg * (1.0f + a[i] * (1.0f - sg));
    }
    ops::linear_backward(be, x, w.fc1_weight.view<2>(), tensor_view<const float, 2>(dsv), tensor_view<float, 2>(), g.fc1_weight.view<2>(),
                         g.fc1_bias.data());
    return loss / static_cast<double>(n);
}

}  // namespace detail

/// Fresh router weights as PyTorch's nn.Linear initialises them (fc1 and fc2 weights and biases uniform in
/// ±1/√fan_in), the skip vector at 0; from `seed`.
inline entropy_router_weights init_entropy_router_weights(std::int64_t d, std::int64_t hidden, std::uint64_t seed) {
    if (d < 1 || hidden < 1) throw config_error("init_entropy_router_weights: d and hidden must be positive");
    auto w = detail::router_zeros(d, hidden);
    std::mt19937_64 rng(seed);
    const float b1 = 1.0f / std::sqrt(static_cast<float>(d)), b2 = 1.0f / std::sqrt(static_cast<float>(hidden));
    std::uniform_real_distribution<float> u1(-b1, b1), u2(-b2, b2);
    for (auto& v : w.fc1_weight.span()) v = u1(rng);
    for (auto& v : w.fc1_bias.span()) v = u1(rng);
    for (auto& v : w.fc2_weight.span()) v = u2(rng);
    w.fc2_bias[0] = u2(rng);
    return w;
}

/// Fits an entropy router to the samples `s` (at least 2 rows; throws value_error otherwise, nonfinite_error for a
/// non-finite sample). Initialisation as PyTorch's nn.Linear (uniform ±1/√fan_in from the seed), the skip at 0 and
/// b₂ at the training rows' mean H (init_entropy_router_weights, then the mean).
template <host_backend B>
router_fit_result fit_entropy_router(const B& be, const router_samples& s, router_fit_options o) {
    o.validate();
    const std::int64_t N = s.rows(), d = s.d_model, hid = o.hidden;
    if (N < 2 || d < 1) throw value_error("fit_entropy_router: " + std::to_string(N) + " sample row(s); at least 2 are needed");
    if (s.h.size() != static_cast<std::size_t>(N * d))
        throw shape_error("fit_entropy_router: " + std::to_string(s.h.size()) + " input values for " + std::to_string(N) + " rows of width " +
                          std::to_string(d));
    for (float v : s.H)
        if (!std::isfinite(v)) throw nonfinite_error("fit_entropy_router: a target entropy is " + std::to_string(v));
    for (float v : s.h)
        if (!std::isfinite(v)) throw nonfinite_error("fit_entropy_router: an input row holds " + std::to_string(v));
    std::mt19937_64 rng(o.seed);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(N));
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    const std::int64_t n_held = std::min<std::int64_t>(N - 1, static_cast<std::int64_t>(std::floor(o.heldout_fraction * static_cast<double>(N))));
    const std::int64_t n_train = N - n_held;
    std::vector<std::int64_t> train_rows(idx.begin(), idx.begin() + n_train), held_rows(idx.begin() + n_train, idx.end());
    // Rows gathered into contiguous buffers.
    auto gather = [&](const std::vector<std::int64_t>& rows, std::size_t from, std::size_t count, std::vector<float>& x, std::vector<float>& y) {
        x.resize(count * static_cast<std::size_t>(d));
        y.resize(count);
        for (std::size_t i = 0; i < count; ++i) {
            const auto r = static_cast<std::size_t>(rows[from + i]);
            std::copy_n(s.h.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(d)), d, x.begin() + static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(d)));
            y[i] = s.H[r];
        }
    };
    double mean = 0;
    for (auto r : train_rows) mean += s.H[static_cast<std::size_t>(r)];
    mean /= static_cast<double>(n_train);

    entropy_router_weights w = init_entropy_router_weights(d, hid, rng()), g = detail::router_zeros(d, hid);
    w.fc2_bias[0] = static_cast<float>(mean);
    std::vector<param> ps{{"fc1.weight", &w.fc1_weight, &g.fc1_weight, true},
                          {"fc1.bias", &w.fc1_bias, &g.fc1_bias, false},
                          {"fc2.weight", &w.fc2_weight, &g.fc2_weight, true},
                          {"fc2.bias", &w.fc2_bias, &g.fc2_bias, false},
                          {"skip.weight", &w.skip_weight, &g.skip_weight, false}};
    adamw opt(ps, adamw_config{o.lr, 0.9, 0.999, 1e-8, o.weight_decay});
    const std::int64_t steps_per_epoch = (n_train + o.batch - 1) / o.batch, total = steps_per_epoch * o.epochs;
    const double pi = std::acos(-1.0);
    std::vector<float> xb, yb;
    // Mean squared error of weights ww over rows, in slices of 4096 rows (forward only).
    std::vector<float> a_buf, pred;
    auto mse_of = [&](const entropy_router_weights& ww, const std::vector<std::int64_t>& rows) {
        double sum = 0;
        for (std::size_t from = 0; from < rows.size(); from += 4096) {
            const std::size_t cnt = std::min<std::size_t>(4096, rows.size() - from);
            gather(rows, from, cnt, xb, yb);
            pred.resize(cnt);
            hymix::detail::router_forward(be, ww, tensor_view<const float, 2>(xb.data(), {static_cast<std::int64_t>(cnt), d}), a_buf, a_buf, pred);
            for (std::size_t i = 0; i < cnt; ++i) sum += (static_cast<double>(pred[i]) - yb[i]) * (static_cast<double>(pred[i]) - yb[i]);
        }
        return rows.empty() ? 0.0 : sum / static_cast<double>(rows.size());
    };
    std::int64_t step = 0;
    for (std::int64_t e = 1; e <= o.epochs; ++e) {
        std::shuffle(train_rows.begin(), train_rows.end(), rng);
        double epoch_loss = 0;
        for (std::int64_t from = 0; from < n_train; from += o.batch, ++step) {
            const std::int64_t cnt = std::min(o.batch, n_train - from);
            gather(train_rows, static_cast<std::size_t>(from), static_cast<std::size_t>(cnt), xb, yb);
            for (auto& p : ps) std::fill(p.grad->span().begin(), p.grad->span().end(), 0.0f);
            epoch_loss += detail::router_loss_grad(be, w, tensor_view<const float, 2>(xb.data(), {cnt, d}), yb, g) * static_cast<double>(cnt);
            const double lr = o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(pi * static_cast<double>(step) / static_cast<double>(total))));
            opt.update(ps, lr);
        }
        if (!std::isfinite(epoch_loss))
            throw value_error("fit_entropy_router: the fit diverged in epoch " + std::to_string(e) + " (loss " + std::to_string(epoch_loss) +
                              "); lower the learning rate (" + std::to_string(o.lr) + ")");
        if (o.progress) o.progress(e, epoch_loss / static_cast<double>(n_train), mse_of(w, held_rows));
    }
    router_fit_result r{entropy_router(std::move(w)), n_train, n_held, 0, 0, 0};
    r.train_mse = mse_of(r.router.weights(), train_rows);
    r.heldout_mse = mse_of(r.router.weights(), held_rows);
    if (n_held > 1) {
        double m = 0, v = 0;
        for (auto i : held_rows) m += s.H[static_cast<std::size_t>(i)];
        m /= static_cast<double>(n_held);
        for (auto i : held_rows) v += (s.H[static_cast<std::size_t>(i)] - m) * (s.H[static_cast<std::size_t>(i)] - m);
        r.heldout_var = v / static_cast<double>(n_held);
    }
    return r;
}

}  // namespace hymix::train
