// The Gated DeltaNet mixer layer (spec.md §4.2, §4.4, §4.7): input projections, one causal depthwise conv + SiLU
// over [q | k | v], L2-normalised q/k, gates g and β, the gated delta rule (kernels/gated_delta.hpp), gated RMSNorm
// (norm-then-gate per head) and the output projection. Weights follow Hugging Face Qwen3.5 `linear_attn` names;
// fla's separate q/k/v projections and convs map onto in_proj_qkv / conv1d_weight by concatenating rows [q | k | v].
// Training (issue 8): forward_train saves O(T·d) activations, backward runs the ops' backwards in reverse order.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/kernels/linear.hpp"
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
#include "hymix/mixer/concepts.hpp"

namespace hymix {

/// Sizes of one Gated DeltaNet layer. Qwen3.5 keys: hidden_size, linear_num_key_heads, linear_num_value_heads,
/// linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim, rms_norm_eps.
struct gated_deltanet_config {
    std::int64_t d_model = 0;     // d
    std::int64_t n_k_heads = 0;   // H_k
    std::int64_t n_v_heads = 0;   // H_v, a multiple of H_k
    std::int64_t d_k = 0;         // key / query head width
    std::int64_t d_v = 0;         // value head width
    std::int64_t d_conv = 4;      // K, short-conv width
    std::int64_t chunk_size = 0;  // C of the chunked prefill; 0: the backend's choice (ops::gated_delta_chunk_length)
    float norm_eps = 1e-6f;       // gated norm eps (Qwen3.5 rms_norm_eps; fla uses 1e-5)
    float l2_eps = 1e-6f;         // inside the sqrt of the q/k L2 norm
    bool allow_neg_eigval = false;  // β = 2σ(b) instead of σ(b)
    float decay_floor = 0.f;      // optional clamp g ≤ −decay_floor (spec.md §8.11); 0 = none, as in Qwen3.5 / fla

    std::int64_t key_dim() const noexcept { return n_k_heads * d_k; }
    std::int64_t value_dim() const noexcept { return n_v_heads * d_v; }
    std::int64_t conv_dim() const noexcept { return 2 * key_dim() + value_dim(); }

    /// Throws config_error when a size is not positive or H_v is not a multiple of H_k.
    void validate() const {
        auto pos = [](std::int64_t v, const char* name) {
            if (v <= 0) throw config_error(std::string("gated_deltanet_config: ") + name + " must be > 0, found " + std::to_string(v));
        };
        pos(d_model, "d_model");
        pos(n_k_heads, "n_k_heads");
        pos(n_v_heads, "n_v_heads");
        pos(d_k, "d_k");
        pos(d_v, "d_v");
        pos(d_conv, "d_conv");
        if (chunk_size < 0)
            throw config_error("gated_deltanet_config: chunk_size must be > 0, or 0 for the backend's choice, found " +
                               std::to_string(chunk_size));
        if (n_v_heads % n_k_heads != 0)
            throw config_error("gated_deltanet_config: n_v_heads (" + std::to_string(n_v_heads) +
                               ") must be a multiple of n_k_heads (" + std::to_string(n_k_heads) + ")");
        if (!(norm_eps >= 0.f) || !(l2_eps >= 0.f) || !(decay_floor >= 0.f) || !std::isfinite(norm_eps) || !std::isfinite(l2_eps) ||
            !std::isfinite(decay_floor))
            throw config_error("gated_deltanet_config: norm_eps, l2_eps and decay_floor must be finite and >= 0, found " +
                               std::to_string(norm_eps) + ", " + std::to_string(l2_eps) + ", " + std::to_string(decay_floor));
    }
};

/// Weights of one layer, fp32, Hugging Face [out, in] layout (names of Qwen3.5 `model.layers.{i}.linear_attn.*`).
struct gated_deltanet_weights {
    linear_weight in_proj_qkv;    // in_proj_qkv.weight [2·key_dim + value_dim, d], rows [q | k | v]
    linear_weight in_proj_z;      // in_proj_z.weight   [value_dim, d]  (gate of the output norm)
    linear_weight in_proj_b;      // in_proj_b.weight   [H_v, d]        (β pre-activation)
    linear_weight in_proj_a;      // in_proj_a.weight   [H_v, d]        (decay pre-activation)
    tensor<float> conv1d_weight;  // conv1d.weight [conv_dim, 1, K] stored [conv_dim, K]; no bias
    tensor<float> dt_bias;        // dt_bias [H_v]
    tensor<float> A_log;          // A_log   [H_v]
    tensor<float> norm_weight;    // norm.weight [d_v], plain w shared by all heads
    linear_weight out_proj;       // out_proj.weight [d, value_dim]

    /// Throws shape_error naming the first tensor whose shape differs from the config.
    void validate(const gated_deltanet_config& c) const {
        auto need = [](const auto& t, std::vector<std::int64_t> want, const char* name) {
            if (t.shape() != want)
                throw shape_error(std::string("gated_deltanet_weights: ") + name + ": expected shape " + shape_string(want) +
                                  ", found " + shape_string(t.shape()));
        };
        need(in_proj_qkv, {c.conv_dim(), c.d_model}, "in_proj_qkv");
        need(in_proj_z, {c.value_dim(), c.d_model}, "in_proj_z");
        need(in_proj_b, {c.n_v_heads, c.d_model}, "in_proj_b");
        need(in_proj_a, {c.n_v_heads, c.d_model}, "in_proj_a");
        need(conv1d_weight, {c.conv_dim(), c.d_conv}, "conv1d_weight");
        need(dt_bias, {c.n_v_heads}, "dt_bias");
        need(A_log, {c.n_v_heads}, "A_log");
        need(norm_weight, {c.d_v}, "norm_weight");
        need(out_proj, {c.d_model, c.value_dim()}, "out_proj");
    }

    /// Every present tensor with its Hugging Face name relative to the layer (Qwen3.5 `linear_attn.*`), in a fixed
    /// order: f(std::string_view name, tensor<float>& t). conv1d.weight is held [conv_dim, K] (the checkpoint's
    /// [conv_dim, 1, K] without its unit axis).
    template <class F>
    void for_each(F&& f) {
        visit(*this, f);
    }
    template <class F>
    void for_each(F&& f) const {
        visit(*this, f);
    }

    /// Weights of the same shapes, all zero (gradient accumulators); fp32 weights only (value_error otherwise).
    gated_deltanet_weights zeros_like() const {
        gated_deltanet_weights z;
        // t.data() throws for a 16-bit weight: gradients are for fp32 weights.
        auto zero = [](const auto& t) { return t.rank() > 0 && t.data() ? tensor<float>(t.shape()) : tensor<float>(); };
        z.in_proj_qkv = zero(in_proj_qkv);
        z.in_proj_z = zero(in_proj_z);
        z.in_proj_b = zero(in_proj_b);
        z.in_proj_a = zero(in_proj_a);
        z.conv1d_weight = zero(conv1d_weight);
        z.dt_bias = zero(dt_bias);
        z.A_log = zero(A_log);
        z.norm_weight = zero(norm_weight);
        z.out_proj = zero(out_proj);
        return z;
    }

private:
    /// f(name, tensor) for every present tensor, in for_each's order (a linear_weight passed as itself).
    template <class Self, class F>
    static void visit(Self& w, F&& f) {
        auto v = [&](const char* name, auto& t) {
            if (t.rank() > 0) visit_param(f, std::string_view(name), t);
        };
        v("in_proj_qkv.weight", w.in_proj_qkv);
        v("in_proj_z.weight", w.in_proj_z);
        v("in_proj_b.weight", w.in_proj_b);
        v("in_proj_a.weight", w.in_proj_a);
        v("conv1d.weight", w.conv1d_weight);
        v("dt_bias", w.dt_bias);
        v("A_log", w.A_log);
        v("norm.weight", w.norm_weight);
        v("out_proj.weight", w.out_proj);
    }

public:
    /// Random weights with the Qwen3.5 initialisation (spec.md §4.5): linears N(0, 0.02), dt_bias = 1,
    /// A_log = log U(0.01, 16), norm weight 1; conv weights U(−1/√K, 1/√K) (PyTorch's default for a depthwise conv).
    static gated_deltanet_weights random(const gated_deltanet_config& c, std::uint64_t seed) {
        c.validate();
        std::mt19937_64 gen(seed);
        auto normal = [&](std::vector<std::int64_t> shape) {
            tensor<float> t(std::move(shape));
            std::normal_distribution<float> d(0.f, 0.02f);
            for (auto& x : t.span()) x = d(gen);
            return t;
        };
        gated_deltanet_weights w;
        w.in_proj_qkv = normal({c.conv_dim(), c.d_model});
        w.in_proj_z = normal({c.value_dim(), c.d_model});
        w.in_proj_b = normal({c.n_v_heads, c.d_model});
        w.in_proj_a = normal({c.n_v_heads, c.d_model});
        w.conv1d_weight = tensor<float>({c.conv_dim(), c.d_conv});
        const float bound = 1.f / std::sqrt(static_cast<float>(c.d_conv));
        std::uniform_real_distribution<float> cu(-bound, bound);
        for (auto& x : w.conv1d_weight.span()) x = cu(gen);
        w.dt_bias = tensor<float>({c.n_v_heads});
        w.dt_bias.fill(1.f);
        w.A_log = tensor<float>({c.n_v_heads});
        std::uniform_real_distribution<float> au(0.01f, 16.f);
        for (auto& x : w.A_log.span()) x = std::log(au(gen));
        w.norm_weight = tensor<float>({c.d_v});
        w.norm_weight.fill(1.f);
        w.out_proj = normal({c.d_model, c.value_dim()});
        return w;
    }
};

/// Recurrent state in numbered slots: the delta-rule state and the last K−1 pre-conv inputs of [q | k | v].
struct gated_deltanet_state {
    tensor<float> ssm;   // [S, H_v, d_k, d_v]
    tensor<float> conv;  // [S, conv_dim, K−1], oldest input in column 0

    std::int64_t n_slots() const noexcept { return ssm.rank() == 0 ? 0 : ssm.dim(0); }
    /// Zeroes slot i (a fresh sequence). Throws shape_error when i is out of range.
    void reset_slot(std::int64_t i) {
        check(i, "reset_slot");
        std::fill_n(ssm.data() + i * ssm_slot(), ssm_slot(), 0.f);
        std::fill_n(conv.data() + i * conv_slot(), conv_slot(), 0.f);
    }
    /// Slot `to` becomes a copy of slot `from`. Throws shape_error when either is out of range.
    void copy_slot(std::int64_t from, std::int64_t to) {
        check(from, "copy_slot");
        check(to, "copy_slot");
        if (from == to) return;
        std::copy_n(ssm.data() + from * ssm_slot(), ssm_slot(), ssm.data() + to * ssm_slot());
        std::copy_n(conv.data() + from * conv_slot(), conv_slot(), conv.data() + to * conv_slot());
    }

private:
    std::int64_t ssm_slot() const { return ssm.numel() / std::max<std::int64_t>(1, n_slots()); }
    std::int64_t conv_slot() const { return conv.numel() / std::max<std::int64_t>(1, n_slots()); }
    void check(std::int64_t i, const char* what) const {
        if (i < 0 || i >= n_slots())
            throw shape_error(std::string("gated_deltanet_state::") + what + ": slot " + std::to_string(i) + " outside [0, " +
                              std::to_string(n_slots()) + ")");
    }
};

namespace detail {

/// Checks x, y, state and batch of a mixer call against the config. Throws shape_error.
inline void check_gdn_call(const gated_deltanet_config& c, const gated_deltanet_state& st, const seq_batch& batch,
                           tensor_view<const float, 2> x, tensor_view<float, 2> y, bool validate_batch = true) {
    x.require_shape({batch.n_rows, c.d_model}, "gated_deltanet: x [n_rows, d_model]");
    y.require_shape({batch.n_rows, c.d_model}, "gated_deltanet: y [n_rows, d_model]");
    const std::int64_t S = st.n_slots();
    const std::vector<std::int64_t> ws{S, c.n_v_heads, c.d_k, c.d_v}, wc{S, c.conv_dim(), c.d_conv - 1};
    if (st.ssm.shape() != ws)
        throw shape_error("gated_deltanet: state.ssm: expected shape " + shape_string(ws) + ", found " + shape_string(st.ssm.shape()));
    if (st.conv.shape() != wc)
        throw shape_error("gated_deltanet: state.conv: expected shape " + shape_string(wc) + ", found " + shape_string(st.conv.shape()));
    if (validate_batch) batch.validate(S);
}

/// Per-thread scratch of the mixer, grown to the largest call seen on that thread and reused (so steady-state
/// decode and repeated prefill do not allocate or page-fault).
inline std::vector<float>& gdn_workspace() {
    thread_local std::vector<float> ws;
    return ws;
}

}  // namespace detail

/// Gated DeltaNet layer. forward(): any token counts (chunked prefill; dispatches to the step path when every
/// sequence has exactly one token); step(): one token per sequence. Both read and update the state slots of the
/// batch in place; rows outside valid sequences (padding, slot −1) get zero output.
class gated_deltanet {
public:
    using config_type = gated_deltanet_config;
    using weights_type = gated_deltanet_weights;
    using state_type = gated_deltanet_state;
    static constexpr kind_info kind{layer_kind::gated_deltanet, {"gated_deltanet", "linear_attention"}};

    /// Validates both (config_error / shape_error).
    gated_deltanet(gated_deltanet_config c, gated_deltanet_weights w) : cfg_(c), w_(std::move(w)) {
        cfg_.validate();
        w_.validate(cfg_);
    }

    const gated_deltanet_config& config() const noexcept { return cfg_; }
    const gated_deltanet_weights& weights() const noexcept { return w_; }
    /// Mutable weights for the optimizer. The layer caches nothing derived from them.
    gated_deltanet_weights& weights_mut() noexcept { return w_; }

    /// A zeroed state with n_slots slots: ssm [S, H_v, d_k, d_v], conv [S, conv_dim, K−1].
    gated_deltanet_state make_state(std::int64_t n_slots) const {
        if (n_slots < 0) throw shape_error("gated_deltanet::make_state: negative slot count " + std::to_string(n_slots));
        gated_deltanet_state s;
        s.ssm = tensor<float>({n_slots, cfg_.n_v_heads, cfg_.d_k, cfg_.d_v});
        s.conv = tensor<float>({n_slots, cfg_.conv_dim(), cfg_.d_conv - 1});
        return s;
    }
    /// The chunk length the delta rule runs at on backend be: config.chunk_size, or the backend's choice when it is 0.
    template <backend B>
    std::int64_t chunk_for(const B& be) const {
        return cfg_.chunk_size > 0 ? cfg_.chunk_size : ops::gated_delta_chunk_length(be, cfg_.d_k, cfg_.d_v);
    }

    /// y [n_rows, d] = layer(x [n_rows, d]) for every sequence of `batch` (a seq_batch, or a validated_batch from a
    /// stack), any lengths. fp32. Throws shape_error on mismatched x / y / state / batch.
    template <host_backend B, batch_like Batch>
    void forward(const B& be, gated_deltanet_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        detail::check_gdn_call(cfg_, st, batch, x, y, false);
        std::optional<validated_batch> tmp;
        const validated_batch& vb = as_validated(batch, st.n_slots(), tmp);
        run(be, st, vb, x, y, vb.is_decode());
    }

    /// Decode step: every sequence of `batch` must have exactly one token (else shape_error). fp32.
    template <host_backend B, batch_like Batch>
    void step(const B& be, gated_deltanet_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        const seq_batch& b = batch;
        detail::check_gdn_call(cfg_, st, b, x, y, false);
        for (std::int64_t s = 0; s < b.n_seq(); ++s)
            if (b.lengths[s] != 1)
                throw shape_error("gated_deltanet::step: sequence " + std::to_string(s) + " has " + std::to_string(b.lengths[s]) +
                                  " tokens, a decode step takes exactly 1");
        std::optional<validated_batch> tmp;
        run(be, st, as_validated(batch, st.n_slots(), tmp), x, y, true);
    }

    // ---- Training (issue 8): forward_train saves activations, backward runs the ops' backwards in reverse order. ----

    /// What forward_train saves for backward, per token: 2·conv_dim + 3·value_dim + 4·H_v floats (O(T·d); the chunk
    /// states of the delta rule, O(T·d_k·d_v / C), are recomputed by its backward). Buffers grow and are reused.
    struct train_cache {
        std::int64_t n_rows = 0;
        std::vector<float> qkv;          // [n, conv_dim]     projection x W_qkvᵀ (the conv's input), token-major
        std::vector<float> qkvc;         // [n · conv_dim]    conv + SiLU (+ L2 on q, k): head-major blocks, as forward
        std::vector<float> z;            // [n, value_dim]    gate projection x W_zᵀ
        std::vector<float> a_raw, b_raw; // [n, H_v]          x W_aᵀ, x W_bᵀ
        std::vector<float> g, beta;      // [n, H_v]          log-decay and β
        std::vector<float> o;            // [H_v, n, d_v]     delta-rule output, head-major
        std::vector<float> on;           // [n, value_dim]    gated norm output (out_proj's input)
    };

    /// Training forward from zero initial states (conv and recurrent) over the sequences of `batch` (packed; slots are
    /// ignored: every sequence runs). x, y [n_rows, d]; rows outside every sequence get y = 0. Saves into tc what
    /// backward needs. Throws shape_error on mismatched shapes or overlapping sequences.
    template <host_backend B>
    void forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                       train_cache& tc) const;

    /// Backward of forward_train: dy [n_rows, d] the gradient of y; dx [n_rows, d] overwritten (0 outside sequences);
    /// parameter gradients accumulated (+=) into g (made by weights().zeros_like()). x is the forward's input and tc what
    /// it saved. Order: out_proj → gated norm → gated delta rule → gates (a, b, dt_bias, A_log) → conv1d + SiLU + L2 of
    /// q/k → the four input projections. Throws shape_error on mismatched shapes.
    template <host_backend B>
    void backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x,
                  tensor_view<const float, 2> dy, tensor_view<float, 2> dx, gated_deltanet_weights& g) const;


private:
    template <host_backend B>
    void run(const B& be, gated_deltanet_state& st, const validated_batch& vb, tensor_view<const float, 2> x,
             tensor_view<float, 2> y, bool decode) const {
        const seq_batch& batch = vb.batch();
        const auto& c = cfg_;
        const std::int64_t n = batch.n_rows, Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v;
        const std::int64_t CD = c.conv_dim(), VD = c.value_dim(), KD = c.key_dim(), K = c.d_conv;
        if (n == 0) return;
        // Scratch from the per-thread workspace: qkv and its conv output [n, conv_dim], z and o [n, value_dim],
        // raw b, a and the gates g, β [n, H_v].
        auto& ws = detail::gdn_workspace();
        const std::int64_t need = n * (2 * CD + 2 * VD + 4 * Hv);
        if (static_cast<std::int64_t>(ws.size()) < need) ws.resize(static_cast<std::size_t>(need));
        float* p = ws.data();
        auto take = [&](std::int64_t cols) {
            tensor_view<float, 2> t(p, {n, cols});
            p += n * cols;
            return t;
        };
        const auto qkv = take(CD), qkvc = take(CD), z = take(VD), o = take(VD), braw = take(Hv), araw = take(Hv),
                   g = take(Hv), beta = take(Hv);
        // 1. Projections on every row (padding rows are computed and discarded).
        ops::linear(be, x, w_.in_proj_qkv, nullptr, qkv);
        ops::linear(be, x, w_.in_proj_z, nullptr, z);
        ops::linear(be, x, w_.in_proj_b, nullptr, braw);
        ops::linear(be, x, w_.in_proj_a, nullptr, araw);
        // 2. Causal depthwise conv + SiLU per valid sequence, carrying its conv state, then L2 norms of the q and k
        //    heads (eps inside the sqrt) fused in the conv op. Prefill writes head-major buffers (q, k heads
        //    [2·H_k, n, d_k], then v heads [H_v, n, d_v]; one problem per (sequence, head)) so the chunked kernel
        //    streams contiguous rows; decode keeps token-major rows [n, conv_dim] (one problem per sequence).
        //    Rows of padding / invalid entries stay unwritten: nothing downstream reads them.
        const bool head_major = !decode;
        const std::int64_t n_blk = head_major ? 2 * Hk + Hv : 1;
        auto blk_col = [&](std::int64_t i) { return i < 2 * Hk ? i * dk : 2 * KD + (i - 2 * Hk) * dv; };
        auto blk_width = [&](std::int64_t i) { return head_major ? (i < 2 * Hk ? dk : dv) : CD; };
        auto blk_data = [&](std::int64_t i) { return qkvc.data + n * blk_col(i); };  // head-major [n, width]
        {
            std::vector<ops::conv_problem<>> convs;
            for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
                if (batch.slots[s] < 0 || batch.lengths[s] == 0) continue;
                for (std::int64_t blk = 0; blk < n_blk; ++blk) {
                    const std::int64_t c0 = head_major ? blk_col(blk) : 0, cw = blk_width(blk);
                    const std::int64_t r0 = batch.starts[s], len = batch.lengths[s];
                    ops::conv_problem<> pr;
                    pr.x = tensor_view<const float, 2>(qkv.data + r0 * CD + c0, {len, cw}, {CD, 1});
                    pr.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * K, {cw, K});
                    pr.state = st.conv.data() + (batch.slots[s] * CD + c0) * (K - 1);
                    float* out = head_major ? blk_data(blk) + r0 * cw : qkvc.data + r0 * CD;
                    pr.out = tensor_view<float, 2>(out, {len, cw}, {head_major ? cw : CD, 1});
                    if (!head_major || blk < 2 * Hk) {
                        pr.l2_group = dk;
                        pr.l2_channels = head_major ? dk : 2 * KD;
                        pr.l2_eps = c.l2_eps;
                    }
                    convs.push_back(pr);
                }
            }
            ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(convs), kernels::conv_activation::silu);
        }
        // 3. Gates g and β.
        ops::gdn_gates(be, tensor_view<const float, 2>(araw), tensor_view<const float, 2>(braw), w_.dt_bias.data(), w_.A_log.data(),
                       c.decay_floor, c.allow_neg_eigval, g, beta);
        // 4. The delta rule; o is head-major [H_v, n, d_v] in prefill, token-major [n, H_v, d_v] in decode.
        const float scale = 1.f / std::sqrt(static_cast<float>(dk));
        tensor_view<float, 4> ssm = st.ssm.view<4>();
        tensor_view<float, 3> ov = head_major ? tensor_view<float, 3>(o.data, {n, Hv, dv}, {dv, n * dv, 1})
                                              : tensor_view<float, 3>(o.data, {n, Hv, dv}, {VD, dv, 1});
        if (head_major) {
            tensor_view<const float, 3> q(blk_data(0), {n, Hk, dk}, {dk, n * dk, 1});
            tensor_view<const float, 3> k(blk_data(Hk), {n, Hk, dk}, {dk, n * dk, 1});
            tensor_view<const float, 3> v(blk_data(2 * Hk), {n, Hv, dv}, {dv, n * dv, 1});
            ops::gated_delta_chunked(be, batch, q, k, v, g, beta, scale, ssm, ov, chunk_for(be));
        } else {
            tensor_view<const float, 3> q(qkvc.data, {n, Hk, dk}, {CD, dk, 1});
            tensor_view<const float, 3> k(qkvc.data + KD, {n, Hk, dk}, {CD, dk, 1});
            tensor_view<const float, 3> v(qkvc.data + 2 * KD, {n, Hv, dv}, {CD, dv, 1});
            ops::gated_delta_step(be, batch, q, k, v, g, beta, scale, ssm, ov);
        }
        // 5. Gated RMSNorm, norm-then-gate per head over d_v, from o into token-major `on` [n, value_dim] (reusing the
        //    projection buffer, consumed by the conv).
        const tensor_view<float, 2> on(qkv.data, {n, VD});
        ops::gated_rms_norm(be, tensor_view<const float, 3>(ov), tensor_view<const float, 3>(z.data, {n, Hv, dv}),
                            w_.norm_weight.data(), dv, kernels::gate_order::norm_then_gate, c.norm_eps,
                            tensor_view<float, 3>(on.data, {n, Hv, dv}));
        // 6. Output projection, then zero the rows of padding and invalid entries.
        ops::linear(be, tensor_view<const float, 2>(on), w_.out_proj, nullptr, y);
        ops::zero_rows(be, y, vb.live());
    }

    gated_deltanet_config cfg_;
    gated_deltanet_weights w_;
};

// ---- Training forward and backward ----------------------------------------------------------------------------

namespace detail {

/// 1 for rows that belong to some sequence of b (slots ignored), else 0.
inline std::vector<unsigned char> gdn_covered_rows(const seq_batch& b) {
    std::vector<unsigned char> keep(static_cast<std::size_t>(std::max<std::int64_t>(b.n_rows, 0)), 0);
    for (std::int64_t s = 0; s < b.n_seq(); ++s)
        std::fill_n(keep.begin() + b.starts[static_cast<std::size_t>(s)], b.lengths[static_cast<std::size_t>(s)], static_cast<unsigned char>(1));
    return keep;
}

/// The batch of a training call: the same rows, sequence i in slot i (training ignores slots and starts from zeros).
/// Throws shape_error on ranges outside the rows or overlapping sequences.
inline seq_batch gdn_train_batch(const seq_batch& b) {
    seq_batch t = b;
    for (std::size_t i = 0; i < t.slots.size(); ++i) t.slots[i] = static_cast<std::int64_t>(i);
    t.validate();
    return t;
}

/// Per-thread scratch of the training calls (grown to the largest call, reused).
inline std::vector<float>& gdn_train_workspace() {
    thread_local std::vector<float> ws;
    return ws;
}

/// The head-major blocks of a prefill [q heads | k heads | v heads] buffer: block i's first channel in [q | k | v] and
/// its width.
struct gdn_blocks {
    std::int64_t Hk, Hv, dk, dv;
    std::int64_t count() const { return 2 * Hk + Hv; }
    std::int64_t col(std::int64_t i) const { return i < 2 * Hk ? i * dk : 2 * Hk * dk + (i - 2 * Hk) * dv; }
    std::int64_t width(std::int64_t i) const { return i < 2 * Hk ? dk : dv; }
};

}  // namespace detail

template <host_backend B>
void gated_deltanet::forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                                   train_cache& tc) const {
    const auto& c = cfg_;
    x.require_shape({batch.n_rows, c.d_model}, "gated_deltanet::forward_train: x [n_rows, d_model]");
    y.require_shape({batch.n_rows, c.d_model}, "gated_deltanet::forward_train: y [n_rows, d_model]");
    const seq_batch tb = detail::gdn_train_batch(batch);
    const std::int64_t n = batch.n_rows, Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v, K = c.d_conv;
    const std::int64_t CD = c.conv_dim(), VD = c.value_dim();
    const auto grow = [](std::vector<float>& v, std::int64_t m) {
        if (static_cast<std::int64_t>(v.size()) < m) v.resize(static_cast<std::size_t>(m));
    };
    tc.n_rows = n;
    grow(tc.qkv, n * CD);
    grow(tc.qkvc, n * CD);
    grow(tc.z, n * VD);
    for (auto* v : {&tc.a_raw, &tc.b_raw, &tc.g, &tc.beta}) grow(*v, n * Hv);
    grow(tc.o, n * VD);
    grow(tc.on, n * VD);
    if (n == 0) return;
    const auto keep = detail::gdn_covered_rows(tb);
    const tensor_view<float, 2> qkv(tc.qkv.data(), {n, CD}), z(tc.z.data(), {n, VD}), araw(tc.a_raw.data(), {n, Hv}),
        braw(tc.b_raw.data(), {n, Hv}), g(tc.g.data(), {n, Hv}), beta(tc.beta.data(), {n, Hv}), on(tc.on.data(), {n, VD});
    // 1. Projections; rows outside every sequence are zeroed so nothing there (padding, NaN) reaches the gradients.
    ops::linear(be, x, w_.in_proj_qkv, nullptr, qkv);
    ops::linear(be, x, w_.in_proj_z, nullptr, z);
    ops::linear(be, x, w_.in_proj_b, nullptr, braw);
    ops::linear(be, x, w_.in_proj_a, nullptr, araw);
    for (const auto& t : {qkv, z, braw, araw}) ops::zero_rows(be, t, keep);
    // 2. Conv + SiLU (+ L2 of q, k heads) from zero conv states into head-major blocks, one problem per (sequence, head).
    const detail::gdn_blocks blk{Hk, Hv, dk, dv};
    {
        std::vector<ops::conv_problem<>> convs;
        for (std::int64_t s = 0; s < tb.n_seq(); ++s) {
            const std::int64_t r0 = tb.starts[static_cast<std::size_t>(s)], len = tb.lengths[static_cast<std::size_t>(s)];
            if (len == 0) continue;
            for (std::int64_t i = 0; i < blk.count(); ++i) {
                const std::int64_t c0 = blk.col(i), cw = blk.width(i);
                ops::conv_problem<> pr;
                pr.x = tensor_view<const float, 2>(qkv.data + r0 * CD + c0, {len, cw}, {CD, 1});
                pr.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * K, {cw, K});
                pr.state = nullptr;
                pr.out = tensor_view<float, 2>(tc.qkvc.data() + n * c0 + r0 * cw, {len, cw});
                if (i < 2 * Hk) {
                    pr.l2_group = dk;
                    pr.l2_channels = dk;
                    pr.l2_eps = c.l2_eps;
                }
                convs.push_back(pr);
            }
        }
        ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(convs), kernels::conv_activation::silu);
    }
    // 3. Gates.
    ops::gdn_gates(be, tensor_view<const float, 2>(araw), tensor_view<const float, 2>(braw), w_.dt_bias.data(), w_.A_log.data(),
                   c.decay_floor, c.allow_neg_eigval, g, beta);
    // 4. The delta rule from zero states (the final states go to scratch and are dropped).
    auto& ws = detail::gdn_train_workspace();
    const std::int64_t S = std::max<std::int64_t>(tb.n_seq(), 1), ssz = S * Hv * dk * dv;
    if (static_cast<std::int64_t>(ws.size()) < ssz) ws.resize(static_cast<std::size_t>(ssz));
    std::fill_n(ws.begin(), ssz, 0.f);
    const float* qkvc = tc.qkvc.data();
    tensor_view<const float, 3> q(qkvc + n * blk.col(0), {n, Hk, dk}, {dk, n * dk, 1});
    tensor_view<const float, 3> k(qkvc + n * blk.col(Hk), {n, Hk, dk}, {dk, n * dk, 1});
    tensor_view<const float, 3> v(qkvc + n * blk.col(2 * Hk), {n, Hv, dv}, {dv, n * dv, 1});
    const tensor_view<float, 3> ov(tc.o.data(), {n, Hv, dv}, {dv, n * dv, 1});
    ops::gated_delta_chunked(be, tb, q, k, v, tensor_view<const float, 2>(g), tensor_view<const float, 2>(beta),
                             1.f / std::sqrt(static_cast<float>(dk)), tensor_view<float, 4>(ws.data(), {S, Hv, dk, dv}), ov,
                             chunk_for(be));
    // 5. Gated RMSNorm (norm-then-gate per head), token-major.
    ops::gated_rms_norm(be, tensor_view<const float, 3>(ov), tensor_view<const float, 3>(z.data, {n, Hv, dv}), w_.norm_weight.data(), dv,
                        kernels::gate_order::norm_then_gate, c.norm_eps, tensor_view<float, 3>(on.data, {n, Hv, dv}));
    ops::zero_rows(be, on, keep);
    // 6. Output projection.
    ops::linear(be, tensor_view<const float, 2>(on), w_.out_proj, nullptr, y);
    ops::zero_rows(be, y, keep);
}

template <host_backend B>
void gated_deltanet::backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x,
                              tensor_view<const float, 2> dy, tensor_view<float, 2> dx, gated_deltanet_weights& gw) const {
    const auto& c = cfg_;
    const std::int64_t n = batch.n_rows, Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v, K = c.d_conv, d = c.d_model;
    const std::int64_t CD = c.conv_dim(), VD = c.value_dim();
    x.require_shape({n, d}, "gated_deltanet::backward: x [n_rows, d_model]");
    dy.require_shape({n, d}, "gated_deltanet::backward: dy [n_rows, d_model]");
    dx.require_shape({n, d}, "gated_deltanet::backward: dx [n_rows, d_model]");
    if (tc.n_rows != n)
        throw shape_error("gated_deltanet::backward: the train_cache holds " + std::to_string(tc.n_rows) + " rows, the batch has " +
                          std::to_string(n) + " (run forward_train on this batch first)");
    gw.validate(c);
    const seq_batch tb = detail::gdn_train_batch(batch);
    if (n == 0) return;
    const auto keep = detail::gdn_covered_rows(tb);
    // Scratch: masked dy, dL/d(on), dL/do (head-major), dz, dL/d(qkvc) (head-major), dL/d(qkv), dg, dβ, da, db, and one
    // [n, d] buffer for the input-gradient partials.
    auto& ws = detail::gdn_train_workspace();
    const std::int64_t need = 2 * n * d + 3 * n * VD + 2 * n * CD + 4 * n * Hv;
    if (static_cast<std::int64_t>(ws.size()) < need) ws.resize(static_cast<std::size_t>(need));
    float* p = ws.data();
    const auto take = [&](std::int64_t m) {
        float* r = p;
        p += m;
        return r;
    };
    const tensor_view<float, 2> dym(take(n * d), {n, d}), tmp(take(n * d), {n, d}), don(take(n * VD), {n, VD}), dz(take(n * VD), {n, VD});
    float* d_o = take(n * VD);
    float* dqkvc = take(n * CD);
    const tensor_view<float, 2> dqkv(take(n * CD), {n, CD}), dg(take(n * Hv), {n, Hv}), dbeta(take(n * Hv), {n, Hv}),
        da(take(n * Hv), {n, Hv}), db(take(n * Hv), {n, Hv});
    // Saved activations.
    const detail::gdn_blocks blk{Hk, Hv, dk, dv};
    const float* qkvc = tc.qkvc.data();
    const tensor_view<const float, 2> qkv(tc.qkv.data(), {n, CD}), z(tc.z.data(), {n, VD}), araw(tc.a_raw.data(), {n, Hv}),
        braw(tc.b_raw.data(), {n, Hv}), g(tc.g.data(), {n, Hv}), beta(tc.beta.data(), {n, Hv}), on(tc.on.data(), {n, VD});
    const tensor_view<const float, 3> ov(tc.o.data(), {n, Hv, dv}, {dv, n * dv, 1});
    // 1. dy outside every sequence is ignored (y was zeroed there).
    ops::copy(be, tensor_view<const float, 3>(dy.data, {n, 1, d}, {dy.strides[0], d, 1}), tensor_view<float, 3>(dym.data, {n, 1, d}));
    ops::zero_rows(be, dym, keep);
    // 2. out_proj.
    ops::linear_backward(be, on, w_.out_proj.view<2>(), tensor_view<const float, 2>(dym), don, gw.out_proj.view<2>(), nullptr);
    // 3. Gated norm (norm-then-gate per head): dL/do (head-major, as the delta rule wrote o) and dz.
    const tensor_view<float, 3> d_ov(d_o, {n, Hv, dv}, {dv, n * dv, 1});
    ops::gated_rms_norm_backward(be, ov, tensor_view<const float, 3>(z.data, {n, Hv, dv}), w_.norm_weight.data(), dv,
                                 kernels::gate_order::norm_then_gate, c.norm_eps, tensor_view<const float, 3>(don.data, {n, Hv, dv}), d_ov,
                                 tensor_view<float, 3>(dz.data, {n, Hv, dv}), gw.norm_weight.data());
    ops::zero_rows(be, dz, keep);
    // 4. The delta rule (zero initial states; chunk states recomputed): dq, dk, dv into head-major blocks, dg, dβ.
    ops::gated_delta_chunked_backward(
        be, tb, tensor_view<const float, 3>(qkvc + n * blk.col(0), {n, Hk, dk}, {dk, n * dk, 1}),
        tensor_view<const float, 3>(qkvc + n * blk.col(Hk), {n, Hk, dk}, {dk, n * dk, 1}),
        tensor_view<const float, 3>(qkvc + n * blk.col(2 * Hk), {n, Hv, dv}, {dv, n * dv, 1}), g, beta,
        1.f / std::sqrt(static_cast<float>(dk)), tensor_view<const float, 4>(), tensor_view<const float, 3>(d_ov),
        tensor_view<float, 3>(dqkvc + n * blk.col(0), {n, Hk, dk}, {dk, n * dk, 1}),
        tensor_view<float, 3>(dqkvc + n * blk.col(Hk), {n, Hk, dk}, {dk, n * dk, 1}),
        tensor_view<float, 3>(dqkvc + n * blk.col(2 * Hk), {n, Hv, dv}, {dv, n * dv, 1}), dg, dbeta, tensor_view<float, 4>(), chunk_for(be));
    // 5. Gates: da, db and the parameter gradients of dt_bias and A_log.
    ops::gdn_gates_backward(be, araw, braw, w_.dt_bias.data(), w_.A_log.data(), c.decay_floor, c.allow_neg_eigval,
                            tensor_view<const float, 2>(dg), tensor_view<const float, 2>(dbeta), da, db, gw.dt_bias.data(), gw.A_log.data());
    // 6. Conv + SiLU + L2 (the pre-activation is recomputed from the saved conv input): dqkv and the conv weight gradient.
    {
        std::vector<ops::conv_backward_problem<>> convs;
        for (std::int64_t s = 0; s < tb.n_seq(); ++s) {
            const std::int64_t r0 = tb.starts[static_cast<std::size_t>(s)], len = tb.lengths[static_cast<std::size_t>(s)];
            if (len == 0) continue;
            for (std::int64_t i = 0; i < blk.count(); ++i) {
                const std::int64_t c0 = blk.col(i), cw = blk.width(i);
                ops::conv_backward_problem<> pr;
                pr.x = tensor_view<const float, 2>(qkv.data + r0 * CD + c0, {len, cw}, {CD, 1});
                pr.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * K, {cw, K});
                pr.dout = tensor_view<const float, 2>(dqkvc + n * c0 + r0 * cw, {len, cw});
                pr.dx = tensor_view<float, 2>(dqkv.data + r0 * CD + c0, {len, cw}, {CD, 1});
                pr.dw = tensor_view<float, 2>(gw.conv1d_weight.data() + c0 * K, {cw, K});
                if (i < 2 * Hk) {
                    pr.l2_group = dk;
                    pr.l2_channels = dk;
                    pr.l2_eps = c.l2_eps;
                }
                convs.push_back(pr);
            }
        }
        ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(convs), kernels::conv_activation::silu);
    }
    ops::zero_rows(be, dqkv, keep);
    // 7. The input projections: dx = dqkv W_qkv + dz W_z + db W_b + da W_a; their weight gradients.
    ops::linear_backward(be, x, w_.in_proj_qkv.view<2>(), tensor_view<const float, 2>(dqkv), dx, gw.in_proj_qkv.view<2>(), nullptr);
    const std::pair<tensor_view<float, 2>, const linear_weight*> rest[] = {{dz, &w_.in_proj_z}, {db, &w_.in_proj_b}, {da, &w_.in_proj_a}};
    linear_weight* grads[] = {&gw.in_proj_z, &gw.in_proj_b, &gw.in_proj_a};
    for (std::size_t i = 0; i < 3; ++i) {
        ops::linear_backward(be, x, rest[i].second->view<2>(), tensor_view<const float, 2>(rest[i].first), tmp, grads[i]->view<2>(), nullptr);
        ops::add_rows(be, dx, tensor_view<const float, 2>(tmp), keep);
    }
    ops::zero_rows(be, dx, keep);
}

static_assert(mixer<gated_deltanet, cpu_backend>);
static_assert(mixer<gated_deltanet, reference_backend>);

/// Whole-layer reference in the precision of T (use double), token by token with obvious loops, from the same fp32
/// weights: projections, conv window + SiLU, L2 norms, gates, the §4.1 recurrence, gated norm, out_proj.
/// ssm [S, H_v, d_k, d_v] and conv [S, conv_dim, K−1] are updated in place per valid sequence; x, y [n_rows, d].
/// Rows outside valid sequences get y = 0. Throws shape_error on mismatched shapes.
template <class T>
void gated_deltanet_ref(const gated_deltanet_config& c, const gated_deltanet_weights& w, const seq_batch& batch,
                        tensor_view<const T, 2> x,  // [n_rows, d]
                        tensor_view<T, 4> ssm,      // [S, H_v, d_k, d_v]
                        tensor_view<T, 3> conv,     // [S, conv_dim, K−1]
                        tensor_view<T, 2> y) {      // [n_rows, d]
    c.validate();
    w.validate(c);
    const std::int64_t d = c.d_model, Hk = c.n_k_heads, Hv = c.n_v_heads, dk = c.d_k, dv = c.d_v, K = c.d_conv;
    const std::int64_t CD = c.conv_dim(), VD = c.value_dim(), KD = c.key_dim(), r = Hv / Hk;
    x.require_shape({batch.n_rows, d}, "gated_deltanet_ref: x");
    y.require_shape({batch.n_rows, d}, "gated_deltanet_ref: y");
    ssm.require_shape({-1, Hv, dk, dv}, "gated_deltanet_ref: ssm");
    conv.require_shape({ssm.dim(0), CD, K - 1}, "gated_deltanet_ref: conv");
    batch.validate(ssm.dim(0));
    for (std::int64_t t = 0; t < batch.n_rows; ++t)
        for (std::int64_t i = 0; i < d; ++i) y(t, i) = T(0);
    auto dot = [](const float* wrow, const T* xt, std::int64_t n) {
        T acc = 0;
        for (std::int64_t i = 0; i < n; ++i) acc += static_cast<T>(wrow[i]) * xt[i];
        return acc;
    };
    std::vector<T> xt(d), pre(CD), qkv(CD), z(VD), o(VD), u(dv);
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const std::int64_t slot = batch.slots[s];
        if (slot < 0) continue;
        for (std::int64_t t = batch.starts[s]; t < batch.starts[s] + batch.lengths[s]; ++t) {
            for (std::int64_t i = 0; i < d; ++i) xt[i] = x(t, i);
            for (std::int64_t ch = 0; ch < CD; ++ch) pre[ch] = dot(&w.in_proj_qkv[ch * d], xt.data(), d);
            for (std::int64_t ch = 0; ch < VD; ++ch) z[ch] = dot(&w.in_proj_z[ch * d], xt.data(), d);
            // Conv window [state | current] with tap K−1 on the current token, then SiLU; shift the state.
            for (std::int64_t ch = 0; ch < CD; ++ch) {
                T acc = static_cast<T>(w.conv1d_weight[ch * K + K - 1]) * pre[ch];
                for (std::int64_t j = 0; j < K - 1; ++j) acc += static_cast<T>(w.conv1d_weight[ch * K + j]) * conv(slot, ch, j);
                qkv[ch] = silu(acc);
                for (std::int64_t j = 0; j + 1 < K - 1; ++j) conv(slot, ch, j) = conv(slot, ch, j + 1);
                if (K > 1) conv(slot, ch, K - 2) = pre[ch];
            }
            // L2 norms of q and k heads (eps inside the sqrt).
            for (std::int64_t h = 0; h < 2 * Hk; ++h) {
                T ss = 0;
                for (std::int64_t a = 0; a < dk; ++a) ss += qkv[h * dk + a] * qkv[h * dk + a];
                const T nrm = std::sqrt(ss + static_cast<T>(c.l2_eps));
                for (std::int64_t a = 0; a < dk; ++a) qkv[h * dk + a] /= nrm;
            }
            const T scale = T(1) / std::sqrt(static_cast<T>(dk));
            for (std::int64_t j = 0; j < Hv; ++j) {
                const T a_raw = dot(&w.in_proj_a[j * d], xt.data(), d);
                const T b_raw = dot(&w.in_proj_b[j * d], xt.data(), d);
                const T gt = kernels::gdn_log_decay(a_raw, static_cast<T>(w.dt_bias[j]), static_cast<T>(w.A_log[j]),
                                                    static_cast<T>(c.decay_floor));
                const T bt = kernels::gdn_beta(b_raw, c.allow_neg_eigval);
                const T* qh = &qkv[(j / r) * dk];
                const T* kh = &qkv[KD + (j / r) * dk];
                const T* vh = &qkv[2 * KD + j * dv];
                auto S = ssm[slot][j];  // [d_k, d_v]
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) S(a, b) *= std::exp(gt);
                for (std::int64_t b = 0; b < dv; ++b) {
                    T sk = 0;
                    for (std::int64_t a = 0; a < dk; ++a) sk += S(a, b) * kh[a];
                    u[b] = bt * (vh[b] - sk);
                }
                for (std::int64_t a = 0; a < dk; ++a)
                    for (std::int64_t b = 0; b < dv; ++b) S(a, b) += kh[a] * u[b];
                // o_j = Sᵀ(scale q), then norm-then-gate over the head.
                T ss = 0;
                for (std::int64_t b = 0; b < dv; ++b) {
                    T acc = 0;
                    for (std::int64_t a = 0; a < dk; ++a) acc += S(a, b) * qh[a] * scale;
                    o[j * dv + b] = acc;
                    ss += acc * acc;
                }
                const T inv = T(1) / std::sqrt(ss / static_cast<T>(dv) + static_cast<T>(c.norm_eps));
                for (std::int64_t b = 0; b < dv; ++b)
                    o[j * dv + b] = static_cast<T>(w.norm_weight[b]) * o[j * dv + b] * inv * silu(z[j * dv + b]);
            }
            for (std::int64_t i = 0; i < d; ++i) y(t, i) = dot(&w.out_proj[i * VD], o.data(), VD);
        }
    }
}

/// fp64 states of every slot for gated_deltanet_layer_ref: ssm [S, H_v, d_k, d_v], conv [S, conv_dim, K−1].
struct gated_deltanet_ref_slots {
    tensor<double> ssm, conv;
    gated_deltanet_ref_slots(const gated_deltanet_config& c, std::int64_t n_slots)
        : ssm({n_slots, c.n_v_heads, c.d_k, c.d_v}), conv({n_slots, c.conv_dim(), c.d_conv - 1}) {}
    void reset_slot(std::int64_t i) {
        std::fill_n(ssm.data() + i * (ssm.numel() / ssm.dim(0)), ssm.numel() / ssm.dim(0), 0.0);
        std::fill_n(conv.data() + i * (conv.numel() / conv.dim(0)), conv.numel() / conv.dim(0), 0.0);
    }
    void copy_slot(std::int64_t from, std::int64_t to) {
        const auto a = ssm.numel() / ssm.dim(0), b = conv.numel() / conv.dim(0);
        std::copy_n(ssm.data() + from * a, a, ssm.data() + to * a);
        std::copy_n(conv.data() + from * b, b, conv.data() + to * b);
    }
};

/// The whole layer in fp64 over a batch (the common *_layer_ref signature): gated_deltanet_ref on the slots' states.
inline void gated_deltanet_layer_ref(const gated_deltanet_config& c, const gated_deltanet_weights& w, const seq_batch& batch,
                                     tensor_view<const double, 2> x, gated_deltanet_ref_slots& st, tensor_view<double, 2> y) {
    gated_deltanet_ref<double>(c, w, batch, x, st.ssm.view<4>(), st.conv.view<3>(), y);
}

/// Mixer-level hooks used by generic tests (tests/support/mixer_harness.hpp).
inline gated_deltanet_ref_slots make_ref_state(const gated_deltanet& m, std::int64_t n_slots) {
    return gated_deltanet_ref_slots(m.config(), n_slots);
}
inline void layer_ref(const gated_deltanet& m, const seq_batch& b, tensor_view<const double, 2> x, gated_deltanet_ref_slots& st,
                      tensor_view<double, 2> y) {
    gated_deltanet_layer_ref(m.config(), m.weights(), b, x, st, y);
}

}  // namespace hymix
