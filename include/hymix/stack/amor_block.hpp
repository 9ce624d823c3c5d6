// AMOR's gated attention block (spec.md §5.3–5.6; arXiv 2602.13215): a plain RMSNorm of the stream (its own eps),
// a per-token gate on that normalised input (entropy_ema by default; `always` gives the always-on comparison with
// the same parameters), multi-head attention with RoPE and no MLP, and a per-channel output scale
// α = σ(max(raw_α, −1)):
//   ĥ = norm(h);  o = g ⊙ attention(ĥ);  h ← ĥ + α ⊙ o (classic block 0: the stream is replaced)  or  h ← h + α ⊙ o.
// Inference is true-sparse: every token's K and V (RoPE on K) go to the block's KV cache, but only fired rows pay
// for Q, the attention row and W_o (attention::forward_sparse). Training is dense-with-mask (§5.5): attention runs on
// every row and unfired rows are dropped, so W_k and W_v learn from every key a fired query sees.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/gate/entropy_ema.hpp"
#include "hymix/gate/token_gate.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/ops/channel_scale.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/stack/context.hpp"

namespace hymix {

/// The AMOR layer kind ('R', "amor").
inline constexpr layer_kind amor_kind{'R', "amor"};

/// How an AMOR block writes the stream (spec.md §5.4): `add` (h ← h + α ⊙ o) or `replace` (h ← ĥ + α ⊙ o; block 0
/// of the classic mode, whose norm is the backbone's norm_f).
enum class amor_residual { add, replace };

template <class Gate = entropy_ema>
class amor_block {
public:
    using mixer_type = attention;
    using state_type = attention_state;
    using gate_type = Gate;
    static constexpr kind_info kind{amor_kind, {}};

    /// norm [d] (its eps: AMOR's own norms 1e-6, block 0 of the classic mode the backbone's norm_f eps), the
    /// attention mixer (MHA with RoPE, no qk-norm, no output gate), raw_alpha [d], the gate and the residual mode.
    /// `flavor` is the norm's flavour: plain for AMOR's own norms; block 0 of the classic mode uses the backbone's
    /// final norm (zero-centred for Qwen3.5 backbones).
    amor_block(tensor<float> norm, float norm_eps, attention attn, tensor<float> raw_alpha, Gate gate = {},
               amor_residual residual = amor_residual::add, kernels::rms_flavor flavor = kernels::rms_flavor::plain)
        : norm_(std::move(norm)), eps_(norm_eps), attn_(std::move(attn)), raw_alpha_(std::move(raw_alpha)), gate_(std::move(gate)),
          residual_(residual), flavor_(flavor) {
        if (!(eps_ > 0) || !std::isfinite(eps_)) throw config_error("amor_block: norm eps must be positive, found " + std::to_string(eps_));
        const auto& c = attn_.config();
        if (c.output_gate || c.qk_norm.mode != qk_norm_mode::none || c.n_kv_heads != c.n_heads)
            throw config_error("amor_block: the attention is plain MHA (no output gate, no qk-norm, n_kv_heads = n_heads)");
    }

    const attention& mixer() const noexcept { return attn_; }
    attention& mixer_mut() noexcept { return attn_; }
    const Gate& gate() const noexcept { return gate_; }
    Gate& gate() noexcept { return gate_; }
    const tensor<float>& norm() const noexcept { return norm_; }
    float norm_eps() const noexcept { return eps_; }
    kernels::rms_flavor norm_flavor() const noexcept { return flavor_; }
    const tensor<float>& raw_alpha() const noexcept { return raw_alpha_; }
    amor_residual residual() const noexcept { return residual_; }
    void set_residual(amor_residual r) noexcept { residual_ = r; }
    state_type make_state(std::int64_t n_slots) const { return attn_.make_state(n_slots); }

    /// α = σ(max(raw_α, −1)) per channel.
    std::vector<float> alpha() const {
        std::vector<float> a(static_cast<std::size_t>(raw_alpha_.numel()));
        for (std::size_t c = 0; c < a.size(); ++c) a[c] = static_cast<float>(1.0 / (1.0 + std::exp(-std::max<double>(raw_alpha_[c], -1.0))));
        return a;
    }

    /// Throws shape_error naming "<where>.norm" / "<where>.raw_alpha", config_error when the width differs.
    void validate(std::int64_t d, const std::string& where) const {
        auto need = [&](const tensor<float>& t, const char* n) {
            if (t.rank() != 1 || t.dim(0) != d)
                throw shape_error(where + "." + n + ": expected shape [" + std::to_string(d) + "], found " + shape_string(t.shape()));
        };
        need(norm_, "norm");
        need(raw_alpha_, "raw_alpha");
        if (attn_.config().d_model != d)
            throw config_error(where + ": the attention's d_model is " + std::to_string(attn_.config().d_model) + ", the stack's is " +
                               std::to_string(d));
    }

    /// f(name, p) (see visit_param) for "<prefix>.norm", "<prefix>.mixer.<attention names>", "<prefix>.raw_alpha".
    template <class F>
    void for_each_param(const std::string& prefix, F&& f) {
        visit_param(f, prefix + ".norm", norm_);
        attn_.weights_mut().for_each([&](std::string_view n, auto& t) { visit_param(f, prefix + ".mixer." + std::string(n), t); });
        visit_param(f, prefix + ".raw_alpha", raw_alpha_);
    }
    void weights_changed() {}

    /// Inference: updates the stream x [n_rows, d] of ctx.batch's live rows; the KV cache gets every token.
    template <backend B>
    void forward(block_context<B>& ctx, state_type& s, tensor_view<float, 2> x) const {
        const auto& be = ctx.be;
        const std::int64_t n = x.dim(0), d = x.dim(1);
        auto h = ctx.ws.h.get(n, d);
        auto y = ctx.ws.y.get(n, d);
        ops::rms_norm(be, tensor_view<const float, 2>(x), norm_.data(), eps_, flavor_, h);
        auto& fire = ctx.ws.fire;
        decide(ctx, tensor_view<const float, 2>(h), false);
        if constexpr (Gate::fires_all)
            attn_.forward(be, s, ctx.batch, tensor_view<const float, 2>(h), y);
        else
            attn_.forward_sparse(be, s, ctx.batch, tensor_view<const float, 2>(h), y, std::span<const unsigned char>(fire));
        const auto a = alpha();
        ops::scale_columns(be, y, a.data(), std::span<const unsigned char>(fire));
        if (residual_ == amor_residual::replace)
            ops::copy(be, tensor_view<const float, 3>(h.data, {n, 1, d}), tensor_view<float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}));
        ops::add_rows(be, x, tensor_view<const float, 2>(y), std::span<const unsigned char>(fire));
    }

    // ---- training: dense-with-mask (spec.md §5.5) ------------------------------------------------------------------
    struct train_cache {
        tensor<float> x_in, h, y_att;  // [n, d]: stream in, ĥ, attention output before α and the mask
        std::vector<unsigned char> mask;
        typename attention::train_cache mixer;
    };

    template <host_backend B>
    void forward_train(block_context<B>& ctx, tensor_view<float, 2> x, train_cache& tc) {
        const auto& be = ctx.be;
        const std::int64_t n = x.dim(0), d = x.dim(1);
        tc.x_in = tensor<float>({n, d});
        ops::copy(be, tensor_view<const float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}), tensor_view<float, 3>(tc.x_in.data(), {n, 1, d}));
        tc.h = tensor<float>({n, d});
        ops::rms_norm(be, tc.x_in.template view<2>(), norm_.data(), eps_, flavor_, tc.h.template view<2>());
        decide(ctx, tc.h.template view<2>(), true);
        tc.mask = ctx.ws.fire;
        tc.y_att = tensor<float>({n, d});
        attn_.forward_train(be, ctx.batch.batch(), tc.h.template view<2>(), tc.y_att.template view<2>(), tc.mixer);
        tensor<float> y = tc.y_att;
        const auto a = alpha();
        ops::scale_columns(be, y.template view<2>(), a.data(), std::span<const unsigned char>(tc.mask));
        if (residual_ == amor_residual::replace)
            ops::copy(be, tensor_view<const float, 3>(tc.h.data(), {n, 1, d}), tensor_view<float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}));
        ops::add_rows(be, x, y.template view<2>(), std::span<const unsigned char>(tc.mask));
    }

    /// dx: dL/d(stream out) in, dL/d(stream in) out; gradients accumulated into g (same type).
    template <host_backend B>
    void backward(block_context<B>& ctx, const train_cache& tc, tensor_view<float, 2> dx, amor_block& g) const {
        const auto& be = ctx.be;
        const std::int64_t n = dx.dim(0), d = dx.dim(1);
        const auto live = ctx.batch.live();
        const std::span<const unsigned char> mask(tc.mask);
        tensor<float> dy({n, d}), dh({n, d});
        ops::copy(be, tensor_view<const float, 3>(dx.data, {n, 1, d}, {dx.strides[0], d, 1}), tensor_view<float, 3>(dy.data(), {n, 1, d}));
        ops::zero_rows(be, dy.template view<2>(), mask);
        // α: d y_att = α ⊙ dy on fired rows; d α accumulated, then chained through σ(max(raw, −1)).
        std::vector<float> dalpha(static_cast<std::size_t>(d), 0.0f);
        const auto a = alpha();
        ops::scale_columns_backward(be, tc.y_att.template view<2>(), a.data(), tensor_view<const float, 2>(dy.template view<2>()),
                                    dy.template view<2>(), dalpha.data(), mask);
        for (std::int64_t c = 0; c < d; ++c)
            if (raw_alpha_[c] >= -1.0f) g.raw_alpha_[c] += dalpha[static_cast<std::size_t>(c)] * a[static_cast<std::size_t>(c)] * (1.0f - a[static_cast<std::size_t>(c)]);
        attn_.backward(be, ctx.batch.batch(), tc.mixer, tc.h.template view<2>(), tensor_view<const float, 2>(dy.template view<2>()),
                       dh.template view<2>(), g.attn_.weights_mut());
        if (residual_ == amor_residual::replace) {
            ops::add_rows(be, dh.template view<2>(), tensor_view<const float, 2>(dx), live);
            ops::rms_norm_backward(be, tc.x_in.template view<2>(), norm_.data(), eps_, flavor_,
                                   tensor_view<const float, 2>(dh.template view<2>()), dx, g.norm_.data());
            ops::zero_rows(be, dx, live);
        } else {
            tensor<float> dn({n, d});
            ops::rms_norm_backward(be, tc.x_in.template view<2>(), norm_.data(), eps_, flavor_,
                                   tensor_view<const float, 2>(dh.template view<2>()), dn.template view<2>(), g.norm_.data());
            ops::add_rows(be, dx, dn.template view<2>(), live);
        }
    }

private:
    /// ctx.ws.fire from the gate (training: the gate's statistics advance first), ANDed with the live rows; the
    /// block's statistics are reported.
    template <class B>
    void decide(block_context<B>& ctx, tensor_view<const float, 2> h, bool training) const {
        auto& fire = ctx.ws.fire;
        fire.assign(static_cast<std::size_t>(h.dim(0)), 0);
        ctx.ws.score.clear();
        gate_.decide(ctx, h, std::span<unsigned char>(fire));
        (void)training;
        finish(ctx);
    }
    template <class B>
    void decide(block_context<B>& ctx, tensor_view<const float, 2> h, bool training) {
        auto& fire = ctx.ws.fire;
        fire.assign(static_cast<std::size_t>(h.dim(0)), 0);
        ctx.ws.score.clear();
        if constexpr (requires { gate_.decide_train(ctx, h, std::span<unsigned char>(fire)); }) {
            if (training) gate_.decide_train(ctx, h, std::span<unsigned char>(fire));
            else std::as_const(gate_).decide(ctx, h, std::span<unsigned char>(fire));
        } else {
            std::as_const(gate_).decide(ctx, h, std::span<unsigned char>(fire));
        }
        finish(ctx);
    }
    template <class B>
    void finish(block_context<B>& ctx) const {
        const auto live = ctx.batch.live();
        auto& fire = ctx.ws.fire;
        std::int64_t rows = 0, fired = 0;
        for (std::size_t r = 0; r < fire.size(); ++r) {
            fire[r] = (fire[r] && live[r]) ? 1 : 0;
            rows += live[r];
            fired += fire[r];
        }
        if (ctx.stats) ctx.stats->push_back(block_stats{ctx.layer, Gate::name, rows, fired, ctx.ws.score, ctx.ws.score_threshold});
    }

    tensor<float> norm_;
    float eps_;
    attention attn_;
    tensor<float> raw_alpha_;
    Gate gate_;
    amor_residual residual_;
    kernels::rms_flavor flavor_;
};

}  // namespace hymix
