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
#include "hymix/ops/swiglu.hpp"
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
            gate_.decide(ctx, hc, std::span<unsigned char>(fire));
            std::int64_t rows = 0, fired = 0;
            for (std::size_t r = 0; r < fire.size(); ++r) {
                fire[r] = (fire[r] && live[r]) ? 1 : 0;
                rows += live[r];
                fired += fire[r];
            }
            if (ctx.stats) ctx.stats->push_back(block_stats{ctx.layer, Gate::name, rows, fired, {}});
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

private:
    template <class B>
    void run_mixer(block_context<B>& ctx, state_type& s, tensor_view<const float, 2> h, tensor_view<float, 2> y) const {
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
