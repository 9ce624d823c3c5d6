// kernels::linear (spec.md §0: y = x Wᵀ + b, weights [out, in]) against its double-precision twin linear_ref:
// small-M (decode) and large-M (Eigen GEMM) paths, odd sizes, bias, 1 and 2 threads, strided views, shape errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/linear.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

/// Runs linear and linear_ref on fresh random x [M, K], w [N, K], bias [N] and returns the relative error.
double linear_error(const cpu_backend& be, std::int64_t M, std::int64_t N, std::int64_t K, bool with_bias,
                    std::uint64_t seed) {
    const auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, seed);
    const auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, seed + 1);
    const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, seed + 2);
    const tensor_view<const float, 2> x(xs.data(), {M, K});  // [M, K]
    const tensor_view<const float, 2> w(ws.data(), {N, K});  // [N, K]
    const float* bias = with_bias ? bs.data() : nullptr;     // [N]

    std::vector<float> y(static_cast<std::size_t>(M * N), -7.f);  // garbage: every entry must be written
    std::vector<double> ref(static_cast<std::size_t>(M * N));
    kernels::linear(be, x, w, bias, tensor_view<float, 2>(y.data(), {M, N}));
    kernels::linear_ref(x, w, bias, tensor_view<double, 2>(ref.data(), {M, N}));
    return test::rel_error(y, ref);
}

}  // namespace

// Bound: spec.md §0's fp32 tolerance. Typical errors are ~1e-7; single outputs (M = N = 1) with a bias can
// lose a few digits to cancellation between x·w and b, which is rounding, not a defect. Real defects (a
// missed tail column, a wrong bias index, a skipped row) give errors of order 1.
TEST_CASE("linear matches linear_ref for M = 1..300, odd N and K, with and without bias") {
    const std::int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33, 100, 255, 256, 257, 300};
    const std::int64_t NKs[][2] = {{1, 1}, {3, 5}, {4, 16}, {37, 53}, {129, 67}, {70, 200}, {33, 1000}};
    std::uint64_t seed = 100;
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (auto M : Ms)
            for (const auto& nk : NKs)
                for (bool with_bias : {false, true}) {
                    CAPTURE(threads);
                    CAPTURE(M);
                    CAPTURE(nk[0]);
                    CAPTURE(nk[1]);
                    CAPTURE(with_bias);
                    CHECK(linear_error(be, M, nk[0], nk[1], with_bias, seed += 3) < 1e-5);
                }
    }
}

TEST_CASE("linear at model sizes: small-M path splits N across threads, large-M path uses several column blocks") {
    std::uint64_t seed = 5000;
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (std::int64_t M : {1, 6, 8, 64}) {
            CAPTURE(threads);
            CAPTURE(M);
            CHECK(linear_error(be, M, 771, 768, true, seed += 3) < 1e-5);
            CHECK(linear_error(be, M, 1030, 129, false, seed += 3) < 1e-5);
        }
    }
}

TEST_CASE("linear reads and writes strided views (sub-blocks of larger matrices)") {
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (std::int64_t M : {1, 5, 8, 9, 70}) {
            const std::int64_t N = 45, K = 38;
            const std::int64_t ldx = K + 7, ldw = K + 3, ldy = N + 11;
            const auto xs = test::uniform(static_cast<std::size_t>(M * ldx), -1.f, 1.f, 11 + M);
            const auto ws = test::uniform(static_cast<std::size_t>(N * ldw), -1.f, 1.f, 12 + M);
            const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, 13 + M);
            // Views start one element in, so they are also unaligned.
            const tensor_view<const float, 2> x(xs.data() + 1, {M, K}, {ldx, 1});  // [M, K], row stride ldx
            const tensor_view<const float, 2> w(ws.data() + 1, {N, K}, {ldw, 1});  // [N, K], row stride ldw
            std::vector<float> ybuf(static_cast<std::size_t>(M * ldy), 123.f);
            const tensor_view<float, 2> y(ybuf.data(), {M, N}, {ldy, 1});  // [M, N], row stride ldy
            kernels::linear(be, x, w, bs.data(), y);

            std::vector<double> ref(static_cast<std::size_t>(M * N));
            kernels::linear_ref(x, w, bs.data(), tensor_view<double, 2>(ref.data(), {M, N}));
            std::vector<float> packed(static_cast<std::size_t>(M * N));
            for (std::int64_t m = 0; m < M; ++m)
                for (std::int64_t n = 0; n < N; ++n) packed[static_cast<std::size_t>(m * N + n)] = y(m, n);
            CAPTURE(threads);
            CAPTURE(M);
            CHECK(test::rel_error(packed, ref) < 1e-6);
            // The gaps between output rows are untouched.
            bool gaps_untouched = true;
            for (std::int64_t m = 0; m < M; ++m)
                for (std::int64_t c = N; c < ldy; ++c)
                    gaps_untouched = gaps_untouched && ybuf[static_cast<std::size_t>(m * ldy + c)] == 123.f;
            CHECK(gaps_untouched);
        }
    }
}

TEST_CASE("linear with M = 0 or N = 0 does nothing") {
    const cpu_backend be(2);
    std::vector<float> xs(12, 1.f), ws(12, 1.f), ys(4, 5.f);
    kernels::linear(be, tensor_view<const float, 2>(xs.data(), {0, 3}), tensor_view<const float, 2>(ws.data(), {4, 3}),
                    nullptr, tensor_view<float, 2>(ys.data(), {0, 4}));
    kernels::linear(be, tensor_view<const float, 2>(xs.data(), {4, 3}), tensor_view<const float, 2>(ws.data(), {0, 3}),
                    nullptr, tensor_view<float, 2>(ys.data(), {4, 0}));
    CHECK(ys == std::vector<float>(4, 5.f));
}

TEST_CASE("linear rejects mismatched shapes and non-unit inner strides") {
    const cpu_backend be(1);
    std::vector<float> buf(1000, 0.5f);
    const tensor_view<const float, 2> x(buf.data(), {4, 6});  // [M=4, K=6]
    const tensor_view<const float, 2> w(buf.data(), {5, 6});  // [N=5, K=6]
    std::vector<float> out(100);
    const tensor_view<float, 2> y(out.data(), {4, 5});  // [M, N]

    SUBCASE("weight with the wrong input width") {
        const tensor_view<const float, 2> w_bad(buf.data(), {5, 7});
        CHECK_THROWS_AS(kernels::linear(be, x, w_bad, nullptr, y), shape_error);
        CHECK_THROWS_WITH(kernels::linear(be, x, w_bad, nullptr, y),
                          doctest::Contains("linear: weight: expected shape [5, 6], found [5, 7]"));
    }
    SUBCASE("output with the wrong number of rows or columns") {
        CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, nullptr, tensor_view<float, 2>(out.data(), {3, 5})),
                             doctest::Contains("linear: output: expected shape [4, 5], found [3, 5]"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, nullptr, tensor_view<float, 2>(out.data(), {4, 6})),
                             doctest::Contains("linear: output: expected shape [4, 5], found [4, 6]"), shape_error);
    }
    SUBCASE("non-unit inner stride") {
        const tensor_view<const float, 2> x_strided(buf.data(), {4, 6}, {12, 2});
        CHECK_THROWS_AS(kernels::linear(be, x_strided, w, nullptr, y), shape_error);
        const tensor_view<const float, 2> w_strided(buf.data(), {5, 6}, {12, 2});
        CHECK_THROWS_AS(kernels::linear(be, x, w_strided, nullptr, y), shape_error);
        const tensor_view<float, 2> y_strided(out.data(), {4, 5}, {10, 2});
        CHECK_THROWS_AS(kernels::linear(be, x, w, nullptr, y_strided), shape_error);
    }
    SUBCASE("a correct call does not throw") {
        CHECK_NOTHROW(kernels::linear(be, x, w, nullptr, y));
    }
}

TEST_CASE("linear: the output may not overlap itself, x, the weight or the bias (shape_error naming the argument)") {
    const cpu_backend be(1);
    std::vector<float> buf(1000, 0.5f);
    const tensor_view<const float, 2> x(buf.data(), {4, 6}), w(buf.data() + 100, {5, 6});
    std::vector<float> out(100);
    CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, nullptr, tensor_view<float, 2>(out.data(), {4, 5}, {3, 1})),
                         doctest::Contains("linear: output [4, 5] is written, but its strides [3, 1] make elements overlap"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, nullptr, tensor_view<float, 2>(buf.data() + 20, {4, 5})),
                         doctest::Contains("linear: output overlaps x"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, nullptr, tensor_view<float, 2>(buf.data() + 120, {4, 5})),
                         doctest::Contains("linear: output overlaps weight"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::linear(be, x, w, out.data() + 2, tensor_view<float, 2>(out.data(), {4, 5})),
                         doctest::Contains("linear: output overlaps bias"), shape_error);
    // inner strides name the argument; an inner extent of 1 still needs stride 1 (Eigen maps require it)
    CHECK_THROWS_WITH_AS(kernels::linear(be, tensor_view<const float, 2>(buf.data(), {4, 6}, {12, 2}), w, nullptr,
                                         tensor_view<float, 2>(out.data(), {4, 5})),
                         doctest::Contains("linear: x [4, 6] needs unit stride along axis 1"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::linear(be, tensor_view<const float, 2>(buf.data(), {9, 1}, {1, 4}),
                                         tensor_view<const float, 2>(buf.data() + 100, {5, 1}), nullptr, tensor_view<float, 2>(out.data(), {9, 5})),
                         doctest::Contains("linear: x [9, 1] needs unit stride"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::linear(be, x, tensor_view<const float, 2>(buf.data() + 100, {5, 6}, {1, 5}), nullptr,
                                         tensor_view<float, 2>(out.data(), {4, 5})),
                         doctest::Contains("linear: weight [5, 6] needs unit stride"), shape_error);
    CHECK_NOTHROW(kernels::linear(be, x, w, buf.data() + 200, tensor_view<float, 2>(out.data(), {4, 5}, {20, 1})));
}
