// Per-token gates: which rows of a block's input the block acts on. A gate sees the block's normalised input rows
// and the block context (LM head, final norm, per-token side inputs) and fills a fire mask; it may keep statistics
// (AMOR's entropy EMA, spec.md §5.2) that training updates and inference freezes. `always` and `never` are the two
// trivial gates: `always` makes a gated block equal to the plain block bit for bit; `never` makes it the identity on
// the stream while its state (KV cache) still receives every token. Per-layer schedules are in schedule/.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>

#include "hymix/core/tensor.hpp"

namespace hymix {

/// A per-token gate: `decide(ctx, h, fire)` sets fire[r] (1 or 0) for every row r of h [n_rows, d] (only live rows
/// matter; the block ANDs the mask with them). `fires_all` / `fires_none` say when the answer is known at compile
/// time, so blocks can take their ungated path. `name` is used in statistics and error messages.
template <class G, class Ctx>
concept token_gate = requires(const G& g, const Ctx& ctx, tensor_view<const float, 2> h, std::span<unsigned char> fire) {
    { G::name } -> std::convertible_to<const char*>;
    { G::fires_all } -> std::convertible_to<bool>;
    { G::fires_none } -> std::convertible_to<bool>;
    g.decide(ctx, h, fire);
};

/// Every token fires: the block is the plain block.
struct always {
    static constexpr const char* name = "always";
    static constexpr bool fires_all = true;
    static constexpr bool fires_none = false;
    template <class Ctx>
    void decide(const Ctx&, tensor_view<const float, 2>, std::span<unsigned char> fire) const {
        std::fill(fire.begin(), fire.end(), static_cast<unsigned char>(1));
    }
};

/// No token fires: the block adds nothing to the stream, but its mixer state still sees every token.
struct never {
    static constexpr const char* name = "never";
    static constexpr bool fires_all = false;
    static constexpr bool fires_none = true;
    template <class Ctx>
    void decide(const Ctx&, tensor_view<const float, 2>, std::span<unsigned char> fire) const {
        std::fill(fire.begin(), fire.end(), static_cast<unsigned char>(0));
    }
};

/// Fires where the caller's per-token side input (block_context::side, one byte per row) is non-zero: an explicit
/// per-token list, as Oryx's inference schedules give one (spec.md §6.6). Without a side input nothing fires.
struct side_input_gate {
    static constexpr const char* name = "side_input";
    static constexpr bool fires_all = false;
    static constexpr bool fires_none = false;
    template <class Ctx>
    void decide(const Ctx& ctx, tensor_view<const float, 2> h, std::span<unsigned char> fire) const {
        for (std::size_t r = 0; r < fire.size(); ++r)
            fire[r] = (r < ctx.side.size() && static_cast<std::int64_t>(r) < h.dim(0) && ctx.side[r]) ? 1 : 0;
    }
};

}  // namespace hymix
