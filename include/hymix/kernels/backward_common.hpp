// Pieces shared by the CPU backward kernels: fp32 xsimd dot products and sigmoid, and the deterministic reduction
// of a parameter gradient over fixed row blocks (per-block partials summed in block order, so the result does not
// depend on the thread count: TRAINING_PLAN / issue 8 "deterministic for a given thread count").
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/core/math.hpp"

namespace hymix::kernels::detail {

/// Runs f(r0, r1, partial) over fixed blocks of `block` rows of [0, rows) in parallel; `partial` is the block's own
/// zeroed fp32 buffer of n entries (nullptr when dw is null). Afterwards dw[i] += Σ_blocks partial[i], summed in
/// block order in fp64. The partition depends on rows and block only, so dw is bit-identical for any thread count.
template <class Backend, class F>
void blocked_param_grad(const Backend& be, std::int64_t rows, std::int64_t block, float* dw, std::int64_t n, F&& f) {
    if (rows <= 0) return;
    const std::int64_t nb = (rows + block - 1) / block;
    std::vector<float> part(dw ? static_cast<std::size_t>(nb * n) : 0, 0.f);  // [nb, n]
    be.parallel_for(nb, 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t b = b0; b < b1; ++b)
            f(b * block, std::min(rows, (b + 1) * block), dw ? part.data() + b * n : nullptr);
    });
    if (!dw) return;
    for (std::int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (std::int64_t b = 0; b < nb; ++b) s += static_cast<double>(part[static_cast<std::size_t>(b * n + i)]);
        dw[i] = static_cast<float>(static_cast<double>(dw[i]) + s);
    }
}

/// Σ a_i·b_i in fp32 with W-lane accumulators (xsimd architecture Arch).
template <class Arch>
inline float dot_f32(const float* a, const float* b, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc(0.f);
    std::int64_t i = 0;
    for (; i + W <= n; i += W) acc = xsimd::fma(V::load_unaligned(a + i), V::load_unaligned(b + i), acc);
    float s = xsimd::hadd(acc);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/// Σ a_i·b_i·c_i in fp32.
template <class Arch>
inline float dot3_f32(const float* a, const float* b, const float* c, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc(0.f);
    std::int64_t i = 0;
    for (; i + W <= n; i += W)
        acc = xsimd::fma(V::load_unaligned(a + i) * V::load_unaligned(b + i), V::load_unaligned(c + i), acc);
    float s = xsimd::hadd(acc);
    for (; i < n; ++i) s += a[i] * b[i] * c[i];
    return s;
}

/// s_i = σ(z_i) in fp32.
template <class Arch>
inline void sigmoid_f32(const float* z, float* s, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    std::int64_t i = 0;
    for (; i + W <= n; i += W) (V(1.f) / (V(1.f) + xsimd::exp(-V::load_unaligned(z + i)))).store_unaligned(s + i);
    for (; i < n; ++i) s[i] = sigmoid(z[i]);
}

}  // namespace hymix::kernels::detail
