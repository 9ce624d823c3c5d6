// Per-token mode schedules of Oryx multi-mixer layers (spec.md §6.4–6.6): which read-out (softmax attention or the
// linear mixer) each token's layer output uses. A schedule is a policy answering "mode of the token at this position of
// this sequence in this kind of call"; modes_for() turns it into the one-byte-per-row side input of a seq_batch.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"

namespace hymix {

/// The read-out of one token; the byte values are those of the side input (1 = attention, 0 = linear).
enum class token_mode : unsigned char { linear = 0, attention = 1 };

/// What kind of call the tokens come in: a prompt (prefill; any token counts) or generated tokens (decode).
enum class call_phase { prefill, decode };

/// A mode schedule: `mode(seq, pos, phase)` gives the mode of the token at absolute position `pos` (0-based, counted
/// from the sequence's first token) of the sequence identified by `seq` (an id chosen by the caller: the batch index,
/// a training-example counter, ...), in a call of the given phase.
template <class S>
concept mode_schedule = requires(const S& s, std::uint64_t seq, std::int64_t pos, call_phase ph) {
    { s.mode(seq, pos, ph) } -> std::same_as<token_mode>;
};

/// Every token reads out through the linear mixer.
struct all_linear {
    static constexpr const char* name = "all_linear";
    token_mode mode(std::uint64_t, std::int64_t, call_phase) const noexcept { return token_mode::linear; }
};

/// Every token reads out through softmax attention.
struct all_attention {
    static constexpr const char* name = "all_attention";
    token_mode mode(std::uint64_t, std::int64_t, call_phase) const noexcept { return token_mode::attention; }
};

/// Prompt tokens linear (the KV cache is still filled), generated tokens attention (spec.md §6.6).
struct linear_prefill_attention_decode {
    static constexpr const char* name = "linear_prefill_attention_decode";
    token_mode mode(std::uint64_t, std::int64_t, call_phase ph) const noexcept {
        return ph == call_phase::decode ? token_mode::attention : token_mode::linear;
    }
};

/// One attention block of `block` tokens every `every` blocks: the token at position p is attention iff
/// (p / block) % every == offset (offset 0: the sequence starts with an attention block). every = 1 is all-attention;
/// the attention fraction is 1/every.
struct periodic_modes {
    static constexpr const char* name = "periodic";
    std::int64_t every = 8;
    std::int64_t block = 128;
    std::int64_t offset = 0;

    /// Throws config_error unless every >= 1, block >= 1 and 0 <= offset < every.
    void validate() const {
        if (every < 1 || block < 1 || offset < 0 || offset >= every)
            throw config_error("periodic mode schedule: need every >= 1, block >= 1 and 0 <= offset < every; found every " +
                               std::to_string(every) + ", block " + std::to_string(block) + ", offset " + std::to_string(offset));
    }
    token_mode mode(std::uint64_t, std::int64_t pos, call_phase) const noexcept {
        return (pos / block) % every == offset ? token_mode::attention : token_mode::linear;
    }
};

/// Block-random training modes (spec.md §6.5): positions of each sequence split into blocks of `block_size` tokens;
/// each block is attention with probability p_attention, drawn independently per (sequence id, block) from `seed` by a
/// counter-based hash, so a draw is reproducible, independent of call order and of how a sequence is split into calls.
/// One draw is shared by all layers (the same side input goes to every layer); per-layer draws use one schedule per
/// layer with different seeds.
struct block_random {
    static constexpr const char* name = "block_random";
    std::int64_t block_size = 128;
    double p_attention = 0.5;
    std::uint64_t seed = 0;

    /// Throws config_error unless block_size >= 1 and p_attention lies in [0, 1].
    void validate() const {
        if (block_size < 1 || !(p_attention >= 0.0 && p_attention <= 1.0))
            throw config_error("block_random mode schedule: need block_size >= 1 and p_attention in [0, 1]; found " +
                               std::to_string(block_size) + ", " + std::to_string(p_attention));
    }
    /// The uniform draw in [0, 1) of block `blk` of sequence `seq`.
    double draw(std::uint64_t seq, std::int64_t blk) const noexcept {
        std::uint64_t h = mix(seed ^ 0x6f72797862726e64ULL);  // "oryxbrnd"
        h = mix(h ^ mix(seq + 0x9e3779b97f4a7c15ULL));
        h = mix(h ^ static_cast<std::uint64_t>(blk));
        return static_cast<double>(h >> 11) * 0x1.0p-53;
    }
    token_mode mode(std::uint64_t seq, std::int64_t pos, call_phase) const noexcept {
        return draw(seq, pos / block_size) < p_attention ? token_mode::attention : token_mode::linear;
    }

private:
    static std::uint64_t mix(std::uint64_t z) noexcept {  // splitmix64 finaliser
        z += 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
};

/// An explicit per-token list: lists[seq][pos] (a single list is shared by every sequence). Positions past the end of
/// a list take `beyond` when set; otherwise they are an error (value_error).
struct mode_list {
    static constexpr const char* name = "list";
    std::vector<std::vector<token_mode>> lists;
    std::optional<token_mode> beyond;

    token_mode mode(std::uint64_t seq, std::int64_t pos, call_phase) const {
        if (lists.empty()) throw value_error("mode_list: no list given");
        const auto& l = lists.size() == 1 ? lists[0] : lists.at(checked_seq(seq));
        if (pos >= 0 && pos < static_cast<std::int64_t>(l.size())) return l[static_cast<std::size_t>(pos)];
        if (beyond) return *beyond;
        throw value_error("mode_list: position " + std::to_string(pos) + " of sequence " + std::to_string(seq) +
                          " is past the end of its list (" + std::to_string(l.size()) + " modes) and no `beyond` mode is set");
    }

private:
    std::size_t checked_seq(std::uint64_t seq) const {
        if (seq >= lists.size())
            throw value_error("mode_list: sequence " + std::to_string(seq) + " has no list (" + std::to_string(lists.size()) + " lists)");
        return static_cast<std::size_t>(seq);
    }
};

static_assert(mode_schedule<all_linear> && mode_schedule<all_attention> && mode_schedule<linear_prefill_attention_decode> &&
              mode_schedule<periodic_modes> && mode_schedule<block_random> && mode_schedule<mode_list>);

/// Writes the mode byte of every row of `b` into out [n_rows]: row t of sequence i (position n_past[i] + t) gets
/// s.mode(seq_ids[i], n_past[i] + t, phase); rows outside every sequence get 0. n_past empty: every sequence starts
/// at position 0 (training, a fresh prompt); seq_ids empty: sequence i has id i. Throws shape_error on size mismatches.
template <mode_schedule S>
void fill_modes(const S& s, const seq_batch& b, call_phase phase, std::span<unsigned char> out, std::span<const std::int64_t> n_past = {},
                std::span<const std::uint64_t> seq_ids = {}) {
    const auto n = static_cast<std::size_t>(b.n_seq());
    if (static_cast<std::int64_t>(out.size()) != b.n_rows)
        throw shape_error("fill_modes: out has " + std::to_string(out.size()) + " entries for " + std::to_string(b.n_rows) + " rows");
    if (!n_past.empty() && n_past.size() != n)
        throw shape_error("fill_modes: n_past has " + std::to_string(n_past.size()) + " entries for " + std::to_string(n) + " sequences");
    if (!seq_ids.empty() && seq_ids.size() != n)
        throw shape_error("fill_modes: seq_ids has " + std::to_string(seq_ids.size()) + " entries for " + std::to_string(n) + " sequences");
    b.validate();
    std::fill(out.begin(), out.end(), static_cast<unsigned char>(0));
    for (std::size_t i = 0; i < n; ++i) {
        const std::int64_t p0 = n_past.empty() ? 0 : n_past[i];
        const std::uint64_t id = seq_ids.empty() ? static_cast<std::uint64_t>(i) : seq_ids[i];
        for (std::int64_t t = 0; t < b.lengths[i]; ++t)
            out[static_cast<std::size_t>(b.starts[i] + t)] = static_cast<unsigned char>(s.mode(id, p0 + t, phase));
    }
}

/// The mode bytes [n_rows] of a call (see fill_modes).
template <mode_schedule S>
std::vector<unsigned char> modes_for(const S& s, const seq_batch& b, call_phase phase, std::span<const std::int64_t> n_past = {},
                                     std::span<const std::uint64_t> seq_ids = {}) {
    std::vector<unsigned char> out(static_cast<std::size_t>(std::max<std::int64_t>(b.n_rows, 0)));
    fill_modes(s, b, phase, out, n_past, seq_ids);
    return out;
}

/// As above with the phase read from the call's shape: decode when every sequence holds exactly one token. A caller
/// that knows better (a one-token prompt is a prefill) passes the phase.
template <mode_schedule S>
std::vector<unsigned char> modes_for(const S& s, const seq_batch& b, std::span<const std::int64_t> n_past = {},
                                     std::span<const std::uint64_t> seq_ids = {}) {
    return modes_for(s, b, b.n_seq() > 0 && b.is_decode() ? call_phase::decode : call_phase::prefill, n_past, seq_ids);
}

/// A schedule chosen at run time (a tool's --schedule flag, a config file).
using any_mode_schedule =
    std::variant<all_linear, all_attention, linear_prefill_attention_decode, periodic_modes, block_random, mode_list>;

/// The mode of a run-time schedule (so any_mode_schedule is itself a mode schedule through this wrapper).
struct dynamic_mode_schedule {
    any_mode_schedule s;
    token_mode mode(std::uint64_t seq, std::int64_t pos, call_phase ph) const {
        return std::visit([&](const auto& x) { return x.mode(seq, pos, ph); }, s);
    }
};

namespace detail {
inline std::int64_t parse_schedule_int(std::string_view s, std::string_view spec) {
    std::int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size())
        throw config_error("mode schedule \"" + std::string(spec) + "\": \"" + std::string(s) + "\" is not an integer");
    return v;
}
inline double parse_schedule_double(std::string_view s, std::string_view spec) {
    std::size_t used = 0;
    double v = 0;
    try {
        v = std::stod(std::string(s), &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != s.size() || s.empty())
        throw config_error("mode schedule \"" + std::string(spec) + "\": \"" + std::string(s) + "\" is not a number");
    return v;
}
}  // namespace detail

/// Parses a named schedule: "all_linear", "all_attention", "linear_prefill_attention_decode",
/// "periodic:EVERY[:BLOCK[:OFFSET]]" (block 128, offset 0 by default), "block_random[:P[:BLOCK[:SEED]]]"
/// (0.5, 128, 0). Throws config_error naming the spec on anything else.
inline any_mode_schedule parse_mode_schedule(std::string_view spec) {
    std::vector<std::string_view> part;
    for (std::size_t b = 0;;) {
        const std::size_t e = spec.find(':', b);
        part.push_back(spec.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
        if (e == std::string_view::npos) break;
        b = e + 1;
    }
    const std::string_view head = part[0];
    auto arity = [&](std::size_t lo, std::size_t hi) {
        if (part.size() - 1 < lo || part.size() - 1 > hi)
            throw config_error("mode schedule \"" + std::string(spec) + "\": " + std::string(head) + " takes " + std::to_string(lo) +
                               " to " + std::to_string(hi) + " parameters, found " + std::to_string(part.size() - 1));
    };
    if (head == all_linear::name) {
        arity(0, 0);
        return all_linear{};
    }
    if (head == all_attention::name) {
        arity(0, 0);
        return all_attention{};
    }
    if (head == linear_prefill_attention_decode::name) {
        arity(0, 0);
        return linear_prefill_attention_decode{};
    }
    if (head == periodic_modes::name) {
        arity(1, 3);
        periodic_modes p;
        p.every = detail::parse_schedule_int(part[1], spec);
        if (part.size() > 2) p.block = detail::parse_schedule_int(part[2], spec);
        if (part.size() > 3) p.offset = detail::parse_schedule_int(part[3], spec);
        p.validate();
        return p;
    }
    if (head == block_random::name) {
        arity(0, 3);
        block_random r;
        if (part.size() > 1) r.p_attention = detail::parse_schedule_double(part[1], spec);
        if (part.size() > 2) r.block_size = detail::parse_schedule_int(part[2], spec);
        if (part.size() > 3) r.seed = static_cast<std::uint64_t>(detail::parse_schedule_int(part[3], spec));
        r.validate();
        return r;
    }
    throw config_error("mode schedule \"" + std::string(spec) +
                       "\": unknown; expected all_linear, all_attention, linear_prefill_attention_decode, "
                       "periodic:EVERY[:BLOCK[:OFFSET]] or block_random[:P[:BLOCK[:SEED]]]");
}

}  // namespace hymix
