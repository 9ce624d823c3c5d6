// The KV cache of attention-like mixers (softmax attention, AMOR blocks, Oryx): post-RoPE keys and values per
// sequence slot, layout [S, H_kv, capacity, d_h], with the cached token count (n_past) of each slot. Stored in fp32,
// or in bf16 / f16 (the cache's dtype, chosen at construction): a 16-bit cache halves the bytes each decode step
// reads at long context; keys and values are rounded to nearest even once, when appended, and widened exactly to
// fp32 by the attention kernels (every product and sum stays fp32).
// Per-slot append (an op, so any backend can run it), views for the attention kernels, truncate / rollback to a
// length (speculative decoding), copy / reset of a slot (prompt caching), and eviction of tokens no query can see
// any more (sliding-window attention keeps a bounded cache). Token indices are absolute positions: a slot holds
// tokens [first(slot), length(slot)). Capacity is shared by all slots and grows geometrically, so a decode step
// normally allocates nothing (spec.md §2, §5.6, §6.4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/elementwise.hpp"

namespace hymix {

class kv_cache {
public:
    kv_cache() = default;
    /// n_slots sequences of n_kv_heads × head_dim keys/values, room for `capacity` tokens each to start with,
    /// stored in `kv_dtype` (f32, bf16 or f16). Throws config_error on negative or zero sizes and dtype_error on
    /// another dtype.
    kv_cache(std::int64_t n_slots, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t capacity = 0,
             dtype kv_dtype = dtype::f32)
        : n_slots_(n_slots), h_kv_(n_kv_heads), d_h_(head_dim), dtype_(kv_dtype),
          len_(static_cast<std::size_t>(std::max<std::int64_t>(n_slots, 0)), 0), off_(len_.size(), 0) {
        if (n_slots < 0 || n_kv_heads <= 0 || head_dim <= 0)
            throw config_error("kv_cache: need n_slots >= 0, n_kv_heads > 0, head_dim > 0; found " + std::to_string(n_slots) + ", " +
                               std::to_string(n_kv_heads) + ", " + std::to_string(head_dim));
        if (!supported(kv_dtype))
            throw dtype_error("kv_cache: keys and values are stored in F32, BF16 or F16, found " + std::string(dtype_name(kv_dtype)));
        reallocate(capacity);
    }

    /// Whether a KV cache can be stored in `t` (f32, bf16, f16).
    static constexpr bool supported(dtype t) noexcept { return t == dtype::f32 || t == dtype::bf16 || t == dtype::f16; }
    /// The element type keys and values are stored in.
    dtype kv_dtype() const noexcept { return dtype_; }
    /// Calls f(KV{}) with a value of the stored element type (float, bf16 or f16): the attention mixers build their
    /// problems for that type. Returns what f returns.
    template <class F>
    decltype(auto) with_kv_type(F&& f) const {
        switch (dtype_) {
            case dtype::bf16: return f(bf16{});
            case dtype::f16: return f(f16{});
            default: return f(float{});
        }
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
        each_store([&](auto& k, auto& v) {
            for (std::int64_t h = 0; h < h_kv_; ++h) {
                std::copy_n(k.data() + offset(slot, h) + drop * d_h_, keep * d_h_, k.data() + offset(slot, h));
                std::copy_n(v.data() + offset(slot, h) + drop * d_h_, keep * d_h_, v.data() + offset(slot, h));
            }
        });
        off_[static_cast<std::size_t>(slot)] = pos;
        return true;
    }
    /// Slot `to` becomes a copy of slot `from` (prompt caching).
    void copy_slot(std::int64_t from, std::int64_t to) {
        check(from);
        check(to);
        if (from == to) return;
        const std::int64_t n = stored(from);
        each_store([&](auto& k, auto& v) {
            for (std::int64_t h = 0; h < h_kv_; ++h) {
                std::copy_n(k.data() + offset(from, h), n * d_h_, k.data() + offset(to, h));
                std::copy_n(v.data() + offset(from, h), n * d_h_, v.data() + offset(to, h));
            }
        });
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

    /// Writes k, v [T, H_kv, d_h] (unit stride along d_h) at positions [at, at + T) (at >= first) of `slot` on `be`,
    /// rounded to nearest even in a 16-bit cache. The caller has made room (ensure) and sets the length afterwards;
    /// appends of distinct slots may run in one parallel region. Throws shape_error on a shape mismatch or a range
    /// past the capacity.
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
        each_store([&](auto& ks, auto& vs) {
            ops::copy(be, k, token_view(ks, slot, at - f, T));
            ops::copy(be, v, token_view(vs, slot, at - f, T));
        });
    }
    /// Appends k, v [T, H_kv, d_h] after the slot's cached tokens (growing the cache when needed).
    template <host_backend B>
    void append(const B& be, std::int64_t slot, tensor_view<const float, 3> k, tensor_view<const float, 3> v) {
        const std::int64_t n = length(slot), T = k.dim(0);
        ensure(stored(slot) + T);
        write(be, slot, n, k, v);
        len_[static_cast<std::size_t>(slot)] = n + T;
    }

    /// Keys of one slot, [H_kv, capacity, d_h], as KV (the cache's element type: float, the default, bf16 or
    /// f16); the first stored(slot) tokens are valid (position first(slot) first). Throws dtype_error when KV is not
    /// the stored type.
    template <class KV = float>
    tensor_view<KV, 3> keys(std::int64_t slot) { return slot_view(store<KV>(true), slot); }
    template <class KV = float>
    tensor_view<KV, 3> values(std::int64_t slot) { return slot_view(store<KV>(false), slot); }
    template <class KV = float>
    tensor_view<const KV, 3> keys(std::int64_t slot) const { return const_cast<kv_cache*>(this)->keys<KV>(slot); }
    template <class KV = float>
    tensor_view<const KV, 3> values(std::int64_t slot) const { return const_cast<kv_cache*>(this)->values<KV>(slot); }
    /// Tokens at positions [from, to) of a slot as the attention kernels read them: [to − from, H_kv, d_h] (token
    /// stride d_h, head stride capacity·d_h), as KV (see keys). Throws shape_error unless first ≤ from ≤ to ≤ first +
    /// capacity, dtype_error when KV is not the stored type.
    template <class KV = float>
    tensor_view<const KV, 3> key_range(std::int64_t slot, std::int64_t from, std::int64_t to) const {
        return range(const_cast<kv_cache*>(this)->store<KV>(true), slot, from, to);
    }
    template <class KV = float>
    tensor_view<const KV, 3> value_range(std::int64_t slot, std::int64_t from, std::int64_t to) const {
        return range(const_cast<kv_cache*>(this)->store<KV>(false), slot, from, to);
    }
    /// Bytes of keys and values held (the allocated capacity of every slot).
    std::int64_t bytes() const noexcept {
        return 2 * n_slots_ * h_kv_ * cap_ * d_h_ * static_cast<std::int64_t>(dtype_size(dtype_));
    }

private:
    std::int64_t check(std::int64_t slot) const {
        if (slot < 0 || slot >= n_slots_)
            throw shape_error("kv_cache: slot " + std::to_string(slot) + " outside [0, " + std::to_string(n_slots_) + ")");
        return slot;
    }
    // The storage of element type KV (keys or values); dtype_error when the cache holds another type.
    template <class KV>
    tensor<KV>& store(bool keys_store) {
        if (dtype_of_v<KV> != dtype_)
            throw dtype_error("kv_cache: the cache stores " + std::string(dtype_name(dtype_)) + ", read as " +
                              std::string(dtype_name(dtype_of_v<KV>)));
        if constexpr (std::is_same_v<KV, float>)
            return keys_store ? k_ : v_;
        else if constexpr (std::is_same_v<KV, bf16>)
            return keys_store ? kb_ : vb_;
        else
            return keys_store ? kh_ : vh_;
    }
    // f(keys, values) on the storage in use.
    template <class F>
    void each_store(F&& f) {
        switch (dtype_) {
            case dtype::bf16: f(kb_, vb_); break;
            case dtype::f16: f(kh_, vh_); break;
            default: f(k_, v_); break;
        }
    }
    template <class KV>
    tensor_view<KV, 3> range(const tensor<KV>& t, std::int64_t slot, std::int64_t from, std::int64_t to) const {
        const std::int64_t f = first(slot);
        if (from < f || to < from || to - f > cap_)
            throw shape_error("kv_cache: positions [" + std::to_string(from) + ", " + std::to_string(to) + ") outside the stored range [" +
                              std::to_string(f) + ", " + std::to_string(f + cap_) + ")");
        return token_view(t, slot, from - f, to - from);
    }
    std::int64_t offset(std::int64_t slot, std::int64_t h) const { return ((slot * h_kv_) + h) * cap_ * d_h_; }
    template <class KV>
    tensor_view<KV, 3> slot_view(tensor<KV>& t, std::int64_t slot) {
        check(slot);
        return tensor_view<KV, 3>(t.data() + offset(slot, 0), {h_kv_, cap_, d_h_});
    }
    template <class KV>
    tensor_view<KV, 3> token_view(const tensor<KV>& t, std::int64_t slot, std::int64_t at, std::int64_t n) const {
        check(slot);
        return tensor_view<KV, 3>(const_cast<KV*>(t.data()) + offset(slot, 0) + at * d_h_, {n, h_kv_, d_h_}, {d_h_, cap_ * d_h_, 1});
    }
    void reallocate(std::int64_t cap) {
        each_store([&](auto& k_old, auto& v_old) {
            using KV = typename std::remove_reference_t<decltype(k_old)>::value_type;
            tensor<KV> k({n_slots_, h_kv_, cap, d_h_}), v({n_slots_, h_kv_, cap, d_h_});
            for (std::int64_t s = 0; s < n_slots_; ++s)
                for (std::int64_t h = 0; h < h_kv_; ++h) {
                    const std::int64_t n = (len_[static_cast<std::size_t>(s)] - off_[static_cast<std::size_t>(s)]) * d_h_;
                    const std::int64_t dst = ((s * h_kv_) + h) * cap * d_h_;
                    if (n > 0) {
                        std::copy_n(k_old.data() + offset(s, h), n, k.data() + dst);
                        std::copy_n(v_old.data() + offset(s, h), n, v.data() + dst);
                    }
                }
            k_old = std::move(k);
            v_old = std::move(v);
        });
        cap_ = cap;
    }

    std::int64_t n_slots_ = 0, h_kv_ = 0, d_h_ = 0, cap_ = 0;
    dtype dtype_ = dtype::f32;
    std::vector<std::int64_t> len_;  // [S] positions seen per slot (n_past)
    std::vector<std::int64_t> off_;  // [S] first stored position per slot
    tensor<float> k_, v_;            // [S, H_kv, capacity, d_h] of an f32 cache (empty otherwise)
    tensor<bf16> kb_, vb_;           // ... of a bf16 cache
    tensor<f16> kh_, vh_;            // ... of an f16 cache
};

}  // namespace hymix
