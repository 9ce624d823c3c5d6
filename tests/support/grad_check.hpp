// Central finite differences in double precision, the oracle of every backward pass (issue 8): a scalar loss
// L(θ) = Σ_i c_i · f_i(θ) with fixed random cotangents c, perturbed one input at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace hymix::test {

/// Random cotangent (upstream gradient) of n entries, uniform in [−1, 1).
inline std::vector<double> cotangent(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_real_distribution<double> d(-1.0, 1.0);
    std::vector<double> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

/// Σ_i a_i b_i.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) s += a[i] * b[i];
    return s;
}

/// Checks `analytic` (dL/dθ for θ = `theta`) against central differences of `loss`, which must read θ from
/// `theta` (it is perturbed in place and restored). At most `max_probes` entries are probed (all when the input is
/// smaller; else a seeded random subset that always includes the first and last entry). Passes when
/// |fd − analytic| ≤ tol · max(1, |analytic|) for every probed entry. `what` names the input in failures.
inline void check_gradient(const std::string& what, std::vector<double>& theta, const std::vector<double>& analytic,
                           const std::function<double()>& loss, double tol = 1e-6, double eps = 1e-6,
                           std::size_t max_probes = 48, std::uint64_t seed = 7) {
    REQUIRE_MESSAGE(theta.size() == analytic.size(), what << ": gradient has " << analytic.size() << " entries for "
                                                          << theta.size() << " inputs");
    std::vector<std::size_t> idx;
    if (theta.size() <= max_probes) {
        for (std::size_t i = 0; i < theta.size(); ++i) idx.push_back(i);
    } else {
        std::mt19937_64 g(seed);
        std::uniform_int_distribution<std::size_t> u(0, theta.size() - 1);
        idx.push_back(0);
        idx.push_back(theta.size() - 1);
        while (idx.size() < max_probes) idx.push_back(u(g));
    }
    double worst = 0;
    std::size_t worst_i = 0;
    for (const std::size_t i : idx) {
        const double x0 = theta[i], h = eps * std::max(1.0, std::abs(x0));
        theta[i] = x0 + h;
        const double lp = loss();
        theta[i] = x0 - h;
        const double lm = loss();
        theta[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        const double err = std::abs(fd - analytic[i]) / std::max(1.0, std::abs(analytic[i]));
        if (!(err <= worst)) {
            worst = err;
            worst_i = i;
        }
        if (!(err <= tol))
            FAIL_CHECK(what << "[" << i << "]: finite difference " << fd << ", analytic " << analytic[i] << " (error "
                            << err << ", tolerance " << tol << ")");
    }
    MESSAGE(what << ": worst finite-difference error " << worst << " at entry " << worst_i << " of " << theta.size());
}

}  // namespace hymix::test
