// Causal softmax attention layer (spec.md §2): q/k/v projections, optional qk-norm (plain or zero-centred,
// before RoPE), RoPE, GQA attention over a per-slot KV cache, optional Qwen3-Next/3.5 output gate, o_proj.
// Weight names and shapes follow the Hugging Face `self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm` layout.
// Training (issue 8): forward_train from empty caches saves O(T·d) per layer and backward runs the ops' backwards in
// reverse (o_proj, output gate, flash-style attention backward, RoPE transpose, qk-norm, q/k/v projections).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/kernels/norm.hpp"
#include "hymix/kernels/rope.hpp"
#include "hymix/mixer/concepts.hpp"
#include "hymix/mixer/kv_cache.hpp"
#include "hymix/ops/attention.hpp"
#include "hymix/ops/attention_backward.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/elementwise_backward.hpp"
#include "hymix/ops/linear.hpp"
#include "hymix/ops/linear_backward.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/ops/rope_backward.hpp"

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
    dtype kv_dtype = dtype::f32;      // storage of the KV cache: f32, or bf16 / f16 (half the bytes; see kv_cache)

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
        if (!kv_cache::supported(kv_dtype))
            throw config_error("attention_config: kv_dtype must be F32, BF16 or F16, found " + std::string(dtype_name(kv_dtype)));
    }
};

/// Weights in the Hugging Face layout (no biases).
struct attention_weights {
    linear_weight q_proj;  // self_attn.q_proj.weight [H·d_h·(output_gate ? 2 : 1), d]; with the gate, rows viewed [H, 2·d_h]
    linear_weight k_proj;  // self_attn.k_proj.weight [H_kv·d_h, d]
    linear_weight v_proj;  // self_attn.v_proj.weight [H_kv·d_h, d]
    linear_weight o_proj;  // self_attn.o_proj.weight [d, H·d_h]
    tensor<float> q_norm;  // self_attn.q_norm.weight [d_h] (only with qk-norm)
    tensor<float> k_norm;  // self_attn.k_norm.weight [d_h] (only with qk-norm)

    /// Throws shape_error naming the tensor, with expected and found shapes.
    void validate(const attention_config& c) const {
        auto need = [](const auto& t, std::vector<std::int64_t> s, const char* name) {
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

    /// Visits every present tensor as f(name, tensor) with its Hugging Face name relative to the layer
    /// ("q_proj.weight", ..., "q_norm.weight" and "k_norm.weight" only with qk-norm), in that order.
    template <class F>
    void for_each(F&& f) {
        visit(*this, f);
    }
    template <class F>
    void for_each(F&& f) const {
        visit(*this, f);
    }
    /// Same tensors and shapes, all zero: the gradient accumulator of backward.
    attention_weights zeros_like() const {
        attention_weights z;
        auto zero = [](const auto& t) { return t.data() ? tensor<float>(t.shape()) : tensor<float>(); };
        z.q_proj = zero(q_proj);
        z.k_proj = zero(k_proj);
        z.v_proj = zero(v_proj);
        z.o_proj = zero(o_proj);
        z.q_norm = zero(q_norm);
        z.k_norm = zero(k_norm);
        return z;
    }

    /// Random weights for tests and benchmarks: projections uniform in ±1/sqrt(fan_in); norm weights near their
    /// identity value (0 for zero-centred, 1 for plain) with a ±0.2 perturbation so the tests see them.
    static attention_weights random(const attention_config& c, std::uint64_t seed) {
        c.validate();
        std::mt19937_64 g(seed);
        auto fill = [&g](auto& t, float lo, float hi) {  // tensor<float> or linear_weight
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

private:
    template <class W, class F>
    static void visit(W& w, F& f) {
        const auto one = [&f](const char* name, auto& t) {
            if (t.rank() > 0) visit_param(f, std::string_view(name), t);  // present (a 16-bit weight has no fp32 data)
        };
        one("q_proj.weight", w.q_proj);
        one("k_proj.weight", w.k_proj);
        one("v_proj.weight", w.v_proj);
        one("o_proj.weight", w.o_proj);
        one("q_norm.weight", w.q_norm);
        one("k_norm.weight", w.k_norm);
    }
};

/// What attention::forward_train keeps for backward: O(T·d) floats per layer (about 2·q_rows + 4·kv_rows + H·d_h + H
/// per token), never a [T, T] matrix. Reusable across calls (tensors are reallocated only when the shapes change).
struct attention_train_cache {
    std::int64_t n_rows = 0;
    std::vector<std::int64_t> starts, lengths;  // the batch's sequences: backward checks it gets the same batch
    std::vector<std::int64_t> pos;              // [N] position of each row in its sequence (0 outside)
    std::vector<unsigned char> live;            // [N] 1 for rows inside a sequence
    tensor<float> qproj;  // [N, q_rows]     q_proj output: pre-norm queries (and the gate pre-activations)
    tensor<float> kproj;  // [N, H_kv·d_h]   k_proj output before qk-norm (only with qk-norm)
    tensor<float> q;      // [N, H, d_h]     queries after qk-norm and RoPE
    tensor<float> k;      // [N, H_kv, d_h]  keys after qk-norm and RoPE
    tensor<float> v;      // [N, H_kv, d_h]
    tensor<float> o;      // [N, H, d_h]     attention output before the gate (0 outside sequences)
    tensor<float> lse;    // [N, H]          its natural-log LSE
    // Scratch of forward_train and backward (not read across calls), kept so that repeated steps neither allocate nor
    // page-fault: a = o ⊙ σ(gate), da, dq, dk, dv, dqproj, one dx term.
    mutable tensor<float> ws_a, ws_da, ws_dq, ws_dk, ws_dv, ws_dqproj, ws_dx;
};

/// The attention mixer's state is a KV cache (mixer/kv_cache.hpp).
using attention_state = kv_cache;

/// The attention mixer (see docs/architecture.md for the contract).
class attention {
public:
    using config_type = attention_config;
    using weights_type = attention_weights;
    using state_type = attention_state;
    using train_cache = attention_train_cache;
    static constexpr kind_info kind{layer_kind::attention, {"full_attention", "attention"}};

    /// Validates both (config_error / shape_error).
    attention(attention_config c, attention_weights w) : cfg_(c), w_(std::move(w)) {
        cfg_.validate();
        w_.validate(cfg_);
    }

    const attention_config& config() const noexcept { return cfg_; }
    const attention_weights& weights() const noexcept { return w_; }
    /// Mutable weights for the optimizer (the layer caches nothing derived from them).
    attention_weights& weights_mut() noexcept { return w_; }
    /// An empty KV cache with `n_slots` slots (call reserve() on it to pre-size the capacity).
    attention_state make_state(std::int64_t n_slots) const {
        return attention_state(n_slots, cfg_.n_kv_heads, cfg_.head_dim, 0, cfg_.kv_dtype);
    }
    /// Stores the KV cache of states made from now on in `d` (f32, bf16 or f16; attention_config::kv_dtype). Throws
    /// config_error for another dtype.
    void set_kv_dtype(dtype d) {
        attention_config c = cfg_;
        c.kv_dtype = d;
        c.validate();
        cfg_ = c;
    }

    /// Any token counts (chunked prefill; dispatches to the decode kernel when every sequence has one token).
    /// x, y [n_rows, d_model]; appends each valid sequence's keys/values to its slot. `batch` is a seq_batch or a
    /// validated_batch from a stack. Throws shape_error on bad shapes, slots out of range or a state built for another
    /// layer shape.
    template <host_backend B, batch_like Batch>
    void forward(const B& be, attention_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        std::optional<validated_batch> tmp;
        const validated_batch& vb = as_validated(batch, st.n_slots(), tmp);
        run(be, st, vb, x, y, vb.is_decode(), {});
    }

    /// Decode step: every sequence must have exactly one token (else shape_error).
    template <host_backend B, batch_like Batch>
    void step(const B& be, attention_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        const seq_batch& b = batch;
        for (std::int64_t i = 0; i < b.n_seq(); ++i)
            if (b.lengths[static_cast<std::size_t>(i)] != 1)
                throw shape_error("attention::step: sequence " + std::to_string(i) + " has " +
                                  std::to_string(b.lengths[static_cast<std::size_t>(i)]) + " tokens, expected 1");
        std::optional<validated_batch> tmp;
        run(be, st, as_validated(batch, st.n_slots(), tmp), x, y, true, {});
    }

    /// Sparse queries (spec.md §5.6 true-sparse inference): every valid row's key and value go to the KV cache, but
    /// only rows with fire[r] != 0 pay for the query projection, attention and o_proj; the other rows of y are 0.
    /// fire [n_rows] (empty: every row fires, as forward). Equal to forward followed by zeroing unfired rows.
    template <host_backend B, batch_like Batch>
    void forward_sparse(const B& be, attention_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                        std::span<const unsigned char> fire) const {
        const seq_batch& b = batch;
        if (!fire.empty() && static_cast<std::int64_t>(fire.size()) != b.n_rows)
            throw shape_error("attention::forward_sparse: fire mask has " + std::to_string(fire.size()) + " entries for " +
                              std::to_string(b.n_rows) + " rows");
        std::optional<validated_batch> tmp;
        const validated_batch& vb = as_validated(batch, st.n_slots(), tmp);
        run(be, st, vb, x, y, vb.is_decode(), fire);
    }

    /// Training forward from empty KV caches over the sequences of `batch` (packed; slots are ignored): as forward on a
    /// fresh state (the same ops, so the same values), saving what backward needs in `tc`. x, y [n_rows, d_model];
    /// rows outside every sequence get y = 0. Throws shape_error on bad shapes or overlapping sequences.
    template <host_backend B>
    void forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                       train_cache& tc) const {
        check_train_batch(batch, "attention::forward_train");
        const std::int64_t d = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, dh = cfg_.head_dim, N = batch.n_rows;
        const std::int64_t qr = cfg_.q_rows(), kr = cfg_.kv_rows(), ad = H * dh;
        x.require_shape({N, d}, "attention::forward_train", "x");
        y.require_shape({N, d}, "attention::forward_train", "y");
        tc.n_rows = N;
        tc.starts = batch.starts;
        tc.lengths = batch.lengths;
        tc.pos.assign(static_cast<std::size_t>(N), 0);
        tc.live.assign(static_cast<std::size_t>(N), 0);
        for (std::int64_t s = 0; s < batch.n_seq(); ++s)
            for (std::int64_t t = 0; t < batch.lengths[static_cast<std::size_t>(s)]; ++t) {
                const auto r = static_cast<std::size_t>(batch.starts[static_cast<std::size_t>(s)] + t);
                tc.pos[r] = t;
                tc.live[r] = 1;
            }
        const bool qkn = cfg_.qk_norm.mode != qk_norm_mode::none;
        ensure(tc.qproj, {N, qr});
        if (qkn) ensure(tc.kproj, {N, kr});
        ensure(tc.q, {N, H, dh});
        ensure(tc.k, {N, Hkv, dh});
        ensure(tc.v, {N, Hkv, dh});
        ensure(tc.o, {N, H, dh});
        ensure(tc.lse, {N, H});
        if (N == 0) return;

        // 1. Projections; q (and k with qk-norm) copied out of the raw projections, which backward needs.
        ops::linear(be, x, w_.q_proj, nullptr, tc.qproj.view<2>());
        const tensor_view<float, 2> k2(tc.k.data(), {N, kr}), v2(tc.v.data(), {N, kr});
        ops::linear(be, x, w_.k_proj, nullptr, qkn ? tc.kproj.view<2>() : k2);
        ops::linear(be, x, w_.v_proj, nullptr, v2);
        ops::copy(be, query_view(tc.qproj), tc.q.view<3>());
        if (qkn) ops::copy(be, tensor_view<const float, 3>(tc.kproj.data(), {N, Hkv, dh}), tc.k.view<3>());

        // 2. qk-norm, RoPE at each row's position in its sequence.
        if (qkn) {
            ops::rms_norm_heads(be, tc.q.view<3>(), w_.q_norm.data(), static_cast<float>(cfg_.qk_norm.eps), qk_flavor());
            ops::rms_norm_heads(be, tc.k.view<3>(), w_.k_norm.data(), static_cast<float>(cfg_.qk_norm.eps), qk_flavor());
        }
        const std::int64_t d_rot = cfg_.rope_dims();
        if (d_rot > 0) {
            ops::rope(be, tc.q.view<3>(), tc.pos, cfg_.rope.mode, cfg_.rope.theta, d_rot);
            ops::rope(be, tc.k.view<3>(), tc.pos, cfg_.rope.mode, cfg_.rope.theta, d_rot);
        }

        // 3. One attention problem per sequence (its queries are all its keys), with the LSE kept.
        std::vector<kernels::attention_problem<float>> probs;
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const std::int64_t r0 = batch.starts[static_cast<std::size_t>(s)], T = batch.lengths[static_cast<std::size_t>(s)];
            if (T == 0) continue;
            kernels::attention_problem<float> p;
            p.q = tensor_view<const float, 3>(tc.q.view<3>().slice(r0, T));
            p.k = tensor_view<const float, 3>(tc.k.view<3>().slice(r0, T));
            p.v = tensor_view<const float, 3>(tc.v.view<3>().slice(r0, T));
            p.o = tc.o.view<3>().slice(r0, T);
            p.lse = tc.lse.view<2>().slice(r0, T);
            probs.push_back(p);
        }
        ops::attention_prefill(be, std::span<const kernels::attention_problem<float>>(probs), {cfg_.scale, cfg_.sliding_window});
        ops::zero_rows(be, tensor_view<float, 2>(tc.o.data(), {N, ad}), tc.live);

        // 4. Output gate on a copy of o, then o_proj.
        ensure(tc.ws_a, {N, H, dh});
        gated_output(be, tc, tc.ws_a);
        ops::linear(be, tensor_view<const float, 2>(tc.ws_a.data(), {N, ad}), w_.o_proj, nullptr, y);
    }

    /// Backward of forward_train over the same batch, cache `tc` and input x: dx [n_rows, d_model] is overwritten (0
    /// outside sequences); the weight gradients are accumulated into g (shaped as the weights: weights().zeros_like()).
    /// dy rows outside sequences are ignored. Runs o_proj → output gate → attention → RoPE transpose → qk-norm →
    /// q/k/v projections. Throws shape_error on bad shapes, a cache of another batch, or g of another shape.
    template <host_backend B>
    void backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x,
                  tensor_view<const float, 2> dy, tensor_view<float, 2> dx, weights_type& g) const {
        const char* who = "attention::backward";
        check_train_batch(batch, who);
        const std::int64_t d = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, dh = cfg_.head_dim, N = batch.n_rows;
        const std::int64_t qr = cfg_.q_rows(), kr = cfg_.kv_rows(), ad = H * dh;
        if (tc.n_rows != N || tc.starts != batch.starts || tc.lengths != batch.lengths)
            throw shape_error(std::string(who) + ": train_cache was filled by forward_train on another batch (" +
                              std::to_string(tc.n_rows) + " rows, " + std::to_string(tc.starts.size()) + " sequences; this batch has " +
                              std::to_string(N) + " rows, " + std::to_string(batch.n_seq()) + " sequences)");
        const bool qkn = cfg_.qk_norm.mode != qk_norm_mode::none;
        tc.qproj.view<2>().require_shape({N, qr}, who, "train_cache.qproj");  // a cache of another layer shape
        if (qkn) tc.kproj.view<2>().require_shape({N, kr}, who, "train_cache.kproj");
        tc.q.view<3>().require_shape({N, H, dh}, who, "train_cache.q");
        tc.k.view<3>().require_shape({N, Hkv, dh}, who, "train_cache.k");
        x.require_shape({N, d}, who, "x");
        dy.require_shape({N, d}, who, "dy");
        dx.require_shape({N, d}, who, "dx");
        g.validate(cfg_);
        if (N == 0) return;

        // 1. o_proj: da = dy · W_o (rows outside sequences dropped), dW_o += dyᵀ · a with a = o ⊙ σ(gate) recomputed.
        tensor<float>& a = tc.ws_a;
        tensor<float>& da = tc.ws_da;
        tensor<float>& dqproj = tc.ws_dqproj;
        tensor<float>& dq = tc.ws_dq;
        tensor<float>& dk = tc.ws_dk;
        tensor<float>& dv = tc.ws_dv;
        tensor<float>& dxt = tc.ws_dx;
        ensure(a, {N, H, dh});
        ensure(da, {N, H, dh});
        ensure(dqproj, {N, qr});
        ensure(dq, {N, H, dh});
        ensure(dk, {N, Hkv, dh});
        ensure(dv, {N, Hkv, dh});
        ensure(dxt, {N, d});
        gated_output(be, tc, a);
        const tensor_view<float, 2> da2(da.data(), {N, ad});
        ops::linear_backward(be, tensor_view<const float, 2>(a.data(), {N, ad}), w_.o_proj.view<2>(), dy, da2, g.o_proj.view<2>(), nullptr);
        ops::zero_rows(be, da2, tc.live);

        // 2. Output gate: do = da ⊙ σ(gate) in place, dgate into the gate channels of dqproj.
        if (cfg_.output_gate)
            ops::mul_sigmoid_backward(be, tensor_view<const float, 3>(tc.o.view<3>()), gate_view(tc.qproj), tensor_view<const float, 3>(da.view<3>()),
                                      da.view<3>(), gate_view(dqproj), tc.live);

        // 3. Attention backward per sequence: dq, dk, dv (0 outside sequences).
        ops::zero_rows(be, tensor_view<float, 2>(dq.data(), {N, ad}), tc.live);
        ops::zero_rows(be, tensor_view<float, 2>(dk.data(), {N, kr}), tc.live);
        ops::zero_rows(be, tensor_view<float, 2>(dv.data(), {N, kr}), tc.live);
        std::vector<kernels::attention_backward_problem<float>> probs;
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const std::int64_t r0 = batch.starts[static_cast<std::size_t>(s)], T = batch.lengths[static_cast<std::size_t>(s)];
            if (T == 0) continue;
            kernels::attention_backward_problem<float> p;
            p.q = tc.q.view<3>().slice(r0, T);
            p.k = tc.k.view<3>().slice(r0, T);
            p.v = tc.v.view<3>().slice(r0, T);
            p.o = tc.o.view<3>().slice(r0, T);
            p.lse = tc.lse.view<2>().slice(r0, T);
            p.dout = tensor_view<const float, 3>(da.view<3>().slice(r0, T));
            p.dq = dq.view<3>().slice(r0, T);
            p.dk = dk.view<3>().slice(r0, T);
            p.dv = dv.view<3>().slice(r0, T);
            probs.push_back(p);
        }
        ops::attention_prefill_backward(be, std::span<const kernels::attention_backward_problem<float>>(probs),
                                        {cfg_.scale, cfg_.sliding_window});

        // 4. RoPE transpose, then qk-norm backward into the raw projections' gradients.
        const std::int64_t d_rot = cfg_.rope_dims();
        if (d_rot > 0) {
            ops::rope_backward(be, dq.view<3>(), tc.pos, cfg_.rope.mode, cfg_.rope.theta, d_rot);
            ops::rope_backward(be, dk.view<3>(), tc.pos, cfg_.rope.mode, cfg_.rope.theta, d_rot);
        }
        const auto dq_raw = query_view(dqproj);  // [N, H, d_h] query channels of dqproj
        if (qkn) {
            const auto eps = static_cast<float>(cfg_.qk_norm.eps);
            ops::rms_norm_heads_backward(be, query_view(tc.qproj), w_.q_norm.data(), eps, qk_flavor(), tensor_view<const float, 3>(dq.view<3>()),
                                         dq_raw, g.q_norm.data());
            ops::rms_norm_heads_backward(be, tensor_view<const float, 3>(tc.kproj.data(), {N, Hkv, dh}), w_.k_norm.data(), eps, qk_flavor(),
                                         tensor_view<const float, 3>(dk.view<3>()), dk.view<3>(), g.k_norm.data());
        } else {
            ops::copy(be, tensor_view<const float, 3>(dq.view<3>()), dq_raw);
        }

        // 5. Projections: dx = dqproj · W_q + dk · W_k + dv · W_v, dW += dᵀ · x.
        ops::linear_backward(be, x, w_.q_proj.view<2>(), tensor_view<const float, 2>(dqproj.view<2>()), dx, g.q_proj.view<2>(), nullptr);
        ops::linear_backward(be, x, w_.k_proj.view<2>(), tensor_view<const float, 2>(dk.data(), {N, kr}), dxt.view<2>(), g.k_proj.view<2>(), nullptr);
        ops::add_rows(be, dx, tensor_view<const float, 2>(dxt.view<2>()), tc.live);
        ops::linear_backward(be, x, w_.v_proj.view<2>(), tensor_view<const float, 2>(dv.data(), {N, kr}), dxt.view<2>(), g.v_proj.view<2>(), nullptr);
        ops::add_rows(be, dx, tensor_view<const float, 2>(dxt.view<2>()), tc.live);
        ops::zero_rows(be, dx, tc.live);
    }

private:
    /// Sequences inside [0, n_rows), not overlapping; slots are not used by training.
    static void check_train_batch(const seq_batch& batch, const char* who) {
        seq_batch b = batch;
        for (std::size_t i = 0; i < b.slots.size(); ++i) b.slots[i] = static_cast<std::int64_t>(i);
        try {
            b.validate();
        } catch (const shape_error& e) {
            throw shape_error(std::string(who) + ": " + e.what());
        }
    }
    static void ensure(tensor<float>& t, std::vector<std::int64_t> shape) {
        if (t.shape() != shape || !t.data()) t = tensor<float>(std::move(shape));
    }
    kernels::rms_flavor qk_flavor() const {
        return cfg_.qk_norm.mode == qk_norm_mode::plain ? kernels::rms_flavor::plain : kernels::rms_flavor::zero_centered;
    }
    /// [N, H, d_h] query channels of a [N, q_rows] projection (every other d_h block with the output gate).
    template <class T>
    tensor_view<T, 3> query_view(T* p, std::int64_t N) const {
        const std::int64_t dh = cfg_.head_dim;
        return tensor_view<T, 3>(p, {N, cfg_.n_heads, dh}, {cfg_.q_rows(), cfg_.output_gate ? 2 * dh : dh, 1});
    }
    tensor_view<const float, 3> query_view(const tensor<float>& t) const { return query_view(t.data(), t.dim(0)); }
    tensor_view<float, 3> query_view(tensor<float>& t) const { return query_view(t.data(), t.dim(0)); }
    /// [N, H, d_h] gate channels of a [N, q_rows] projection (output gate only).
    tensor_view<const float, 3> gate_view(const tensor<float>& t) const {
        const std::int64_t dh = cfg_.head_dim;
        return tensor_view<const float, 3>(t.data() + dh, {t.dim(0), cfg_.n_heads, dh}, {cfg_.q_rows(), 2 * dh, 1});
    }
    tensor_view<float, 3> gate_view(tensor<float>& t) const {
        const std::int64_t dh = cfg_.head_dim;
        return tensor_view<float, 3>(t.data() + dh, {t.dim(0), cfg_.n_heads, dh}, {cfg_.q_rows(), 2 * dh, 1});
    }
    /// a = o ⊙ σ(gate) on the live rows (a = o without the gate); o is 0 outside sequences.
    template <host_backend B>
    void gated_output(const B& be, const train_cache& tc, tensor<float>& a) const {
        ops::copy(be, tc.o.view<3>(), a.view<3>());
        if (cfg_.output_gate) ops::mul_sigmoid(be, a.view<3>(), gate_view(tc.qproj), tc.live);
    }

    template <host_backend B>
    void run(const B& be, attention_state& st, const validated_batch& vb, tensor_view<const float, 2> x, tensor_view<float, 2> y,
             bool decode, std::span<const unsigned char> fire) const {
        const seq_batch& batch = vb.batch();
        const std::int64_t d = cfg_.d_model, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, dh = cfg_.head_dim;
        const std::int64_t N = x.dim(0);
        x.require_shape({batch.n_rows, d}, "attention: x");
        y.require_shape({batch.n_rows, d}, "attention: y");
        if (st.n_kv_heads() != Hkv || st.head_dim() != dh)
            throw shape_error("attention: state holds [H_kv, d_h] = [" + std::to_string(st.n_kv_heads()) + ", " +
                              std::to_string(st.head_dim()) + "], the layer needs [" + std::to_string(Hkv) + ", " +
                              std::to_string(dh) + "]");
        if (N == 0) return;

        // Positions of the rows of valid sequences, and the query rows (every live row, or the fired ones).
        const auto covered = vb.live();
        std::vector<std::int64_t> pos(static_cast<std::size_t>(N), 0);
        std::int64_t need = 0;
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const auto i = static_cast<std::size_t>(s);
            if (batch.slots[i] < 0 || batch.lengths[i] == 0) continue;
            const std::int64_t past = st.length(batch.slots[i]);
            for (std::int64_t t = 0; t < batch.lengths[i]; ++t) pos[static_cast<std::size_t>(batch.starts[i] + t)] = past + t;
            need = std::max(need, st.stored(batch.slots[i]) + batch.lengths[i]);
        }
        const bool dense = fire.empty();
        std::vector<std::int64_t> qrow_of;  // sparse: query row -> token row
        std::vector<std::int64_t> qidx;     // sparse: token row -> query row or -1
        if (!dense) {
            qidx.assign(static_cast<std::size_t>(N), -1);
            for (std::int64_t r = 0; r < N; ++r)
                if (covered[static_cast<std::size_t>(r)] && fire[static_cast<std::size_t>(r)]) {
                    qidx[static_cast<std::size_t>(r)] = static_cast<std::int64_t>(qrow_of.size());
                    qrow_of.push_back(r);
                }
        }
        const std::int64_t Nq = dense ? N : static_cast<std::int64_t>(qrow_of.size());

        // 1. Projections: k, v for every row; q for the query rows.
        const std::int64_t qr = cfg_.q_rows(), kr = cfg_.kv_rows(), ad = H * dh;
        // One uninitialised workspace: q [Nq, qr], k [N, kr], v [N, kr], attention output a [Nq, H·d_h], and in the
        // sparse case the gathered query inputs xq [Nq, d] and projected rows yq [Nq, d].
        const std::int64_t extra = dense ? 0 : Nq * 2 * d;
        const std::unique_ptr<float[]> ws(new float[static_cast<std::size_t>(Nq * (qr + ad) + 2 * N * kr + extra + 1)]);
        const tensor_view<float, 2> q(ws.get(), {Nq, qr}), k(q.data + Nq * qr, {N, kr}), v(k.data + N * kr, {N, kr}),
            a(v.data + N * kr, {Nq, ad});
        tensor_view<const float, 2> xq = x;
        if (!dense) {
            tensor_view<float, 2> g(a.data + Nq * ad, {Nq, d});
            ops::gather_rows(be, x, qrow_of, g);
            xq = g;
        }
        ops::linear(be, xq, w_.q_proj, nullptr, q);
        ops::linear(be, x, w_.k_proj, nullptr, k);
        ops::linear(be, x, w_.v_proj, nullptr, v);

        // 2. qk-norm, then RoPE at each row's position.
        const std::int64_t qh_stride = cfg_.output_gate ? 2 * dh : dh;
        tensor_view<float, 3> qv(q.data, {Nq, H, dh}, {qr, qh_stride, 1});  // queries [Nq, H, d_h]
        tensor_view<float, 3> kv(k.data, {N, Hkv, dh});                     // keys [N, H_kv, d_h]
        if (cfg_.qk_norm.mode != qk_norm_mode::none) {
            const auto fl = cfg_.qk_norm.mode == qk_norm_mode::plain ? kernels::rms_flavor::plain : kernels::rms_flavor::zero_centered;
            const auto eps = static_cast<float>(cfg_.qk_norm.eps);
            ops::rms_norm_heads(be, qv, w_.q_norm.data(), eps, fl);
            ops::rms_norm_heads(be, kv, w_.k_norm.data(), eps, fl);
        }
        const std::int64_t d_rot = cfg_.rope_dims();
        if (d_rot > 0) {
            std::vector<std::int64_t> qpos;
            if (!dense)
                for (auto r : qrow_of) qpos.push_back(pos[static_cast<std::size_t>(r)]);
            ops::rope(be, qv, dense ? std::span<const std::int64_t>(pos) : std::span<const std::int64_t>(qpos), cfg_.rope.mode,
                      cfg_.rope.theta, d_rot);
            ops::rope(be, kv, pos, cfg_.rope.mode, cfg_.rope.theta, d_rot);
        }

        // 3. Append every valid row's key / value to its sequence's cache, then attend. A run of consecutive query
        //    rows of one sequence is one problem (its queries are the last rows of the keys it sees).
        st.ensure(need);
        st.with_kv_type([&](auto kv_tag) {  // problems over the cache's element type (f32, bf16 or f16)
            using KV = decltype(kv_tag);
            std::vector<kernels::attention_problem<float, KV>> probs;
            for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
                const auto i = static_cast<std::size_t>(s);
                const std::int64_t slot = batch.slots[i], T = batch.lengths[i], r0 = batch.starts[i];
                if (slot < 0 || T == 0) continue;
                const std::int64_t past = st.length(slot);
                st.write(be, slot, past, tensor_view<const float, 3>(k.data + r0 * kr, {T, Hkv, dh}),
                         tensor_view<const float, 3>(v.data + r0 * kr, {T, Hkv, dh}));
                for (std::int64_t t = 0; t < T;) {
                    const std::int64_t qi = dense ? r0 + t : qidx[static_cast<std::size_t>(r0 + t)];
                    if (qi < 0) {
                        ++t;
                        continue;
                    }
                    std::int64_t e = t + 1;
                    while (e < T && (dense || qidx[static_cast<std::size_t>(r0 + e)] >= 0)) ++e;
                    // Keys [from, past + e): all stored ones, or with a sliding window only those a query of the run can
                    // see (the queries stay the last rows of the keys, so the bottom-right mask is unchanged).
                    const std::int64_t Tk = past + e, w = cfg_.sliding_window;
                    const std::int64_t from = w > 0 ? std::max(st.first(slot), Tk - (e - t) - w + 1) : st.first(slot);
                    kernels::attention_problem<float, KV> p;
                    p.q = tensor_view<const float, 3>(qv.slice(qi, e - t));
                    p.k = st.template key_range<KV>(slot, from, Tk);
                    p.v = st.template value_range<KV>(slot, from, Tk);
                    p.o = tensor_view<float, 3>(&a(qi, 0), {e - t, H, dh});
                    probs.push_back(p);
                    t = e;
                }
            }
            const kernels::attention_params prm{cfg_.scale, cfg_.sliding_window};
            if (decode)
                ops::attention_decode(be, std::span<const kernels::attention_problem<float, KV>>(probs), prm);
            else
                ops::attention_prefill(be, std::span<const kernels::attention_problem<float, KV>>(probs), prm);
        });
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const auto i = static_cast<std::size_t>(s);
            if (batch.slots[i] < 0 || batch.lengths[i] == 0) continue;
            const std::int64_t len = st.length(batch.slots[i]) + batch.lengths[i];
            st.set_length(batch.slots[i], len);
            // A sliding window keeps the cache bounded: drop what no later query can see, once that is a window's worth.
            if (cfg_.sliding_window > 0) st.evict_before(batch.slots[i], len - cfg_.sliding_window, cfg_.sliding_window);
        }

        // 4. Rows outside valid sequences are zero (every query row of a valid sequence was written by the kernel);
        //    output gate σ(gate) per head channel, then o_proj (zero rows of a give zero rows of y).
        const std::vector<unsigned char> ones(dense ? 0 : static_cast<std::size_t>(Nq), 1);
        const std::span<const unsigned char> qcovered = dense ? covered : std::span<const unsigned char>(ones);
        ops::zero_rows(be, a, qcovered);
        if (cfg_.output_gate)
            ops::mul_sigmoid(be, tensor_view<float, 3>(a.data, {Nq, H, dh}), tensor_view<const float, 3>(q.data + dh, {Nq, H, dh}, {qr, 2 * dh, 1}),
                             qcovered);
        if (dense) {
            ops::linear(be, tensor_view<const float, 2>(a), w_.o_proj, nullptr, y);
        } else {
            tensor_view<float, 2> yq(a.data + Nq * ad + Nq * d, {Nq, d});
            ops::linear(be, tensor_view<const float, 2>(a), w_.o_proj, nullptr, yq);
            ops::zero_rows(be, y, std::vector<unsigned char>(static_cast<std::size_t>(N), 0));
            ops::scatter_rows(be, tensor_view<const float, 2>(yq), qrow_of, y);
        }
    }

    attention_config cfg_;
    attention_weights w_;
};

static_assert(mixer<attention, cpu_backend>);
static_assert(mixer<attention, reference_backend>);

/// fp64 KV cache of every slot for attention_layer_ref: per slot the post-RoPE keys and the values of every token
/// seen, [n, H_kv, d_h] flattened (the reference twin of kv_cache, never evicting).
struct attention_ref_cache {
    std::int64_t h_kv = 0, d_h = 0;
    std::vector<std::vector<double>> k, v;  // [S][n · H_kv · d_h]
    attention_ref_cache(const attention_config& c, std::int64_t n_slots)
        : h_kv(c.n_kv_heads), d_h(c.head_dim), k(static_cast<std::size_t>(n_slots)), v(static_cast<std::size_t>(n_slots)) {}
    std::int64_t length(std::int64_t slot) const {
        return static_cast<std::int64_t>(k.at(static_cast<std::size_t>(slot)).size()) / (h_kv * d_h);
    }
    void reset_slot(std::int64_t i) {
        k.at(static_cast<std::size_t>(i)).clear();
        v.at(static_cast<std::size_t>(i)).clear();
    }
    void copy_slot(std::int64_t from, std::int64_t to) {
        k.at(static_cast<std::size_t>(to)) = k.at(static_cast<std::size_t>(from));
        v.at(static_cast<std::size_t>(to)) = v.at(static_cast<std::size_t>(from));
    }
};

/// The whole layer in fp64 over a batch (the common *_layer_ref signature), continuing each slot's cache: projections,
/// qk-norm, RoPE at absolute positions (fp32 angles as in the fast path), append to the cache, attention with a
/// materialised causal (and window) mask over every cached key, output gate, o_proj. x, y [n_rows, d_model]; rows
/// outside valid sequences get y = 0. Throws config_error / shape_error on bad arguments.
inline void attention_layer_ref(const attention_config& c, const attention_weights& w, const seq_batch& batch,
                                tensor_view<const double, 2> x, attention_ref_cache& st, tensor_view<double, 2> y) {
    c.validate();
    w.validate(c);
    const std::int64_t H = c.n_heads, Hkv = c.n_kv_heads, dh = c.head_dim, qr = c.q_rows(), kr = c.kv_rows(), d = c.d_model;
    x.require_shape({batch.n_rows, d}, "attention_layer_ref: x");
    y.require_shape({batch.n_rows, d}, "attention_layer_ref: y");
    batch.validate(static_cast<std::int64_t>(st.k.size()));
    for (std::int64_t r = 0; r < batch.n_rows; ++r)
        for (std::int64_t i = 0; i < d; ++i) y(r, i) = 0;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const auto si = static_cast<std::size_t>(s);
        const std::int64_t slot = batch.slots[si], T = batch.lengths[si], r0 = batch.starts[si];
        if (slot < 0 || T == 0) continue;
        const std::int64_t past = st.length(slot);
        const tensor_view<const double, 2> xs(&x(r0, 0), {T, d}, {x.strides[0], x.strides[1]});
        tensor<double> q({T, qr}), k({T, kr}), v({T, kr}), o({T, H * dh});
        kernels::linear_ref<double, float, double>(xs, w.q_proj.view<2>(), nullptr, q.view<2>());
        kernels::linear_ref<double, float, double>(xs, w.k_proj.view<2>(), nullptr, k.view<2>());
        kernels::linear_ref<double, float, double>(xs, w.v_proj.view<2>(), nullptr, v.view<2>());
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
            for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = past + t;
            kernels::rope_ref(qv, pos, c.rope.mode, c.rope.theta, c.rope_dims());
            kernels::rope_ref(kv, pos, c.rope.mode, c.rope.theta, c.rope_dims());
        }
        auto& kc = st.k[static_cast<std::size_t>(slot)];
        auto& vc = st.v[static_cast<std::size_t>(slot)];
        kc.insert(kc.end(), k.data(), k.data() + T * kr);
        vc.insert(vc.end(), v.data(), v.data() + T * kr);
        kernels::attention_problem<double> p;
        p.q = qv;
        p.k = tensor_view<const double, 3>(kc.data(), {past + T, Hkv, dh});
        p.v = tensor_view<const double, 3>(vc.data(), {past + T, Hkv, dh});
        p.o = tensor_view<double, 3>(o.data(), {T, H, dh});
        kernels::attention_ref(p, {c.scale, c.sliding_window});
        if (c.output_gate)
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t ch = 0; ch < dh; ++ch)
                        o.data()[(t * H + h) * dh + ch] *= sigmoid(q.data()[t * qr + h * 2 * dh + dh + ch]);
        tensor_view<double, 2> ys(&y(r0, 0), {T, d}, {y.strides[0], y.strides[1]});
        kernels::linear_ref<double, float, double>(tensor_view<const double, 2>(o.view<2>()), w.o_proj.view<2>(), nullptr, ys);
    }
}

/// One sequence from position 0 with a fresh cache: x [T, d_model] → y [T, d_model].
inline void attention_layer_ref(const attention_config& c, const attention_weights& w, tensor_view<const double, 2> x,
                                tensor_view<double, 2> y) {
    attention_ref_cache st(c, 1);
    attention_layer_ref(c, w, seq_batch::dense(1, x.dim(0)), x, st, y);
}

/// Mixer-level hooks used by generic tests (tests/support/mixer_harness.hpp).
inline attention_ref_cache make_ref_state(const attention& m, std::int64_t n_slots) { return attention_ref_cache(m.config(), n_slots); }
inline void layer_ref(const attention& m, const seq_batch& b, tensor_view<const double, 2> x, attention_ref_cache& st,
                      tensor_view<double, 2> y) {
    attention_layer_ref(m.config(), m.weights(), b, x, st, y);
}

}  // namespace hymix
