// The KV cache of attention-like mixers (softmax attention, AMOR blocks, Oryx): post-RoPE keys and values per
// sequence slot, fp32, layout [S, H_kv, capacity, d_h], with the cached token count (n_past) of each slot.
// Per-slot append (an op, so any backend can run it), views for the attention kernels, truncate / rollback to a
// length (speculative decoding), copy / reset of a slot (prompt caching), and eviction of tokens no query can see
// any more (sliding-window attention keeps a bounded cache). Token indices are absolute positions: a slot holds
// tokens [first(slot), length(slot)). Capacity is shared by all slots and grows geometrically, so a decode step
// normally allocates nothing (spec.md §2, §5.6, §6.4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/elementwise.hpp"

namespace hymix {

class kv_cache {
public:
    kv_cache() = default;
    /// n_slots sequences of n_kv_heads × head_dim keys/values, room for `capacity` tokens each to start with.
    /// Throws config_error on negative or zero sizes.
    kv_cache(std::int64_t n_slots, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t capacity = 0)
        : n_slots_(n_slots), h_kv_(n_kv_heads), d_h_(head_dim), len_(static_cast<std::size_t>(std::max<std::int64_t>(n_slots, 0)), 0),
          off_(len_.size(), 0) {
        if (n_slots < 0 || n_kv_heads <= 0 || head_dim <= 0)
            throw config_error("kv_cache: need n_slots >= 0, n_kv_heads > 0, head_dim > 0; found " + std::to_string(n_slots) + ", " +
                               std::to_string(n_kv_heads) + ", " + std::to_string(head_dim));
        reallocate(capacity);
    }

    std::int64_t n_slots() const noexcept { return n_slots_; }
    std::int64_t n_kv_heads() const noexcept { return h_kv_; }
    std::int64_t head_dim() const noexcept { return d_h_; }
    /// Tokens each slot can hold before the cache grows.
    std::int64_t capacity() const noexcept { return cap_; }
    /// Tokens seen by `slot` (its n_past, the next token's position). Throws shape_error for a slot out of range.
    std::int64_t length(std::int64_t slot) const { return len_[static_cast<std::size_t>(check(slot))]; }
    /// Position of the oldest token still stored in `slot` (0 unless evict_before dropped older ones).
    std::int64_t first(std::int64_t slot) const { return off_[static_cast<std::size_t>(check(slot))]; }
    /// Tokens stored in `slot`: length − first.
    std::int64_t stored(std::int64_t slot) const { return length(slot) - first(slot); }

    /// Makes room for `tokens` stored tokens per slot (exactly, no geometric slack); keeps the cached contents.
    void reserve(std::int64_t tokens) {
        if (tokens > cap_) reallocate(tokens);
    }
    /// Room for `tokens` stored tokens per slot, growing geometrically (at least doubling) when the cache must grow.
    void ensure(std::int64_t tokens) {
        if (tokens > cap_) reallocate(std::max({tokens, 2 * cap_, std::int64_t{64}}));
    }
    /// A fresh sequence: the slot's cache becomes empty.
    void reset_slot(std::int64_t slot) {
        len_[static_cast<std::size_t>(check(slot))] = 0;
        off_[static_cast<std::size_t>(slot)] = 0;
    }
    /// Rolls `slot` back to its first `length` tokens (speculative decoding: reject drafted tokens). Throws
    /// shape_error when length is negative, longer than what was seen, or before an evicted position.
    void truncate(std::int64_t slot, std::int64_t length) {
        const std::int64_t n = this->length(slot);
        if (length < first(slot) || length > n)
            throw shape_error("kv_cache::truncate: slot " + std::to_string(slot) + " holds tokens [" + std::to_string(first(slot)) +
                              ", " + std::to_string(n) + "), cannot truncate to " + std::to_string(length));
        len_[static_cast<std::size_t>(slot)] = length;
    }
    /// Drops the tokens of `slot` before position `pos` when that frees at least `min_drop` of them (so the move of
    /// the kept tokens is amortised); keeps positions absolute. Returns whether it dropped.
    bool evict_before(std::int64_t slot, std::int64_t pos, std::int64_t min_drop = 1) {
        const std::int64_t f = first(slot), n = length(slot);
        pos = std::min(pos, n);
        if (pos - f < std::max<std::int64_t>(min_drop, 1)) return false;
        const std::int64_t keep = n - pos, drop = pos - f;
        for (std::int64_t h = 0; h < h_kv_; ++h) {
            std::copy_n(k_.data() + offset(slot, h) + drop * d_h_, keep * d_h_, k_.data() + offset(slot, h));
            std::copy_n(v_.data() + offset(slot, h) + drop * d_h_, keep * d_h_, v_.data() + offset(slot, h));
        }
        off_[static_cast<std::size_t>(slot)] = pos;
        return true;
    }
    /// Slot `to` becomes a copy of slot `from` (prompt caching).
    void copy_slot(std::int64_t from, std::int64_t to) {
        check(from);
        check(to);
        if (from == to) return;
        const std::int64_t n = stored(from);
        for (std::int64_t h = 0; h < h_kv_; ++h) {
            std::copy_n(k_.data() + offset(from, h), n * d_h_, k_.data() + offset(to, h));
            std::copy_n(v_.data() + offset(from, h), n * d_h_, v_.data() + offset(to, h));
        }
        len_[static_cast<std::size_t>(to)] = len_[static_cast<std::size_t>(from)];
        off_[static_cast<std::size_t>(to)] = off_[static_cast<std::size_t>(from)];
    }
    /// Sets the position count (n_past) of a slot; the stored tokens [first, n) must fit the capacity.
    void set_length(std::int64_t slot, std::int64_t n) {
        const std::int64_t f = first(slot);
        if (n < f || n - f > cap_)
            throw shape_error("kv_cache: length " + std::to_string(n) + " outside [" + std::to_string(f) + ", " + std::to_string(f + cap_) + "]");
        len_[static_cast<std::size_t>(slot)] = n;
    }

    /// Writes k, v [T, H_kv, d_h] (unit stride along d_h) at positions [at, at + T) (at >= first) of `slot` on `be`.
    /// The caller has made room (ensure) and sets the length afterwards; appends of distinct slots may run in one
    /// parallel region. Throws shape_error on a shape mismatch or a range past the capacity.
    template <host_backend B>
    void write(const B& be, std::int64_t slot, std::int64_t at, tensor_view<const float, 3> k, tensor_view<const float, 3> v) {
        check(slot);
        const std::int64_t T = k.dim(0);
        k.require_shape({T, h_kv_, d_h_}, "kv_cache::write", "k");
        v.require_shape({T, h_kv_, d_h_}, "kv_cache::write", "v");
        const std::int64_t f = first(slot);
        if (at < f || at - f + T > cap_)
            throw shape_error("kv_cache::write: tokens [" + std::to_string(at) + ", " + std::to_string(at + T) + ") outside the stored range [" +
                              std::to_string(f) + ", " + std::to_string(f + cap_) + ")");
        ops::copy(be, k, token_view(k_, slot, at - f, T));
        ops::copy(be, v, token_view(v_, slot, at - f, T));
    }
    /// Appends k, v [T, H_kv, d_h] after the slot's cached tokens (growing the cache when needed).
    template <host_backend B>
    void append(const B& be, std::int64_t slot, tensor_view<const float, 3> k, tensor_view<const float, 3> v) {
        const std::int64_t n = length(slot), T = k.dim(0);
        ensure(stored(slot) + T);
        write(be, slot, n, k, v);
        len_[static_cast<std::size_t>(slot)] = n + T;
    }

    /// Keys of one slot, [H_kv, capacity, d_h]; the first stored(slot) tokens are valid (position first(slot) first).
    tensor_view<float, 3> keys(std::int64_t slot) { return slot_view(k_, slot); }
    tensor_view<float, 3> values(std::int64_t slot) { return slot_view(v_, slot); }
    tensor_view<const float, 3> keys(std::int64_t slot) const { return const_cast<kv_cache*>(this)->keys(slot); }
    tensor_view<const float, 3> values(std::int64_t slot) const { return const_cast<kv_cache*>(this)->values(slot); }
    /// Tokens at positions [from, to) of a slot as the attention kernels read them: [to − from, H_kv, d_h] (token
    /// stride d_h, head stride capacity·d_h). Throws shape_error unless first ≤ from ≤ to ≤ first + capacity.
    tensor_view<const float, 3> key_range(std::int64_t slot, std::int64_t from, std::int64_t to) const { return range(k_, slot, from, to); }
    tensor_view<const float, 3> value_range(std::int64_t slot, std::int64_t from, std::int64_t to) const { return range(v_, slot, from, to); }

private:
    std::int64_t check(std::int64_t slot) const {
        if (slot < 0 || slot >= n_slots_)
            throw shape_error("kv_cache: slot " + std::to_string(slot) + " outside [0, " + std::to_string(n_slots_) + ")");
        return slot;
    }
    tensor_view<float, 3> range(const tensor<float>& t, std::int64_t slot, std::int64_t from, std::int64_t to) const {
        const std::int64_t f = first(slot);
        if (from < f || to < from || to - f > cap_)
            throw shape_error("kv_cache: positions [" + std::to_string(from) + ", " + std::to_string(to) + ") outside the stored range [" +
                              std::to_string(f) + ", " + std::to_string(f + cap_) + ")");
        return token_view(t, slot, from - f, to - from);
    }
    std::int64_t offset(std::int64_t slot, std::int64_t h) const { return ((slot * h_kv_) + h) * cap_ * d_h_; }
    tensor_view<float, 3> slot_view(tensor<float>& t, std::int64_t slot) {
        check(slot);
        return tensor_view<float, 3>(t.data() + offset(slot, 0), {h_kv_, cap_, d_h_});
    }
    tensor_view<float, 3> token_view(const tensor<float>& t, std::int64_t slot, std::int64_t at, std::int64_t n) const {
        check(slot);
        return tensor_view<float, 3>(const_cast<float*>(t.data()) + offset(slot, 0) + at * d_h_, {n, h_kv_, d_h_}, {d_h_, cap_ * d_h_, 1});
    }
    void reallocate(std::int64_t cap) {
        tensor<float> k({n_slots_, h_kv_, cap, d_h_}), v({n_slots_, h_kv_, cap, d_h_});
        for (std::int64_t s = 0; s < n_slots_; ++s)
            for (std::int64_t h = 0; h < h_kv_; ++h) {
                const std::int64_t n = (len_[static_cast<std::size_t>(s)] - off_[static_cast<std::size_t>(s)]) * d_h_;
                const std::int64_t dst = ((s * h_kv_) + h) * cap * d_h_;
                if (n > 0) {
                    std::copy_n(k_.data() + offset(s, h), n, k.data() + dst);
                    std::copy_n(v_.data() + offset(s, h), n, v.data() + dst);
                }
            }
        k_ = std::move(k);
        v_ = std::move(v);
        cap_ = cap;
    }

    std::int64_t n_slots_ = 0, h_kv_ = 0, d_h_ = 0, cap_ = 0;
    std::vector<std::int64_t> len_;  // [S] positions seen per slot (n_past)
    std::vector<std::int64_t> off_;  // [S] first stored position per slot
    tensor<float> k_, v_;            // [S, H_kv, capacity, d_h]
};

}  // namespace hymix
