// A whole stack with random, properly initialised weights in one call (docs/building_stacks.md): each mixer's own
// `weights_type::random` (spec.md §3.5 Mamba-2, §4.5 Gated DeltaNet), SwiGLU MLPs and the embedding (and an untied
// LM head) N(0, 0.02) as in the Hugging Face models, and neutral norm weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/stack/block.hpp"
#include "hymix/stack/model.hpp"

namespace hymix {

namespace detail {
template <class Variant>
struct configs_of;
template <class... M>
struct configs_of<std::variant<M...>> {
    using type = std::tuple<typename M::config_type...>;
};

/// splitmix64 of (seed, layer, part): independent streams for every tensor of every layer.
constexpr std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t layer, std::uint64_t part) noexcept {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (layer * 8 + part + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline tensor<float> normal_tensor(std::vector<std::int64_t> shape, float stddev, std::uint64_t seed) {
    tensor<float> t(std::move(shape));
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> n(0.0f, stddev);
    for (auto& x : t.span()) x = n(gen);
    return t;
}

/// Alternative I of a mixer variant, built from its config and `weights_type::random(config, seed)`.
template <std::size_t I, class MV>
MV random_mixer(const typename std::variant_alternative_t<I, MV>::config_type& c, std::uint64_t seed) {
    using M = std::variant_alternative_t<I, MV>;
    static_assert(requires(const typename M::config_type& cc, std::uint64_t s) { M::weights_type::random(cc, s); },
                  "random_stack: a bound mixer's weights_type needs static random(config, seed)");
    return MV(std::in_place_index<I>, c, M::weights_type::random(c, seed));
}
}  // namespace detail

/// One mixer config per layer kind bound in `Model`, in binding order: for
/// `model<S, N, M, bind<layer_kind::gated_deltanet, gated_deltanet>, bind<layer_kind::attention, attention>>` it is
/// `std::tuple<gated_deltanet_config, attention_config>`.
template <class Model>
using mixer_configs = typename detail::configs_of<typename Model::mixer_variant>::type;

/// What a random stack needs besides stack_config and the mixer configs.
struct layer_plan {
    std::int64_t n_layers = 0;        // 0: the schedule's fixed count (pattern<"...">); required for other static schedules
    std::int64_t d_ff = 0;            // SwiGLU hidden width: required with swiglu_mlp, ignored without an MLP
    std::vector<layer_kind> kinds{};  // per-layer kinds: required for a run-time schedule (any_of<...>); otherwise
                                      // taken from the schedule when empty (and checked against it when given)
};

/// A model of type `Model` with random weights: layer i's mixer gets `weights_type::random(config of its kind, s)`,
/// its MLP (with an MLP policy) `weights_type::random(d_model, d_ff, s)`; the embedding and an untied LM head are
/// N(0, 0.02); every norm weight is neutral for `Model::norm_type` (neutral_norm_weight: ones for plain, zeros for
/// zero-centred RMSNorm). Each tensor has its own stream derived from `seed`, so the result is reproducible.
/// Throws config_error on a missing layer count / MLP width / per-layer kinds, and whatever the model's
/// constructor throws (a mixer config whose d_model is not cfg.d_model, kinds that contradict the schedule, ...).
template <class Model>
Model random_stack(const stack_config& cfg, const layer_plan& plan, const mixer_configs<Model>& mixers, std::uint64_t seed) {
    using Schedule = typename Model::schedule_type;
    using Norm = typename Model::norm_type;
    using Mlp = typename Model::mlp_type;
    using MV = typename Model::mixer_variant;
    cfg.validate();
    if (plan.n_layers < 0) throw config_error("random_stack: layer_plan.n_layers must be >= 0, found " + std::to_string(plan.n_layers));

    std::vector<layer_kind> kinds = plan.kinds;
    if (kinds.empty()) {
        if constexpr (static_layer_schedule<Schedule>) {
            std::int64_t n = plan.n_layers;
            if (n == 0) {
                if (Schedule::layer_count < 0)
                    throw config_error("random_stack: layer schedule " + Schedule::name() +
                                       " does not fix the number of layers; set layer_plan.n_layers");
                n = Schedule::layer_count;
            }
            kinds = schedule_kinds<Schedule>(n);
        } else {
            throw config_error("random_stack: layer schedule " + Schedule::name() +
                               " is decided at run time; give every layer's kind in layer_plan.kinds");
        }
    } else if (plan.n_layers != 0 && plan.n_layers != static_cast<std::int64_t>(kinds.size())) {
        throw config_error("random_stack: layer_plan.n_layers is " + std::to_string(plan.n_layers) + " but layer_plan.kinds has " +
                           std::to_string(kinds.size()) + " entries");
    }
    if constexpr (Mlp::present)
        if (plan.d_ff <= 0)
            throw config_error("random_stack: the stack has an MLP; layer_plan.d_ff must be positive, found " + std::to_string(plan.d_ff));

    const std::int64_t d = cfg.d_model;
    std::vector<typename Model::layer> layers;
    layers.reserve(kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        // The mixer of the alternative bound to this layer's kind (a kind no binding provides is the schedule's error).
        std::size_t alt = Model::bound_kinds.size();
        for (std::size_t b = 0; b < Model::bound_kinds.size(); ++b)
            if (Model::bound_kinds[b] == kinds[i]) alt = b;
        if (alt == Model::bound_kinds.size())
            throw config_error("random_stack: layer " + std::to_string(i) + " is '" + layer_kind_name(kinds[i]) +
                               "', a kind the stack binds to no block or mixer");
        std::optional<MV> mixer;
        [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((alt == I ? void(mixer.emplace(detail::random_mixer<I, MV>(std::get<I>(mixers), detail::stream_seed(seed, i, 0)))) : void()), ...);
        }(std::make_index_sequence<std::variant_size_v<MV>>{});
        typename Mlp::weights_type mlp{};
        tensor<float> mlp_norm;
        if constexpr (Mlp::present) {
            static_assert(requires(std::int64_t n, std::uint64_t s) { Mlp::weights_type::random(n, n, s); },
                          "random_stack: the MLP policy's weights_type needs static random(d_model, d_ff, seed)");
            mlp = Mlp::weights_type::random(d, plan.d_ff, detail::stream_seed(seed, i, 1));
            mlp_norm = neutral_norm_weight<Norm>(d);
        }
        layers.emplace_back(neutral_norm_weight<Norm>(d), std::move(*mixer), std::move(mlp_norm), std::move(mlp));
    }

    stack_weights w;
    const std::uint64_t top = kinds.size();
    w.embedding = detail::normal_tensor({cfg.vocab_size, d}, 0.02f, detail::stream_seed(seed, top, 0));
    w.final_norm = neutral_norm_weight<Norm>(d);
    if (!cfg.tie_embeddings) w.lm_head = detail::normal_tensor({cfg.vocab_size, d}, 0.02f, detail::stream_seed(seed, top, 1));
    return Model(cfg, std::move(w), std::move(layers));
}

}  // namespace hymix
