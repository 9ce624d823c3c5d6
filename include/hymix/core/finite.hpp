// Non-finite values (NaN, ±Inf) as errors: `nonfinite_error`, and helpers that find and name the first
// non-finite element of a buffer, so that no result holding one is ever returned as a success (spec.md §2 keeps
// −∞ only as a masking score inside attention; weights, logits and reported metrics must be finite).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "hymix/core/error.hpp"

namespace hymix {

/// A weight, an input or a result holds NaN or ±Inf where a finite value is required.
struct nonfinite_error : value_error {
    using value_error::value_error;
};

/// "NaN", "+Inf" or "-Inf" (or the number, for a finite value).
inline std::string nonfinite_name(double v) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    return std::to_string(v);
}

/// Index of the first non-finite element of `v`, or -1 when every element is finite.
template <class T>
std::int64_t first_nonfinite(std::span<const T> v) noexcept {
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i])) return static_cast<std::int64_t>(i);
    return -1;
}

/// Throws nonfinite_error "`what`[i] = NaN (and n more non-finite values)" when `v` holds a non-finite element.
template <class T>
void require_finite(std::span<const T> v, std::string_view what) {
    const std::int64_t i = first_nonfinite(v);
    if (i < 0) return;
    std::int64_t more = 0;
    for (std::size_t j = static_cast<std::size_t>(i) + 1; j < v.size(); ++j) more += !std::isfinite(v[j]);
    std::string m = std::string(what) + "[" + std::to_string(i) + "] = " + nonfinite_name(static_cast<double>(v[static_cast<std::size_t>(i)]));
    if (more > 0) m += " (and " + std::to_string(more) + " more non-finite values)";
    throw nonfinite_error(m);
}

}  // namespace hymix
