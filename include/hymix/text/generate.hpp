// Text generation with a causal LM: the prompt is prefilled in bounded chunks (micro-batches of `ubatch` tokens,
// as llama.cpp's n_ubatch), so memory is weights + state + KV cache + one chunk's activations whatever the prompt
// length; then tokens are sampled one at a time until a token limit, a stop string, an end-of-sequence token or
// the context limit. Bytes are handed to a callback as they are produced (streaming).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "hymix/text/sampler.hpp"
#include "hymix/text/tokenizer.hpp"

namespace hymix {

/// A causal LM that can return the logits of each sequence's last token only (hymix::auto_model, compiled stacks
/// through a thin adapter).
template <class M>
concept causal_lm_last = requires(const M& m, typename M::cache& c, const seq_batch& b, std::span<const std::int32_t> t,
                                  tensor_view<float, 2> logits, std::int64_t n) {
    { m.make_cache(n) } -> std::same_as<typename M::cache>;
    m.forward_last(c, b, t, logits);
    { m.info().vocab_size } -> std::convertible_to<std::int64_t>;
};

/// Feeds `ids` to slot 0 of `cache` (a one-slot cache, continuing from its state) in chunks of at most `ubatch`
/// tokens and leaves the last token's logits in `logits` [1, V]. `on_chunk(done, total)` is called after each
/// chunk (may be empty). Throws config_error for ubatch < 1 or empty ids.
template <causal_lm_last M>
void prefill(const M& model, typename M::cache& cache, std::span<const std::int32_t> ids, std::int64_t ubatch,
             tensor_view<float, 2> logits, const std::function<void(std::int64_t, std::int64_t)>& on_chunk = {}) {
    if (ubatch < 1) throw config_error("prefill: ubatch must be >= 1, found " + std::to_string(ubatch));
    const auto T = static_cast<std::int64_t>(ids.size());
    if (T == 0) throw config_error("prefill: no tokens");
    for (std::int64_t t0 = 0; t0 < T; t0 += ubatch) {
        const std::int64_t n = std::min(ubatch, T - t0);
        const auto b = seq_batch::dense(1, n);
        const auto chunk = ids.subspan(static_cast<std::size_t>(t0), static_cast<std::size_t>(n));
        if constexpr (requires { model.forward_last(cache, b, chunk, logits, call_phase::prefill); })
            model.forward_last(cache, b, chunk, logits, call_phase::prefill);  // a one-token chunk is still prompt
        else
            model.forward_last(cache, b, chunk, logits);
        if (on_chunk) on_chunk(t0 + n, T);
    }
}

/// Watches generated text for stop strings. feed() appends bytes and says whether a stop string now ends inside
/// the text seen so far (only the tail that can still complete a match is kept).
class stop_matcher {
public:
    /// Throws config_error for an empty stop string.
    explicit stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
        for (const auto& s : stops_) {
            if (s.empty()) throw config_error("stop strings must not be empty");
            longest_ = std::max(longest_, s.size());
        }
    }
    bool empty() const noexcept { return stops_.empty(); }

    /// Appends `bytes`; returns the stop string that occurs in the text (nullptr when none does yet).
    const std::string* feed(std::string_view bytes) {
        if (stops_.empty()) return nullptr;
        tail_.append(bytes);
        for (const auto& s : stops_)
            if (tail_.find(s) != std::string::npos) return &s;
        if (tail_.size() > longest_) tail_.erase(0, tail_.size() - (longest_ - 1));  // keep what may still match
        return nullptr;
    }

private:
    std::vector<std::string> stops_;
    std::size_t longest_ = 0;
    std::string tail_;
};

enum class stop_reason { token_limit, stop_string, end_of_sequence, context_limit };

inline const char* stop_reason_name(stop_reason r) noexcept {
    switch (r) {
        case stop_reason::token_limit: return "token limit";
        case stop_reason::stop_string: return "stop string";
        case stop_reason::end_of_sequence: return "end-of-sequence token";
        case stop_reason::context_limit: return "context limit";
    }
    return "?";
}

struct generation_options {
    std::int64_t max_new = 128;        ///< tokens to generate; -1 = until a stop string, EOS or the context limit
    std::int64_t ubatch = 512;         ///< prefill chunk (tokens per forward call)
    std::int64_t context_limit = 0;    ///< prompt + generated tokens at most this many; 0 = no limit
    std::vector<std::string> stop;     ///< stop after the generated text contains one of these (it is emitted)
    std::vector<std::int32_t> eos;     ///< end-of-sequence token ids (stop; not emitted)
    sampling_params sampling;
};

struct generation_result {
    std::int64_t prompt_tokens = 0, generated = 0;
    double prefill_seconds = 0, decode_seconds = 0;
    stop_reason reason = stop_reason::token_limit;
};

/// Prefills `prompt` in chunks of options.ubatch, then samples and streams tokens through `emit` (each token's
/// bytes, as decoded by `tok`). Throws config_error for bad options (empty prompt, max_new < -1, ubatch < 1,
/// context_limit < 0), nonfinite_error when the model's logits are NaN or +Inf, and whatever the model throws.
template <causal_lm_last M, tokenizer Tok>
generation_result generate(const M& model, const Tok& tok, std::span<const std::int32_t> prompt, const generation_options& o,
                           const std::function<void(std::string_view)>& emit,
                           const std::function<void(std::int64_t, std::int64_t)>& on_prefill_chunk = {}) {
    using clock = std::chrono::steady_clock;
    if (prompt.empty()) throw config_error("generate: the prompt is empty");
    if (o.max_new < -1) throw config_error("generate: max_new must be >= -1, found " + std::to_string(o.max_new));
    if (o.context_limit < 0) throw config_error("generate: context_limit must be >= 0, found " + std::to_string(o.context_limit));
    const std::int64_t V = model.info().vocab_size;
    sampler smp(o.sampling);
    stop_matcher stops(o.stop);
    auto cache = model.make_cache(1);
    tensor<float> logits({1, V});

    generation_result r;
    r.prompt_tokens = static_cast<std::int64_t>(prompt.size());
    const auto t0 = clock::now();
    prefill(model, cache, prompt, o.ubatch, logits.view<2>(), on_prefill_chunk);
    r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

    const auto t1 = clock::now();
    std::vector<std::int32_t> history(prompt.begin(), prompt.end());  // for the repetition penalty
    auto limit_reached = [&] {
        if (o.max_new >= 0 && r.generated >= o.max_new) return r.reason = stop_reason::token_limit, true;
        if (o.context_limit > 0 && r.prompt_tokens + r.generated >= o.context_limit) return r.reason = stop_reason::context_limit, true;
        return false;
    };
    while (!limit_reached()) {
        const std::int32_t next = smp.sample({logits.data(), static_cast<std::size_t>(V)}, history);
        if (std::find(o.eos.begin(), o.eos.end(), next) != o.eos.end()) {
            r.reason = stop_reason::end_of_sequence;
            break;
        }
        ++r.generated;
        history.push_back(next);
        const std::string bytes = tok.decode(next);
        emit(bytes);
        if (stops.feed(bytes)) {
            r.reason = stop_reason::stop_string;
            break;
        }
        if (limit_reached()) break;  // no forward call for a token that will never be sampled from
        const std::int32_t one[1] = {next};
        if constexpr (requires { model.forward_last(cache, seq_batch::dense(1, 1), one, logits.view<2>(), call_phase::decode); })
            model.forward_last(cache, seq_batch::dense(1, 1), one, logits.view<2>(), call_phase::decode);
        else
            model.forward_last(cache, seq_batch::dense(1, 1), one, logits.view<2>());
    }
    r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return r;
}

}  // namespace hymix
