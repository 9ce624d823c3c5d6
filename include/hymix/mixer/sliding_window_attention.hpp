// Sliding-window causal attention as a layer kind of its own ('S', Hugging Face layer type "sliding_attention", as
// in Mistral / Qwen2 / Gemma configs with a `sliding_window` key): the attention mixer of mixer/attention.hpp with a
// window w > 0 — query i sees keys (i − w, i] — and a KV cache bounded to about 2·w tokens per slot (keys no later
// query can see are evicted, positions stay absolute). spec.md §2 (window mask). Training is attention's.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "hymix/mixer/attention.hpp"

namespace hymix {

class sliding_window_attention {
public:
    using config_type = attention_config;
    using weights_type = attention_weights;
    using state_type = kv_cache;
    using train_cache = attention::train_cache;
    static constexpr kind_info kind{layer_kind('S', "sliding_attention"), {"sliding_attention"}};

    /// Throws config_error unless config.sliding_window > 0 (and whatever attention's constructor throws).
    sliding_window_attention(attention_config c, attention_weights w) : a_(checked(c), std::move(w)) {}

    const attention_config& config() const noexcept { return a_.config(); }
    const attention_weights& weights() const noexcept { return a_.weights(); }
    attention_weights& weights_mut() noexcept { return a_.weights_mut(); }
    std::int64_t window() const noexcept { return a_.config().sliding_window; }
    kv_cache make_state(std::int64_t n_slots) const { return a_.make_state(n_slots); }
    /// The KV cache's storage (attention::set_kv_dtype).
    void set_kv_dtype(dtype d) { a_.set_kv_dtype(d); }

    template <host_backend B, batch_like Batch>
    void forward(const B& be, kv_cache& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        a_.forward(be, st, batch, x, y);
    }
    template <host_backend B, batch_like Batch>
    void step(const B& be, kv_cache& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        a_.step(be, st, batch, x, y);
    }
    template <host_backend B, batch_like Batch>
    void forward_sparse(const B& be, kv_cache& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                        std::span<const unsigned char> fire) const {
        a_.forward_sparse(be, st, batch, x, y, fire);
    }

    /// Training: attention's forward_train / backward (the window is part of the mask).
    template <host_backend B>
    void forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                       train_cache& tc) const {
        a_.forward_train(be, batch, x, y, tc);
    }
    template <host_backend B>
    void backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x,
                  tensor_view<const float, 2> dy, tensor_view<float, 2> dx, weights_type& g) const {
        a_.backward(be, batch, tc, x, dy, dx, g);
    }

private:
    static attention_config checked(attention_config c) {
        if (c.sliding_window <= 0)
            throw config_error("sliding_window_attention: sliding_window must be > 0, found " + std::to_string(c.sliding_window));
        return c;
    }
    attention a_;
};

static_assert(mixer<sliding_window_attention, cpu_backend>);
static_assert(mixer<sliding_window_attention, reference_backend>);

/// Mixer-level hooks used by generic tests: the fp64 reference is attention's, with the window in the mask.
inline attention_ref_cache make_ref_state(const sliding_window_attention& m, std::int64_t n_slots) {
    return attention_ref_cache(m.config(), n_slots);
}
inline void layer_ref(const sliding_window_attention& m, const seq_batch& b, tensor_view<const double, 2> x, attention_ref_cache& st,
                      tensor_view<double, 2> y) {
    attention_layer_ref(m.config(), m.weights(), b, x, st, y);
}

}  // namespace hymix
