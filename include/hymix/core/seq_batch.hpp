// Which rows of a token matrix belong to which sequence, and which state slot each sequence uses.
// One description covers dense [B, T] batches, right-padded rows with per-row lengths, packed variable-length
// batches (FlashAttention's `cu_seqlens`) and decode steps (one token per sequence), see spec.md §0.
#pragma once

#include <algorithm>
#include <concepts>
#include <optional>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"

namespace hymix {

/// Token rows [starts[i], starts[i] + lengths[i]) of the activation matrix x [n_rows, ·] form sequence i,
/// whose recurrent state / KV cache lives in state slot slots[i] (-1: an invalid entry — its outputs are zero
/// and no state is touched). Rows that belong to no sequence (padding) produce zero outputs.
struct seq_batch {
    std::vector<std::int64_t> starts;   // [n_seq]
    std::vector<std::int64_t> lengths;  // [n_seq]
    std::vector<std::int64_t> slots;    // [n_seq]
    std::int64_t n_rows = 0;            // rows of the token matrix

    std::int64_t n_seq() const noexcept { return static_cast<std::int64_t>(starts.size()); }
    std::int64_t max_length() const noexcept {
        return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
    }
    std::int64_t total_tokens() const noexcept {
        std::int64_t s = 0;
        for (auto l : lengths) s += l;
        return s;
    }
    /// True when every sequence contributes exactly one token (a decode step).
    bool is_decode() const noexcept {
        return std::all_of(lengths.begin(), lengths.end(), [](auto l) { return l == 1; });
    }

    /// B sequences of T tokens each, x viewed as [B*T, ·]; sequence b uses slot b.
    static seq_batch dense(std::int64_t B, std::int64_t T) {
        seq_batch s;
        for (std::int64_t b = 0; b < B; ++b) s.add(b * T, T, b);
        s.n_rows = B * T;
        return s;
    }
    /// B rows right-padded to T tokens, row b holding lengths[b] real tokens; slot b.
    static seq_batch padded(std::int64_t T, std::span<const std::int64_t> lengths) {
        seq_batch s;
        for (std::size_t b = 0; b < lengths.size(); ++b) s.add(static_cast<std::int64_t>(b) * T, lengths[b], static_cast<std::int64_t>(b));
        s.n_rows = T * static_cast<std::int64_t>(lengths.size());
        s.validate();
        return s;
    }
    /// Packed sequences: cu_seqlens has n_seq + 1 non-decreasing entries starting at 0. Slots default to 0..n_seq-1.
    static seq_batch packed(std::span<const std::int64_t> cu_seqlens, std::span<const std::int64_t> slots = {}) {
        if (cu_seqlens.empty() || cu_seqlens[0] != 0)
            throw shape_error("cu_seqlens must start with 0 and hold n_seq + 1 entries");
        seq_batch s;
        const std::size_t n = cu_seqlens.size() - 1;
        if (!slots.empty() && slots.size() != n)
            throw shape_error("packed batch: " + std::to_string(n) + " sequences but " + std::to_string(slots.size()) + " slots");
        for (std::size_t i = 0; i < n; ++i) {
            if (cu_seqlens[i + 1] < cu_seqlens[i]) throw shape_error("cu_seqlens must be non-decreasing");
            s.add(cu_seqlens[i], cu_seqlens[i + 1] - cu_seqlens[i], slots.empty() ? static_cast<std::int64_t>(i) : slots[i]);
        }
        s.n_rows = cu_seqlens[n];
        return s;
    }
    /// Decode step: one token per listed slot, row i for slots[i].
    static seq_batch decode(std::span<const std::int64_t> slots) {
        seq_batch s;
        for (std::size_t i = 0; i < slots.size(); ++i) s.add(static_cast<std::int64_t>(i), 1, slots[i]);
        s.n_rows = static_cast<std::int64_t>(slots.size());
        return s;
    }

    void add(std::int64_t start, std::int64_t length, std::int64_t slot) {
        starts.push_back(start);
        lengths.push_back(length);
        slots.push_back(slot);
    }

    /// Checks ranges lie inside [0, n_rows), do not overlap, and valid slots are < n_slots (when given) and distinct.
    void validate(std::int64_t n_slots = -1) const {
        if (starts.size() != lengths.size() || starts.size() != slots.size())
            throw shape_error("seq_batch: starts, lengths and slots differ in size");
        const std::size_t n = starts.size();
        for (std::size_t i = 0; i < n; ++i) {
            if (lengths[i] < 0 || starts[i] < 0 || starts[i] + lengths[i] > n_rows)
                throw shape_error("seq_batch: sequence " + std::to_string(i) + " rows [" + std::to_string(starts[i]) + ", " +
                                  std::to_string(starts[i] + lengths[i]) + ") outside [0, " + std::to_string(n_rows) + ")");
            if (slots[i] < -1)
                throw shape_error("seq_batch: sequence " + std::to_string(i) + " uses state slot " + std::to_string(slots[i]) +
                                  " (slots are >= 0, or -1 for an entry to skip)");
            if (n_slots >= 0 && slots[i] >= n_slots)
                throw shape_error("seq_batch: sequence " + std::to_string(i) + " uses state slot " + std::to_string(slots[i]) +
                                  " but the state has " + std::to_string(n_slots) + " slots");
        }
        if (n <= 64) {  // decode steps and small batches: pairwise checks, no allocation on the hot path
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t j = i + 1; j < n; ++j) {
                    if (lengths[i] > 0 && lengths[j] > 0 && starts[i] < starts[j] + lengths[j] &&
                        starts[j] < starts[i] + lengths[i])
                        throw shape_error("seq_batch: sequences overlap in the token matrix");
                    if (slots[i] >= 0 && slots[i] == slots[j])
                        throw shape_error("seq_batch: two sequences of one call use the same state slot");
                }
            return;
        }
        std::vector<std::pair<std::int64_t, std::int64_t>> r;
        for (std::size_t i = 0; i < n; ++i)
            if (lengths[i] > 0) r.emplace_back(starts[i], starts[i] + lengths[i]);
        std::sort(r.begin(), r.end());
        for (std::size_t i = 1; i < r.size(); ++i)
            if (r[i].first < r[i - 1].second) throw shape_error("seq_batch: sequences overlap in the token matrix");
        std::vector<std::int64_t> used;
        for (auto sl : slots)
            if (sl >= 0) used.push_back(sl);
        std::sort(used.begin(), used.end());
        if (std::adjacent_find(used.begin(), used.end()) != used.end())
            throw shape_error("seq_batch: two sequences of one call use the same state slot");
    }
};

/// A seq_batch checked once against a state's slot count, with the per-row bookkeeping every layer needs computed
/// once: which rows are live (belong to a sequence with a valid slot) and whether the call is a decode step. Stacks
/// build one per forward and pass it to every block and mixer, so nothing below re-validates or re-derives it.
/// Holds a reference: the seq_batch must outlive it.
class validated_batch {
public:
    /// Validates `b` (seq_batch::validate(n_slots); shape_error on failure) and derives the live-row mask.
    validated_batch(const seq_batch& b, std::int64_t n_slots) : b_(&b), n_slots_(n_slots) {
        b.validate(n_slots);
        live_.assign(static_cast<std::size_t>(std::max<std::int64_t>(b.n_rows, 0)), 0);
        for (std::int64_t i = 0; i < b.n_seq(); ++i) {
            const auto s = static_cast<std::size_t>(i);
            if (b.slots[s] < 0) continue;
            std::fill_n(live_.begin() + b.starts[s], b.lengths[s], static_cast<unsigned char>(1));
        }
        decode_ = b.n_seq() > 0 && b.is_decode();
    }

    const seq_batch& batch() const noexcept { return *b_; }
    operator const seq_batch&() const noexcept { return *b_; }  // NOLINT: a validated batch is a batch
    std::int64_t n_rows() const noexcept { return b_->n_rows; }
    std::int64_t n_seq() const noexcept { return b_->n_seq(); }
    /// [n_rows] 1 where the row belongs to a sequence with a valid slot (padding and slot −1 rows are 0).
    std::span<const unsigned char> live() const noexcept { return live_; }
    /// Every sequence holds exactly one token (and there is at least one): mixers take their decode path.
    bool is_decode() const noexcept { return decode_; }
    /// The slot count it was validated against.
    std::int64_t n_slots() const noexcept { return n_slots_; }

private:
    const seq_batch* b_;
    std::int64_t n_slots_ = 0;
    std::vector<unsigned char> live_;
    bool decode_ = false;
};

/// The validated form of `vb` for a state of n_slots slots: `vb` itself (shape_error when it was validated against
/// another slot count). Mixers call as_validated on whatever batch they get, so a stack's validated batch is used as
/// it is and a plain seq_batch is validated once, into `store`.
inline const validated_batch& as_validated(const validated_batch& vb, std::int64_t n_slots, std::optional<validated_batch>&) {
    if (vb.n_slots() != n_slots)
        throw shape_error("validated_batch: validated for " + std::to_string(vb.n_slots()) + " state slots, used with a state of " +
                          std::to_string(n_slots));
    return vb;
}
inline const validated_batch& as_validated(const seq_batch& b, std::int64_t n_slots, std::optional<validated_batch>& store) {
    return store.emplace(b, n_slots);
}

/// A batch argument of a mixer: a seq_batch or an already validated one.
template <class T>
concept batch_like = std::same_as<T, seq_batch> || std::same_as<T, validated_batch>;

}  // namespace hymix
