// A whole causal language model composed at compile time (spec.md §3.6, §4.7, §7):
//   embedding → L blocks (each updates the residual stream) → final norm → LM head.
// The layer schedule (schedule/layer_schedule.hpp) says which kind each layer is; `bind<Kind, X>` says which
// compiled block implements each kind — X is a block (stack/block.hpp, e.g. a gated prenorm_block or an AMOR block)
// or a mixer, which the stack wraps in its pre-norm block `prenorm_block<X, Norm, Mlp>` (norm → mixer → residual,
// then norm → MLP → residual).
//
// Design. `model<Schedule, Norm, Mlp, bind<K1, X1>, bind<K2, X2>, ...>`: the bound kinds must be exactly the kinds
// the schedule allows (checked by static_assert). Each layer holds a `std::variant` of the bound block types and the
// cache holds a variant of their states per layer; with one bound kind the variant has a single alternative and the
// visit is a direct call. The per-layer kinds are checked against the schedule once, at construction. A model is
// immutable after construction; every call takes a `model_cache` (states of every layer for a pool of slots plus
// the activation workspace), so one model can serve several caches on several threads. Every call runs on a backend
// type B (backend/): the CPU backend, or the fp64 reference backend that tests check it against.
#pragma once

#include <cmath>

#include <algorithm>
#include <array>
#include <optional>
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
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/mixer/kv_cache.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/linear.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/stack/block.hpp"
#include "hymix/stack/cache.hpp"
#include "hymix/stack/context.hpp"
#include "hymix/stack/prenorm_block.hpp"

namespace hymix {

/// Sizes shared by every layer of a stack.
struct stack_config {
    std::int64_t d_model = 0;
    std::int64_t vocab_size = 0;
    float norm_eps = 1e-5f;       // every ungated RMSNorm of the stack (layer norms and, unless stack_weights says
                                  // otherwise, the final norm)
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
    linear_weight embedding;   // [V, d]
    tensor<float> final_norm;  // [d]
    linear_weight lm_head;     // [V, d]; ignored (may be empty) when tie_embeddings
};

/// The final norm's eps and flavour where they differ from the stack's (AMOR's final_norm: plain RMSNorm, eps 1e-6, on
/// any backbone).
struct final_norm_options {
    float eps = 0.0f;                          // 0 = the stack's norm_eps
    std::optional<kernels::rms_flavor> flavor;  // none = the stack's Norm policy
};

namespace detail {
template <layer_kind K, class... Binds>
constexpr int count_bound() {
    return ((Binds::kind == K ? 1 : 0) + ... + 0);
}
template <class Schedule, class... Binds>
constexpr bool bindings_cover_schedule() {
    for (int c = 33; c < 127; ++c)  // every printable letter a kind can have
        if (const layer_kind k(static_cast<char>(c)); Schedule::allows(k)) {
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
template <class W>  // tensor<float> or linear_weight (its stored shape)
inline void require_matrix(const W& t, std::int64_t a, std::int64_t b, const std::string& what) {
    if (t.rank() != 2 || t.dim(0) != a || t.dim(1) != b)
        throw shape_error(what + ": expected shape " + shape_string(std::vector<std::int64_t>{a, b}) + ", found " +
                          shape_string(t.shape()));
}
}  // namespace detail

template <layer_schedule Schedule, norm_policy Norm, mlp_policy Mlp, class... Binds>
class model {
    static_assert(sizeof...(Binds) > 0, "model<...>: bind at least one layer kind to a block or mixer type");
    static_assert((Schedule::allows(Binds::kind) && ...),
                  "model<...>: a bound layer kind is one the schedule never uses; bind exactly the schedule's kinds");
    static_assert(detail::bindings_cover_schedule<Schedule, Binds...>(),
                  "model<...>: every layer kind the schedule allows needs exactly one bind<Kind, X>");

    template <class Bind>
    using block_of = std::conditional_t<Bind::is_block, typename Bind::type, prenorm_block<typename Bind::type, Norm, Mlp>>;

public:
    using schedule_type = Schedule;
    using norm_type = Norm;
    using mlp_type = Mlp;
    using block_variant = std::variant<block_of<Binds>...>;
    using mixer_variant = std::variant<typename block_of<Binds>::mixer_type...>;
    using state_variant = std::variant<typename block_of<Binds>::state_type...>;
    using cache_type = model_cache<state_variant>;
    static constexpr std::array<layer_kind, sizeof...(Binds)> bound_kinds{Binds::kind...};

private:
    template <class Bind>
    static constexpr kind_info info_of() {
        using M = typename block_of<Bind>::mixer_type;
        if constexpr (declares_kind<M>) {
            const auto n = Bind::kind.declared_name().empty() ? M::kind.kind.declared_name() : Bind::kind.declared_name();
            return kind_info{layer_kind(Bind::kind.code, n), M::kind.hf_layer_types};
        } else {
            return kind_info{Bind::kind, {}};
        }
    }

public:
    /// What the bound types declare about their kinds (names, Hugging Face layer types), in binding order.
    static constexpr std::array<kind_info, sizeof...(Binds)> kind_infos{info_of<Binds>()...};
    /// The name of a kind as the bound types declare it ("mamba2", "sliding_attention", ...).
    static std::string kind_name(layer_kind k) {
        for (const auto& i : kind_infos)
            if (i.kind == k && !i.kind.declared_name().empty()) return std::string(i.kind.declared_name());
        return layer_kind_name(k);
    }

    /// How a pre-norm layer is described when a stack is built from weights: pre-norm weight, mixer, and (with an
    /// MLP policy) the MLP's pre-norm weight and weights. The model turns it into the block bound to the mixer's kind.
    struct layer {
        tensor<float> norm;  // [d]
        mixer_variant mixer;
        tensor<float> mlp_norm;  // [d]; empty without an MLP
        typename Mlp::weights_type mlp;

        layer(tensor<float> norm_w, mixer_variant m, tensor<float> mlp_norm_w = {}, typename Mlp::weights_type mlp_w = {})
            : norm(std::move(norm_w)), mixer(std::move(m)), mlp_norm(std::move(mlp_norm_w)), mlp(std::move(mlp_w)) {}

        layer_kind kind() const { return bound_kinds[mixer.index()]; }
    };

    /// Validates the sizes, every tensor's shape (shape_error naming it: "layers.3.norm", "embedding", ...), that no
    /// plain RMSNorm weight is all zero (value_error naming it), each mixer's width against d_model (config_error
    /// naming the layer) and the per-layer kinds against the schedule (config_error naming the first mismatching layer).
    model(stack_config cfg, stack_weights w, std::vector<layer> layers) : cfg_(cfg), w_(std::move(w)) {
        blocks_.reserve(layers.size());
        for (std::size_t i = 0; i < layers.size(); ++i) blocks_.push_back(to_block(std::move(layers[i]), i));
        init();
    }
    /// The same from blocks built by the caller (gated blocks, AMOR blocks, ...).
    model(stack_config cfg, stack_weights w, std::vector<block_variant> blocks, final_norm_options fn = {})
        : cfg_(cfg), w_(std::move(w)), blocks_(std::move(blocks)), fn_(fn) {
        init();
    }

    const stack_config& config() const noexcept { return cfg_; }
    std::int64_t n_layers() const noexcept { return static_cast<std::int64_t>(blocks_.size()); }
    const std::vector<layer_kind>& layer_kinds() const noexcept { return kinds_; }
    /// The block of layer i (a variant over the bound block types).
    const block_variant& layer_at(std::int64_t i) const { return blocks_.at(static_cast<std::size_t>(i)); }
    block_variant& layer_at(std::int64_t i) { return blocks_.at(static_cast<std::size_t>(i)); }
    const stack_weights& weights() const noexcept { return w_; }
    /// Mutable weights for training (the optimizer updates them in place; call weights_changed() afterwards).
    stack_weights& weights_mut() noexcept { return w_; }

    /// f(name, p) for every parameter in a fixed order: "embedding", then each layer's block
    /// ("layers.{i}.norm", "layers.{i}.mixer.<name>", ...), "final_norm", and "lm_head" unless tied.
    template <class F>
    void for_each_param(F&& f) {
        visit_param(f, std::string("embedding"), w_.embedding);
        for (std::size_t l = 0; l < blocks_.size(); ++l)
            std::visit([&](auto& blk) {
                if constexpr (requires { blk.for_each_param(std::string(), f); }) blk.for_each_param("layers." + std::to_string(l), f);
            }, blocks_[l]);
        visit_param(f, std::string("final_norm"), w_.final_norm);
        if (!cfg_.tie_embeddings) visit_param(f, std::string("lm_head"), w_.lm_head);
    }
    /// Lets every block re-derive what it caches from its weights after they changed.
    void weights_changed() {
        for (auto& b : blocks_)
            std::visit([](auto& blk) {
                if constexpr (requires { blk.weights_changed(); }) blk.weights_changed();
            }, b);
    }
    /// The LM head [V, d] (the embedding when tied), as stored (f32, or bf16 / f16 / i8 after store_weights_as).
    const linear_weight& head() const noexcept { return cfg_.tie_embeddings ? w_.embedding : w_.lm_head; }

    /// Stores every projection weight (the mixers' linear_weight members, the MLPs, the embedding and LM head) as `d`:
    /// bf16 or f16 for inference (half the bytes a decode step reads; each projection gives the bits of the f32 model
    /// whose weights were rounded to `d`), i8 (a quarter of the bytes: per-row absmax quantization, see q8_view; its
    /// effect on the shared checkpoints' bits/byte is in docs/quantization.md), or f32 again (widening). Norms,
    /// convolutions, gates' parameters and states stay fp32. Training needs f32 (model_grad throws config_error
    /// otherwise). Throws value_error naming the tensor where a value overflows f16, nonfinite_error (a value_error)
    /// naming it where a NaN or Inf is to be quantized to i8, config_error for another dtype; every weight is checked
    /// before any is converted, so a throw leaves the model as it was.
    void store_weights_as(dtype d) {
        if (!is_weight_dtype(d))
            throw config_error(std::string("store_weights_as: weights can be stored as f32, bf16, f16 or i8, not ") + weight_dtype_name(d));
        for_each_param([&](const std::string& name, auto& t) {
            if constexpr (is_linear_weight_v<decltype(t)>) t.check_storable(d, name);
        });
        for_each_param([&](const std::string& name, auto& t) {
            if constexpr (is_linear_weight_v<decltype(t)>) t.store_as(d, name);
        });
        for (auto& b : blocks_)
            std::visit([&](auto& blk) {
                if constexpr (requires { blk.store_cached_weights_as(d); }) blk.store_cached_weights_as(d);
            }, b);
    }
    /// Stores the KV cache of every attention-like layer (softmax attention, AMOR blocks, Oryx) in `d` for the caches
    /// made from now on (make_cache): f32, or bf16 / f16, half the bytes a decode step reads from the cache at long
    /// context (keys and values rounded to nearest even once, when appended; every product and sum stays fp32).
    /// Returns the number of layers it applies to (0 for a stack without attention). Throws config_error for another
    /// dtype, before changing any layer.
    std::int64_t set_kv_dtype(dtype d) {
        if (!kv_cache::supported(d))
            throw config_error("set_kv_dtype: the KV cache is stored in F32, BF16 or F16, not " + std::string(dtype_name(d)));
        std::int64_t n = 0;
        for (auto& b : blocks_)
            std::visit([&](auto& blk) {
                if constexpr (requires { blk.mixer_mut().set_kv_dtype(d); }) {
                    blk.mixer_mut().set_kv_dtype(d);
                    ++n;
                }
            }, b);
        return n;
    }
    /// Bytes the weights occupy in memory: every parameter as stored (fp32, or the projections' bf16 / f16) plus what
    /// blocks derive from them (the MLPs' fused gate|up copy).
    std::size_t weight_bytes() const {
        std::size_t n = 0;
        const_cast<model&>(*this).for_each_param([&](const std::string&, const auto& t) {  // reads only
            if constexpr (is_linear_weight_v<decltype(t)>)
                n += t.stored_bytes();
            else
                n += static_cast<std::size_t>(t.numel()) * sizeof(float);
        });
        for (const auto& b : blocks_)
            std::visit([&](const auto& blk) {
                if constexpr (requires { blk.cached_weight_bytes(); }) n += blk.cached_weight_bytes();
            }, b);
        return n;
    }
    /// The storage type of the projection weights, read off the weights themselves: the first one not stored as f32
    /// (so a model assembled from 16-bit weights reports them too), else dtype::f32. Sets `name` to that weight's name.
    dtype weight_dtype(std::string* name = nullptr) const {
        dtype found = dtype::f32;
        const_cast<model&>(*this).for_each_param([&](const std::string& n, const auto& t) {  // reads only
            if constexpr (is_linear_weight_v<decltype(t)>)
                if (found == dtype::f32 && !t.is_f32()) {
                    found = t.storage();
                    if (name) *name = n;
                }
        });
        return found;
    }

    /// The final norm's flavour (the stack's Norm policy unless the config overrides it).
    kernels::rms_flavor final_flavor() const noexcept { return fn_.flavor.value_or(Norm::flavor); }
    /// The final norm's eps (the stack's norm_eps unless final_norm_options say otherwise).
    float final_eps() const noexcept { return fn_.eps > 0 ? fn_.eps : cfg_.norm_eps; }

    /// A cache for `n_slots` sequences (all fresh).
    cache_type make_cache(std::int64_t n_slots) const {
        if (n_slots <= 0) throw shape_error("make_cache: n_slots must be positive, found " + std::to_string(n_slots));
        std::vector<state_variant> st;
        st.reserve(blocks_.size());
        for (const auto& b : blocks_)
            visit_indexed(b, [&](auto I, const auto& blk) { st.emplace_back(std::in_place_index<decltype(I)::value>, blk.make_state(n_slots)); });
        return cache_type(n_slots, std::move(st));
    }

    /// Logits for every row. tokens: one id per row of the batch (n_rows; rows outside every sequence are
    /// ignored), logits [n_rows, V] fp32; rows outside every sequence (or of a sequence with slot −1) are 0.
    /// Sequences continue from their slots' states. When every sequence has one token the mixers' step paths run.
    /// `side` is an optional per-token side input for the blocks' gates ([n_rows] bytes). Statistics of gated blocks
    /// are left in cache.stats(). Throws shape_error (sizes, seq_batch vs cache), value_error (token id outside [0, V)).
    template <backend B, class Probe = no_probe>
    void forward(const B& be, cache_type& cache, const seq_batch& batch, std::span<const std::int32_t> tokens,
                 tensor_view<float, 2> logits, Probe&& probe = {}, std::span<const unsigned char> side = {}) const {
        const std::int64_t n = batch.n_rows;
        logits.require_shape({n, cfg_.vocab_size}, "model forward: logits");
        const validated_batch vb(batch, cache.n_slots());
        run_layers(be, cache, vb, tokens, probe, side);
        auto& ws = cache.workspace();
        auto x = ws.x.get(n, cfg_.d_model);
        auto h = ws.h.get(n, cfg_.d_model);
        ops::rms_norm(be, tensor_view<const float, 2>(x), w_.final_norm.data(), final_eps(), final_flavor(), h);
        if constexpr (probing<Probe>) probe("final_norm", tensor_view<const float, 2>(h));
        ops::linear(be, tensor_view<const float, 2>(h), head(), nullptr, logits);
        ops::zero_rows(be, logits, vb.live());
    }

    /// Logits [n_seq, V] of each sequence's last token only (the LM head runs on n_seq rows). A sequence with no
    /// tokens or slot −1 gets a zero row. Same errors as forward.
    template <backend B>
    void forward_last(const B& be, cache_type& cache, const seq_batch& batch, std::span<const std::int32_t> tokens,
                      tensor_view<float, 2> logits, std::span<const unsigned char> side = {}) const {
        const std::int64_t S = batch.n_seq(), d = cfg_.d_model;
        logits.require_shape({S, cfg_.vocab_size}, "model forward_last: logits");
        const validated_batch vb(batch, cache.n_slots());
        no_probe p;
        run_layers(be, cache, vb, tokens, p, side);
        auto& ws = cache.workspace();
        auto x = ws.x.get(batch.n_rows, d);
        auto last = ws.last.get(S, d);
        auto lastn = ws.lastn.get(S, d);
        auto& rows = ws.rows;
        rows.resize(static_cast<std::size_t>(S));
        for (std::int64_t i = 0; i < S; ++i) {
            const auto si = static_cast<std::size_t>(i);
            rows[si] = batch.lengths[si] > 0 && batch.slots[si] >= 0 ? batch.starts[si] + batch.lengths[si] - 1 : -1;
        }
        ops::gather_rows(be, tensor_view<const float, 2>(x), rows, last);
        ops::rms_norm(be, tensor_view<const float, 2>(last), w_.final_norm.data(), final_eps(), final_flavor(), lastn);
        ops::linear(be, tensor_view<const float, 2>(lastn), head(), nullptr, logits);
    }

private:
    template <class Probe>
    static constexpr bool probing = !std::is_same_v<std::remove_cvref_t<Probe>, no_probe>;

    /// Calls f(std::integral_constant<size_t, I>, alternative) for the active alternative I of a variant (index-based,
    /// so alternatives of the same type stay distinct).
    template <std::size_t I = 0, class V, class F>
    static decltype(auto) visit_indexed(V&& v, F&& f) {
        if constexpr (I + 1 < std::variant_size_v<std::remove_cvref_t<V>>) {
            if (v.index() != I) return visit_indexed<I + 1>(std::forward<V>(v), std::forward<F>(f));
        }
        return f(std::integral_constant<std::size_t, I>{}, std::get<I>(v));
    }

    block_variant to_block(layer&& L, std::size_t i) {
        return visit_indexed(L.mixer, [&](auto I, auto& m) -> block_variant {
            using Blk = std::variant_alternative_t<decltype(I)::value, block_variant>;
            using M = std::remove_cvref_t<decltype(m)>;
            if constexpr (std::is_constructible_v<Blk, tensor<float>, M, tensor<float>, typename Mlp::weights_type>) {
                return block_variant(std::in_place_index<decltype(I)::value>, std::move(L.norm), std::move(m), std::move(L.mlp_norm),
                                     std::move(L.mlp));
            } else {
                throw config_error("model: layer " + std::to_string(i) +
                                   " is bound to a custom block that cannot be built from (norm, mixer, mlp); pass blocks");
            }
        });
    }

    void init() {
        cfg_.validate();
        const std::int64_t d = cfg_.d_model, V = cfg_.vocab_size;
        detail::require_matrix(w_.embedding, V, d, "embedding");
        detail::require_vector(w_.final_norm, d, "final_norm");
        if (!(fn_.eps >= 0) || !std::isfinite(fn_.eps))
            throw config_error("final_norm_options: eps must be >= 0 and finite (0 = the stack's norm_eps), found " + std::to_string(fn_.eps));
        if (!cfg_.tie_embeddings) detail::require_matrix(w_.lm_head, V, d, "lm_head");
        detail::require_nonzero_norm<Norm>(w_.final_norm, "final_norm");
        if (blocks_.empty()) throw config_error("model: a stack needs at least one layer");
        std::vector<layer_kind> kinds;
        for (std::size_t i = 0; i < blocks_.size(); ++i) {
            const std::string p = "layers." + std::to_string(i);
            std::visit([&](auto& blk) {
                if constexpr (requires { blk.validate(d, p); }) blk.validate(d, p);
            }, blocks_[i]);
            kinds.push_back(bound_kinds[blocks_[i].index()]);
        }
        Schedule::check(kinds);
        kinds_ = std::move(kinds);
    }

    /// Embedding → blocks; leaves the residual stream in the workspace's x [n_rows, d].
    template <backend B, class Probe>
    void run_layers(const B& be, cache_type& cache, const validated_batch& vb, std::span<const std::int32_t> tokens, Probe& probe,
                    std::span<const unsigned char> side) const {
        const std::int64_t n = vb.n_rows(), d = cfg_.d_model, V = cfg_.vocab_size;
        if (cache.n_layers() != n_layers())
            throw shape_error("model forward: cache holds " + std::to_string(cache.n_layers()) + " layers, the model has " +
                              std::to_string(n_layers()));
        if (static_cast<std::int64_t>(tokens.size()) != n)
            throw shape_error("model forward: " + std::to_string(tokens.size()) + " token ids for a batch of " +
                              std::to_string(n) + " rows");
        if (!side.empty() && static_cast<std::int64_t>(side.size()) != n)
            throw shape_error("model forward: side input has " + std::to_string(side.size()) + " entries for " + std::to_string(n) + " rows");
        const auto live = vb.live();
        for (std::int64_t r = 0; r < n; ++r) {
            if (!live[static_cast<std::size_t>(r)]) continue;
            const std::int32_t t = tokens[static_cast<std::size_t>(r)];
            if (t < 0 || t >= V)
                throw value_error("model forward: token id " + std::to_string(t) + " at row " + std::to_string(r) +
                                  " outside the vocabulary [0, " + std::to_string(V) + ")");
        }
        auto& ws = cache.workspace();
        auto x = ws.x.get(n, d);
        ops::embedding(be, w_.embedding, tokens, live, x);
        if constexpr (probing<Probe>) probe("embeddings", tensor_view<const float, 2>(x));
        cache.stats().clear();
        block_context<B> ctx{be, vb, head(), w_.final_norm.data(), cfg_.norm_eps, Norm::flavor, side, ws, &cache.stats(), 0};
        for (std::size_t l = 0; l < blocks_.size(); ++l) {
            ctx.layer = static_cast<std::int64_t>(l);
            auto& st = cache.layer_state(static_cast<std::int64_t>(l));
            visit_indexed(blocks_[l], [&](auto I, const auto& blk) {
                auto* s = std::get_if<decltype(I)::value>(&st);
                if (!s) throw shape_error("model forward: cache layer " + std::to_string(l) + " holds another block's state");
                if constexpr (requires { blk.forward(ctx, *s, x, probe); })
                    blk.forward(ctx, *s, x, probe);
                else
                    blk.forward(ctx, *s, x);
            });
            if constexpr (probing<Probe>) probe("layers." + std::to_string(l) + ".output", tensor_view<const float, 2>(x));
        }
    }

    stack_config cfg_;
    stack_weights w_;
    std::vector<block_variant> blocks_;
    std::vector<layer_kind> kinds_;
    final_norm_options fn_{};
};

}  // namespace hymix
