// Layer kinds: what a stack layer is (Mamba-2, Gated DeltaNet, attention, an MLP-only layer, or any kind a user's
// mixer declares), named by a one-letter pattern code (Nemotron-H `hybrid_override_pattern` letters) and a name.
// The set is open: a mixer declares its kind, name and Hugging Face layer types itself (`kind_info`), and stacks,
// schedules and checkpoint loaders read them from the bound types — adding a mixer edits no switch statement here.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace hymix {

/// A layer kind: its pattern letter (`code`, the identity: two kinds with one code are the same kind) and a
/// readable name. Structural, so kinds are template arguments: every_layer<layer_kind::mamba2>.
struct layer_kind {
    char code = '?';
    char name_chars[31]{};

    constexpr layer_kind() = default;
    constexpr layer_kind(char c, std::string_view n = {}) : code(c) {  // NOLINT: implicit from a letter by design
        for (std::size_t i = 0; i < n.size() && i + 1 < sizeof(name_chars); ++i) name_chars[i] = n[i];
    }
    constexpr bool operator==(const layer_kind& o) const noexcept { return code == o.code; }
    /// The declared name, or "" when the kind was made from its letter alone (see layer_kind_name).
    constexpr std::string_view declared_name() const noexcept { return std::string_view(name_chars); }

    static const layer_kind mamba2, gated_deltanet, attention, mlp;
};
inline constexpr layer_kind layer_kind::mamba2{'M', "mamba2"};
inline constexpr layer_kind layer_kind::gated_deltanet{'G', "gated_deltanet"};
inline constexpr layer_kind layer_kind::attention{'A', "attention"};
inline constexpr layer_kind layer_kind::mlp{'-', "mlp"};

/// The kinds hymix ships (each mixer header also declares its own kind_info with them).
inline constexpr std::array<layer_kind, 4> builtin_layer_kinds{layer_kind::mamba2, layer_kind::gated_deltanet,
                                                               layer_kind::attention, layer_kind::mlp};

/// What a mixer declares about its kind: the kind itself (letter and name) and the `layer_types` entries of Hugging
/// Face configs that mean it (up to four; empty entries unused).
struct kind_info {
    layer_kind kind;
    std::array<std::string_view, 4> hf_layer_types{};

    constexpr bool matches_hf(std::string_view t) const noexcept {
        return std::find(hf_layer_types.begin(), hf_layer_types.end(), t) != hf_layer_types.end() && !t.empty();
    }
};

/// The kind's name: the declared one, a built-in kind's name for its letter, or "kind 'X'".
inline std::string layer_kind_name(layer_kind k) {
    if (!k.declared_name().empty()) return std::string(k.declared_name());
    for (const auto& b : builtin_layer_kinds)
        if (b == k) return std::string(b.declared_name());
    return std::string("kind '") + k.code + "'";
}

/// The kind's pattern letter.
constexpr char layer_kind_code(layer_kind k) noexcept { return k.code; }

/// Compact schedule string of a list of kinds, e.g. "GGAGGA".
inline std::string schedule_string(std::span<const layer_kind> kinds) {
    std::string s;
    for (auto k : kinds) s += k.code;
    return s;
}

}  // namespace hymix
