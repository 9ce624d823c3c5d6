// Model caches: every layer's mixer state (recurrent + conv state, or KV cache) for a pool of sequence slots,
// plus the activation workspace the stack reuses between calls, so that decode allocates nothing per step once
// the workspace has grown to the largest batch seen (design.md, "data flow of one decode step").
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix {

namespace detail {

/// A grow-only fp32 buffer handing out contiguous [rows, cols] views.
class scratch {
public:
    /// View of `rows × cols` floats; reallocates (and so allocates) only when more than ever before is needed.
    tensor_view<float, 2> get(std::int64_t rows, std::int64_t cols) {
        const std::int64_t n = rows * cols;
        if (n > buf_.numel()) buf_ = tensor<float>({n + n / 4 + 16});
        return tensor_view<float, 2>(buf_.data(), {rows, cols});
    }
    std::int64_t capacity() const noexcept { return buf_.numel(); }

private:
    tensor<float> buf_;
};

}  // namespace detail

/// Per-call statistics of one gated block (layer `layer`): how many live rows it saw and how many fired, and an
/// optional per-row score (e.g. AMOR's normalised entropy; empty when the gate computes none).
struct block_stats {
    std::int64_t layer = -1;
    const char* gate = "";
    std::int64_t rows = 0;
    std::int64_t fired = 0;
    std::vector<float> score;  // [n_rows] or empty
    float threshold = 0.0f;    // the gate's threshold on the score (AMOR's τ), when it has one

    double fire_rate() const noexcept { return rows > 0 ? static_cast<double>(fired) / static_cast<double>(rows) : 0.0; }
};

/// Per-call activation buffers of a stack, kept in the cache (a stack is immutable and may be shared by
/// threads, each with its own cache).
struct stack_workspace {
    detail::scratch x;     // [n_rows, d]   residual stream
    detail::scratch h;     // [n_rows, d]   normed input of a sub-block
    detail::scratch y;     // [n_rows, d]   sub-block output
    detail::scratch gu;    // [n_rows, 2F]  SwiGLU gate/up
    detail::scratch last;  // [n_seq, d]    last-token rows for forward_last
    detail::scratch lastn; // [n_seq, d]    their final norm
    std::vector<unsigned char> fire;    // [n_rows] a gated block's fire mask
    std::vector<float> score;           // [n_rows] a gate's per-row score (AMOR: normalised entropy), or empty
    float score_threshold = 0.0f;       // the gate's threshold on that score (AMOR: τ)
    std::vector<std::int64_t> rows;     // [n_seq]  last-token row of each sequence (forward_last)

    /// Total floats held (to show the workspace does not grow between decode steps of one batch size).
    std::int64_t capacity() const noexcept {
        return x.capacity() + h.capacity() + y.capacity() + gu.capacity() + last.capacity() + lastn.capacity();
    }
};

/// One object holding every layer's state for `n_slots` sequence slots. `StateVariant` is a std::variant of the
/// state types of the mixers a stack may hold; layer l's entry holds its mixer's state type.
template <class StateVariant>
class model_cache {
public:
    using state_variant = StateVariant;

    model_cache() = default;
    model_cache(std::int64_t n_slots, std::vector<StateVariant> states) : n_slots_(n_slots), states_(std::move(states)) {}

    std::int64_t n_slots() const noexcept { return n_slots_; }
    std::int64_t n_layers() const noexcept { return static_cast<std::int64_t>(states_.size()); }

    /// A fresh sequence in `slot` (zero recurrent/conv state, empty KV cache) in every layer.
    void reset_slot(std::int64_t slot) {
        check_slot(slot, "reset_slot");
        for (auto& s : states_) std::visit([&](auto& st) { st.reset_slot(slot); }, s);
    }
    /// Prompt caching: slot `to` becomes a copy of slot `from` in every layer.
    void copy_slot(std::int64_t from, std::int64_t to) {
        check_slot(from, "copy_slot (from)");
        check_slot(to, "copy_slot (to)");
        if (from == to) return;
        for (auto& s : states_) std::visit([&](auto& st) { st.copy_slot(from, to); }, s);
    }
    /// Resets every slot.
    void reset() {
        for (std::int64_t i = 0; i < n_slots_; ++i) reset_slot(i);
    }

    StateVariant& layer_state(std::int64_t l) { return states_.at(static_cast<std::size_t>(l)); }
    const StateVariant& layer_state(std::int64_t l) const { return states_.at(static_cast<std::size_t>(l)); }
    stack_workspace& workspace() noexcept { return ws_; }
    /// Statistics of the gated blocks of the last forward call (one entry per gated block, in layer order).
    const std::vector<block_stats>& stats() const noexcept { return stats_; }
    std::vector<block_stats>& stats() noexcept { return stats_; }

private:
    void check_slot(std::int64_t slot, const char* what) const {
        if (slot < 0 || slot >= n_slots_)
            throw shape_error(std::string("model cache ") + what + ": slot " + std::to_string(slot) + " outside [0, " +
                              std::to_string(n_slots_) + ")");
    }

    std::int64_t n_slots_ = 0;
    std::vector<StateVariant> states_;
    stack_workspace ws_;
    std::vector<block_stats> stats_;
};

}  // namespace hymix
