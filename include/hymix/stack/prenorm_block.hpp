// The pre-norm block, the layer of every stack hymix loads (spec.md §3.6, §4.7, §5.4):
//   h = norm(x);  y = mixer(h);  x ← x + g ⊙ y      (residual_add; AMOR's "h" mode and the standard layer)
//                                 x ← h + g ⊙ y      (residual_normed; AMOR's "classic" mode: the stream is replaced)
//   then, with an MLP policy:  x ← x + MLP(norm_mlp(x)).
// g is the per-token gate's fire mask: with `always` the block is the plain layer bit for bit; with `never` it is
// the identity on the stream while the mixer's state (KV cache) still receives every token. Mixers that can skip
// work for unfired rows (attention::forward_sparse) do; others run densely and their unfired rows are dropped.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hymix/gate/token_gate.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/ops/swiglu.hpp"
#include "hymix/ops/swiglu_backward.hpp"
#include "hymix/stack/block.hpp"

namespace hymix {

/// x ← x + g ⊙ mixer(norm(x)).
struct residual_add {
    static constexpr bool replaces_stream = false;
    static constexpr const char* name = "add";
};
/// x ← norm(x) + g ⊙ mixer(norm(x)): the block's normalised input replaces the stream (AMOR classic, block 0).
struct residual_normed {
    static constexpr bool replaces_stream = true;
    static constexpr const char* name = "normed";
};

/// Probe that ignores every activation. A probe is called as probe(name, view [n_rows, d]) with the names of
/// the reference activations: "embeddings", "layers.{i}.mixer_output", "layers.{i}.output", "final_norm".
struct no_probe {
    void operator()(std::string_view, tensor_view<const float, 2>) const noexcept {}
};

namespace detail {
template <class M, class B>
concept sparse_mixer = requires(const M& m, const B& be, typename M::state_type& s, const validated_batch& b,
                                tensor_view<const float, 2> x, tensor_view<float, 2> y, std::span<const unsigned char> f) {
    m.forward_sparse(be, s, b, x, y, f);
};
}  // namespace detail

template <class Mixer, norm_policy Norm, mlp_policy Mlp, class Gate = always, class Residual = residual_add>
class prenorm_block {
public:
    using mixer_type = Mixer;
    using state_type = typename Mixer::state_type;
    using norm_type = Norm;
    using mlp_type = Mlp;
    using gate_type = Gate;
    using residual_type = Residual;

    /// norm [d], mixer, and with an MLP policy mlp_norm [d] and the MLP weights (validated by the stack).
    prenorm_block(tensor<float> norm, Mixer m, tensor<float> mlp_norm = {}, typename Mlp::weights_type mlp = {}, Gate gate = {})
        : norm_(std::move(norm)), mixer_(std::move(m)), mlp_norm_(std::move(mlp_norm)), mlp_(std::move(mlp)), gate_(std::move(gate)) {}

    const Mixer& mixer() const noexcept { return mixer_; }
    const tensor<float>& norm() const noexcept { return norm_; }
    const tensor<float>& mlp_norm() const noexcept { return mlp_norm_; }
    const typename Mlp::weights_type& mlp() const noexcept { return mlp_; }
    const Gate& gate() const noexcept { return gate_; }
    Gate& gate() noexcept { return gate_; }
    /// Mutable parts for training (the optimizer updates them in place; call weights_changed() afterwards).
    Mixer& mixer_mut() noexcept { return mixer_; }
    tensor<float>& norm_mut() noexcept { return norm_; }
    tensor<float>& mlp_norm_mut() noexcept { return mlp_norm_; }
    typename Mlp::weights_type& mlp_mut() noexcept { return mlp_; }

    /// f(name, p) for every parameter (p a tensor<float> or a linear_weight, as core/linear_weight.hpp's visit_param
    /// passes it), named "<prefix>.norm", "<prefix>.mixer.<mixer's name>",
    /// "<prefix>.mlp_norm", "<prefix>.mlp.{gate_proj,up_proj,down_proj}" (mixers without a `for_each` on their
    /// weights contribute nothing).
    template <class F>
    void for_each_param(const std::string& prefix, F&& f) {
        visit_param(f, prefix + ".norm", norm_);
        if constexpr (requires { mixer_.weights_mut().for_each(f); })
            mixer_.weights_mut().for_each([&](std::string_view n, auto& t) { visit_param(f, prefix + ".mixer." + std::string(n), t); });
        if constexpr (Mlp::present) {
            visit_param(f, prefix + ".mlp_norm", mlp_norm_);
            visit_param(f, prefix + ".mlp.gate_proj", mlp_.gate_proj);
            visit_param(f, prefix + ".mlp.up_proj", mlp_.up_proj);
            visit_param(f, prefix + ".mlp.down_proj", mlp_.down_proj);
        }
    }
    /// Stores what the block derived from its weights (the MLP's fused gate|up matrix) as `d` (model::store_weights_as).
    void store_cached_weights_as(dtype d) {
        if constexpr (Mlp::present) mlp_.gate_up.store_as(d, "mlp.gate_up");
    }
    /// Bytes of what the block derives from its weights (the MLP's fused gate|up matrix, as stored).
    std::size_t cached_weight_bytes() const noexcept {
        if constexpr (Mlp::present) return mlp_.gate_up.stored_bytes();
        else return 0;
    }
    /// Re-derives what the block caches from its weights (the MLP's fused gate|up matrix) after an update.
    void weights_changed() {
        if constexpr (Mlp::present) mlp_.prepare();
    }
    state_type make_state(std::int64_t n_slots) const { return mixer_.make_state(n_slots); }

    /// Checks the weights' shapes against d_model (shape_error naming "<where>.norm" etc.), rejects an all-zero plain
    /// RMSNorm weight (value_error), checks the mixer's d_model (config_error naming the layer) and prepares the MLP.
    void validate(std::int64_t d, const std::string& where) {
        require(norm_, d, where + ".norm");
        detail::require_nonzero_norm<Norm>(norm_, where + ".norm");
        if constexpr (Mlp::present) {
            require(mlp_norm_, d, where + ".mlp_norm");
            detail::require_nonzero_norm<Norm>(mlp_norm_, where + ".mlp_norm");
            mlp_.validate(d, where + ".mlp");
            mlp_.prepare();
        }
        if constexpr (requires { mixer_.config().d_model; })
            if (mixer_.config().d_model != d)
                throw config_error(where + ": the mixer's d_model is " + std::to_string(mixer_.config().d_model) +
                                   ", the stack's is " + std::to_string(d));
    }

    /// Updates the residual stream x [n_rows, d] for the live rows of ctx.batch.
    template <backend B, class Probe = no_probe>
    void forward(block_context<B>& ctx, state_type& s, tensor_view<float, 2> x, Probe&& probe = {}) const {
        const auto& be = ctx.be;
        const std::int64_t n = x.dim(0), d = x.dim(1);
        auto& ws = ctx.ws;
        auto h = ws.h.get(n, d);
        auto y = ws.y.get(n, d);
        const auto live = ctx.batch.live();
        ops::rms_norm(be, tensor_view<const float, 2>(x), norm_.data(), ctx.norm_eps, Norm::flavor, h);
        const tensor_view<const float, 2> hc(h);
        std::span<const unsigned char> mask = live;
        if constexpr (Gate::fires_all) {
            run_mixer(ctx, s, hc, y);
        } else {
            auto& fire = ws.fire;
            fire.assign(static_cast<std::size_t>(n), 0);
            ws.score.clear();
            gate_.decide(ctx, hc, std::span<unsigned char>(fire));
            std::int64_t rows = 0, fired = 0;
            for (std::size_t r = 0; r < fire.size(); ++r) {
                fire[r] = (fire[r] && live[r]) ? 1 : 0;
                rows += live[r];
                fired += fire[r];
            }
            if (ctx.stats) ctx.stats->push_back(block_stats{ctx.layer, Gate::name, rows, fired, ws.score, ws.score_threshold});
            if constexpr (detail::sparse_mixer<Mixer, B>) {
                mixer_.forward_sparse(be, s, ctx.batch, hc, y, std::span<const unsigned char>(fire));
            } else {
                run_mixer(ctx, s, hc, y);
            }
            mask = std::span<const unsigned char>(fire);
        }
        if constexpr (!std::is_same_v<std::remove_cvref_t<Probe>, no_probe>)
            probe("layers." + std::to_string(ctx.layer) + ".mixer_output", tensor_view<const float, 2>(y));
        if constexpr (Residual::replaces_stream)
            ops::copy(be, tensor_view<const float, 3>(h.data, {n, 1, d}), tensor_view<float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}));
        ops::add_rows(be, x, tensor_view<const float, 2>(y), mask);
        if constexpr (Mlp::present) {
            ops::rms_norm(be, tensor_view<const float, 2>(x), mlp_norm_.data(), ctx.norm_eps, Norm::flavor, h);
            auto gu = ws.gu.get(n, 2 * mlp_.d_ff());
            ops::swiglu(be, mlp_, hc, gu, y);
            ops::add_rows(be, x, tensor_view<const float, 2>(y), live);
        }
    }

    // ---- training (issue 8): forward that keeps what backward needs, and backward --------------------------------

    /// Activations one training forward keeps for backward: O(n_rows · (d + d_ff)) plus the mixer's own.
    struct train_cache {
        tensor<float> x_in, h, x_mid, h2, gu;  // [n, d] ×4 (x_mid, h2 only with an MLP), [n, 2·d_ff]
        std::vector<unsigned char> mask;        // rows whose mixer output reaches the stream (live and fired)
        typename Mixer::train_cache mixer;
    };

    /// Training forward of the live rows of ctx.batch from zero mixer states (every sequence starts fresh): updates
    /// the residual stream x [n_rows, d] as forward() does (dense-with-mask for gated blocks: the mixer runs on every
    /// row, unfired rows are dropped) and fills tc. Not const: a gate with statistics (AMOR's EMA) advances them.
    template <host_backend B>
    void forward_train(block_context<B>& ctx, tensor_view<float, 2> x, train_cache& tc) {
        const auto& be = ctx.be;
        const std::int64_t n = x.dim(0), d = x.dim(1);
        const auto live = ctx.batch.live();
        tc.x_in = copy_of(be, x);
        tc.h = tensor<float>({n, d});
        ops::rms_norm(be, tc.x_in.template view<2>(), norm_.data(), ctx.norm_eps, Norm::flavor, tc.h.template view<2>());
        tc.mask.assign(live.begin(), live.end());
        if constexpr (!Gate::fires_all) {
            auto& fire = ctx.ws.fire;
            fire.assign(static_cast<std::size_t>(n), 0);
            ctx.ws.score.clear();
            if constexpr (requires { gate_.decide_train(ctx, tc.h.template view<2>(), std::span<unsigned char>(fire)); })
                gate_.decide_train(ctx, tc.h.template view<2>(), std::span<unsigned char>(fire));  // advances its statistics
            else
                gate_.decide(ctx, tc.h.template view<2>(), std::span<unsigned char>(fire));
            std::int64_t rows = 0, fired = 0;
            for (std::size_t r = 0; r < fire.size(); ++r) {
                tc.mask[r] = (fire[r] && live[r]) ? 1 : 0;
                rows += live[r];
                fired += tc.mask[r];
            }
            if (ctx.stats) ctx.stats->push_back(block_stats{ctx.layer, Gate::name, rows, fired, ctx.ws.score, ctx.ws.score_threshold});
        }
        tensor<float> y({n, d});
        if constexpr (requires { mixer_.forward_train(be, ctx.batch.batch(), tc.h.template view<2>(), y.template view<2>(), tc.mixer, ctx.side); })
            mixer_.forward_train(be, ctx.batch.batch(), tc.h.template view<2>(), y.template view<2>(), tc.mixer, ctx.side);  // per-token modes
        else
            mixer_.forward_train(be, ctx.batch.batch(), tc.h.template view<2>(), y.template view<2>(), tc.mixer);
        const std::span<const unsigned char> mask(tc.mask);
        if constexpr (Residual::replaces_stream)
            ops::copy(be, tensor_view<const float, 3>(tc.h.data(), {n, 1, d}), tensor_view<float, 3>(x.data, {n, 1, d}, {x.strides[0], d, 1}));
        ops::add_rows(be, x, y.template view<2>(), mask);
        if constexpr (Mlp::present) {
            tc.x_mid = copy_of(be, x);
            tc.h2 = tensor<float>({n, d});
            ops::rms_norm(be, tc.x_mid.template view<2>(), mlp_norm_.data(), ctx.norm_eps, Norm::flavor, tc.h2.template view<2>());
            tc.gu = tensor<float>({n, 2 * mlp_.d_ff()});
            ops::swiglu_train(be, mlp_, tc.h2.template view<2>(), tc.gu.template view<2>(), y.template view<2>());
            ops::add_rows(be, x, y.template view<2>(), live);
        }
    }

    /// Backward of forward_train: dx [n_rows, d] holds dL/d(output stream) on entry and dL/d(input stream) on exit;
    /// parameter gradients are accumulated (+=) into `g`, a block of the same type holding gradient tensors.
    template <host_backend B>
    void backward(block_context<B>& ctx, const train_cache& tc, tensor_view<float, 2> dx, prenorm_block& g) const {
        const auto& be = ctx.be;
        const std::int64_t n = dx.dim(0), d = dx.dim(1);
        const auto live = ctx.batch.live();
        tensor<float> t1({n, d}), t2({n, d});
        auto v1 = t1.template view<2>();
        auto v2 = t2.template view<2>();
        if constexpr (Mlp::present) {
            // out = x_mid + swiglu(norm(x_mid)) on live rows.
            ops::copy(be, as3(tensor_view<const float, 2>(dx)), as3(v1));
            ops::zero_rows(be, v1, live);
            ops::swiglu_backward(be, mlp_, tc.h2.template view<2>(), tc.gu.template view<2>(), tensor_view<const float, 2>(v1), v2,
                                 g.mlp_);
            ops::rms_norm_backward(be, tc.x_mid.template view<2>(), mlp_norm_.data(), ctx.norm_eps, Norm::flavor,
                                   tensor_view<const float, 2>(v2), v1, g.mlp_norm_.data());
            ops::add_rows(be, dx, tensor_view<const float, 2>(v1), live);
        }
        // out = x_in (or h when the stream is replaced) + mask ⊙ mixer(h), h = norm(x_in).
        ops::copy(be, as3(tensor_view<const float, 2>(dx)), as3(v1));
        ops::zero_rows(be, v1, std::span<const unsigned char>(tc.mask));
        mixer_.backward(be, ctx.batch.batch(), tc.mixer, tc.h.template view<2>(), tensor_view<const float, 2>(v1), v2,
                        g.mixer_.weights_mut());
        if constexpr (Residual::replaces_stream) {
            ops::add_rows(be, v2, tensor_view<const float, 2>(dx), live);
            ops::rms_norm_backward(be, tc.x_in.template view<2>(), norm_.data(), ctx.norm_eps, Norm::flavor,
                                   tensor_view<const float, 2>(v2), dx, g.norm_.data());
            ops::zero_rows(be, dx, live);
        } else {
            ops::rms_norm_backward(be, tc.x_in.template view<2>(), norm_.data(), ctx.norm_eps, Norm::flavor,
                                   tensor_view<const float, 2>(v2), v1, g.norm_.data());
            ops::add_rows(be, dx, tensor_view<const float, 2>(v1), live);
        }
    }

private:
    template <class B>
    static tensor<float> copy_of(const B& be, tensor_view<const float, 2> x) {
        tensor<float> t({x.dim(0), x.dim(1)});
        ops::copy(be, as3(x), as3(t.template view<2>()));
        return t;
    }
    template <class T>
    static tensor_view<T, 3> as3(tensor_view<T, 2> v) {
        return tensor_view<T, 3>(v.data, {v.dim(0), 1, v.dim(1)}, {v.strides[0], v.dim(1), v.strides[1]});
    }

    template <class B>
    void run_mixer(block_context<B>& ctx, state_type& s, tensor_view<const float, 2> h, tensor_view<float, 2> y) const {
        // Mixers with per-token modes (Oryx, spec.md §6.4) read them from the side input.
        if constexpr (requires { mixer_.forward(ctx.be, s, ctx.batch.batch(), h, y, ctx.side); }) {
            mixer_.forward(ctx.be, s, ctx.batch.batch(), h, y, ctx.side);
            return;
        }
        // The stack's validated batch goes down as it is (mixers that take only a seq_batch get that).
        if (ctx.batch.is_decode()) {
            if constexpr (requires { mixer_.step(ctx.be, s, ctx.batch, h, y); })
                mixer_.step(ctx.be, s, ctx.batch, h, y);
            else
                mixer_.step(ctx.be, s, ctx.batch.batch(), h, y);
        } else {
            if constexpr (requires { mixer_.forward(ctx.be, s, ctx.batch, h, y); })
                mixer_.forward(ctx.be, s, ctx.batch, h, y);
            else
                mixer_.forward(ctx.be, s, ctx.batch.batch(), h, y);
        }
    }
    static void require(const tensor<float>& t, std::int64_t n, const std::string& what) {
        if (t.rank() != 1 || t.dim(0) != n)
            throw shape_error(what + ": expected shape [" + std::to_string(n) + "], found " + shape_string(t.shape()));
    }

    tensor<float> norm_;
    Mixer mixer_;
    tensor<float> mlp_norm_;
    typename Mlp::weights_type mlp_;
    Gate gate_;
};

}  // namespace hymix
