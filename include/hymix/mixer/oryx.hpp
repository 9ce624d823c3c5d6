// The Oryx multi-mixer layer (spec.md §6.2–6.5): one head structure whose keys, values, output gate, gated norm and
// output projection are shared by a softmax-attention read-out (W_Q^attn, RoPE, KV cache) and a linear read-out
// (Gated DeltaNet or Mamba-2 SSD with W_Q^lin); every token updates both the KV cache and the linear state and a
// per-token mode selects the read-out. Inference forward and step, training forward_train and backward; the
// config, weights and state are in oryx_config.hpp, the fp64 reference in oryx_ref.hpp. Source: arXiv 2605.28769 as
// summarised in spec.md §6.1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/rope.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/mixer/concepts.hpp"
#include "hymix/mixer/kv_cache.hpp"
#include "hymix/mixer/oryx_config.hpp"
#include "hymix/mixer/oryx_ref.hpp"
#include "hymix/ops/attention.hpp"
#include "hymix/ops/attention_backward.hpp"
#include "hymix/ops/conv1d.hpp"
#include "hymix/ops/conv1d_backward.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/gated_delta.hpp"
#include "hymix/ops/gated_delta_backward.hpp"
#include "hymix/ops/gates_backward.hpp"
#include "hymix/ops/linear.hpp"
#include "hymix/ops/linear_backward.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/ops/rope_backward.hpp"
#include "hymix/ops/ssd.hpp"
#include "hymix/ops/ssd_backward.hpp"
#include "hymix/schedule/mode_schedule.hpp"

namespace hymix {

namespace detail {

/// One valid sequence of a call: rows [start, start + len) and its slot (the state slot; in training a dense index).
struct oryx_seq {
    std::int64_t start = 0, len = 0, slot = 0;
};

/// The row bookkeeping of one Oryx call, computed once: valid sequences, each row's read-out, the attention rows
/// (in row order, so a run of consecutive attention rows of one sequence is a contiguous block) and positions.
struct oryx_plan {
    std::int64_t n = 0;                  // rows of the token matrix
    std::vector<oryx_seq> seqs;          // valid sequences (slot >= 0, length > 0)
    seq_batch kb;                        // the same sequences as a batch for the linear kernels
    std::vector<unsigned char> live;     // [n] row of a valid sequence
    std::vector<unsigned char> attn;     // [n] live row read out by attention
    std::vector<unsigned char> lin;      // [n] live row read out by the linear mixer
    std::vector<std::int64_t> qrow_of;   // [Nq] the attention rows
    std::vector<std::int64_t> qidx;      // [n] index of an attention row in qrow_of, else −1
    std::vector<std::int64_t> pos;       // [n] absolute position of a live row (0 elsewhere)
    std::vector<std::int64_t> qpos;      // [Nq]
    std::int64_t n_lin = 0;

    std::int64_t nq() const noexcept { return static_cast<std::int64_t>(qrow_of.size()); }
    /// Every row is an attention row: the queries are x itself (no gather).
    bool dense_q() const noexcept { return nq() == n; }
};

/// Builds the plan. modes [n] (empty: `dflt` everywhere; nonzero = attention); past(slot) the tokens already in a
/// slot (0 in training). dense_slots: the sequences' kernel slots become 0, 1, ... (training: one zero state each).
/// Throws shape_error on a mode list of the wrong length or sequences outside [0, n) or overlapping.
template <class Past>
oryx_plan make_oryx_plan(const seq_batch& b, std::span<const unsigned char> modes, token_mode dflt, Past&& past, bool dense_slots) {
    oryx_plan p;
    p.n = b.n_rows;
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(b.n_rows, 0));
    if (!modes.empty() && modes.size() != n)
        throw shape_error("oryx: mode list has " + std::to_string(modes.size()) + " entries for " + std::to_string(n) + " rows");
    p.live.assign(n, 0);
    p.attn.assign(n, 0);
    p.lin.assign(n, 0);
    p.qidx.assign(n, -1);
    p.pos.assign(n, 0);
    p.kb.n_rows = b.n_rows;
    for (std::int64_t s = 0; s < b.n_seq(); ++s) {
        const auto i = static_cast<std::size_t>(s);
        const std::int64_t r0 = b.starts[i], len = b.lengths[i], slot = b.slots[i];
        if (len < 0 || r0 < 0 || r0 + len > b.n_rows)
            throw shape_error("oryx: sequence " + std::to_string(s) + " rows [" + std::to_string(r0) + ", " + std::to_string(r0 + len) +
                              ") outside [0, " + std::to_string(b.n_rows) + ")");
        if (slot < 0 || len == 0) continue;
        const std::int64_t ks = dense_slots ? static_cast<std::int64_t>(p.seqs.size()) : slot;
        p.seqs.push_back({r0, len, ks});
        p.kb.add(r0, len, ks);
        const std::int64_t p0 = past(slot);
        for (std::int64_t t = 0; t < len; ++t) {
            const auto r = static_cast<std::size_t>(r0 + t);
            if (p.live[r]) throw shape_error("oryx: sequences overlap in the token matrix at row " + std::to_string(r));
            p.live[r] = 1;
            p.pos[r] = p0 + t;
            const bool a = modes.empty() ? dflt == token_mode::attention : modes[r] != 0;
            p.attn[r] = a ? 1 : 0;
            p.lin[r] = a ? 0 : 1;
            p.n_lin += a ? 0 : 1;
        }
    }
    for (std::size_t r = 0; r < n; ++r)
        if (p.attn[r]) {
            p.qidx[r] = static_cast<std::int64_t>(p.qrow_of.size());
            p.qrow_of.push_back(static_cast<std::int64_t>(r));
            p.qpos.push_back(p.pos[r]);
        }
    return p;
}

/// [rows, H·d_h] as heads [rows, H, d_h].
template <class T>
tensor_view<T, 3> oryx_heads(tensor_view<T, 2> v, std::int64_t H, std::int64_t dh) {
    return tensor_view<T, 3>(v.data, {v.dim(0), H, dh}, {v.strides[0], dh, 1});
}
template <class T>
tensor_view<const T, 3> oryx_heads(const tensor<T>& t, std::int64_t H, std::int64_t dh) {
    return tensor_view<const T, 3>(t.data(), {t.dim(0), H, dh}, {H * dh, dh, 1});
}
template <class T>
tensor_view<T, 3> oryx_heads(tensor<T>& t, std::int64_t H, std::int64_t dh) {
    return tensor_view<T, 3>(t.data(), {t.dim(0), H, dh}, {H * dh, dh, 1});
}

/// Per-thread scratch of the inference path, grown to the largest call seen on the thread.
inline std::vector<float>& oryx_workspace() {
    thread_local std::vector<float> ws;
    return ws;
}

}  // namespace detail

/// The Oryx layer. forward(): any token counts (chunked prefill; the decode kernels when every sequence has one
/// token); step(): one token per sequence. The mode of each row comes from a per-row byte list (1 = attention read-out,
/// 0 = linear read-out) or, without one, the config's default_mode. Work skipped for a row by its mode (spec.md §6.4):
/// an attention row of a linear token is never built (no q_a projection, no RoPE on q_a, no attention problem: problems
/// cover runs of attention rows only). Not skipped: the linear read-out of attention tokens (o_t = S_tᵀq_t is fused into
/// the chunked / step state-update kernels, 2·H·d_h² per token against their ≈ 5·H·d_h² update, and the short conv on
/// q_l must see every token anyway), so the linear kernels write o for every row and attention rows overwrite theirs.
class oryx {
public:
    using config_type = oryx_config;
    using weights_type = oryx_weights;
    using state_type = oryx_state;
    static constexpr kind_info kind{layer_kind('O', "oryx"), {"oryx", "multi_mixer"}};

    /// Validates both (config_error / shape_error).
    oryx(oryx_config c, oryx_weights w) : cfg_(c), w_(std::move(w)) {
        cfg_.validate();
        w_.validate(cfg_);
    }

    const oryx_config& config() const noexcept { return cfg_; }
    const oryx_weights& weights() const noexcept { return w_; }
    /// Mutable weights for the optimizer; nothing is cached from them (A = −exp(A_log) is derived per call).
    oryx_weights& weights_mut() noexcept { return w_; }

    /// Stores the KV cache of states made from now on in `d` (f32, the default, or bf16 / f16: half the bytes an
    /// attention read-out reads; see kv_cache). Throws config_error for another dtype.
    void set_kv_dtype(dtype d) {
        if (!kv_cache::supported(d))
            throw config_error("oryx: the KV cache is stored in F32, BF16 or F16, not " + std::string(dtype_name(d)));
        kv_dtype_ = d;
    }
    dtype kv_dtype() const noexcept { return kv_dtype_; }

    /// An empty state of n_slots slots (KV cache empty, linear and conv states zero).
    oryx_state make_state(std::int64_t n_slots) const {
        if (n_slots < 0) throw shape_error("oryx::make_state: negative slot count " + std::to_string(n_slots));
        oryx_state s;
        s.kv = kv_cache(n_slots, cfg_.n_heads, cfg_.head_dim, 0, kv_dtype_);
        s.lin = tensor<float>({n_slots, cfg_.n_heads, cfg_.head_dim, cfg_.head_dim});
        s.conv = tensor<float>({n_slots, cfg_.conv_dim(), cfg_.d_conv - 1});
        return s;
    }

    /// y [n_rows, d] = layer(x [n_rows, d]) with every row in the default mode. See the 6-argument overload.
    template <host_backend B, batch_like Batch>
    void forward(const B& be, oryx_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        forward(be, st, batch, x, y, std::span<const unsigned char>());
    }
    /// y [n_rows, d] = layer(x [n_rows, d]) with row r read out in mode modes[r] (1 attention, 0 linear; empty: the
    /// default). Every valid row appends RoPE(k), v to its slot's KV cache and updates the linear and conv states
    /// whatever its mode. Rows outside valid sequences get y = 0. Throws shape_error on bad shapes, slots or mode list.
    template <host_backend B, batch_like Batch>
    void forward(const B& be, oryx_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                 std::span<const unsigned char> modes) const {
        st.validate(cfg_);
        std::optional<validated_batch> tmp;
        const validated_batch& vb = as_validated(batch, st.n_slots(), tmp);
        run(be, st, vb, x, y, modes, vb.is_decode());
    }

    /// Decode step: every sequence must hold exactly one token (shape_error otherwise). Default mode.
    template <host_backend B, batch_like Batch>
    void step(const B& be, oryx_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        step(be, st, batch, x, y, std::span<const unsigned char>());
    }
    /// Decode step with a mode per row.
    template <host_backend B, batch_like Batch>
    void step(const B& be, oryx_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
              std::span<const unsigned char> modes) const {
        const seq_batch& b = batch;
        for (std::int64_t i = 0; i < b.n_seq(); ++i)
            if (b.lengths[static_cast<std::size_t>(i)] != 1)
                throw shape_error("oryx::step: sequence " + std::to_string(i) + " has " + std::to_string(b.lengths[static_cast<std::size_t>(i)]) +
                                  " tokens, a decode step takes exactly 1");
        st.validate(cfg_);
        std::optional<validated_batch> tmp;
        run(be, st, as_validated(batch, st.n_slots(), tmp), x, y, modes, true);
    }

    // ---- Training (issue 10 on issue 8's engine): forward_train keeps O(T·d) activations, backward runs the ops'
    // backwards in reverse. Every row is in one mode (a per-row list, e.g. a block_random draw): W_Q^attn sees only
    // the attention rows' gradients, the linear read-out only the linear rows' (spec.md §6.5); the tied K, V, G, O,
    // norm and convs get both.

    /// What forward_train keeps for backward, per token 11·H·d_h + 4·H floats for GDN (10·H·d_h + 4·H for Mamba-2) plus
    /// H·d_h + H per attention row (O(T·d); no [T, T] matrix: the
    /// attention backward recomputes its probabilities from q, k and the LSE; the linear mixer's chunk states are
    /// recomputed by its backward). Buffers grow and are reused across calls.
    struct train_cache {
        std::int64_t n_rows = 0;
        std::vector<unsigned char> attn;         // [n] 1: the row was read out by attention (live rows only)
        std::vector<float> qlp, kp, vp, g;       // [n, H·d_h] projections (the convs' inputs; g the norm's gate)
        std::vector<float> ga, gb, gv, gbeta;    // [n, H] gate pre-activations (GDN a, b; Mamba-2 dt) and gates (g, β; Δ)
        std::vector<float> ql, k, kl, v;         // [n, H·d_h] conv outputs: q_l, k (before RoPE), L2(k) (GDN), v
        std::vector<float> kr;                   // [n, H·d_h] RoPE(k): the attention keys
        std::vector<float> qa;                   // [Nq, H·d_h] RoPE(x W_Q^attnᵀ) of the attention rows
        std::vector<float> lse;                  // [Nq, H] their LSE
        std::vector<float> o, on;                // [n, H·d_h] the selected read-out and the gated norm's output
    };

    /// Training forward from empty states (KV cache, linear and conv states zero) over the sequences of `batch`
    /// (packed; slots are ignored, every sequence runs). x, y [n_rows, d]; modes [n_rows] (1 attention, 0 linear; empty:
    /// the config's default mode). Rows outside every sequence get y = 0. Equals forward() on a fresh state. Throws
    /// shape_error on bad shapes, overlapping sequences or a mode list of the wrong length.
    template <host_backend B>
    void forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y, train_cache& tc,
                       std::span<const unsigned char> modes = {}) const;

    /// Backward of forward_train (same batch): dy [n_rows, d] the gradient of y; dx [n_rows, d] overwritten (0 outside
    /// sequences); parameter gradients accumulated (+=) into g (from weights().zeros_like()). Order: W_O → gated norm →
    /// the attention rows' flash-style backward (RoPE transposed on q_a and k) and the linear rows' chunked backward
    /// (GDN: gated delta rule, gates; Mamba-2: SSD, Δ) → short convs (+ SiLU, L2) → the input projections. Throws
    /// shape_error on mismatched shapes or a cache of another batch.
    template <host_backend B>
    void backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x, tensor_view<const float, 2> dy,
                  tensor_view<float, 2> dx, oryx_weights& g) const;

private:
    /// The plan of a training call: every sequence runs from position 0 in a dense slot.
    detail::oryx_plan train_plan(const seq_batch& batch, std::span<const unsigned char> modes) const {
        seq_batch tb = batch;
        for (std::size_t i = 0; i < tb.slots.size(); ++i) tb.slots[i] = static_cast<std::int64_t>(i);
        return detail::make_oryx_plan(tb, modes, cfg_.default_mode, [](std::int64_t) { return std::int64_t{0}; }, true);
    }

    /// One run of consecutive attention rows of a sequence: rows r0 + [t, e) of the sequence starting at row r0, whose
    /// queries are qa rows [qi, qi + e − t); it sees the keys r0 + [0, e) (plus a slot's cached ones in inference).
    struct attention_run {
        std::int64_t seq, r0, t, e, qi;
    };
    static std::vector<attention_run> attention_runs(const detail::oryx_plan& p) {
        std::vector<attention_run> runs;
        for (std::size_t s = 0; s < p.seqs.size(); ++s) {
            const auto& sq = p.seqs[s];
            for (std::int64_t t = 0; t < sq.len;) {
                const std::int64_t qi = p.qidx[static_cast<std::size_t>(sq.start + t)];
                if (qi < 0) {
                    ++t;
                    continue;
                }
                std::int64_t e = t + 1;
                while (e < sq.len && p.qidx[static_cast<std::size_t>(sq.start + e)] >= 0) ++e;
                runs.push_back({static_cast<std::int64_t>(s), sq.start, t, e, qi});
                t = e;
            }
        }
        return runs;
    }

    kernels::conv_activation act() const noexcept {
        return cfg_.is_gdn() ? kernels::conv_activation::silu : kernels::conv_activation::none;
    }
    std::vector<float> a_vector() const {  // A = −exp(A_log) [H], fp32 (spec.md §0 dtype rules)
        std::vector<float> A(static_cast<std::size_t>(cfg_.n_heads));
        for (std::int64_t h = 0; h < cfg_.n_heads; ++h) A[static_cast<std::size_t>(h)] = -std::exp(w_.A_log[h]);
        return A;
    }
    void check_xy(const seq_batch& b, tensor_view<const float, 2> x, tensor_view<float, 2> y, const char* who) const {
        x.require_shape({b.n_rows, cfg_.d_model}, who, "x [n_rows, d_model]");
        y.require_shape({b.n_rows, cfg_.d_model}, who, "y [n_rows, d_model]");
        if (x.strides[1] != 1 || y.strides[1] != 1) throw shape_error(std::string(who) + ": x and y need unit inner stride");
    }

    /// Projections of every row: q_l, k, v, the gate (pre-conv) and the gates' pre-activations.
    template <host_backend B>
    void project(const B& be, tensor_view<const float, 2> x, tensor_view<float, 2> qlp, tensor_view<float, 2> kp, tensor_view<float, 2> vp,
                 tensor_view<float, 2> g, tensor_view<float, 2> ga, tensor_view<float, 2> gb) const {
        ops::linear(be, x, w_.q_lin_proj, nullptr, qlp);
        ops::linear(be, x, w_.k_proj, nullptr, kp);
        ops::linear(be, x, w_.v_proj, nullptr, vp);
        ops::linear(be, x, w_.g_proj, nullptr, g);
        if (cfg_.is_gdn()) {
            ops::linear(be, x, w_.a_proj, nullptr, ga);
            ops::linear(be, x, w_.b_proj, nullptr, gb);
        } else {
            ops::linear(be, x, w_.dt_proj, nullptr, ga);
        }
    }

    /// The short convs + φ per valid sequence, in channel blocks (whole heads) so the op has parallel work in decode:
    /// q_l (GDN: then L2 per head), k, and for GDN kl = L2(φ(conv_k(k))) from a copy of k's conv state (kcopy,
    /// [n_seq, H·d_h, K−1]) since the real one is advanced by the plain-k problem. conv [S, 3·H·d_h, K−1] is the state
    /// (null: zeros, not written: training).
    template <host_backend B>
    void convolve(const B& be, const detail::oryx_plan& p, tensor_view<const float, 2> qlp, tensor_view<const float, 2> kp,
                  tensor_view<const float, 2> vp, tensor_view<float, 2> ql, tensor_view<float, 2> k, tensor_view<float, 2> kl,
                  tensor_view<float, 2> v, float* conv, float* kcopy) const {
        const std::int64_t HD = cfg_.inner(), K = cfg_.d_conv, dh = cfg_.head_dim, cs = HD * (K - 1);
        const std::int64_t blk = dh * std::max<std::int64_t>(1, 128 / dh);
        const bool gdn = cfg_.is_gdn();
        std::vector<ops::conv_problem<>> probs;
        auto add = [&](const detail::oryx_seq& s, tensor_view<const float, 2> in, const tensor<float>& w, float* state,
                       tensor_view<float, 2> out, bool l2) {
            for (std::int64_t c0 = 0; c0 < HD; c0 += blk) {
                const std::int64_t cn = std::min(blk, HD - c0);
                ops::conv_problem<> pr;
                pr.x = tensor_view<const float, 2>(in.data + s.start * in.strides[0] + c0, {s.len, cn}, {in.strides[0], 1});
                pr.w = tensor_view<const float, 2>(w.data() + c0 * K, {cn, K});
                pr.state = state ? state + c0 * (K - 1) : nullptr;
                pr.out = tensor_view<float, 2>(out.data + s.start * out.strides[0] + c0, {s.len, cn}, {out.strides[0], 1});
                if (l2) {
                    pr.l2_group = dh;
                    pr.l2_eps = cfg_.l2_eps;
                }
                probs.push_back(pr);
            }
        };
        for (std::size_t i = 0; i < p.seqs.size(); ++i) {
            const auto& s = p.seqs[i];
            float* st = conv ? conv + s.slot * 3 * cs : nullptr;  // [3·H·d_h, K−1]
            float* kc = nullptr;
            if (gdn && st) {
                kc = kcopy + static_cast<std::int64_t>(i) * cs;
                std::copy_n(st + cs, cs, kc);
            }
            add(s, qlp, w_.conv_q, st, ql, gdn);
            add(s, kp, w_.conv_k, st ? st + cs : nullptr, k, false);
            if (gdn) add(s, kp, w_.conv_k, kc, kl, true);
            add(s, vp, w_.conv_v, st ? st + 2 * cs : nullptr, v, false);
        }
        ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(probs), act());
    }

    /// GDN: g = −exp(A_log)·softplus(a + dt_bias), β = σ(b). Mamba-2: Δ = softplus(dt + dt_bias) into gv.
    template <host_backend B>
    void gates(const B& be, tensor_view<const float, 2> ga, tensor_view<const float, 2> gb, tensor_view<float, 2> gv,
               tensor_view<float, 2> gbeta) const {
        if (cfg_.is_gdn())
            ops::gdn_gates(be, ga, gb, w_.dt_bias.data(), w_.A_log.data(), 0.f, false, gv, gbeta);
        else
            ops::ssd_delta(be, ga, w_.dt_bias.data(), 0.f, std::numeric_limits<float>::infinity(), gv);
    }

    /// The linear mixer over every valid sequence from/into lin [S, H, d_h, d_h] (slots of p.seqs): o [n, H·d_h] for
    /// every row (zero outside valid sequences). kk is the kernel's key: L2(k) for GDN, k (B) for Mamba-2.
    template <host_backend B>
    void linear_readout(const B& be, const detail::oryx_plan& p, tensor_view<const float, 2> ql, tensor_view<const float, 2> kk,
                        tensor_view<const float, 2> v, tensor_view<const float, 2> gv, tensor_view<const float, 2> gbeta,
                        tensor_view<float, 4> lin, tensor_view<float, 2> o, bool decode) const {
        const std::int64_t H = cfg_.n_heads, dh = cfg_.head_dim;
        const auto oh = detail::oryx_heads(o, H, dh);
        if (cfg_.is_gdn()) {
            const float scale = 1.f / std::sqrt(static_cast<float>(dh));
            if (decode)
                ops::gated_delta_step(be, p.kb, detail::oryx_heads(ql, H, dh), detail::oryx_heads(kk, H, dh), detail::oryx_heads(v, H, dh), gv,
                                      gbeta, scale, lin, oh);
            else
                ops::gated_delta_chunked(be, p.kb, detail::oryx_heads(ql, H, dh), detail::oryx_heads(kk, H, dh), detail::oryx_heads(v, H, dh),
                                         gv, gbeta, scale, lin, oh, cfg_.gdn_chunk);
        } else {
            const auto A = a_vector();
            kernels::ssd_inputs<float> in;
            in.x = detail::oryx_heads(v, H, dh);
            in.dt = gv;
            in.A = A.data();
            in.B = detail::oryx_heads(kk, H, dh);
            in.C = detail::oryx_heads(ql, H, dh);
            in.D = w_.D.data();
            std::vector<kernels::ssd_sequence<float>> seqs;
            for (const auto& s : p.seqs) seqs.push_back({s.start, s.len, &lin(s.slot, 0, 0, 0)});
            if (decode)
                ops::ssd_step(be, in, std::span<const kernels::ssd_sequence<float>>(seqs), oh);
            else
                ops::ssd_chunked(be, in, std::span<const kernels::ssd_sequence<float>>(seqs), cfg_.ssd_chunk, oh);
        }
        ops::zero_rows(be, o, std::span<const unsigned char>(p.live));
    }

    /// qa [Nq, H·d_h] = RoPE(x_q W_Q^attnᵀ) for the attention rows (x itself when every row is one).
    template <host_backend B>
    void attention_queries(const B& be, const detail::oryx_plan& p, tensor_view<const float, 2> x, tensor_view<float, 2> qa) const {
        if (p.dense_q()) {
            ops::linear(be, x, w_.q_attn_proj, nullptr, qa);
        } else {
            tensor<float> xq({p.nq(), cfg_.d_model});
            ops::gather_rows(be, x, p.qrow_of, xq.view<2>());
            ops::linear(be, tensor_view<const float, 2>(xq.view<2>()), w_.q_attn_proj, nullptr, qa);
        }
        ops::rope(be, detail::oryx_heads(qa, cfg_.n_heads, cfg_.head_dim), p.qpos, kernels::rope_mode::rotate_half, cfg_.rope_theta,
                  cfg_.head_dim);
    }

    /// on [n, H·d_h] = GatedRMSNorm(o, g) per head, norm-then-gate (o_norm shared by the heads).
    template <host_backend B>
    void output_norm(const B& be, tensor_view<const float, 2> o, tensor_view<const float, 2> g, tensor_view<float, 2> on) const {
        const std::int64_t H = cfg_.n_heads, dh = cfg_.head_dim;
        ops::gated_rms_norm(be, detail::oryx_heads(o, H, dh), detail::oryx_heads(g, H, dh), w_.o_norm.data(), dh,
                            kernels::gate_order::norm_then_gate, cfg_.norm_eps, detail::oryx_heads(on, H, dh));
    }
    /// y = GatedRMSNorm(o, g) W_Oᵀ, zero outside valid sequences.
    template <host_backend B>
    void output(const B& be, const detail::oryx_plan& p, tensor_view<const float, 2> o, tensor_view<const float, 2> g, tensor_view<float, 2> on,
                tensor_view<float, 2> y) const {
        output_norm(be, o, g, on);
        ops::linear(be, tensor_view<const float, 2>(on), w_.o_proj, nullptr, y);
        ops::zero_rows(be, y, std::span<const unsigned char>(p.live));
    }

    template <host_backend B>
    void run(const B& be, oryx_state& st, const validated_batch& vb, tensor_view<const float, 2> x, tensor_view<float, 2> y,
             std::span<const unsigned char> modes, bool decode) const {
        const seq_batch& batch = vb.batch();
        check_xy(batch, x, y, "oryx");
        const auto p = detail::make_oryx_plan(batch, modes, cfg_.default_mode, [&](std::int64_t slot) { return st.kv.length(slot); }, false);
        const std::int64_t n = p.n, H = cfg_.n_heads, HD = cfg_.inner(), dh = cfg_.head_dim, K = cfg_.d_conv;
        if (n == 0) return;
        const bool gdn = cfg_.is_gdn();
        // Scratch: qlp, kp, vp, g, ql, k, v [n, H·d_h] (+ kl for GDN), ga, gb, gv, gbeta [n, H], the copies of k's
        // conv states, qa [Nq, H·d_h]. The read-out o and the normed output reuse kp and qlp (consumed by the convs).
        auto& ws = detail::oryx_workspace();
        const auto n_seq = static_cast<std::int64_t>(p.seqs.size());
        const std::int64_t need = n * HD * (gdn ? 8 : 7) + 4 * n * H + n_seq * HD * (K - 1) + p.nq() * HD;
        if (static_cast<std::int64_t>(ws.size()) < need) ws.resize(static_cast<std::size_t>(need));
        float* q = ws.data();
        auto take = [&](std::int64_t rows, std::int64_t cols) {
            tensor_view<float, 2> t(q, {rows, cols});
            q += rows * cols;
            return t;
        };
        const auto qlp = take(n, HD), kp = take(n, HD), vp = take(n, HD), g = take(n, HD), ql = take(n, HD), k = take(n, HD), v = take(n, HD),
                   kl = gdn ? take(n, HD) : tensor_view<float, 2>(), ga = take(n, H), gb = take(n, H), gv = take(n, H), gbeta = take(n, H),
                   kcopy = take(n_seq, HD * (K - 1)), qa = take(p.nq(), HD);
        const tensor_view<float, 2> o = kp;  // [n, H·d_h] read-out

        project(be, x, qlp, kp, vp, g, ga, gb);
        convolve(be, p, qlp, kp, vp, ql, k, kl, v, st.conv.data(), kcopy.data);
        gates(be, ga, gb, gv, gbeta);
        linear_readout(be, p, ql, gdn ? kl : k, v, gv, gbeta, st.lin.view<4>(), o, decode);

        // Every valid row's RoPE(k) and v go to its slot's cache; attention rows then attend over it.
        ops::rope(be, detail::oryx_heads(k, H, dh), p.pos, kernels::rope_mode::rotate_half, cfg_.rope_theta, dh);
        std::int64_t cap = 0;
        for (const auto& s : p.seqs) cap = std::max(cap, st.kv.stored(s.slot) + s.len);
        st.kv.ensure(cap);
        for (const auto& s : p.seqs)
            st.kv.write(be, s.slot, st.kv.length(s.slot), tensor_view<const float, 3>(k.data + s.start * HD, {s.len, H, dh}),
                        tensor_view<const float, 3>(v.data + s.start * HD, {s.len, H, dh}));
        if (p.nq() > 0) {
            attention_queries(be, p, x, qa);
            st.kv.with_kv_type([&](auto kv_tag) {  // problems over the cache's element type (f32, bf16 or f16)
                using KV = decltype(kv_tag);
                std::vector<kernels::attention_problem<float, KV>> probs;
                for (const auto& r : attention_runs(p)) {
                    const std::int64_t slot = p.seqs[static_cast<std::size_t>(r.seq)].slot, past = st.kv.length(slot);
                    kernels::attention_problem<float, KV> pr;
                    pr.q = detail::oryx_heads(tensor_view<const float, 2>(qa), H, dh).slice(r.qi, r.e - r.t);
                    pr.k = st.kv.template key_range<KV>(slot, st.kv.first(slot), past + r.e);
                    pr.v = st.kv.template value_range<KV>(slot, st.kv.first(slot), past + r.e);
                    pr.o = detail::oryx_heads(o, H, dh).slice(r.r0 + r.t, r.e - r.t);
                    probs.push_back(pr);
                }
                const std::span<const kernels::attention_problem<float, KV>> ps(probs);
                if (decode)
                    ops::attention_decode(be, ps, kernels::attention_params{});
                else
                    ops::attention_prefill(be, ps, kernels::attention_params{});
            });
        }
        for (const auto& s : p.seqs) st.kv.set_length(s.slot, st.kv.length(s.slot) + s.len);
        output(be, p, o, g, qlp, y);
    }

    oryx_config cfg_;
    oryx_weights w_;
    dtype kv_dtype_ = dtype::f32;  // storage of the KV cache of the states this layer makes
};

// ---- Training forward and backward ----------------------------------------------------------------------------

namespace detail {

/// Per-thread scratch of the Oryx training calls (grown to the largest call, reused).
inline std::vector<float>& oryx_train_workspace() {
    thread_local std::vector<float> ws;
    return ws;
}

inline void oryx_grow(std::vector<float>& v, std::int64_t m) {
    if (static_cast<std::int64_t>(v.size()) < m) v.resize(static_cast<std::size_t>(m));
}

}  // namespace detail

template <host_backend B>
void oryx::forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y, train_cache& tc,
                         std::span<const unsigned char> modes) const {
    check_xy(batch, x, y, "oryx::forward_train");
    const auto p = train_plan(batch, modes);
    const std::int64_t n = p.n, H = cfg_.n_heads, HD = cfg_.inner(), dh = cfg_.head_dim, nq = p.nq();
    const bool gdn = cfg_.is_gdn();
    tc.n_rows = n;
    tc.attn = p.attn;
    for (auto* b : {&tc.qlp, &tc.kp, &tc.vp, &tc.g, &tc.ql, &tc.k, &tc.v, &tc.kr, &tc.o, &tc.on}) detail::oryx_grow(*b, n * HD);
    if (gdn) detail::oryx_grow(tc.kl, n * HD);
    for (auto* b : {&tc.ga, &tc.gb, &tc.gv, &tc.gbeta}) detail::oryx_grow(*b, n * H);
    detail::oryx_grow(tc.qa, nq * HD);
    detail::oryx_grow(tc.lse, nq * H);
    if (n == 0) return;
    const auto mat = [](std::vector<float>& b, std::int64_t rows, std::int64_t cols) { return tensor_view<float, 2>(b.data(), {rows, cols}); };
    const auto qlp = mat(tc.qlp, n, HD), kp = mat(tc.kp, n, HD), vp = mat(tc.vp, n, HD), g = mat(tc.g, n, HD), ql = mat(tc.ql, n, HD),
               k = mat(tc.k, n, HD), kl = gdn ? mat(tc.kl, n, HD) : tensor_view<float, 2>(), v = mat(tc.v, n, HD), kr = mat(tc.kr, n, HD),
               o = mat(tc.o, n, HD), on = mat(tc.on, n, HD), ga = mat(tc.ga, n, H), gb = mat(tc.gb, n, H), gv = mat(tc.gv, n, H),
               gbeta = mat(tc.gbeta, n, H), qa = mat(tc.qa, nq, HD), lse = mat(tc.lse, nq, H);
    // 1. Projections; rows outside every sequence are zeroed so nothing there (padding, NaN) reaches the gradients.
    project(be, x, qlp, kp, vp, g, ga, gb);
    for (const auto& t : {qlp, kp, vp, g, ga, gb}) ops::zero_rows(be, t, std::span<const unsigned char>(p.live));
    // 2. Short convs from zero states, gates, and the linear read-out of every row from zero linear states.
    convolve(be, p, qlp, kp, vp, ql, k, kl, v, nullptr, nullptr);
    gates(be, ga, gb, gv, gbeta);
    auto& ws = detail::oryx_train_workspace();
    const std::int64_t S = std::max<std::int64_t>(static_cast<std::int64_t>(p.seqs.size()), 1), ssz = S * H * dh * dh;
    detail::oryx_grow(ws, ssz);
    std::fill_n(ws.begin(), ssz, 0.f);
    linear_readout(be, p, ql, gdn ? kl : k, v, gv, gbeta, tensor_view<float, 4>(ws.data(), {S, H, dh, dh}), o, false);
    // 3. Attention keys RoPE(k); the attention rows' queries and their runs overwrite o.
    ops::copy(be, detail::oryx_heads(tensor_view<const float, 2>(k), H, dh), detail::oryx_heads(kr, H, dh));
    ops::rope(be, detail::oryx_heads(kr, H, dh), p.pos, kernels::rope_mode::rotate_half, cfg_.rope_theta, dh);
    if (nq > 0) {
        attention_queries(be, p, x, qa);
        std::vector<kernels::attention_problem<float>> probs;
        for (const auto& r : attention_runs(p)) {
            kernels::attention_problem<float> pr;
            pr.q = detail::oryx_heads(tensor_view<const float, 2>(qa), H, dh).slice(r.qi, r.e - r.t);
            pr.k = tensor_view<const float, 3>(kr.data + r.r0 * HD, {r.e, H, dh});
            pr.v = tensor_view<const float, 3>(v.data + r.r0 * HD, {r.e, H, dh});
            pr.o = detail::oryx_heads(o, H, dh).slice(r.r0 + r.t, r.e - r.t);
            pr.lse = tensor_view<float, 2>(lse.data + r.qi * H, {r.e - r.t, H});
            probs.push_back(pr);
        }
        ops::attention_prefill(be, std::span<const kernels::attention_problem<float>>(probs), kernels::attention_params{});
    }
    // 4. Gated norm and W_O.
    output(be, p, o, g, on, y);
}

template <host_backend B>
void oryx::backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x, tensor_view<const float, 2> dy,
                    tensor_view<float, 2> dx, oryx_weights& gw) const {
    const std::int64_t n = batch.n_rows, d = cfg_.d_model, H = cfg_.n_heads, HD = cfg_.inner(), dh = cfg_.head_dim, K = cfg_.d_conv;
    x.require_shape({n, d}, "oryx::backward", "x [n_rows, d_model]");
    dy.require_shape({n, d}, "oryx::backward", "dy [n_rows, d_model]");
    dx.require_shape({n, d}, "oryx::backward", "dx [n_rows, d_model]");
    if (x.strides[1] != 1 || dy.strides[1] != 1 || dx.strides[1] != 1) throw shape_error("oryx::backward: x, dy and dx need unit inner stride");
    if (tc.n_rows != n || static_cast<std::int64_t>(tc.attn.size()) != n)
        throw shape_error("oryx::backward: the train_cache holds " + std::to_string(tc.n_rows) + " rows, the batch has " + std::to_string(n) +
                          " (run forward_train on this batch first)");
    gw.validate(cfg_);
    const auto p = train_plan(batch, tc.attn);
    const std::int64_t nq = p.nq();
    if (nq * HD > static_cast<std::int64_t>(tc.qa.size()))
        throw shape_error("oryx::backward: the train_cache holds fewer attention rows than the batch (run forward_train on this batch first)");
    if (n == 0) return;
    const bool gdn = cfg_.is_gdn();
    const std::span<const unsigned char> live(p.live);
    // Scratch.
    auto& ws = detail::oryx_train_workspace();
    const std::int64_t need = 2 * n * d + 16 * n * HD + 4 * n * H + nq * (HD + 2 * d) + H;
    detail::oryx_grow(ws, need);
    float* sp = ws.data();
    const auto take = [&](std::int64_t rows, std::int64_t cols) {
        tensor_view<float, 2> t(sp, {rows, cols});
        sp += rows * cols;
        return t;
    };
    const auto dym = take(n, d), tmp = take(n, d), don = take(n, HD), d_o = take(n, HD), dgate = take(n, HD), dol = take(n, HD),
               dkr = take(n, HD), dva = take(n, HD), dkrun = take(n, HD), dvrun = take(n, HD), dql = take(n, HD), dkl = take(n, HD),
               dvl = take(n, HD), dqlp = take(n, HD), dkp = take(n, HD), dkp2 = take(n, HD), dvp = take(n, HD), dgv = take(n, H),
               dbeta = take(n, H), dga = take(n, H), dgb = take(n, H), dqa = take(nq, HD), xq = take(nq, d), dxq = take(nq, d);
    float* dA = sp;
    const auto cmat = [](const std::vector<float>& b, std::int64_t rows, std::int64_t cols) {
        return tensor_view<const float, 2>(b.data(), {rows, cols});
    };
    const auto qlp = cmat(tc.qlp, n, HD), kp = cmat(tc.kp, n, HD), vp = cmat(tc.vp, n, HD), g = cmat(tc.g, n, HD), ql = cmat(tc.ql, n, HD),
               k = cmat(tc.k, n, HD), v = cmat(tc.v, n, HD), kr = cmat(tc.kr, n, HD), o = cmat(tc.o, n, HD), on = cmat(tc.on, n, HD),
               ga = cmat(tc.ga, n, H), gb = cmat(tc.gb, n, H), gv = cmat(tc.gv, n, H), gbeta = cmat(tc.gbeta, n, H), qa = cmat(tc.qa, nq, HD),
               lse = cmat(tc.lse, nq, H);
    const auto kl = gdn ? cmat(tc.kl, n, HD) : tensor_view<const float, 2>();
    const auto heads = [&](auto m) { return detail::oryx_heads(m, H, dh); };
    const auto rows = [&](auto m, std::int64_t r0, std::int64_t len) {  // rows [r0, r0 + len) of an [n, H·d_h] matrix as heads
        using V = decltype(detail::oryx_heads(m, H, dh));
        return V(m.data + r0 * m.strides[0], {len, H, dh}, {m.strides[0], dh, 1});
    };
    // 1. dy outside every sequence is ignored (y was zeroed there); W_O.
    ops::copy(be, tensor_view<const float, 3>(dy.data, {n, 1, d}, {dy.strides[0], d, 1}), tensor_view<float, 3>(dym.data, {n, 1, d}));
    ops::zero_rows(be, dym, live);
    ops::linear_backward(be, on, w_.o_proj.view<2>(), tensor_view<const float, 2>(dym), don, gw.o_proj.view<2>(), nullptr);
    // 2. Gated norm (norm-then-gate per head): dL/do and dL/dg.
    ops::gated_rms_norm_backward(be, heads(o), heads(g), w_.o_norm.data(), dh, kernels::gate_order::norm_then_gate, cfg_.norm_eps,
                                 heads(tensor_view<const float, 2>(don)), heads(d_o), heads(dgate), gw.o_norm.data());
    ops::zero_rows(be, dgate, live);
    // 3. Attention rows: flash-style backward per run. Runs of one sequence share its keys, so the j-th runs of all
    //    sequences go in one call (their dk, dv into per-sequence scratch), added onto the keys' and values' gradients.
    std::fill_n(dkr.data, n * HD, 0.f);
    std::fill_n(dva.data, n * HD, 0.f);
    if (nq > 0) {
        const auto runs = attention_runs(p);
        std::vector<std::vector<attention_run>> per_seq(p.seqs.size());
        for (const auto& r : runs) per_seq[static_cast<std::size_t>(r.seq)].push_back(r);
        std::vector<unsigned char> ones;
        for (std::size_t round = 0;; ++round) {
            std::vector<kernels::attention_backward_problem<float>> probs;
            std::vector<attention_run> used;
            for (const auto& rs : per_seq) {
                if (round >= rs.size()) continue;
                const auto& r = rs[round];
                kernels::attention_backward_problem<float> pr;
                pr.q = heads(qa).slice(r.qi, r.e - r.t);
                pr.k = rows(kr, r.r0, r.e);
                pr.v = rows(v, r.r0, r.e);
                pr.o = rows(o, r.r0 + r.t, r.e - r.t);
                pr.lse = tensor_view<const float, 2>(lse.data + r.qi * H, {r.e - r.t, H});
                pr.dout = rows(tensor_view<const float, 2>(d_o), r.r0 + r.t, r.e - r.t);
                pr.dq = heads(dqa).slice(r.qi, r.e - r.t);
                pr.dk = rows(dkrun, r.r0, r.e);
                pr.dv = rows(dvrun, r.r0, r.e);
                probs.push_back(pr);
                used.push_back(r);
            }
            if (probs.empty()) break;
            ops::attention_prefill_backward(be, std::span<const kernels::attention_backward_problem<float>>(probs), kernels::attention_params{});
            for (const auto& r : used) {
                ones.assign(static_cast<std::size_t>(r.e), 1);
                const auto sub = [&](tensor_view<float, 2> m) { return tensor_view<float, 2>(m.data + r.r0 * HD, {r.e, HD}); };
                ops::add_rows(be, sub(dkr), tensor_view<const float, 2>(sub(dkrun)), std::span<const unsigned char>(ones));
                ops::add_rows(be, sub(dva), tensor_view<const float, 2>(sub(dvrun)), std::span<const unsigned char>(ones));
            }
        }
        // RoPE transposed on the queries and keys; W_Q^attn from the attention rows only.
        ops::rope_backward(be, heads(dqa), p.qpos, kernels::rope_mode::rotate_half, cfg_.rope_theta, dh);
        if (p.dense_q()) {
            ops::copy(be, tensor_view<const float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}), tensor_view<float, 3>(xq.data, {n, 1, d}));
        } else {
            ops::gather_rows(be, x, p.qrow_of, xq);
        }
        ops::linear_backward(be, tensor_view<const float, 2>(xq), w_.q_attn_proj.view<2>(), tensor_view<const float, 2>(dqa), dxq,
                             gw.q_attn_proj.view<2>(), nullptr);
    }
    ops::rope_backward(be, heads(dkr), p.pos, kernels::rope_mode::rotate_half, cfg_.rope_theta, dh);
    // 4. Linear rows: the linear mixer's chunked backward from zero states with dL/do of the linear rows only.
    ops::copy(be, heads(tensor_view<const float, 2>(d_o)), heads(dol));
    ops::zero_rows(be, dol, std::span<const unsigned char>(p.lin));
    if (gdn) {
        ops::gated_delta_chunked_backward(be, p.kb, heads(ql), heads(kl), heads(v), gv, gbeta, 1.f / std::sqrt(static_cast<float>(dh)),
                                          tensor_view<const float, 4>(), heads(tensor_view<const float, 2>(dol)), heads(dql), heads(dkl),
                                          heads(dvl), dgv, dbeta, tensor_view<float, 4>(), cfg_.gdn_chunk);
        ops::gdn_gates_backward(be, ga, gb, w_.dt_bias.data(), w_.A_log.data(), 0.f, false, tensor_view<const float, 2>(dgv),
                                tensor_view<const float, 2>(dbeta), dga, dgb, gw.dt_bias.data(), gw.A_log.data());
    } else {
        const auto A = a_vector();
        kernels::ssd_inputs<float> in;
        in.x = heads(v);
        in.dt = gv;
        in.A = A.data();
        in.B = heads(k);
        in.C = heads(ql);
        in.D = w_.D.data();
        std::vector<kernels::ssd_backward_sequence<float>> seqs;
        for (const auto& s : p.seqs) {
            kernels::ssd_backward_sequence<float> bs;
            bs.start = s.start;
            bs.length = s.len;
            seqs.push_back(bs);
        }
        std::fill_n(dA, H, 0.f);
        kernels::ssd_grads<float> gr;
        gr.dx = heads(dvl);
        gr.ddt = dgv;
        gr.dB = heads(dkl);
        gr.dC = heads(dql);
        gr.dA = dA;
        gr.dD = gw.D.data();
        ops::ssd_chunked_backward(be, in, std::span<const kernels::ssd_backward_sequence<float>>(seqs), cfg_.ssd_chunk,
                                  heads(tensor_view<const float, 2>(dol)), gr);
        for (std::int64_t h = 0; h < H; ++h) gw.A_log[h] += dA[h] * A[static_cast<std::size_t>(h)];  // dA/dA_log = A
        ops::ssd_delta_backward(be, ga, w_.dt_bias.data(), 0.f, std::numeric_limits<float>::infinity(), tensor_view<const float, 2>(dgv), dga,
                                gw.dt_bias.data());
    }
    // 5. Short convs (+ SiLU, L2 for GDN) from the saved inputs. k feeds the attention keys (through RoPE) and the
    //    linear mixer's key (GDN: through its own L2, a second problem on the same input with its own dx).
    const std::span<const unsigned char> all(p.live);
    if (gdn) {
        ops::add_rows(be, dvl, tensor_view<const float, 2>(dva), all);
    } else {
        ops::add_rows(be, dvl, tensor_view<const float, 2>(dva), all);
        ops::add_rows(be, dkl, tensor_view<const float, 2>(dkr), all);
    }
    {
        std::vector<ops::conv_backward_problem<>> convs;
        const auto add = [&](const detail::oryx_seq& s, tensor_view<const float, 2> in, const tensor<float>& w, tensor<float>& dw,
                             tensor_view<const float, 2> dout, tensor_view<float, 2> din, bool l2) {
            ops::conv_backward_problem<> pr;
            pr.x = tensor_view<const float, 2>(in.data + s.start * HD, {s.len, HD});
            pr.w = w.view<2>();
            pr.dout = tensor_view<const float, 2>(dout.data + s.start * HD, {s.len, HD});
            pr.dx = tensor_view<float, 2>(din.data + s.start * HD, {s.len, HD});
            pr.dw = dw.view<2>();
            if (l2) {
                pr.l2_group = dh;
                pr.l2_eps = cfg_.l2_eps;
            }
            convs.push_back(pr);
        };
        for (const auto& s : p.seqs) {
            add(s, qlp, w_.conv_q, gw.conv_q, dql, dqlp, gdn);
            add(s, kp, w_.conv_k, gw.conv_k, gdn ? tensor_view<const float, 2>(dkr) : tensor_view<const float, 2>(dkl), dkp, false);
            if (gdn) add(s, kp, w_.conv_k, gw.conv_k, dkl, dkp2, true);
            add(s, vp, w_.conv_v, gw.conv_v, dvl, dvp, false);
        }
        ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(convs), act());
    }
    for (const auto& t : {dqlp, dkp, dkp2, dvp}) ops::zero_rows(be, t, live);
    if (gdn) ops::add_rows(be, dkp, tensor_view<const float, 2>(dkp2), all);
    (void)K;
    // 6. The input projections: dx = Σ d(proj) W_proj (+ the attention rows' query term); their weight gradients.
    ops::linear_backward(be, x, w_.q_lin_proj.view<2>(), tensor_view<const float, 2>(dqlp), dx, gw.q_lin_proj.view<2>(), nullptr);
    const auto accum = [&](tensor_view<float, 2> dp, const linear_weight& w, linear_weight& dw) {
        ops::linear_backward(be, x, w.view<2>(), tensor_view<const float, 2>(dp), tmp, dw.view<2>(), nullptr);
        ops::add_rows(be, dx, tensor_view<const float, 2>(tmp), all);
    };
    accum(dkp, w_.k_proj, gw.k_proj);
    accum(dvp, w_.v_proj, gw.v_proj);
    accum(dgate, w_.g_proj, gw.g_proj);
    if (gdn) {
        accum(dga, w_.a_proj, gw.a_proj);
        accum(dgb, w_.b_proj, gw.b_proj);
    } else {
        accum(dga, w_.dt_proj, gw.dt_proj);
    }
    if (nq > 0) {
        if (p.dense_q()) {
            ops::add_rows(be, dx, tensor_view<const float, 2>(dxq), all);
        } else {
            std::fill_n(tmp.data, n * d, 0.f);
            ops::scatter_rows(be, tensor_view<const float, 2>(dxq), p.qrow_of, tmp);
            ops::add_rows(be, dx, tensor_view<const float, 2>(tmp), all);
        }
    }
    ops::zero_rows(be, dx, live);
}

static_assert(mixer<oryx, cpu_backend>);
static_assert(mixer<oryx, reference_backend>);

/// Mixer-level hooks used by generic tests (tests/support/mixer_harness.hpp): the default mode of the config.
inline oryx_ref_slots make_ref_state(const oryx& m, std::int64_t n_slots) { return oryx_ref_slots(m.config(), n_slots); }
inline void layer_ref(const oryx& m, const seq_batch& b, tensor_view<const double, 2> x, oryx_ref_slots& st, tensor_view<double, 2> y) {
    oryx_layer_ref(m.config(), m.weights(), b, x, st, y);
}

}  // namespace hymix
