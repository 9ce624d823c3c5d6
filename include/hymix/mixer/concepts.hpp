// The mixer policy: what a sequence mixer (Mamba-2, Gated DeltaNet, attention, Oryx multi-mixer) must
// provide so stacks can compose it. A mixer is one function (x, state_in) -> (y, state_out) (spec.md §0):
// `forward` takes any token counts (chunked prefill), `step` exactly one token per sequence (decode).
#pragma once

#include <concepts>
#include <cstdint>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/layer_kind.hpp"

namespace hymix {

/// Per-sequence state held in numbered slots (recurrent state + conv state, or KV cache).
template <class S>
concept mixer_state = requires(S& s, const S& cs, std::int64_t i) {
    { cs.n_slots() } -> std::convertible_to<std::int64_t>;
    s.reset_slot(i);          // a fresh sequence: zeros / empty cache
    s.copy_slot(i, i);        // prompt caching: slot `to` becomes a copy of slot `from`
};

/// A mixer that declares its layer kind (letter, name, Hugging Face layer types): `static constexpr kind_info kind`.
template <class M>
concept declares_kind = requires { { M::kind } -> std::convertible_to<kind_info>; };

/// A sequence mixer usable on backend B. x and y are [n_rows, d_model] fp32 token matrices described by a
/// seq_batch; the state is read at each sequence's slot and updated in place.
template <class M, class B>
concept mixer = backend<B> && requires { typename M::config_type; typename M::weights_type; typename M::state_type; } &&
                mixer_state<typename M::state_type> &&
                requires(const M& m, const B& be, typename M::state_type& s, const seq_batch& batch,
                         tensor_view<const float, 2> x, tensor_view<float, 2> y, std::int64_t n) {
                    { m.config() } -> std::convertible_to<const typename M::config_type&>;
                    { m.make_state(n) } -> std::same_as<typename M::state_type>;
                    m.forward(be, s, batch, x, y);
                    m.step(be, s, batch, x, y);
                };

}  // namespace hymix
