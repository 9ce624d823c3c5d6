// Run-time facade over the compiled stacks: `basic_auto_model<B>::load(dir)` reads config.json, picks the stack type
// for the checkpoint family (HF Mamba2ForCausalLM, Qwen3_5ForCausalLM text models; spec.md §3.7, §4.7) and hides it
// behind one API (pimpl: a small virtual interface over `model<...>` instances and their caches), running on a
// backend of type B: `auto_model` (the CPU backend) or `reference_auto_model` (the fp64 reference backend). Oryx
// models (models/oryx_lm.hpp) read each token's read-out from a mode schedule (set_mode_schedule); the facade keeps
// every slot's position so that schedules see absolute positions across calls.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/op.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/models/amor.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/models/check_weights.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"
#include "hymix/models/oryx_lm.hpp"
#include "hymix/schedule/mode_schedule.hpp"

namespace hymix {

/// What a loaded model is.
struct model_info {
    std::string architecture, model_type;
    std::int64_t n_params = 0, n_layers = 0, d_model = 0, vocab_size = 0;
    bool tie_embeddings = false;           // the LM head is the embedding matrix (else a separate lm_head [V, d])
    std::vector<std::string> layer_kinds;  // "mamba2" | "gated_deltanet" | "attention" per layer
    std::string schedule;                  // compact, e.g. "GGAGGA"
    bool per_token_modes = false;          // Oryx: every token's read-out comes from a mode schedule
};

namespace detail {

struct any_cache {
    virtual ~any_cache() = default;
    const void* owner = nullptr;     // the stack that made it
    std::vector<std::int64_t> pos;  // tokens seen per slot (the next token's absolute position)
};

template <class B>
struct any_stack {
    virtual ~any_stack() = default;
    virtual std::unique_ptr<any_cache> make_cache(std::int64_t n_slots) const = 0;
    virtual void reset_slot(any_cache&, std::int64_t) const = 0;
    virtual void copy_slot(any_cache&, std::int64_t, std::int64_t) const = 0;
    virtual void forward(const B&, any_cache&, const seq_batch&, std::span<const std::int32_t>, tensor_view<float, 2>,
                         bool last_only, std::span<const unsigned char> modes) const = 0;
    virtual const std::vector<block_stats>& stats(any_cache&) const = 0;
    virtual void store_weights_as(dtype) = 0;
    virtual std::int64_t set_kv_dtype(dtype) = 0;
    virtual dtype weight_dtype() const = 0;
    virtual std::size_t weight_bytes() const = 0;
    virtual void set_entropy_routers(const std::vector<std::shared_ptr<const entropy_router>>&, const std::string& origin,
                                     std::int64_t vocab_size) = 0;
};

template <class B, class Stack>
struct stack_holder final : any_stack<B> {
    struct cache_holder final : any_cache {
        typename Stack::cache_type c;
    };
    Stack m;
    explicit stack_holder(Stack s) : m(std::move(s)) {}

    cache_holder& get(any_cache& c) const {
        if (c.owner != this) throw value_error("auto_model: the cache was made by another model (or moved from)");
        return static_cast<cache_holder&>(c);
    }
    std::unique_ptr<any_cache> make_cache(std::int64_t n) const override {
        auto h = std::make_unique<cache_holder>();
        h->c = m.make_cache(n);
        h->owner = this;
        h->pos.assign(static_cast<std::size_t>(n), 0);
        return h;
    }
    void reset_slot(any_cache& c, std::int64_t s) const override {
        get(c).c.reset_slot(s);
        c.pos[static_cast<std::size_t>(s)] = 0;
    }
    void copy_slot(any_cache& c, std::int64_t f, std::int64_t t) const override {
        get(c).c.copy_slot(f, t);
        c.pos[static_cast<std::size_t>(t)] = c.pos[static_cast<std::size_t>(f)];
    }
    const std::vector<block_stats>& stats(any_cache& c) const override { return get(c).c.stats(); }
    void store_weights_as(dtype d) override { m.store_weights_as(d); }
    std::int64_t set_kv_dtype(dtype d) override { return m.set_kv_dtype(d); }
    dtype weight_dtype() const override { return m.weight_dtype(); }
    std::size_t weight_bytes() const override { return m.weight_bytes(); }
    void set_entropy_routers(const std::vector<std::shared_ptr<const entropy_router>>& r, const std::string& origin,
                             std::int64_t vocab_size) override {
        if (r.empty()) return models::for_each_entropy_gate(m, [](entropy_ema& g) { g.set_router(nullptr); });  // exact gates again
        models::attach_entropy_routers(m, r, origin, vocab_size);
    }
    void forward(const B& be, any_cache& c, const seq_batch& b, std::span<const std::int32_t> tok,
                 tensor_view<float, 2> logits, bool last_only, std::span<const unsigned char> modes) const override {
        if (last_only)
            m.forward_last(be, get(c).c, b, tok, logits, modes);
        else
            m.forward(be, get(c).c, b, tok, logits, {}, modes);
    }
};

template <class B, class Stack>
std::unique_ptr<any_stack<B>> hold(Stack s, model_info& info) {
    info.n_layers = s.n_layers();
    info.d_model = s.config().d_model;
    info.vocab_size = s.config().vocab_size;
    info.tie_embeddings = s.config().tie_embeddings;
    for (auto k : s.layer_kinds()) info.layer_kinds.emplace_back(Stack::kind_name(k));
    info.schedule = schedule_string(s.layer_kinds());
    return std::make_unique<stack_holder<B, Stack>>(std::move(s));
}

}  // namespace detail

/// What loading does with weights holding NaN or ±Inf: refuse them (nonfinite_error naming the tensor; the default),
/// or allow them (a damaged checkpoint examined on purpose: its results may be non-finite).
enum class nonfinite_weights { refuse, allow };

/// A checkpoint loaded into the compiled stack for its family, with a backend of type B of its own.
template <backend B>
class basic_auto_model {
public:
    /// Opaque per-model cache of every layer's state for n_slots sequences (and the activation workspace).
    class cache {
    public:
        cache() = default;
        cache(cache&&) noexcept = default;
        cache& operator=(cache&&) noexcept = default;

    private:
        friend class basic_auto_model;
        explicit cache(std::unique_ptr<detail::any_cache> p) : p_(std::move(p)) {}
        std::unique_ptr<detail::any_cache> p_;
    };

    using backend_type = B;

    /// Loads `dir` (config.json + model.safetensors or model.safetensors.index.json; f32/bf16/f16 weights, kept in
    /// fp32). threads 0 = every core (the reference backend always runs on one). Throws io_error (missing files), format_error (malformed files, missing or
    /// extra tensors), shape_error (a tensor's shape, named with expected and found), config_error (unsupported
    /// model_type or setting), and nonfinite_error naming the first tensor holding NaN / ±Inf (scanned before any is
    /// converted) unless `nonfinite` is nonfinite_weights::allow.
    static basic_auto_model load(const std::filesystem::path& dir, int threads = 0, nonfinite_weights nonfinite = nonfinite_weights::refuse) {
        models::checkpoint_reader rd(dir);
        if (nonfinite == nonfinite_weights::refuse) models::require_finite_weights(rd.weights());
        const auto& j = rd.config();
        basic_auto_model am;
        am.be_ = std::make_unique<B>(threads);
        am.info_.model_type = io::require<std::string>(j, "model_type", rd.config_path());
        const auto& mt = am.info_.model_type;
        if (mt == "mamba2") {
            am.info_.architecture = models::config_architecture(j, "Mamba2ForCausalLM");
            am.impl_ = detail::hold<B>(models::load_hf_mamba2<models::hf_mamba2_stack>(rd), am.info_);
        } else if (mt == "qwen3_5_text" || mt == "qwen3_5") {
            am.info_.architecture = models::config_architecture(j, "Qwen3_5ForCausalLM");
            const auto c = models::read_hf_qwen3_5_config(j, rd.config_path());
            bool all_gdn = true;
            for (auto k : c.kinds) all_gdn = all_gdn && k == layer_kind::gated_deltanet;
            if (all_gdn)
                am.impl_ = detail::hold<B>(models::load_hf_qwen3_5<models::qwen3_5_gdn_stack>(rd), am.info_);
            else
                am.impl_ = detail::hold<B>(models::load_hf_qwen3_5<models::qwen3_5_hybrid_stack>(rd), am.info_);
        } else if (mt == "oryx") {
            am.info_.architecture = models::config_architecture(j, "OryxForCausalLM");
            am.impl_ = detail::hold<B>(models::load_oryx_lm(rd), am.info_);
            am.info_.per_token_modes = true;
        } else {
            throw config_error(rd.config_path() + ": unsupported model_type '" + mt +
                               "' (supported: mamba2, qwen3_5_text, qwen3_5, oryx)");
        }
        am.info_.n_params = rd.n_params();
        return am;
    }

    /// A post-hoc AMOR model (spec.md §5): the backbone checkpoint `dir` (HF Mamba-2, or a Qwen3.5 stack of Gated
    /// DeltaNet layers) plus the AMOR file `amor` (models/amor.hpp). Throws as load, plus config_error when the AMOR
    /// file's backbone kind or sizes do not match the checkpoint; non-finite values in either file as load.
    static basic_auto_model load(const std::filesystem::path& dir, const std::filesystem::path& amor, int threads = 0,
                                 nonfinite_weights nonfinite = nonfinite_weights::refuse) {
        models::checkpoint_reader rd(dir);
        const auto& j = rd.config();
        const auto ac = models::read_amor_config(amor);
        if (nonfinite == nonfinite_weights::refuse) {
            models::require_finite_weights(rd.weights());
            models::require_finite_weights(safetensors::file(amor));
        }
        basic_auto_model am;
        am.be_ = std::make_unique<B>(threads);
        am.info_.model_type = io::require<std::string>(j, "model_type", rd.config_path());
        const auto& mt = am.info_.model_type;
        models::require_amor_backbone(ac, mt, amor.string(), rd.config_path());
        if (mt == "mamba2") {
            am.info_.architecture = models::config_architecture(j, "Mamba2ForCausalLM") + "+AMOR";
            am.impl_ = detail::hold<B>(models::load_amor<models::amor_mamba2_stack<>>(models::load_hf_mamba2<models::hf_mamba2_stack>(rd), amor),
                                       am.info_);
        } else {
            am.info_.architecture = models::config_architecture(j, "Qwen3_5ForCausalLM") + "+AMOR";
            am.impl_ = detail::hold<B>(models::load_amor<models::amor_gdn_stack<>>(models::load_hf_qwen3_5<models::qwen3_5_gdn_stack>(rd), amor),
                                       am.info_);
        }
        am.info_.n_params = rd.n_params();
        safetensors::file f(amor);
        for (const auto& t : f.tensors()) am.info_.n_params += t.numel();
        return am;
    }

    const model_info& info() const noexcept { return info_; }

    /// Keeps every projection weight (mixers, MLPs, embedding, LM head) as `d` for inference: bf16 or f16 halve the
    /// bytes a decode step streams; each projection then gives the bits of the f32 model on the rounded weights
    /// (model::store_weights_as). f32 widens back exactly. Weights load as fp32 first (a bf16 checkpoint's values are
    /// kept exactly by bf16). Throws value_error naming the tensor where a value overflows f16 (nothing is converted
    /// then), config_error for another dtype.
    void store_weights_as(dtype d) { impl_->store_weights_as(d); }
    /// Stores the KV cache of the attention-like layers in `d` (f32, bf16 or f16) in the caches made from now on
    /// (model::set_kv_dtype): half the bytes a long-context decode step reads with bf16 / f16. Returns how many layers
    /// it applies to. Throws config_error for another dtype.
    std::int64_t set_kv_dtype(dtype d) { return impl_->set_kv_dtype(d); }
    /// The projection weights' storage type (f32 unless some are kept as bf16, f16 or i8; model::weight_dtype).
    dtype weight_dtype() const { return impl_->weight_dtype(); }
    /// Bytes the weights occupy in memory (model::weight_bytes): every parameter as stored (16-bit projections 2 bytes
    /// per value, i8 ones 1 byte plus a 4-byte scale per row) plus the MLPs' fused gate|up copy.
    std::size_t weight_bytes() const { return impl_->weight_bytes(); }
    /// AMOR models: the entropy gates fire on the fitted routers of `router_file` (models/amor_router.hpp, spec.md §5.6)
    /// instead of the LM head's entropy, with the same τ; an empty path restores the exact gates. Throws as
    /// read_entropy_routers, and config_error as attach_entropy_routers (gate count, d_model, vocabulary, always-on
    /// gates).
    void use_entropy_routers(const std::filesystem::path& router_file) {
        if (router_file.empty()) return impl_->set_entropy_routers({}, "", 0);
        const auto f = models::read_entropy_routers(router_file);
        impl_->set_entropy_routers(f.routers, router_file.string(), f.vocab_size());
    }
    /// Statistics of the gated blocks of the last forward call on cache `c` (one entry per gated block: layer, gate,
    /// rows, fired rows and per-row scores such as AMOR's normalised entropies). Empty for ungated models.
    const std::vector<block_stats>& stats(cache& c) const { return impl_->stats(*checked(c)); }
    const B& backend() const noexcept { return *be_; }
    /// Times every op the model runs into `p` (backend/op_profile.hpp: wall time per op and argument shapes) until
    /// set back to nullptr; `p` must outlive that. CPU models only (a backend with an op profile).
    void set_op_profile(op_profile* p) noexcept
        requires profiling_backend<B>
    {
        be_->set_op_profile(p);
    }

    /// A cache with n_slots fresh sequence slots. Throws shape_error when n_slots <= 0.
    cache make_cache(std::int64_t n_slots) const { return cache(impl_->make_cache(n_slots)); }
    /// A fresh sequence in `slot`. Throws shape_error for a slot out of range.
    void reset_slot(cache& c, std::int64_t slot) const { impl_->reset_slot(*checked(c), slot); }
    /// Prompt caching: slot `to` becomes a copy of slot `from`. Throws shape_error for slots out of range.
    void copy_slot(cache& c, std::int64_t from, std::int64_t to) const { impl_->copy_slot(*checked(c), from, to); }

    /// The read-out schedule of a model with per-token modes (Oryx, spec.md §6.6): every later call reads each token's
    /// mode from it at the token's absolute position in its slot (counted since the slot's last reset), in the call's
    /// phase (as stated by the caller; else decode when every sequence of the call holds one token, prefill otherwise),
    /// with the sequence's index in the call as block_random's sequence id (so block_random draws depend on how
    /// sequences are batched; use it for experiments, periodic or lists for reproducible serving). Without one, the model's default_mode. Throws config_error for a model
    /// without per-token modes.
    void set_mode_schedule(any_mode_schedule s) {
        if (!info_.per_token_modes)
            throw config_error("auto_model: a " + info_.architecture + " model has no per-token read-out modes (mode schedules are for Oryx models)");
        std::visit([](const auto& x) {
            if constexpr (requires { x.validate(); }) x.validate();
        }, s);
        schedule_ = std::move(s);
    }
    /// The schedule set by set_mode_schedule, if any.
    const std::optional<any_mode_schedule>& mode_schedule() const noexcept { return schedule_; }

    /// tokens: one id per row of the batch (n_rows); logits [n_rows, V] fp32 for every row (zero for rows outside
    /// every sequence). Throws shape_error (sizes, slots), value_error (token id outside [0, V), foreign cache).
    void forward(cache& c, const seq_batch& b, std::span<const std::int32_t> tokens, tensor_view<float, 2> logits) const {
        run(c, b, tokens, logits, false, std::nullopt);
    }
    /// As forward, with the call's phase stated (a prompt chunk of one token is still a prefill): the phase a mode
    /// schedule sees. Without it the phase is read from the call's shape (one token per sequence: decode).
    void forward(cache& c, const seq_batch& b, std::span<const std::int32_t> tokens, tensor_view<float, 2> logits, call_phase phase) const {
        run(c, b, tokens, logits, false, phase);
    }
    /// logits [n_seq, V] of each sequence's last token only (the LM head runs on n_seq rows). Errors as forward.
    void forward_last(cache& c, const seq_batch& b, std::span<const std::int32_t> tokens, tensor_view<float, 2> logits) const {
        run(c, b, tokens, logits, true, std::nullopt);
    }
    /// As forward_last, with the call's phase stated.
    void forward_last(cache& c, const seq_batch& b, std::span<const std::int32_t> tokens, tensor_view<float, 2> logits,
                      call_phase phase) const {
        run(c, b, tokens, logits, true, phase);
    }

private:
    basic_auto_model() = default;
    void run(cache& c, const seq_batch& b, std::span<const std::int32_t> tokens, tensor_view<float, 2> logits, bool last_only,
             std::optional<call_phase> phase) const {
        auto& ac = *checked(c);
        std::vector<std::int64_t> past;
        std::vector<unsigned char> modes;
        if (schedule_) {
            b.validate(static_cast<std::int64_t>(ac.pos.size()));
            past.assign(static_cast<std::size_t>(b.n_seq()), 0);
            for (std::int64_t i = 0; i < b.n_seq(); ++i)
                if (b.slots[static_cast<std::size_t>(i)] >= 0) past[static_cast<std::size_t>(i)] = ac.pos[static_cast<std::size_t>(b.slots[static_cast<std::size_t>(i)])];
            const dynamic_mode_schedule ds{*schedule_};
            modes = phase ? modes_for(ds, b, *phase, std::span<const std::int64_t>(past)) : modes_for(ds, b, std::span<const std::int64_t>(past));
        }
        impl_->forward(*be_, ac, b, tokens, logits, last_only, modes);
        for (std::int64_t i = 0; i < b.n_seq(); ++i) {
            const std::int64_t slot = b.slots[static_cast<std::size_t>(i)];
            if (slot >= 0 && slot < static_cast<std::int64_t>(ac.pos.size())) ac.pos[static_cast<std::size_t>(slot)] += b.lengths[static_cast<std::size_t>(i)];
        }
    }
    static detail::any_cache* checked(cache& c) {
        if (!c.p_) throw value_error("auto_model: empty (default-constructed or moved-from) cache");
        return c.p_.get();
    }

    model_info info_;
    std::optional<any_mode_schedule> schedule_;
    std::unique_ptr<B> be_;
    std::unique_ptr<detail::any_stack<B>> impl_;
};

/// A checkpoint on the CPU backend (oneTBB threads, xsimd kernels).
using auto_model = basic_auto_model<cpu_backend>;
/// A checkpoint on the fp64 reference backend: the oracle other backends are checked against (slow).
using reference_auto_model = basic_auto_model<reference_backend>;

}  // namespace hymix
