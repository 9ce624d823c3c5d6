// RoPE (spec.md §2): fp32 kernel vs fp64 reference, hand-computed values for both pairings, partial rotary
// pass-through, the relative-position property, the rotate-half ↔ interleaved permutation, bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hymix/kernels/rope.hpp"
#include "support/random.hpp"

using namespace hymix;
using kernels::rope_mode;

namespace {

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("rope: fp32 kernel matches the fp64 reference (both pairings, partial factors, large positions)") {
    const std::int64_t T = 37, H = 3, dh = 24;
    for (auto mode : {rope_mode::rotate_half, rope_mode::interleaved})
        for (double factor : {1.0, 0.5, 0.25}) {
            const std::int64_t d_rot = kernels::rope_dims(dh, factor);
            auto x = test::uniform(static_cast<std::size_t>(T * H * dh), -2.f, 2.f, 11);
            auto xd = to_double(x);
            std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
            std::mt19937_64 g(5);
            for (auto& p : pos) p = static_cast<std::int64_t>(g() % 200000);
            pos[0] = 0;
            kernels::rope(tensor_view<float, 3>(x.data(), {T, H, dh}), pos, mode, 1e4, d_rot);
            kernels::rope_ref(tensor_view<double, 3>(xd.data(), {T, H, dh}), pos, mode, 1e4, d_rot);
            CAPTURE(factor);
            CHECK(test::rel_error(x, xd) < 1e-6);
            // Pass-through channels are untouched, bit for bit.
            const auto orig = test::uniform(static_cast<std::size_t>(T * H * dh), -2.f, 2.f, 11);
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t c = d_rot; c < dh; ++c) {
                        const auto i = static_cast<std::size_t>((t * H + h) * dh + c);
                        REQUIRE(x[i] == orig[i]);
                    }
            // Position 0 is the identity.
            for (std::int64_t i = 0; i < H * dh; ++i) CHECK(x[static_cast<std::size_t>(i)] == orig[static_cast<std::size_t>(i)]);
        }
}

TEST_CASE("rope: hand-computed angles for rotate-half and interleaved") {
    // d_h = 4, base 1e4: θ_0 = 1, θ_1 = 1e4^(-1/2) = 0.01. Position 3.
    const std::vector<std::int64_t> pos{3};
    {
        std::vector<float> x{1.f, 2.f, 3.f, 4.f};
        kernels::rope(tensor_view<float, 3>(x.data(), {1, 1, 4}), pos, rope_mode::rotate_half, 1e4, 4);
        // pairs (0, 2) with φ = 3 and (1, 3) with φ = 0.03
        CHECK(x[0] == doctest::Approx(1 * std::cos(3.0) - 3 * std::sin(3.0)).epsilon(1e-6));
        CHECK(x[2] == doctest::Approx(3 * std::cos(3.0) + 1 * std::sin(3.0)).epsilon(1e-6));
        CHECK(x[1] == doctest::Approx(2 * std::cos(0.03) - 4 * std::sin(0.03)).epsilon(1e-6));
        CHECK(x[3] == doctest::Approx(4 * std::cos(0.03) + 2 * std::sin(0.03)).epsilon(1e-6));
    }
    {
        std::vector<float> x{1.f, 2.f, 3.f, 4.f};
        kernels::rope(tensor_view<float, 3>(x.data(), {1, 1, 4}), pos, rope_mode::interleaved, 1e4, 4);
        // pairs (0, 1) with φ = 3 and (2, 3) with φ = 0.03
        CHECK(x[0] == doctest::Approx(1 * std::cos(3.0) - 2 * std::sin(3.0)).epsilon(1e-6));
        CHECK(x[1] == doctest::Approx(2 * std::cos(3.0) + 1 * std::sin(3.0)).epsilon(1e-6));
        CHECK(x[2] == doctest::Approx(3 * std::cos(0.03) - 4 * std::sin(0.03)).epsilon(1e-6));
        CHECK(x[3] == doctest::Approx(4 * std::cos(0.03) + 3 * std::sin(0.03)).epsilon(1e-6));
    }
    {
        std::vector<float> x{1.f, 2.f, 3.f, 4.f};
        kernels::rope(tensor_view<float, 3>(x.data(), {1, 1, 4}), pos, rope_mode::none, 1e4, 4);
        CHECK(x == std::vector<float>{1.f, 2.f, 3.f, 4.f});
    }
}

TEST_CASE("rope: scores depend only on the position difference; norms are preserved") {
    const std::int64_t dh = 32;
    for (auto mode : {rope_mode::rotate_half, rope_mode::interleaved}) {
        const auto q0 = to_double(test::uniform(dh, -1.f, 1.f, 1));
        const auto k0 = to_double(test::uniform(dh, -1.f, 1.f, 2));
        auto score = [&](std::int64_t pq, std::int64_t pk) {
            auto q = q0, k = k0;
            const std::vector<std::int64_t> a{pq}, b{pk};
            kernels::rope_ref(tensor_view<double, 3>(q.data(), {1, 1, dh}), a, mode, 1e4, dh);
            kernels::rope_ref(tensor_view<double, 3>(k.data(), {1, 1, dh}), b, mode, 1e4, dh);
            double s = 0, nq = 0, nq0 = 0;
            for (std::int64_t c = 0; c < dh; ++c) {
                s += q[c] * k[c];
                nq += q[c] * q[c];
                nq0 += q0[c] * q0[c];
            }
            CHECK(nq == doctest::Approx(nq0).epsilon(1e-12));
            return s;
        };
        const double s1 = score(17, 5), s2 = score(1017, 1005), s3 = score(12, 0);
        CHECK(s1 == doctest::Approx(s2).epsilon(1e-5));  // fp32 angles: not exact for large positions
        CHECK(s1 == doctest::Approx(s3).epsilon(1e-6));
        CHECK(std::abs(score(17, 5) - score(5, 17)) > 1e-3);  // and the sign of the difference matters
    }
}

TEST_CASE("rope: interleaved equals rotate-half after the pair permutation (2i, 2i+1) <-> (i, i + d_rot/2)") {
    const std::int64_t T = 9, H = 2, dh = 20, d_rot = 10, half = d_rot / 2;
    auto x = test::uniform(static_cast<std::size_t>(T * H * dh), -1.f, 1.f, 3);
    std::vector<float> xp(x.size());
    auto perm = [&](std::int64_t c) { return c >= d_rot ? c : (c % 2 == 0 ? c / 2 : c / 2 + half); };
    for (std::int64_t r = 0; r < T * H; ++r)
        for (std::int64_t c = 0; c < dh; ++c) xp[static_cast<std::size_t>(r * dh + perm(c))] = x[static_cast<std::size_t>(r * dh + c)];
    kernels::rope(tensor_view<float, 3>(x.data(), {T, H, dh}), 40, rope_mode::interleaved, 5e5, d_rot);
    kernels::rope(tensor_view<float, 3>(xp.data(), {T, H, dh}), 40, rope_mode::rotate_half, 5e5, d_rot);
    for (std::int64_t r = 0; r < T * H; ++r)
        for (std::int64_t c = 0; c < dh; ++c)
            REQUIRE(xp[static_cast<std::size_t>(r * dh + perm(c))] ==
                    doctest::Approx(x[static_cast<std::size_t>(r * dh + c)]).epsilon(1e-6));  // FMA contraction may differ
}

TEST_CASE("rope: strided views (query half of a gated projection) are rotated in place") {
    const std::int64_t T = 5, H = 3, dh = 8;
    auto buf = test::uniform(static_cast<std::size_t>(T * H * 2 * dh), -1.f, 1.f, 4);
    auto dense = std::vector<float>(static_cast<std::size_t>(T * H * dh));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < dh; ++c)
                dense[static_cast<std::size_t>((t * H + h) * dh + c)] = buf[static_cast<std::size_t>((t * H + h) * 2 * dh + c)];
    const auto before = buf;
    kernels::rope(tensor_view<float, 3>(buf.data(), {T, H, dh}, {H * 2 * dh, 2 * dh, 1}), 7, rope_mode::rotate_half, 1e4, dh);
    kernels::rope(tensor_view<float, 3>(dense.data(), {T, H, dh}), 7, rope_mode::rotate_half, 1e4, dh);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t c = 0; c < dh; ++c) {
                const auto i = static_cast<std::size_t>((t * H + h) * 2 * dh);
                CHECK(buf[i + c] == dense[static_cast<std::size_t>((t * H + h) * dh + c)]);
                CHECK(buf[i + dh + c] == before[i + dh + c]);  // gate half untouched
            }
}

TEST_CASE("rope: bad arguments throw") {
    std::vector<float> x(2 * 8);
    const std::vector<std::int64_t> pos{0, 1, 2};
    CHECK_THROWS_AS(kernels::rope(tensor_view<float, 3>(x.data(), {2, 1, 8}), pos, rope_mode::rotate_half, 1e4, 8), shape_error);
    CHECK_THROWS_AS(kernels::rope(tensor_view<float, 3>(x.data(), {2, 1, 8}), 0, rope_mode::rotate_half, 1e4, 10), shape_error);
    CHECK_THROWS_AS(kernels::rope(tensor_view<float, 3>(x.data(), {2, 1, 8}), 0, rope_mode::rotate_half, 1e4, 5), shape_error);
    CHECK_THROWS_AS(kernels::rope_dims(6, 0.5), config_error);   // 3 rotary dims: odd
    CHECK_THROWS_AS(kernels::rope_dims(64, 0.0), config_error);
    CHECK_THROWS_AS(kernels::rope_dims(64, 1.5), config_error);
    CHECK(kernels::rope_dims(256, 0.25) == 64);
    CHECK(kernels::rope_dims(64, 0.25) == 16);
}

TEST_CASE("rope: view stride rules and preconditions are checked, naming the argument (rope and rope_ref)") {
    const std::int64_t T = 3, H = 2, dh = 8;
    auto x = hymix::test::uniform(std::size_t(T * H * dh), -1.f, 1.f, 80);
    std::vector<double> xd(x.begin(), x.end());
    const auto x0 = x;
    const std::vector<std::int64_t> pos{0, 1, 2};
    const auto rh = kernels::rope_mode::rotate_half;
    // channel stride 2 (every other float)
    std::vector<float> wide(200);
    CHECK_THROWS_WITH_AS(kernels::rope(tensor_view<float, 3>(wide.data(), {T, H, dh}, {32, 16, 2}), pos, rh, 1e4, 8),
                         doctest::Contains("rope: x [3, 2, 8] needs unit stride along axis 2"), shape_error);
    // heads on top of each other (head stride 0): each would be rotated twice
    CHECK_THROWS_WITH_AS(kernels::rope(tensor_view<float, 3>(x.data(), {T, H, dh}, {dh, 0, 1}), pos, rh, 1e4, 8),
                         doctest::Contains("rope: x [3, 2, 8] is written, but its strides [8, 0, 1] make elements overlap"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::rope_ref(tensor_view<double, 3>(xd.data(), {T, H, dh}, {dh, 0, 1}), pos, rh, 1e4, 8),
                         doctest::Contains("rope_ref: x"), shape_error);
    const tensor_view<float, 3> xv(x.data(), {T, H, dh});
    const std::vector<std::int64_t> neg{0, -1, 2};
    CHECK_THROWS_WITH_AS(kernels::rope(xv, neg, rh, 1e4, 8), doctest::Contains("rope: positions[1] = -1 is negative"), value_error);
    CHECK_THROWS_WITH_AS(kernels::rope(xv, std::int64_t{-5}, rh, 1e4, 8), doctest::Contains("rope: positions[0] = -5"), value_error);
    for (double base : {0.0, -1e4, std::nan(""), std::numeric_limits<double>::infinity()})
        CHECK_THROWS_WITH_AS(kernels::rope(xv, pos, rh, base, 8), doctest::Contains("rope: base (rope_theta) must be finite and > 0"),
                             value_error);
    CHECK_THROWS_WITH_AS(kernels::rope_ref(tensor_view<double, 3>(xd.data(), {T, H, dh}), pos, rh, 0.0, 8),
                         doctest::Contains("rope_ref: base"), value_error);
    CHECK_THROWS_WITH_AS(kernels::rope(xv, pos, static_cast<kernels::rope_mode>(3), 1e4, 8), doctest::Contains("rope: unknown mode 3"),
                         value_error);
    CHECK(x == x0);  // nothing was rotated by a rejected call
    CHECK_NOTHROW(kernels::rope(xv, pos, kernels::rope_mode::none, 0.0, 8));  // nothing rotates: the base is unused
}
