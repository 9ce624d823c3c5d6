// A whole causal language model composed at compile time (spec.md §3.6, §4.7, §7):
//   embedding → L × [ r ← r + mixer(norm(r));  optionally r ← r + SwiGLU(norm(r)) ] → final norm → LM head.
// The layer schedule (gate/fixed_schedule.hpp) says which mixer kind each layer uses; `bind<Kind, Mixer>` says
// which compiled mixer type implements each kind.
//
// Design. `model<Schedule, Norm, Mlp, bind<K1, M1>, bind<K2, M2>, ...>`: the bound kinds must be exactly the
// kinds the schedule allows (checked by static_assert). Each layer holds a `std::variant<M1, M2, ...>` and the
// cache holds a `std::variant<M1::state_type, ...>` per layer; with one bound kind the variant has a single
// alternative and the visit is a direct call. The per-layer kinds are checked against the schedule once, at
// construction (Schedule::check, config_error naming the first mismatching layer). Norm flavour and MLP are
// policies. A model is immutable after construction; every call takes a `model_cache` (states of every layer
// for a pool of slots plus the activation workspace), so one model can serve several caches on several threads.
#pragma once

#include <cmath>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/gate/fixed_schedule.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/norm.hpp"
#include "hymix/stack/block.hpp"
#include "hymix/stack/cache.hpp"

namespace hymix {

/// Sizes shared by every layer of a stack.
struct stack_config {
    std::int64_t d_model = 0;
    std::int64_t vocab_size = 0;
    float norm_eps = 1e-5f;       // every ungated RMSNorm of the stack (layer norms and the final norm)
    bool tie_embeddings = false;  // LM head = embedding matrix

    /// Throws config_error on non-positive sizes or eps.
    void validate() const {
        if (d_model <= 0) throw config_error("stack_config: d_model must be positive, found " + std::to_string(d_model));
        if (vocab_size <= 0) throw config_error("stack_config: vocab_size must be positive, found " + std::to_string(vocab_size));
        if (!(norm_eps > 0) || !std::isfinite(norm_eps)) throw config_error("stack_config: norm_eps must be positive and finite, found " + std::to_string(norm_eps));
    }
};

/// Weights outside the layers.
struct stack_weights {
    tensor<float> embedding;   // [V, d]
    tensor<float> final_norm;  // [d]
    tensor<float> lm_head;     // [V, d]; ignored (may be empty) when tie_embeddings
};

/// Probe that ignores every activation. A probe is called as probe(name, view [n_rows, d]) with the names of
/// the reference activations: "embeddings", "layers.{i}.mixer_output", "layers.{i}.output", "final_norm".
struct no_probe {
    void operator()(std::string_view, tensor_view<const float, 2>) const noexcept {}
};

namespace detail {
template <layer_kind K, class... Binds>
constexpr int count_bound() {
    return ((Binds::kind == K ? 1 : 0) + ... + 0);
}
template <class Schedule, class... Binds>
constexpr bool bindings_cover_schedule() {
    for (auto k : all_layer_kinds)
        if (Schedule::allows(k)) {
            int n = 0;
            ((n += Binds::kind == k ? 1 : 0), ...);
            if (n != 1) return false;
        }
    return true;
}
inline void require_vector(const tensor<float>& t, std::int64_t n, const std::string& what) {
    if (t.rank() != 1 || t.dim(0) != n)
        throw shape_error(what + ": expected shape [" + std::to_string(n) + "], found " + shape_string(t.shape()));
}
inline void require_matrix(const tensor<float>& t, std::int64_t a, std::int64_t b, const std::string& what) {
    if (t.rank() != 2 || t.dim(0) != a || t.dim(1) != b)
        throw shape_error(what + ": expected shape " + shape_string(std::vector<std::int64_t>{a, b}) + ", found " +
                          shape_string(t.shape()));
}
}  // namespace detail

template <layer_schedule Schedule, norm_policy Norm, mlp_policy Mlp, class... Binds>
class model {
    static_assert(sizeof...(Binds) > 0, "model<...>: bind at least one layer kind to a mixer type");
    static_assert((Schedule::allows(Binds::kind) && ...),
                  "model<...>: a bound layer kind is one the schedule never uses; bind exactly the schedule's kinds");
    static_assert(detail::bindings_cover_schedule<Schedule, Binds...>(),
                  "model<...>: every layer kind the schedule allows needs exactly one bind<Kind, Mixer>");

public:
    using schedule_type = Schedule;
    using norm_type = Norm;
    using mlp_type = Mlp;
    using mixer_variant = std::variant<typename Binds::mixer_type...>;
    using state_variant = std::variant<typename Binds::state_type...>;
    using cache_type = model_cache<state_variant>;
    static constexpr std::array<layer_kind, sizeof...(Binds)> bound_kinds{Binds::kind...};

    /// One layer: pre-norm weight, mixer, and (with an MLP policy) the MLP's pre-norm weight and weights.
    struct layer {
        tensor<float> norm;  // [d]
        mixer_variant mixer;
        tensor<float> mlp_norm;  // [d]; empty without an MLP
        typename Mlp::weights_type mlp;

        layer(tensor<float> norm_w, mixer_variant m, tensor<float> mlp_norm_w = {}, typename Mlp::weights_type mlp_w = {})
            : norm(std::move(norm_w)), mixer(std::move(m)), mlp_norm(std::move(mlp_norm_w)), mlp(std::move(mlp_w)) {}

        layer_kind kind() const { return bound_kinds[mixer.index()]; }
    };

    /// Validates the sizes, every tensor's shape (shape_error naming it: "layers.3.norm", "embedding", ...) and the
    /// per-layer kinds against the schedule (config_error naming the first mismatching layer).
    model(stack_config cfg, stack_weights w, std::vector<layer> layers)
        : cfg_(cfg), w_(std::move(w)), layers_(std::move(layers)) {
        cfg_.validate();
        const std::int64_t d = cfg_.d_model, V = cfg_.vocab_size;
        detail::require_matrix(w_.embedding, V, d, "embedding");
        detail::require_vector(w_.final_norm, d, "final_norm");
        if (!cfg_.tie_embeddings) detail::require_matrix(w_.lm_head, V, d, "lm_head");
        if (layers_.empty()) throw config_error("model: a stack needs at least one layer");
        std::vector<layer_kind> kinds;
        for (std::size_t i = 0; i < layers_.size(); ++i) {
            auto& L = layers_[i];
            const std::string p = "layers." + std::to_string(i);
            detail::require_vector(L.norm, d, p + ".norm");
            if constexpr (Mlp::present) {
                detail::require_vector(L.mlp_norm, d, p + ".mlp_norm");
                L.mlp.validate(d, p + ".mlp");
                L.mlp.prepare();
            }
            kinds.push_back(L.kind());
        }
        Schedule::check(kinds);
        kinds_ = std::move(kinds);
    }

    const stack_config& config() const noexcept { return cfg_; }
    std::int64_t n_layers() const noexcept { return static_cast<std::int64_t>(layers_.size()); }
    const std::vector<layer_kind>& layer_kinds() const noexcept { return kinds_; }
    const layer& layer_at(std::int64_t i) const { return layers_.at(static_cast<std::size_t>(i)); }
    const stack_weights& weights() const noexcept { return w_; }

    /// A cache for `n_slots` sequences (all fresh).
    cache_type make_cache(std::int64_t n_slots) const {
        if (n_slots <= 0) throw shape_error("make_cache: n_slots must be positive, found " + std::to_string(n_slots));
        std::vector<state_variant> st;
        st.reserve(layers_.size());
        for (const auto& L : layers_)
            std::visit([&](const auto& m) {
                using S = typename std::decay_t<decltype(m)>::state_type;
                st.emplace_back(std::in_place_type<S>, m.make_state(n_slots));
            }, L.mixer);
        return cache_type(n_slots, std::move(st));
    }

    /// Logits for every row. tokens: one id per row of the batch (n_rows; rows outside every sequence are
    /// ignored), logits [n_rows, V] fp32; rows outside every sequence (or of a sequence with slot −1) are 0.
    /// Sequences continue from their slots' states. When every sequence has one token the mixers' step paths run.
    /// Throws shape_error (sizes, seq_batch vs cache), value_error (token id outside [0, V)).
    template <cpu_backend_type B, class Probe = no_probe>
    void forward(const B& be, cache_type& cache, const seq_batch& batch, std::span<const std::int32_t> tokens,
                 tensor_view<float, 2> logits, Probe&& probe = {}) const {
        const std::int64_t n = batch.n_rows;
        logits.require_shape({n, cfg_.vocab_size}, "model forward: logits");
        run_layers(be, cache, batch, tokens, probe);
        auto& ws = cache.workspace();
        auto x = ws.x.get(n, cfg_.d_model);
        auto h = ws.h.get(n, cfg_.d_model);
        kernels::rms_norm<float>(x, w_.final_norm.data(), cfg_.norm_eps, Norm::flavor, h);
        probe("final_norm", h);
        kernels::linear(be, h, head(), nullptr, logits);
        for (std::int64_t r = 0; r < n; ++r)
            if (!ws.active[static_cast<std::size_t>(r)]) std::fill_n(&logits(r, 0), cfg_.vocab_size, 0.f);
    }

    /// Logits [n_seq, V] of each sequence's last token only (the LM head runs on n_seq rows). A sequence with no
    /// tokens or slot −1 gets a zero row. Same errors as forward.
    template <cpu_backend_type B>
    void forward_last(const B& be, cache_type& cache, const seq_batch& batch, std::span<const std::int32_t> tokens,
                      tensor_view<float, 2> logits) const {
        const std::int64_t S = batch.n_seq(), d = cfg_.d_model;
        logits.require_shape({S, cfg_.vocab_size}, "model forward_last: logits");
        no_probe p;
        run_layers(be, cache, batch, tokens, p);
        auto& ws = cache.workspace();
        auto x = ws.x.get(batch.n_rows, d);
        auto last = ws.last.get(S, d);
        auto lastn = ws.lastn.get(S, d);
        for (std::int64_t i = 0; i < S; ++i) {
            const std::size_t si = static_cast<std::size_t>(i);
            if (batch.lengths[si] > 0 && batch.slots[si] >= 0)
                std::copy_n(&x(batch.starts[si] + batch.lengths[si] - 1, 0), d, &last(i, 0));
            else
                std::fill_n(&last(i, 0), d, 0.f);
        }
        kernels::rms_norm<float>(last, w_.final_norm.data(), cfg_.norm_eps, Norm::flavor, lastn);
        kernels::linear(be, lastn, head(), nullptr, logits);
    }

private:
    tensor_view<const float, 2> head() const {
        return cfg_.tie_embeddings ? w_.embedding.view<2>() : w_.lm_head.view<2>();
    }

    /// Embedding → layers; leaves the residual stream in the workspace's x [n_rows, d].
    template <cpu_backend_type B, class Probe>
    void run_layers(const B& be, cache_type& cache, const seq_batch& batch, std::span<const std::int32_t> tokens,
                    Probe& probe) const {
        const std::int64_t n = batch.n_rows, d = cfg_.d_model, V = cfg_.vocab_size;
        constexpr bool probing = !std::is_same_v<std::remove_cvref_t<Probe>, no_probe>;
        batch.validate(cache.n_slots());
        if (cache.n_layers() != n_layers())
            throw shape_error("model forward: cache holds " + std::to_string(cache.n_layers()) + " layers, the model has " +
                              std::to_string(n_layers()));
        if (static_cast<std::int64_t>(tokens.size()) != n)
            throw shape_error("model forward: " + std::to_string(tokens.size()) + " token ids for a batch of " +
                              std::to_string(n) + " rows");
        auto& active = cache.workspace().active;
        active.assign(static_cast<std::size_t>(n), 0);
        for (std::int64_t i = 0; i < batch.n_seq(); ++i) {
            const std::size_t si = static_cast<std::size_t>(i);
            if (batch.slots[si] < 0) continue;
            for (std::int64_t r = batch.starts[si]; r < batch.starts[si] + batch.lengths[si]; ++r) {
                const std::int32_t t = tokens[static_cast<std::size_t>(r)];
                if (t < 0 || t >= V)
                    throw value_error("model forward: token id " + std::to_string(t) + " at row " + std::to_string(r) +
                                      " outside the vocabulary [0, " + std::to_string(V) + ")");
                active[static_cast<std::size_t>(r)] = 1;
            }
        }
        auto& ws = cache.workspace();
        auto x = ws.x.get(n, d);
        auto h = ws.h.get(n, d);
        auto y = ws.y.get(n, d);
        const float* emb = w_.embedding.data();
        for (std::int64_t r = 0; r < n; ++r) {
            if (active[static_cast<std::size_t>(r)])
                std::copy_n(emb + static_cast<std::int64_t>(tokens[static_cast<std::size_t>(r)]) * d, d, &x(r, 0));
            else
                std::fill_n(&x(r, 0), d, 0.f);
        }
        if constexpr (probing) probe("embeddings", x);
        const bool decode = batch.n_seq() > 0 && batch.is_decode();
        auto add_active = [&](tensor_view<float, 2> src) {
            for (std::int64_t r = 0; r < n; ++r) {
                if (!active[static_cast<std::size_t>(r)]) continue;
                float* xr = &x(r, 0);
                const float* sr = &src(r, 0);
                for (std::int64_t i = 0; i < d; ++i) xr[i] += sr[i];
            }
        };
        for (std::size_t l = 0; l < layers_.size(); ++l) {
            const layer& L = layers_[l];
            kernels::rms_norm<float>(x, L.norm.data(), cfg_.norm_eps, Norm::flavor, h);
            auto& st = cache.layer_state(static_cast<std::int64_t>(l));
            std::visit([&](const auto& m) {
                using S = typename std::decay_t<decltype(m)>::state_type;
                auto* s = std::get_if<S>(&st);
                if (!s) throw shape_error("model forward: cache layer " + std::to_string(l) + " holds another mixer's state");
                if (decode)
                    m.step(be, *s, batch, tensor_view<const float, 2>(h), y);
                else
                    m.forward(be, *s, batch, tensor_view<const float, 2>(h), y);
            }, L.mixer);
            if constexpr (probing) probe("layers." + std::to_string(l) + ".mixer_output", y);
            add_active(y);
            if constexpr (Mlp::present) {
                kernels::rms_norm<float>(x, L.mlp_norm.data(), cfg_.norm_eps, Norm::flavor, h);
                auto gu = ws.gu.get(n, 2 * L.mlp.d_ff());
                kernels::swiglu(be, L.mlp, h, gu, y);
                add_active(y);
            }
            if constexpr (probing) probe("layers." + std::to_string(l) + ".output", x);
        }
    }

    stack_config cfg_;
    stack_weights w_;
    std::vector<layer> layers_;
    std::vector<layer_kind> kinds_;
};

}  // namespace hymix
