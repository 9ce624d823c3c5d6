// AdamW with decoupled weight decay and bias correction (Loshchilov & Hutter, arXiv 1711.05101; the update of
// PyTorch's torch.optim.AdamW), gradient clipping by global norm, and the learning-rate schedules of issue 8:
// linear warmup, then constant, linear decay or cosine decay. Parameters are named fp32 tensors (the model's own
// weights, its master copy); the optimizer holds the first and second moments per parameter. Every reduction runs
// in a fixed order, so a run is deterministic for a given thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::train {

/// One trainable tensor: its name (the checkpoint's), the value and its gradient (same shape), and whether weight
/// decay applies (by default: matrices yes, vectors no — `decays_by_default`).
struct param {
    std::string name;
    tensor<float>* value = nullptr;
    tensor<float>* grad = nullptr;
    bool decay = true;
    bool frozen = false;  ///< skipped by the optimizer (and its gradient is never read)
};

/// The default decay rule: tensors of rank >= 2 decay, vectors and scalars (norm weights, biases, A_log, D, dt_bias)
/// do not.
inline bool decays_by_default(const tensor<float>& t) { return t.rank() >= 2; }

struct adamw_config {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;  ///< applied as p ← p − lr·wd·p to parameters with decay = true
};

/// sqrt(Σ g²) over the gradients of every non-frozen parameter, accumulated in double in parameter order.
inline double global_grad_norm(const std::vector<param>& ps) {
    double s = 0;
    for (const auto& p : ps) {
        if (p.frozen) continue;
        const float* g = p.grad->data();
        const std::int64_t n = p.grad->numel();
        double ps_ = 0;
        for (std::int64_t i = 0; i < n; ++i) ps_ += static_cast<double>(g[i]) * g[i];
        s += ps_;
    }
    return std::sqrt(s);
}

/// Scales every gradient by max_norm / norm when norm > max_norm (max_norm <= 0: no clipping). Returns the norm
/// before clipping. Throws nonfinite_error when the norm is not finite (a NaN or Inf gradient: the step is refused).
inline double clip_grad_norm(std::vector<param>& ps, double max_norm) {
    const double norm = global_grad_norm(ps);
    if (!std::isfinite(norm)) throw nonfinite_error("clip_grad_norm: the gradient norm is " + std::to_string(norm) + " (a NaN or Inf gradient)");
    if (max_norm > 0 && norm > max_norm) {
        const float s = static_cast<float>(max_norm / (norm + 1e-6));
        for (auto& p : ps) {
            if (p.frozen) continue;
            for (auto& g : p.grad->span()) g *= s;
        }
    }
    return norm;
}

/// AdamW over a fixed list of parameters. The moments are fp32 tensors named "<param>.exp_avg" and
/// "<param>.exp_avg_sq" in checkpoints; `step()` counts completed updates (bias correction uses step + 1).
class adamw {
public:
    adamw() = default;
    /// Zero moments for every trainable parameter of `ps` (shapes of their values). A frozen parameter gets empty
    /// moments (shape [0]): a frozen backbone costs the optimizer no memory and its checkpoints no bytes.
    adamw(const std::vector<param>& ps, adamw_config cfg) : cfg_(cfg) {
        for (const auto& p : ps) {
            const auto shape = p.frozen ? std::vector<std::int64_t>{0} : p.value->shape();
            m_.emplace_back(shape);
            v_.emplace_back(shape);
        }
    }
    const adamw_config& config() const noexcept { return cfg_; }
    adamw_config& config() noexcept { return cfg_; }
    std::int64_t step() const noexcept { return step_; }
    void set_step(std::int64_t s) noexcept { step_ = s; }
    tensor<float>& exp_avg(std::size_t i) { return m_.at(i); }
    tensor<float>& exp_avg_sq(std::size_t i) { return v_.at(i); }
    std::size_t size() const noexcept { return m_.size(); }

    /// One update with learning rate `lr` of every non-frozen parameter from its gradient. Throws shape_error when
    /// `ps` does not match the parameters the optimizer was made for.
    void update(std::vector<param>& ps, double lr) {
        if (ps.size() != m_.size())
            throw shape_error("adamw::update: " + std::to_string(ps.size()) + " parameters, the optimizer holds moments for " +
                              std::to_string(m_.size()));
        ++step_;
        const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(step_));
        const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(step_));
        const double step_size = lr / bc1, sqrt_bc2 = std::sqrt(bc2);
        const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
        for (std::size_t k = 0; k < ps.size(); ++k) {
            auto& p = ps[k];
            if (p.frozen) continue;  // (a parameter frozen after construction keeps its moments, unchanged)
            if (p.value->shape() != m_[k].shape())
                throw shape_error("adamw::update: parameter " + p.name + " has shape " + shape_string(p.value->shape()) +
                                  ", its moments " + shape_string(m_[k].shape()));
            float* w = p.value->data();
            const float* g = p.grad->data();
            float* m = m_[k].data();
            float* v = v_[k].data();
            const float decay = p.decay ? static_cast<float>(1.0 - lr * cfg_.weight_decay) : 1.0f;
            const std::int64_t n = p.value->numel();
            for (std::int64_t i = 0; i < n; ++i) {
                m[i] = b1 * m[i] + (1 - b1) * g[i];
                v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
                const double denom = std::sqrt(static_cast<double>(v[i])) / sqrt_bc2 + cfg_.eps;
                w[i] = static_cast<float>(static_cast<double>(w[i] * decay) - step_size * m[i] / denom);
            }
        }
    }

private:
    adamw_config cfg_{};
    std::vector<tensor<float>> m_, v_;
    std::int64_t step_ = 0;
};

/// Shape of the learning rate after warmup.
enum class lr_decay { constant, linear, cosine };

inline lr_decay parse_lr_decay(std::string_view s) {
    if (s == "constant") return lr_decay::constant;
    if (s == "linear") return lr_decay::linear;
    if (s == "cosine") return lr_decay::cosine;
    throw config_error("learning-rate schedule '" + std::string(s) + "' is not one of constant, linear, cosine");
}
inline const char* lr_decay_name(lr_decay d) {
    return d == lr_decay::constant ? "constant" : d == lr_decay::linear ? "linear" : "cosine";
}

/// lr(step) for step = 0, 1, …: lr·(step+1)/warmup during the first `warmup` steps, then constant, or decaying
/// linearly / by a half cosine from lr to min_lr at step total_steps − 1.
struct lr_schedule {
    double lr = 1e-3;
    std::int64_t warmup = 0;
    std::int64_t total_steps = 1;
    lr_decay decay = lr_decay::constant;
    double min_lr = 0.0;

    double operator()(std::int64_t step) const {
        if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
        if (decay == lr_decay::constant) return lr;
        const std::int64_t span = std::max<std::int64_t>(1, total_steps - 1 - warmup);
        const double f = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
        if (decay == lr_decay::linear) return min_lr + (lr - min_lr) * (1.0 - f);
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * f));
    }
};

}  // namespace hymix::train
