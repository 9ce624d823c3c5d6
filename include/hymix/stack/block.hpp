// What a stack layer is (spec.md §1, §3.6, §4.7): the `block` concept (a layer that updates the residual stream in
// place, given a block context), the norm policies (plain RMSNorm for Mamba-2 models, zero-centred for Qwen3.5),
// the MLP policies (none, or SwiGLU, kernels/swiglu.hpp), and `bind<Kind, X>`, which ties a schedule's layer kind
// to a compiled block type or to a mixer (wrapped by the stack in its pre-norm block).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/mixer/concepts.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/stack/context.hpp"
#include "hymix/kernels/norm.hpp"
#include "hymix/kernels/swiglu.hpp"

namespace hymix {

// ---- norm policies ----------------------------------------------------------------------------------------

/// w ⊙ x / rms(x): HF Mamba2RMSNorm, fla, Nemotron-H.
struct plain_rms_norm {
    static constexpr kernels::rms_flavor flavor = kernels::rms_flavor::plain;
    static constexpr const char* name = "plain";
};
/// (1 + w) ⊙ x / rms(x): Qwen3-Next / Qwen3.5 input, post-attention and final norms.
struct zero_centered_rms_norm {
    static constexpr kernels::rms_flavor flavor = kernels::rms_flavor::zero_centered;
    static constexpr const char* name = "zero_centered";
};

template <class N>
concept norm_policy = requires {
    { N::flavor } -> std::convertible_to<kernels::rms_flavor>;
};

/// The value of a norm weight that leaves x / rms(x) unchanged: 1 for plain RMSNorm, 0 for zero-centred RMSNorm.
template <norm_policy Norm>
inline constexpr float neutral_norm_value = Norm::flavor == kernels::rms_flavor::plain ? 1.0f : 0.0f;

/// A norm weight [d] filled with the neutral value of `Norm` (ones for plain_rms_norm, zeros for
/// zero_centered_rms_norm): the norm then only divides by rms(x).
template <norm_policy Norm>
tensor<float> neutral_norm_weight(std::int64_t d) {
    tensor<float> w({d});
    w.fill(neutral_norm_value<Norm>);
    return w;
}

namespace detail {
/// Throws value_error naming `what` when a plain RMSNorm weight is all zero: the norm's output, and so everything
/// downstream of it, would be zero (a zero-filled tensor<float> is the likely cause; the neutral weight is all ones).
/// Zero-centred weights are 1 + w, so zeros are their neutral value and are accepted.
template <norm_policy Norm>
void require_nonzero_norm(const tensor<float>& w, const std::string& what) {
    if constexpr (Norm::flavor == kernels::rms_flavor::plain) {
        const auto s = w.span();
        if (!s.empty() && std::all_of(s.begin(), s.end(), [](float v) { return v == 0.0f; }))
            throw value_error(what + ": all-zero weight with plain RMSNorm gives all-zero output (the neutral plain "
                                     "RMSNorm weight is all ones; zeros are neutral only for zero_centered_rms_norm)");
    }
}
}  // namespace detail

// ---- MLP policies -----------------------------------------------------------------------------------------

/// No MLP sub-block (HF Mamba-2 layers are mixer-only).
struct no_mlp {
    struct weights_type {
        void validate(std::int64_t /*d_model*/, const std::string& /*where*/) const {}
    };
    static constexpr bool present = false;
};

/// SwiGLU MLP sub-block: r ← r + W_down(silu(W_gate h) ⊙ W_up h), h = norm(r).
struct swiglu_mlp {
    using weights_type = swiglu_weights;
    static constexpr bool present = true;
};

template <class M>
concept mlp_policy = requires { typename M::weights_type; { M::present } -> std::convertible_to<bool>; };


// ---- blocks -----------------------------------------------------------------------------------------------

/// A block: one layer of a stack. `forward(ctx, state, x)` updates the residual stream x [n_rows, d] in place for the
/// sequences of ctx.batch (rows outside them stay as they are), reading and updating `state` (the block's slots).
template <class Blk, class B>
concept block = backend<B> && requires { typename Blk::state_type; typename Blk::mixer_type; } &&
                mixer_state<typename Blk::state_type> &&
                requires(const Blk& b, block_context<B>& ctx, typename Blk::state_type& s, tensor_view<float, 2> x, std::int64_t n) {
                    { b.make_state(n) } -> std::same_as<typename Blk::state_type>;
                    b.forward(ctx, s, x);
                };

namespace detail {
/// A type is usable in bind<Kind, X> when it is a block or a mixer (on the CPU backend, the one every type must
/// support). The model checks the stronger per-backend concept when it is run.
template <class X>
concept block_or_mixer = block<X, cpu_backend> || mixer<X, cpu_backend>;
}  // namespace detail

// ---- kind → block binding ---------------------------------------------------------------------------------

/// Binds a schedule's layer kind to the block type (or mixer type, wrapped in the stack's pre-norm block) that
/// implements it in one compiled stack. A type that is neither fails here, naming the concept.
template <layer_kind Kind, detail::block_or_mixer X>
struct bind {
    static constexpr layer_kind kind = Kind;
    using type = X;
    static constexpr bool is_block = block<X, cpu_backend>;
};

}  // namespace hymix
