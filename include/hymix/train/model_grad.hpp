// Loss and gradients of a whole stack (issue 8), llm.c style: one training forward through the embedding, every
// block (each keeps what its backward needs: O(T·d) per layer) and the final norm, the fused streaming LM-head +
// cross-entropy, then the blocks' backwards in reverse. Gradients live in a second model of the same type (same
// tensors, same names), so every block writes its gradients into a block of its own type and an optimizer pairs
// parameters with gradients by visiting both models in the same order. Layers below `frozen_prefix` run forward
// only: their activations are dropped as soon as the next layer has its input, and backward stops above them.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/cross_entropy.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/elementwise_backward.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/stack/cache.hpp"
#include "hymix/stack/context.hpp"
#include "hymix/train/optimizer.hpp"

namespace hymix::train {

namespace detail {
/// A block that can train: it has a training cache and its mixer one (blocks whose mixer cannot train may still
/// run as a frozen prefix).
template <class Blk>
concept trainable_block = requires { typename Blk::mixer_type::train_cache; };
template <class Blk>
struct train_cache_or_none {
    using type = std::monostate;
};
template <trainable_block Blk>
struct train_cache_or_none<Blk> {
    using type = typename Blk::train_cache;
};
template <class V>
struct train_caches_of;
template <class... Bs>
struct train_caches_of<std::variant<Bs...>> {
    using type = std::variant<typename train_cache_or_none<Bs>::type...>;
};
/// f(integral_constant<I>, std::get<I>(v)) for the active alternative (index-based: equal types stay distinct).
template <std::size_t I = 0, class V, class F>
decltype(auto) visit_at(V&& v, F&& f) {
    if constexpr (I + 1 < std::variant_size_v<std::remove_cvref_t<V>>) {
        if (v.index() != I) return visit_at<I + 1>(std::forward<V>(v), std::forward<F>(f));
    }
    return f(std::integral_constant<std::size_t, I>{}, std::get<I>(v));
}
}  // namespace detail

/// Everything one training step of `Model` keeps between its forward and its backward (reused across steps).
template <class Model>
struct activations {
    using cache_variant = typename detail::train_caches_of<typename Model::block_variant>::type;
    std::vector<cache_variant> layers;  // one per layer at or above frozen_prefix
    stack_workspace ws;
    std::vector<block_stats> stats;
    tensor<float> x, x_final, h_final, dh, dx;  // [n, d]
    std::vector<float> losses;                  // [n] nats per row (0 where the target is −1)
    std::int64_t frozen_prefix = 0;             // layers [0, frozen_prefix) run forward only
};

/// The loss of one batch: Σ nats over the rows with a target, and their count.
struct batch_loss {
    double sum_nats = 0;
    std::int64_t n_targets = 0;
    double mean() const { return n_targets ? sum_nats / static_cast<double>(n_targets) : 0.0; }
};

namespace detail {
/// Training reads and writes fp32 weights: throws config_error naming the first weight `m` keeps as bf16 / f16.
template <class Model>
void require_f32_weights(const Model& m, const char* who) {
    if constexpr (requires { m.weight_dtype(); }) {
        std::string name;
        if (const dtype d = m.weight_dtype(&name); d != dtype::f32)
            throw config_error(std::string(who) + ": the model stores its projection weights as " + weight_dtype_name(d) + " ('" + name +
                               "') for inference; training needs f32 (store_weights_as(dtype::f32) first)");
    }
}
}  // namespace detail

/// A model of the same type as `m` whose every parameter is zero: where gradients accumulate. Throws config_error
/// when m's weights are not fp32.
template <class Model>
Model zeros_like(const Model& m) {
    detail::require_f32_weights(m, "zeros_like");
    Model g = m;
    g.for_each_param([](const std::string&, tensor<float>& t) { t.fill(0.0f); });
    return g;
}

namespace detail {
/// The layer a parameter name "layers.{i}.…" belongs to, or −1 (embedding, final_norm, lm_head).
inline std::int64_t layer_of(const std::string& name) {
    if (name.rfind("layers.", 0) != 0) return -1;
    std::int64_t l = 0;
    std::size_t i = 7;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) l = 10 * l + (name[i] - '0');
    return i > 7 ? l : -1;
}
/// Whether no gradient reaches parameter `name` when backward stops above the first `frozen_prefix` layers: the
/// prefix's own parameters, and the embedding when frozen_prefix > 0 and it is not tied to the LM head (a tied one
/// gets the head's gradient).
inline bool below_frozen_prefix(const std::string& name, std::int64_t frozen_prefix, bool tied_embeddings) {
    if (name == "embedding") return frozen_prefix > 0 && !tied_embeddings;
    const std::int64_t l = layer_of(name);
    return l >= 0 && l < frozen_prefix;
}
}  // namespace detail

namespace detail {
/// An empty stand-in of the same rank as `t` (every dimension 0): a block visits it as it visits `t` (presence is
/// rank() != 0), but it holds nothing.
template <class T>
tensor<float> empty_like_rank(const T& t) {
    return tensor<float>(std::vector<std::int64_t>(t.rank(), 0));
}
/// The fused gate|up copy a block's SwiGLU derives from its weights (nullptr for blocks without one): no gradient
/// is ever written into it (kernels/swiglu_backward.hpp).
template <class Blk>
linear_weight* derived_gate_up(Blk& blk) {
    if constexpr (requires { blk.mlp_mut().gate_up; }) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(blk.mlp_mut().gate_up)>, linear_weight>) return &blk.mlp_mut().gate_up;
    }
    return nullptr;
}
}  // namespace detail

/// The gradient model for training `m` with its layers [0, frozen_prefix) run forward only (activations::
/// frozen_prefix): zeros_like(m), except that the parameters of those layers are empty tensors (same rank, every
/// dimension 0), so is the embedding's when frozen_prefix > 0 and it is not tied to the LM head (no gradient reaches
/// it then), and no layer keeps the SwiGLU's derived gate|up copy (backward never touches it). A frozen backbone
/// under trained blocks (AMOR) thus costs no gradient memory. The frozen layers' weights are never copied, not even
/// for a moment: they are set aside while the rest of m is copied and put back, so m is briefly incomplete (no other
/// thread may use it during the call) and unchanged afterwards, also when something throws. Use it with
/// parameters(m, g, frozen), whose `frozen` must hold for every parameter left without a gradient, and with
/// activations whose frozen_prefix is at least as large. Throws value_error when frozen_prefix is outside
/// [0, n_layers], config_error when m's weights are not fp32.
template <class Model>
Model gradient_model(Model& m, std::int64_t frozen_prefix) {
    detail::require_f32_weights(m, "gradient_model");
    if (frozen_prefix < 0 || frozen_prefix > m.n_layers())
        throw value_error("gradient_model: frozen_prefix " + std::to_string(frozen_prefix) + " outside [0, " + std::to_string(m.n_layers()) + "]");
    const bool tied = m.config().tie_embeddings;
    auto set_aside = [&](const std::string& name) { return detail::below_frozen_prefix(name, frozen_prefix, tied); };
    // Set those parameters (and the prefix's derived copies) aside, leaving same-rank empty stand-ins in m: blocks
    // decide a parameter's presence by its rank, so every later visit sees the same parameters in the same order.
    std::size_t n_aside = 0;
    m.for_each_param([&](const std::string& name, const auto&) { n_aside += set_aside(name) ? 1 : 0; });
    std::vector<linear_weight> aside;
    aside.reserve(n_aside + static_cast<std::size_t>(frozen_prefix));
    std::size_t n_params = 0, n_derived = 0;  // how many of each were set aside (all, unless something threw)
    auto restore = [&] {
        std::size_t i = 0;
        m.for_each_param([&](const std::string& name, auto& t) {
            if (!set_aside(name) || i >= n_params) return;
            if constexpr (is_linear_weight_v<decltype(t)>) t = std::move(aside[i++]);
            else t = std::move(aside[i++].f32());
        });
        for (std::int64_t l = 0; l < frozen_prefix && i < n_params + n_derived; ++l)
            std::visit([&](auto& blk) {
                if (auto* gu = detail::derived_gate_up(blk); gu && i < n_params + n_derived) *gu = std::move(aside[i++]);
            }, m.layer_at(l));
    };
    std::optional<Model> g;
    try {
        m.for_each_param([&](const std::string& name, auto& t) {
            if (!set_aside(name)) return;
            auto stand_in = detail::empty_like_rank(t);
            if constexpr (is_linear_weight_v<decltype(t)>) aside.push_back(std::move(t));
            else aside.emplace_back(std::move(t));
            t = std::move(stand_in);
            ++n_params;
        });
        for (std::int64_t l = 0; l < frozen_prefix; ++l)
            std::visit([&](auto& blk) {
                if (auto* gu = detail::derived_gate_up(blk)) {
                    aside.push_back(std::move(*gu));
                    *gu = linear_weight();
                    ++n_derived;
                }
            }, m.layer_at(l));
        g.emplace(m);
    } catch (...) {
        restore();
        throw;
    }
    restore();
    for (std::int64_t l = 0; l < g->n_layers(); ++l)
        std::visit([](auto& blk) {
            if (auto* gu = detail::derived_gate_up(blk)) *gu = linear_weight();
        }, g->layer_at(l));
    g->for_each_param([](const std::string&, auto& t) { t.fill(0.0f); });
    return std::move(*g);
}

/// The trainable parameters of `m` paired with their gradients in `g` (a zeros_like or gradient_model of m), in the
/// models' fixed visiting order. `frozen(name)` marks parameters the optimizer skips. A parameter whose gradient
/// tensor gradient_model left empty gets no gradient (grad nullptr) and must be frozen. Throws shape_error when m
/// and g differ, config_error when a parameter with an empty gradient is not frozen.
template <class Model, class Frozen>
std::vector<param> parameters(Model& m, Model& g, Frozen&& frozen) {
    detail::require_f32_weights(m, "train::parameters");
    detail::require_f32_weights(g, "train::parameters (gradients)");
    std::vector<param> ps;
    m.for_each_param([&](const std::string& name, tensor<float>& t) {
        param p;
        p.name = name;
        p.value = &t;
        p.decay = decays_by_default(t);
        p.frozen = frozen(name);
        ps.push_back(std::move(p));
    });
    std::size_t i = 0;
    g.for_each_param([&](const std::string& name, tensor<float>& t) {
        if (i >= ps.size() || ps[i].name != name)
            throw shape_error("train::parameters: the gradient model does not match the model at '" + name + "'");
        if (t.numel() == 0 && ps[i].value->numel() != 0) {  // below gradient_model's frozen prefix
            if (!ps[i].frozen)
                throw config_error("train::parameters: '" + name + "' has no gradient tensor (backward stops above the gradient "
                                   "model's frozen prefix) but is not frozen");
            ++i;
            return;
        }
        if (ps[i].value->shape() != t.shape())
            throw shape_error("train::parameters: the gradient model does not match the model at '" + name + "' (shape " +
                              shape_string(t.shape()) + ", the model's " + shape_string(ps[i].value->shape()) + ")");
        ps[i++].grad = &t;
    });
    if (i != ps.size()) throw shape_error("train::parameters: the gradient model has fewer tensors than the model");
    return ps;
}
template <class Model>
std::vector<param> parameters(Model& m, Model& g) {
    return parameters(m, g, [](const std::string&) { return false; });
}

/// Sets every gradient of `ps` to zero.
inline void zero_grads(std::vector<param>& ps) {
    for (auto& p : ps)
        if (p.grad) p.grad->fill(0.0f);
}

namespace detail {
/// Throws config_error when `g` lacks a gradient tensor that a backward from layer `first` up writes (a gradient
/// model made with a larger frozen prefix than the activations').
template <class Model>
void require_grads_above(Model& m, Model& g, std::int64_t first) {
    std::vector<std::int64_t> sizes;
    m.for_each_param([&](const std::string&, const auto& t) { sizes.push_back(t.numel()); });
    std::size_t i = 0;
    g.for_each_param([&](const std::string& name, const auto& t) {
        const std::int64_t want = i < sizes.size() ? sizes[i] : 0;
        ++i;
        if (t.numel() == 0 && want != 0 && !detail::below_frozen_prefix(name, first, m.config().tie_embeddings))
            throw config_error("loss_and_grad: the gradient model has no tensor for '" + name + "', which the backward from layer " +
                               std::to_string(first) + " writes (gradient_model was given a larger frozen prefix than the activations)");
    });
}
}  // namespace detail

/// One training forward and backward of `m` over `batch` (fresh states for every sequence): accumulates
/// grad_scale · d(Σ losses)/dθ into the gradient model `g` (a zeros_like of m, or gradient_model(m, p) for p at most
/// a.frozen_prefix; += so micro-batches accumulate) and
/// returns the loss. tokens and targets [n_rows] (target −1: no loss at that row; rows outside every sequence are
/// ignored); `side` is the per-token side input of the blocks (Oryx modes, gate decisions; [n_rows] or empty). Throws
/// shape_error (sizes), value_error (token or target outside [0, V)), nonfinite_error when the loss is not finite.
template <backend B, class Model>
batch_loss loss_and_grad(const B& be, Model& m, Model& g, activations<Model>& a, const seq_batch& batch,
                         std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, float grad_scale,
                         std::span<const unsigned char> side = {}) {
    detail::require_f32_weights(m, "loss_and_grad");
    const std::int64_t n = batch.n_rows, d = m.config().d_model, V = m.config().vocab_size, L = m.n_layers();
    if (static_cast<std::int64_t>(tokens.size()) != n || static_cast<std::int64_t>(targets.size()) != n)
        throw shape_error("loss_and_grad: " + std::to_string(tokens.size()) + " tokens and " + std::to_string(targets.size()) +
                          " targets for a batch of " + std::to_string(n) + " rows");
    if (a.frozen_prefix < 0 || a.frozen_prefix > L)
        throw value_error("loss_and_grad: frozen_prefix " + std::to_string(a.frozen_prefix) + " outside [0, " + std::to_string(L) + "]");
    detail::require_grads_above(m, g, a.frozen_prefix);
    std::int64_t n_slots = 1;
    for (const auto sl : batch.slots) n_slots = std::max<std::int64_t>(n_slots, sl + 1);
    const validated_batch vb(batch, n_slots);
    const auto live = vb.live();
    std::vector<std::int32_t> tgt(targets.begin(), targets.end());
    for (std::int64_t r = 0; r < n; ++r) {
        const auto ri = static_cast<std::size_t>(r);
        if (!live[ri]) {
            tgt[ri] = -1;
            continue;
        }
        if (tokens[ri] < 0 || tokens[ri] >= V)
            throw value_error("loss_and_grad: token id " + std::to_string(tokens[ri]) + " at row " + std::to_string(r) +
                              " outside the vocabulary [0, " + std::to_string(V) + ")");
        if (tgt[ri] < -1 || tgt[ri] >= V)
            throw value_error("loss_and_grad: target " + std::to_string(tgt[ri]) + " at row " + std::to_string(r) +
                              " outside [0, " + std::to_string(V) + ") (or −1 for none)");
    }

    // Forward.
    a.x = tensor<float>({n, d});
    auto x = a.x.template view<2>();
    ops::embedding(be, m.weights().embedding.template view<2>(), tokens, live, x);
    a.stats.clear();
    if (!side.empty() && static_cast<std::int64_t>(side.size()) != n)
        throw shape_error("loss_and_grad: side input has " + std::to_string(side.size()) + " entries for " + std::to_string(n) + " rows");
    block_context<B> ctx{be, vb, m.head(), m.weights().final_norm.data(), m.config().norm_eps, Model::norm_type::flavor, side, a.ws, &a.stats, 0};
    a.layers.clear();
    a.layers.reserve(static_cast<std::size_t>(L - a.frozen_prefix));
    for (std::int64_t l = 0; l < L; ++l) {
        ctx.layer = l;
        detail::visit_at(m.layer_at(l), [&](auto I, auto& blk) {
            constexpr std::size_t i = decltype(I)::value;
            using Blk = std::remove_cvref_t<decltype(blk)>;
            if (l < a.frozen_prefix) {
                // Frozen: the inference forward from fresh states; nothing is kept for backward.
                auto st = blk.make_state(n_slots);
                std::as_const(blk).forward(ctx, st, x);
            } else if constexpr (detail::trainable_block<Blk>) {
                a.layers.emplace_back(std::in_place_index<i>);
                blk.forward_train(ctx, x, std::get<i>(a.layers.back()));
            } else {
                throw config_error("loss_and_grad: layer " + std::to_string(l) + " cannot be trained (its mixer has no backward); "
                                   "freeze it (frozen_prefix)");
            }
        });
    }
    a.x_final = tensor<float>({n, d});
    ops::copy(be, tensor_view<const float, 3>(a.x.data(), {n, 1, d}), tensor_view<float, 3>(a.x_final.data(), {n, 1, d}));
    a.h_final = tensor<float>({n, d});
    ops::rms_norm(be, a.x_final.template view<2>(), m.weights().final_norm.data(), m.final_eps(), m.final_flavor(),
                  a.h_final.template view<2>());

    // Loss and the head's backward (fused, streaming over the vocabulary).
    a.losses.assign(static_cast<std::size_t>(n), 0.0f);
    a.dh = tensor<float>({n, d});
    auto& gw = g.weights_mut();
    tensor<float>& dhead = m.config().tie_embeddings ? gw.embedding.f32() : gw.lm_head.f32();
    ops::cross_entropy(be, a.h_final.template view<2>(), m.head().template view<2>(), std::span<const std::int32_t>(tgt), std::span<float>(a.losses),
                       a.dh.template view<2>(), dhead.template view<2>(), grad_scale);
    batch_loss out;
    for (std::int64_t r = 0; r < n; ++r)
        if (tgt[static_cast<std::size_t>(r)] >= 0) {
            out.sum_nats += a.losses[static_cast<std::size_t>(r)];
            ++out.n_targets;
        }
    if (!std::isfinite(out.sum_nats))
        throw nonfinite_error("loss_and_grad: the loss is " + nonfinite_name(out.sum_nats) + " (NaN or Inf activations)");

    // Backward.
    a.dx = tensor<float>({n, d});
    auto dx = a.dx.template view<2>();
    ops::rms_norm_backward(be, a.x_final.template view<2>(), m.weights().final_norm.data(), m.final_eps(),
                           m.final_flavor(), a.dh.template view<2>(), dx, gw.final_norm.data());
    for (std::int64_t l = L - 1; l >= a.frozen_prefix; --l) {
        ctx.layer = l;
        auto& cache = a.layers[static_cast<std::size_t>(l - a.frozen_prefix)];
        detail::visit_at(m.layer_at(l), [&](auto I, const auto& blk) {
            constexpr std::size_t i = decltype(I)::value;
            if constexpr (detail::trainable_block<std::remove_cvref_t<decltype(blk)>>) {
                auto& gb = std::get<i>(g.layer_at(l));
                blk.backward(ctx, std::get<i>(cache), dx, gb);
            }
        });
    }
    if (a.frozen_prefix == 0)
        ops::embedding_backward(be, tokens, live, a.dx.template view<2>(), gw.embedding.template view<2>());
    return out;
}

}  // namespace hymix::train
