// Fixed-schedule gates: which mixer kind each layer of a hybrid stack uses, decided per layer, not per token
// (spec.md §7). Schedules are types (every_layer, periodic, interval_rule, pattern<"M-M*-">, any_of) checked
// against the run-time list of a checkpoint's config.json (`layer_types`, `hybrid_override_pattern`) at load.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/schedule/layer_kind.hpp"

namespace hymix {

namespace detail {

/// Parses one pattern letter: '*' means attention (Nemotron-H), '-' an MLP layer, and any capital letter the kind
/// with that code (M Mamba-2, G Gated DeltaNet, A attention, and whatever letters the bound mixers declare: a stack
/// rejects, at compile time or at load, a kind no binding provides). Anything else is rejected: a throw in a constant
/// expression is a compile error, at run time a config_error.
constexpr layer_kind parse_pattern_char(char c, std::size_t index) {
    if (c == '*' || c == 'A') return layer_kind::attention;
    if (c == '-') return layer_kind::mlp;
    if (c == 'M') return layer_kind::mamba2;
    if (c == 'G') return layer_kind::gated_deltanet;
    if (c >= 'B' && c <= 'Z') return layer_kind(c);
    throw config_error("layer pattern: unsupported letter '" + std::string(1, c) + "' at layer " + std::to_string(index) +
                       " (expected a capital letter, * or -)");
}

[[noreturn]] inline void schedule_mismatch(std::string_view schedule, std::size_t layer, layer_kind expected,
                                           layer_kind found) {
    throw config_error("layer schedule " + std::string(schedule) + ": layer " + std::to_string(layer) + " is '" +
                       layer_kind_name(found) + "', expected '" + layer_kind_name(expected) + "'");
}

}  // namespace detail

/// A string literal usable as a template argument: pattern<"M-M*-">.
template <std::size_t N>
struct fixed_string {
    char chars[N]{};
    constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, chars); }  // NOLINT: implicit by design
    constexpr std::size_t size() const noexcept { return N - 1; }
    constexpr std::string_view view() const noexcept { return {chars, N - 1}; }
};

/// A layer schedule is a type that says which layer kinds it allows (`allows`, a constexpr predicate), how many
/// layers it fixes (`layer_count`, -1 for any number), and checks a run-time per-layer list (`check`, config_error
/// naming the first mismatching layer, the expected and the found kind). The list comes from a checkpoint's
/// config.json (the loaders prefix the error with its path) or from the layers of a stack built in code (the model's
/// constructor), so the messages name neither.
template <class S>
concept layer_schedule = requires(layer_kind k, std::span<const layer_kind> kinds) {
    { S::allows(k) } -> std::same_as<bool>;
    { S::layer_count } -> std::convertible_to<std::int64_t>;
    { S::is_static } -> std::convertible_to<bool>;
    { S::name() } -> std::convertible_to<std::string>;
    S::check(kinds);
};

/// A schedule whose kind for layer i is known at compile time (`kind_at(i)` is constexpr).
template <class S>
concept static_layer_schedule = layer_schedule<S> && S::is_static && requires(std::int64_t i) {
    { S::kind_at(i) } -> std::same_as<layer_kind>;
};

namespace detail {
/// Shared check for static schedules: the count (when fixed) and then every layer against kind_at.
template <class S>
void check_static(std::span<const layer_kind> kinds) {
    if (S::layer_count >= 0 && static_cast<std::int64_t>(kinds.size()) != S::layer_count)
        throw config_error("layer schedule " + S::name() + ": expected " + std::to_string(S::layer_count) +
                           " layers, found " + std::to_string(kinds.size()));
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        const layer_kind e = S::kind_at(static_cast<std::int64_t>(i));
        if (kinds[i] != e) schedule_mismatch(S::name(), i, e, kinds[i]);
    }
}
}  // namespace detail

/// Every layer uses the same kind (plain Mamba-2 models, all-GDN Qwen3.5 stacks).
template <layer_kind Kind>
struct every_layer {
    static constexpr bool is_static = true;
    static constexpr std::int64_t layer_count = -1;
    static constexpr layer_kind kind_at(std::int64_t) noexcept { return Kind; }
    static constexpr bool allows(layer_kind k) noexcept { return k == Kind; }
    static std::string name() { return "every_layer<" + layer_kind_name(Kind) + ">"; }
    static void check(std::span<const layer_kind> kinds) { detail::check_static<every_layer>(kinds); }
};

/// Attention iff i % Period == Offset, `Base` otherwise (Jamba: period 8, offset 4).
template <std::int64_t Period, std::int64_t Offset, layer_kind Base = layer_kind::mamba2>
    requires(Period > 0 && Offset >= 0 && Offset < Period && Base != layer_kind::attention)
struct periodic {
    static constexpr bool is_static = true;
    static constexpr std::int64_t layer_count = -1;
    static constexpr layer_kind kind_at(std::int64_t i) noexcept {
        return i % Period == Offset ? layer_kind::attention : Base;
    }
    static constexpr bool allows(layer_kind k) noexcept { return k == Base || k == layer_kind::attention; }
    static std::string name() {
        return "periodic<" + std::to_string(Period) + ", " + std::to_string(Offset) + ", " +
               layer_kind_name(Base) + ">";
    }
    static void check(std::span<const layer_kind> kinds) { detail::check_static<periodic>(kinds); }
};

/// Qwen3-Next / Qwen3.5 rule: attention iff (i + 1) % Interval == 0, `Base` (GDN) otherwise
/// (config key `full_attention_interval`, default 4).
template <std::int64_t Interval = 4, layer_kind Base = layer_kind::gated_deltanet>
    requires(Interval > 0 && Base != layer_kind::attention)
struct interval_rule {
    static constexpr bool is_static = true;
    static constexpr std::int64_t layer_count = -1;
    static constexpr std::int64_t interval = Interval;
    static constexpr layer_kind kind_at(std::int64_t i) noexcept {
        return (i + 1) % Interval == 0 ? layer_kind::attention : Base;
    }
    static constexpr bool allows(layer_kind k) noexcept {
        return k == Base || (k == layer_kind::attention && Interval >= 1);
    }
    static std::string name() {
        return "interval_rule<" + std::to_string(Interval) + ", " + layer_kind_name(Base) + ">";
    }
    static void check(std::span<const layer_kind> kinds) { detail::check_static<interval_rule>(kinds); }
};

/// An explicit per-layer pattern, one letter per layer, parsed at compile time:
/// M Mamba-2, G Gated DeltaNet, A or * attention, - MLP (Nemotron-H "M-M*-", Qwen "GGAGGA").
/// The number of layers is fixed by the pattern.
template <fixed_string Pattern>
struct pattern {
    static constexpr std::int64_t layer_count = static_cast<std::int64_t>(Pattern.size());
    static_assert(layer_count > 0, "pattern<...>: the layer pattern must not be empty");
    static constexpr std::array<layer_kind, Pattern.size()> kinds = [] {
        std::array<layer_kind, Pattern.size()> a{};
        for (std::size_t i = 0; i < Pattern.size(); ++i) a[i] = detail::parse_pattern_char(Pattern.chars[i], i);
        return a;
    }();
    static constexpr bool is_static = true;
    static constexpr layer_kind kind_at(std::int64_t i) noexcept { return kinds[static_cast<std::size_t>(i)]; }
    static constexpr bool allows(layer_kind k) noexcept {
        return std::find(kinds.begin(), kinds.end(), k) != kinds.end();
    }
    static std::string name() { return "pattern<\"" + std::string(Pattern.view()) + "\">"; }
    static void check(std::span<const layer_kind> kinds_found) { detail::check_static<pattern>(kinds_found); }
};

/// The run-time list decides; the type only fixes which kinds may appear (and so which mixer types a layer
/// must be able to hold). For checkpoints whose `layer_types` follow no rule known at compile time.
template <layer_kind... Kinds>
    requires(sizeof...(Kinds) > 0)
struct any_of {
    static constexpr bool is_static = false;
    static constexpr std::int64_t layer_count = -1;
    static constexpr bool allows(layer_kind k) noexcept { return ((k == Kinds) || ...); }
    static std::string name() {
        std::string s = "any_of<";
        bool first = true;
        for (auto k : {Kinds...}) {
            if (!first) s += ", ";
            s += layer_kind_name(k);
            first = false;
        }
        return s + ">";
    }
    static void check(std::span<const layer_kind> kinds) {
        for (std::size_t i = 0; i < kinds.size(); ++i)
            if (!allows(kinds[i]))
                throw config_error("layer schedule " + name() + ": layer " + std::to_string(i) + " is '" +
                                   layer_kind_name(kinds[i]) + "', which this schedule does not allow");
    }
};

/// The per-layer kinds a static schedule gives for n layers.
template <static_layer_schedule S>
std::vector<layer_kind> schedule_kinds(std::int64_t n_layers) {
    if (S::layer_count >= 0 && n_layers != S::layer_count)
        throw config_error("layer schedule " + S::name() + ": expected " + std::to_string(S::layer_count) +
                           " layers, asked for " + std::to_string(n_layers));
    std::vector<layer_kind> v(static_cast<std::size_t>(n_layers));
    for (std::int64_t i = 0; i < n_layers; ++i) v[static_cast<std::size_t>(i)] = S::kind_at(i);
    return v;
}

/// Kinds from a Nemotron-H `hybrid_override_pattern` (M, *, -; also G and A). Throws config_error on other letters.
inline std::vector<layer_kind> kinds_from_pattern(std::string_view p) {
    std::vector<layer_kind> v;
    v.reserve(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) v.push_back(detail::parse_pattern_char(p[i], i));
    return v;
}

/// Kind of one entry of a config.json layer list. `linear_attention` means the family's recurrent mixer
/// (`linear_kind`: GDN for Qwen3-Next/3.5, Mamba-2 for Nemotron-H `layers_block_type`); `full_attention` and
/// `attention` mean softmax attention; `mamba`/`mamba2`/`m2` Mamba-2; `mlp` an MLP layer; any other entry is looked up
/// in the Hugging Face layer types that the stack's mixers declare (`declared`, e.g. "sliding_attention"). Throws
/// config_error naming the layer index and the entry otherwise.
inline layer_kind kind_from_layer_type(std::string_view t, layer_kind linear_kind, std::size_t index,
                                       std::span<const kind_info> declared = {}) {
    if (t == "linear_attention") return linear_kind;
    if (t == "full_attention" || t == "attention") return layer_kind::attention;
    if (t == "mamba" || t == "mamba2" || t == "m2") return layer_kind::mamba2;
    if (t == "gated_deltanet") return layer_kind::gated_deltanet;
    if (t == "mlp") return layer_kind::mlp;
    for (const auto& k : declared)
        if (k.matches_hf(t)) return k.kind;
    std::string known = "linear_attention, full_attention, mamba2, mlp";
    for (const auto& k : declared)
        for (auto h : k.hf_layer_types)
            if (!h.empty() && known.find(h) == std::string::npos) known += ", " + std::string(h);
    throw config_error("layer_types: unsupported layer type '" + std::string(t) + "' at layer " + std::to_string(index) +
                       " (expected " + known + ")");
}

/// Kinds from a Qwen-style `layer_types` list.
inline std::vector<layer_kind> kinds_from_layer_types(std::span<const std::string> types, layer_kind linear_kind,
                                                      std::span<const kind_info> declared = {}) {
    std::vector<layer_kind> v;
    v.reserve(types.size());
    for (std::size_t i = 0; i < types.size(); ++i) v.push_back(kind_from_layer_type(types[i], linear_kind, i, declared));
    return v;
}

static_assert(static_layer_schedule<every_layer<layer_kind::mamba2>>);
static_assert(static_layer_schedule<periodic<8, 4>>);
static_assert(static_layer_schedule<interval_rule<4>>);
static_assert(static_layer_schedule<pattern<"M-M*-">>);
static_assert(layer_schedule<any_of<layer_kind::gated_deltanet, layer_kind::attention>>);
static_assert(!static_layer_schedule<any_of<layer_kind::gated_deltanet>>);

}  // namespace hymix
