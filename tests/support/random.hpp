// Deterministic random inputs and error metrics shared by the kernel tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace hymix::test {

/// Fresh random vector with entries uniform in [lo, hi).
inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// Relative error ||a - b|| / ||b|| (Frobenius), with b the reference.
template <class A, class B>
double rel_error(const A* a, const B* b, std::size_t n) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        num += d * d;
        den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
    }
    if (den == 0) return std::sqrt(num);
    return std::sqrt(num / den);
}
template <class VA, class VB>
double rel_error(const VA& a, const VB& b) {
    return rel_error(a.data(), b.data(), a.size());
}

/// Max |a - b|.
template <class VA, class VB>
double max_abs_diff(const VA& a, const VB& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    return m;
}

}  // namespace hymix::test
