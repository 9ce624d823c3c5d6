// Scalar activation functions with the exact conventions of spec.md §0:
// softplus(x) = x for x > 20 (finite everywhere), sigmoid, silu. Templated so the fp64 references share them.
#pragma once

#include <cmath>

namespace hymix {

template <class T> inline T sigmoid(T x) noexcept { return T(1) / (T(1) + std::exp(-x)); }
template <class T> inline T silu(T x) noexcept { return x * sigmoid(x); }
/// softplus with the threshold of mamba_ssm / PyTorch (beta 1, threshold 20).
template <class T> inline T softplus(T x) noexcept { return x > T(20) ? x : std::log1p(std::exp(x)); }

}  // namespace hymix
