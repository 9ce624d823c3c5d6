// Causal softmax attention layer (spec.md §2): q/k/v projections, optional qk-norm (plain or zero-centred,
// before RoPE), RoPE, GQA attention over a per-slot KV cache, optional Qwen3-Next/3.5 output gate, o_proj.
// Weight names and shapes follow the Hugging Face `self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm` layout.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/norm.hpp"
#include "hymix/kernels/rope.hpp"
#include "hymix/mixer/concepts.hpp"

namespace hymix {

using kernels::rope_mode;

/// qk-norm flavour (spec.md §1): none, plain `w ⊙ x / rms(x)` (fla), zero-centred `(1 + w) ⊙ x / rms(x)` (Qwen).
enum class qk_norm_mode { none, plain, zero_centered };

struct attention_rope_config {
    rope_mode mode = rope_mode::rotate_half;
    double theta = 1e4;                  // `rope_theta`
    double partial_rotary_factor = 1.0;  // d_rot = int(head_dim · factor)
};

struct attention_qk_norm_config {
    qk_norm_mode mode = qk_norm_mode::none;
    double eps = 1e-6;  // `rms_norm_eps`
};

/// Sizes and options of one attention layer.
struct attention_config {
    std::int64_t d_model = 0;     // d (`hidden_size`)
    std::int64_t n_heads = 0;     // H (`num_attention_heads`)
    std::int64_t n_kv_heads = 0;  // H_kv (`num_key_value_heads`), H % H_kv == 0
    std::int64_t head_dim = 0;    // d_h
    attention_rope_config rope{};
    attention_qk_norm_config qk_norm{};
    bool output_gate = false;         // Qwen3-Next / Qwen3.5: q_proj also yields a per-channel sigmoid gate
    double scale = 0.0;               // 0 → 1/sqrt(d_h)
    std::int64_t sliding_window = 0;  // 0 = none

    /// Rows of q_proj.weight: H·d_h, doubled with the output gate.
    std::int64_t q_rows() const noexcept { return n_heads * head_dim * (output_gate ? 2 : 1); }
    std::int64_t kv_rows() const noexcept { return n_kv_heads * head_dim; }
    /// Rotated channels per head (0 without RoPE).
    std::int64_t rope_dims() const {
        return rope.mode == rope_mode::none ? 0 : kernels::rope_dims(head_dim, rope.partial_rotary_factor);
    }

    /// Throws config_error naming the offending field.
    void validate() const {
        auto pos = [](std::int64_t v, const char* n) {
            if (v <= 0) throw config_error(std::string("attention_config: ") + n + " must be > 0, found " + std::to_string(v));
        };
        pos(d_model, "d_model");
        pos(n_heads, "n_heads");
        pos(n_kv_heads, "n_kv_heads");
        pos(head_dim, "head_dim");
        if (n_heads % n_kv_heads != 0)
            throw config_error("attention_config: n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv_heads " +
                               std::to_string(n_kv_heads));
        if (rope.mode != rope_mode::none) {
            if (!(rope.theta > 0)) throw config_error("attention_config: rope.theta must be > 0, found " + std::to_string(rope.theta));
            (void)rope_dims();  // throws config_error for a bad partial_rotary_factor
        }
        if (qk_norm.mode != qk_norm_mode::none && !(qk_norm.eps > 0 && std::isfinite(qk_norm.eps)))
            throw config_error("attention_config: qk_norm.eps must be > 0, found " + std::to_string(qk_norm.eps));
        if (scale < 0 || !std::isfinite(scale))
            throw config_error("attention_config: scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), found " + std::to_string(scale));
        if (sliding_window < 0)
            throw config_error("attention_config: sliding_window must be >= 0, found " + std::to_string(sliding_window));
    }
};

/// Weights in the Hugging Face layout (no biases).
struct attention_weights {
    tensor<float> q_proj;  // self_attn.q_proj.weight [H·d_h·(output_gate ? 2 : 1), d]; with the gate, rows viewed [H, 2·d_h]
    tensor<float> k_proj;  // self_attn.k_proj.weight [H_kv·d_h, d]
    tensor<float> v_proj;  // self_attn.v_proj.weight [H_kv·d_h, d]
    tensor<float> o_proj;  // self_attn.o_proj.weight [d, H·d_h]
    tensor<float> q_norm;  // self_attn.q_norm.weight [d_h] (only with qk-norm)
    tensor<float> k_norm;  // self_attn.k_norm.weight [d_h] (only with qk-norm)

    /// Throws shape_error naming the tensor, with expected and found shapes.
    void validate(const attention_config& c) const {
        auto need = [](const tensor<float>& t, std::vector<std::int64_t> s, const char* name) {
            if (t.shape() != s)
                throw shape_error(std::string("attention_weights: ") + name + " expected shape " + shape_string(s) + ", found " +
                                  shape_string(t.shape()));
        };
        need(q_proj, {c.q_rows(), c.d_model}, "q_proj.weight");
        need(k_proj, {c.kv_rows(), c.d_model}, "k_proj.weight");
        need(v_proj, {c.kv_rows(), c.d_model}, "v_proj.weight");
        need(o_proj, {c.d_model, c.n_heads * c.head_dim}, "o_proj.weight");
        if (c.qk_norm.mode != qk_norm_mode::none) {
            need(q_norm, {c.head_dim}, "q_norm.weight");
            need(k_norm, {c.head_dim}, "k_norm.weight");
        }
    }

    /// Random weights for tests and benchmarks: projections uniform in ±1/sqrt(fan_in); norm weights near their
    /// identity value (0 for zero-centred, 1 for plain) with a ±0.2 perturbation so the tests see them.
    static attention_weights random(const attention_config& c, std::uint64_t seed) {
        c.validate();
        std::mt19937_64 g(seed);
        auto fill = [&g](tensor<float>& t, float lo, float hi) {
            std::uniform_real_distribution<float> d(lo, hi);
            for (auto& v : t.span()) v = d(g);
        };
        attention_weights w;
        const auto a = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_model)));
        const auto ao = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.n_heads * c.head_dim)));
        w.q_proj = tensor<float>({c.q_rows(), c.d_model});
        w.k_proj = tensor<float>({c.kv_rows(), c.d_model});
        w.v_proj = tensor<float>({c.kv_rows(), c.d_model});
        w.o_proj = tensor<float>({c.d_model, c.n_heads * c.head_dim});
        fill(w.q_proj, -a, a);
        fill(w.k_proj, -a, a);
        fill(w.v_proj, -a, a);
        fill(w.o_proj, -ao, ao);
        if (c.qk_norm.mode != qk_norm_mode::none) {
            const float base = c.qk_norm.mode == qk_norm_mode::plain ? 1.f : 0.f;
            w.q_norm = tensor<float>({c.head_dim});
            w.k_norm = tensor<float>({c.head_dim});
            fill(w.q_norm, base - 0.2f, base + 0.2f);
            fill(w.k_norm, base - 0.2f, base + 0.2f);
        }
        return w;
    }
};

/// KV cache of one attention layer: post-RoPE keys and values, fp32, layout [S, H_kv, capacity, d_h], plus the
/// number of cached tokens (n_past) per slot. Capacity is shared by all slots and grows geometrically when a call
/// would exceed it, so a decode step normally allocates nothing.
class attention_state {
public:
    attention_state() = default;
    attention_state(std::int64_t n_slots, std::int64_t n_kv_heads, std::int64_t head_dim, std::int64_t capacity = 0)
        : n_slots_(n_slots), h_kv_(n_kv_heads), d_h_(head_dim), len_(static_cast<std::size_t>(std::max<std::int64_t>(n_slots, 0)), 0) {
        if (n_slots < 0 || n_kv_heads <= 0 || head_dim <= 0)
            throw config_error("attention_state: need n_slots >= 0, n_kv_heads > 0, head_dim > 0; found " + std::to_string(n_slots) +
                               ", " + std::to_string(n_kv_heads) + ", " + std::to_string(head_dim));
        reallocate(capacity);
    }

    std::int64_t n_slots() const noexcept { return n_slots_; }
    std::int64_t n_kv_heads() const noexcept { return h_kv_; }
    std::int64_t head_dim() const noexcept { return d_h_; }
    /// Tokens each slot can hold before the cache grows.
    std::int64_t capacity() const noexcept { return cap_; }
    /// Tokens cached in `slot` (its n_past).
    std::int64_t length(std::int64_t slot) const { return len_[static_cast<std::size_t>(check(slot))]; }

    /// Makes room for `tokens` tokens per slot (exactly, no geometric slack); keeps the cached contents.
    void reserve(std::int64_t tokens) {
        if (tokens > cap_) reallocate(tokens);
    }
    /// Room for `tokens` per slot, growing geometrically (at least doubling) when the cache must grow.
    void ensure(std::int64_t tokens) {
        if (tokens > cap_) reallocate(std::max({tokens, 2 * cap_, std::int64_t{64}}));
    }
    /// A fresh sequence: the slot's cache becomes empty.
    void reset_slot(std::int64_t slot) { len_[static_cast<std::size_t>(check(slot))] = 0; }
    /// Slot `to` becomes a copy of slot `from` (prompt caching).
    void copy_slot(std::int64_t from, std::int64_t to) {
        check(from);
        check(to);
        if (from == to) return;
        const std::int64_t n = len_[static_cast<std::size_t>(from)];
        for (std::int64_t h = 0; h < h_kv_; ++h) {
            std::copy_n(k_.data() + offset(from, h), n * d_h_, k_.data() + offset(to, h));
            std::copy_n(v_.data() + offset(from, h), n * d_h_, v_.data() + offset(to, h));
        }
        len_[static_cast<std::size_t>(to)] = n;
    }
    /// Sets the cached token count of a slot (≤ capacity); the mixer calls it after appending.
    void set_length(std::int64_t slot, std::int64_t n) {
        if (n < 0 || n > cap_)
            throw shape_error("attention_state: length " + std::to_string(n) + " outside [0, capacity " + std::to_string(cap_) + "]");
        len_[static_cast<std::size_t>(check(slot))] = n;
    }

    /// Keys of one slot, [H_kv, capacity, d_h]; the first length(slot) tokens are valid.
    tensor_view<float, 3> keys(std::int64_t slot) { return slot_view(k_, slot); }
    tensor_view<float, 3> values(std::int64_t slot) { return slot_view(v_, slot); }
    tensor_view<const float, 3> keys(std::int64_t slot) const { return const_cast<attention_state*>(this)->keys(slot); }
    tensor_view<const float, 3> values(std::int64_t slot) const { return const_cast<attention_state*>(this)->values(slot); }

private:
    std::int64_t check(std::int64_t slot) const {
        if (slot < 0 || slot >= n_slots_)
            throw shape_error("attention_state: slot " + std::to_string(slot) + " outside [0, " + std::to_string(n_slots_) + ")");
        return slot;
    }
    std::int64_t offset(std::int64_t slot, std::int64_t h) const { return ((slot * h_kv_) + h) * cap_ * d_h_; }
    tensor_view<float, 3> slot_view(tensor<float>& t, std::int64_t slot) {
        check(slot);
        return tensor_view<float, 3>(t.data() + offset(slot, 0), {h_kv_, cap_, d_h_});
    }
    void reallocate(std::int64_t cap) {
        tensor<float> k({n_slots_, h_kv_, cap, d_h_}), v({n_slots_, h_kv_, cap, d_h_});
        for (std::int64_t s = 0; s < n_slots_; ++s)
            for (std::int64_t h = 0; h < h_kv_; ++h) {
                const std::int64_t n = len_[static_cast<std::size_t>(s)] * d_h_;
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
    std::vector<std::int64_t> len_;  // [S] cached tokens per slot
    tensor<float> k_, v_;            // [S, H_kv, capacity, d_h]
};

namespace detail {
/// a[i] ← a[i] · σ(g[i]) over n floats (σ saturates cleanly: exp overflow gives 0, underflow gives 1).
template <class Arch>
inline void mul_sigmoid(float* a, const float* g, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    std::int64_t i = 0;
    for (; i + W <= n; i += W)
        (V::load_unaligned(a + i) / (V(1.f) + xsimd::exp(-V::load_unaligned(g + i)))).store_unaligned(a + i);
    for (; i < n; ++i) a[i] *= sigmoid(g[i]);
}
}  // namespace detail

/// The attention mixer (see docs/architecture.md for the contract).
class attention {
public:
    using config_type = attention_config;
    using weights_type = attention_weights;
    using state_type = attention_state;

    /// Validates both (config_error / shape_error).
    attention(attention_config c, attention_weights w) : cfg_(c), w_(std::move(w)) {
        cfg_.validate();
        w_.validate(cfg_);
    }

    const attention_config& config() const noexcept { return cfg_; }
    const attention_weights& weights() const noexcept { return w_; }
    /// An empty KV cache with `n_slots` slots (call reserve() on it to pre-size the capacity).
    attention_state make_state(std::int64_t n_slots) const { return attention_state(n_slots, cfg_.n_kv_heads, cfg_.head_dim); }

    /// Any token counts (chunked prefill; dispatches to the decode kernel when every sequence has one token).
    /// x, y [n_rows, d_model]; appends each valid sequence's keys/values to its slot. Throws shape_error on bad
    /// shapes, slots out of range or a state built for another layer shape.
    template <cpu_backend_type B>
    void forward(const B& be, attention_state& st, const seq_batch& batch, tensor_view<const float, 2> x,
                 tensor_view<float, 2> y) const {
        run(be, st, batch, x, y, batch.n_seq() > 0 && batch.is_decode());
    }

    /// Decode step: every sequence must have exactly one token (else shape_error).
    template <cpu_backend_type B>
    void step(const B& be, attention_state& st, const seq_batch& batch, tensor_view<const float, 2> x,
              tensor_view<float, 2> y) const {
        for (std::int64_t i = 0; i < batch.n_seq(); ++i)
            if (batch.lengths[static_cast<std::size_t>(i)] != 1)
                throw shape_error("attention::step: sequence " + std::to_string(i) + " has " +
                                  std::to_string(batch.lengths[static_cast<std::size_t>(i)]) + " tokens, expected 1");
        run(be, st, batch, x, y, true);
    }

private:
    template <cpu_backend_type B>
    void run(const B& be, attention_state& st, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
             bool decode) const {
        const std::int64_t d = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, dh = cfg_.head_dim;
        const std::int64_t N = x.dim(0);
        x.require_shape({batch.n_rows, d}, "attention: x");
        y.require_shape({batch.n_rows, d}, "attention: y");
        if (st.n_kv_heads() != Hkv || st.head_dim() != dh)
            throw shape_error("attention: state holds [H_kv, d_h] = [" + std::to_string(st.n_kv_heads()) + ", " +
                              std::to_string(st.head_dim()) + "], the layer needs [" + std::to_string(Hkv) + ", " +
                              std::to_string(dh) + "]");
        batch.validate(st.n_slots());
        if (N == 0) return;

        // 1. Projections over every row (rows outside valid sequences are discarded below).
        const std::int64_t qr = cfg_.q_rows(), kr = cfg_.kv_rows();
        // One uninitialised workspace: q [N, qr], k [N, kr], v [N, kr], attention output a [N, H·d_h].
        const std::int64_t ad = H * dh;
        const std::unique_ptr<float[]> ws(new float[static_cast<std::size_t>(N * (qr + 2 * kr + ad))]);
        const tensor_view<float, 2> q(ws.get(), {N, qr}), k(q.data + N * qr, {N, kr}), v(k.data + N * kr, {N, kr}),
            a(v.data + N * kr, {N, ad});
        kernels::linear(be, x, w_.q_proj.view<2>(), nullptr, q);
        kernels::linear(be, x, w_.k_proj.view<2>(), nullptr, k);
        kernels::linear(be, x, w_.v_proj.view<2>(), nullptr, v);

        // 2. Positions, then qk-norm and RoPE row-parallel.
        std::vector<std::int64_t> pos(static_cast<std::size_t>(N), 0);
        std::int64_t need = 0;
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const auto i = static_cast<std::size_t>(s);
            if (batch.slots[i] < 0 || batch.lengths[i] == 0) continue;
            const std::int64_t past = st.length(batch.slots[i]);
            for (std::int64_t t = 0; t < batch.lengths[i]; ++t) pos[static_cast<std::size_t>(batch.starts[i] + t)] = past + t;
            need = std::max(need, past + batch.lengths[i]);
        }
        const std::int64_t qh_stride = cfg_.output_gate ? 2 * dh : dh;
        tensor_view<float, 3> qv(q.data, {N, H, dh}, {qr, qh_stride, 1});  // queries [N, H, d_h]
        tensor_view<float, 3> kv(k.data, {N, Hkv, dh});                    // keys [N, H_kv, d_h]
        const std::int64_t d_rot = cfg_.rope_dims();
        be.parallel_for(N, 16, [&](std::int64_t r0, std::int64_t r1) {
            if (cfg_.qk_norm.mode != qk_norm_mode::none) {
                const auto fl = cfg_.qk_norm.mode == qk_norm_mode::plain ? kernels::rms_flavor::plain : kernels::rms_flavor::zero_centered;
                const auto eps = static_cast<float>(cfg_.qk_norm.eps);
                for (std::int64_t r = r0; r < r1; ++r) {
                    kernels::rms_norm<float>(qv[r], w_.q_norm.data(), eps, fl, qv[r]);
                    kernels::rms_norm<float>(kv[r], w_.k_norm.data(), eps, fl, kv[r]);
                }
            }
            if (d_rot > 0) {
                const std::span<const std::int64_t> p(pos.data() + r0, static_cast<std::size_t>(r1 - r0));
                kernels::rope(qv.slice(r0, r1 - r0), p, cfg_.rope.mode, cfg_.rope.theta, d_rot);
                kernels::rope(kv.slice(r0, r1 - r0), p, cfg_.rope.mode, cfg_.rope.theta, d_rot);
            }
        });

        // 3. Append the new keys / values to each sequence's cache (parallel over sequence × KV head), then attend.
        st.ensure(need);
        std::vector<kernels::attention_problem<float>> probs;
        std::vector<std::int64_t> seq_of;
        std::vector<tensor_view<float, 3>> kcs, vcs;  // per problem: the slot's cache [H_kv, capacity, d_h]
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const auto i = static_cast<std::size_t>(s);
            const std::int64_t slot = batch.slots[i], T = batch.lengths[i], r0 = batch.starts[i];
            if (slot < 0 || T == 0) continue;
            const std::int64_t Tk = st.length(slot) + T;
            const auto kc = st.keys(slot), vc = st.values(slot);
            kcs.push_back(kc);
            vcs.push_back(vc);
            kernels::attention_problem<float> p;
            p.q = tensor_view<const float, 3>(qv.slice(r0, T));
            p.k = tensor_view<const float, 3>(kc.data, {Tk, Hkv, dh}, {dh, kc.strides[0], 1});
            p.v = tensor_view<const float, 3>(vc.data, {Tk, Hkv, dh}, {dh, vc.strides[0], 1});
            p.o = tensor_view<float, 3>(&a(r0, 0), {T, H, dh});
            probs.push_back(p);
            seq_of.push_back(s);
        }
        const auto n_prob = static_cast<std::int64_t>(probs.size());
        be.parallel_for(n_prob * Hkv, 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t it = b; it < e; ++it) {
                const auto j = static_cast<std::size_t>(it / Hkv);
                const std::int64_t h = it % Hkv, s = seq_of[j];
                const auto i = static_cast<std::size_t>(s);
                const std::int64_t T = batch.lengths[i], r0 = batch.starts[i], past = probs[j].k.dim(0) - T;
                float* kd = &kcs[j](h, past, 0);
                float* vd = &vcs[j](h, past, 0);
                for (std::int64_t t = 0; t < T; ++t) {
                    std::memcpy(kd + t * dh, &k(r0 + t, h * dh), sizeof(float) * static_cast<std::size_t>(dh));
                    std::memcpy(vd + t * dh, &v(r0 + t, h * dh), sizeof(float) * static_cast<std::size_t>(dh));
                }
            }
        });
        const kernels::attention_params prm{cfg_.scale, cfg_.sliding_window};
        if (decode)
            kernels::attention_decode(be, std::span<const kernels::attention_problem<float>>(probs), prm);
        else
            kernels::attention_prefill(be, std::span<const kernels::attention_problem<float>>(probs), prm);
        for (std::size_t j = 0; j < probs.size(); ++j) {
            const auto i = static_cast<std::size_t>(seq_of[j]);
            st.set_length(batch.slots[i], st.length(batch.slots[i]) + batch.lengths[i]);
        }

        // Rows outside valid sequences are zero (every row of a valid sequence was written by the kernel).
        std::vector<char> covered(static_cast<std::size_t>(N), 0);
        for (std::size_t j = 0; j < probs.size(); ++j) {
            const auto i = static_cast<std::size_t>(seq_of[j]);
            std::fill_n(covered.begin() + batch.starts[i], batch.lengths[i], char{1});
        }
        for (std::int64_t r = 0; r < N; ++r)
            if (!covered[static_cast<std::size_t>(r)]) std::fill_n(&a(r, 0), ad, 0.f);

        // 4. Output gate σ(gate) per head channel, then o_proj (zero rows of a give zero rows of y).
        if (cfg_.output_gate) {
            be.parallel_for(N, 16, [&](std::int64_t r0, std::int64_t r1) {
                for (std::int64_t r = r0; r < r1; ++r)
                    for (std::int64_t h = 0; h < H && covered[static_cast<std::size_t>(r)]; ++h)
                        detail::mul_sigmoid<typename B::arch>(&a(r, h * dh), &q(r, h * 2 * dh + dh), dh);
            });
        }
        kernels::linear(be, tensor_view<const float, 2>(a), w_.o_proj.view<2>(), nullptr, y);
    }

    attention_config cfg_;
    attention_weights w_;
};

static_assert(mixer<attention, cpu_backend>);

/// Whole-layer fp64 reference for one sequence that starts at position 0 (no cache): projections, qk-norm, RoPE
/// (fp32 angles as in the fast path), attention with a materialised mask, output gate and o_proj, all in double.
/// x [T, d_model] → y [T, d_model].
inline void attention_layer_ref(const attention_config& c, const attention_weights& w, tensor_view<const double, 2> x,
                                tensor_view<double, 2> y) {
    c.validate();
    w.validate(c);
    const std::int64_t T = x.dim(0), H = c.n_heads, Hkv = c.n_kv_heads, dh = c.head_dim, qr = c.q_rows(), kr = c.kv_rows();
    x.require_shape({T, c.d_model}, "attention_layer_ref: x");
    y.require_shape({T, c.d_model}, "attention_layer_ref: y");
    tensor<double> q({T, qr}), k({T, kr}), v({T, kr}), o({T, H * dh});
    kernels::linear_ref<double, float, double>(x, w.q_proj.view<2>(), nullptr, q.view<2>());
    kernels::linear_ref<double, float, double>(x, w.k_proj.view<2>(), nullptr, k.view<2>());
    kernels::linear_ref<double, float, double>(x, w.v_proj.view<2>(), nullptr, v.view<2>());
    const std::int64_t qh_stride = c.output_gate ? 2 * dh : dh;
    tensor_view<double, 3> qv(q.data(), {T, H, dh}, {qr, qh_stride, 1});
    tensor_view<double, 3> kv(k.data(), {T, Hkv, dh});
    if (c.qk_norm.mode != qk_norm_mode::none) {
        const auto fl = c.qk_norm.mode == qk_norm_mode::plain ? kernels::rms_flavor::plain : kernels::rms_flavor::zero_centered;
        std::vector<double> wq(w.q_norm.data(), w.q_norm.data() + dh), wk(w.k_norm.data(), w.k_norm.data() + dh);
        for (std::int64_t t = 0; t < T; ++t) {
            kernels::rms_norm<double>(qv[t], wq.data(), c.qk_norm.eps, fl, qv[t]);
            kernels::rms_norm<double>(kv[t], wk.data(), c.qk_norm.eps, fl, kv[t]);
        }
    }
    if (c.rope.mode != rope_mode::none) {
        std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
        for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = t;
        kernels::rope_ref(qv, pos, c.rope.mode, c.rope.theta, c.rope_dims());
        kernels::rope_ref(kv, pos, c.rope.mode, c.rope.theta, c.rope_dims());
    }
    kernels::attention_problem<double> p;
    p.q = qv;
    p.k = tensor_view<const double, 3>(k.data(), {T, Hkv, dh});
    p.v = tensor_view<const double, 3>(v.data(), {T, Hkv, dh});
    p.o = tensor_view<double, 3>(o.data(), {T, H, dh});
    kernels::attention_ref(p, {c.scale, c.sliding_window});
    if (c.output_gate)
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t ch = 0; ch < dh; ++ch) o.data()[(t * H + h) * dh + ch] *= sigmoid(q.data()[t * qr + h * 2 * dh + dh + ch]);
    kernels::linear_ref<double, float, double>(tensor_view<const double, 2>(o.view<2>()), w.o_proj.view<2>(), nullptr, y);
}

}  // namespace hymix
