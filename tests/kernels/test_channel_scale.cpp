// ops::scale_columns and its backward (AMOR's α ⊙ o, spec.md §5.3) on both backends against plain loops and central
// finite differences.
#include <doctest/doctest.h>

#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/ops/channel_scale.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

TEST_CASE_TEMPLATE("scale_columns scales the masked rows; its backward matches finite differences", B, cpu_backend, reference_backend) {
    const std::int64_t n = 77, d = 13;
    const auto y0 = test::uniform(static_cast<std::size_t>(n * d), -2.f, 2.f, 1);
    const auto s = test::uniform(static_cast<std::size_t>(d), 0.1f, 0.9f, 2);
    std::vector<unsigned char> mask(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r) mask[static_cast<std::size_t>(r)] = r % 3 != 0;
    B be(2);
    std::vector<float> y = y0;
    ops::scale_columns(be, tensor_view<float, 2>(y.data(), {n, d}), s.data(), mask);
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t c = 0; c < d; ++c)
            CHECK(y[r * d + c] == doctest::Approx(mask[r] ? y0[r * d + c] * s[c] : y0[r * d + c]).epsilon(1e-6));
    // L = Σ dout ⊙ scale_columns(y0): dL/dy0 and dL/dscale.
    const auto dout = test::uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, 3);
    std::vector<float> dy(static_cast<std::size_t>(n * d)), ds(static_cast<std::size_t>(d), 0.5f);
    ops::scale_columns_backward(be, tensor_view<const float, 2>(y0.data(), {n, d}), s.data(), tensor_view<const float, 2>(dout.data(), {n, d}),
                                tensor_view<float, 2>(dy.data(), {n, d}), ds.data(), mask);
    std::vector<double> theta(s.begin(), s.end()), analytic(ds.begin(), ds.end());
    for (auto& a : analytic) a -= 0.5;  // accumulated onto 0.5
    auto loss = [&]() {
        double L = 0;
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t c = 0; c < d; ++c) L += dout[r * d + c] * (mask[r] ? y0[r * d + c] * theta[c] : y0[r * d + c]);
        return L;
    };
    test::check_gradient("dscale", theta, analytic, loss, 1e-5);
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t c = 0; c < d; ++c) CHECK(dy[r * d + c] == doctest::Approx(mask[r] ? dout[r * d + c] * s[c] : dout[r * d + c]).epsilon(1e-6));
    CHECK_THROWS_AS(ops::scale_columns(be, tensor_view<float, 2>(y.data(), {n, d}), s.data(), std::span(mask).subspan(1)), shape_error);
}
