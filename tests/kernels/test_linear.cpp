// kernels::linear (spec.md §0: y = x Wᵀ + b, weights [out, in]) against its double-precision twin linear_ref:
// decode and prefill sizes, odd sizes, bias, 1 and 2 threads, strided views, shape errors; and batch invariance:
// a row's output is bit-identical at every position of every batch size, and follows the documented order.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/kernels/linear.hpp"
#include "hymix/ops/linear.hpp"
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

TEST_CASE("linear at model sizes: N split across threads, rows in several L2 blocks") {
    std::uint64_t seed = 5000;
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (std::int64_t M : {1, 6, 8, 64}) {
            CAPTURE(threads);
            CAPTURE(M);
            CHECK(linear_error(be, M, 771, 768, true, seed += 3) < 1e-5);
            CHECK(linear_error(be, M, 1030, 129, false, seed += 3) < 1e-5);
        }
        // K large enough that the rows come in several blocks (the x block is sized for L2).
        CAPTURE(threads);
        CHECK(linear_error(be, 150, 67, 4099, true, seed += 3) < 1e-5);
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

namespace {

/// Bits of a float (so -0 differs from +0 and NaNs compare by payload).
std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

/// A pool of P random rows x [P, K] (row stride ldx ≥ K) and weights w [N, K], bias [N].
struct invariance_case {
    std::int64_t P, N, K, ldx;
    std::vector<float> xs, ws, bs;
    invariance_case(std::int64_t p, std::int64_t n, std::int64_t k, std::int64_t ld, std::uint64_t seed)
        : P(p), N(n), K(k), ldx(ld), xs(test::uniform(static_cast<std::size_t>(p * ld), -1.f, 1.f, seed)),
          ws(test::uniform(static_cast<std::size_t>(n * k), -1.f, 1.f, seed + 1)),
          bs(test::uniform(static_cast<std::size_t>(n), -1.f, 1.f, seed + 2)) {}
    tensor_view<const float, 2> w() const { return tensor_view<const float, 2>(ws.data(), {N, K}); }  // [N, K]

    /// y [M, N] for the rows rows[0..M) of the pool, gathered into a batch with row stride ldx.
    std::vector<float> run(const cpu_backend& be, const std::vector<std::int64_t>& rows, bool bias) const {
        const auto M = static_cast<std::int64_t>(rows.size());
        std::vector<float> xb(static_cast<std::size_t>(M * ldx), 0.f);
        for (std::int64_t i = 0; i < M; ++i)
            std::copy_n(xs.data() + rows[static_cast<std::size_t>(i)] * ldx, K, xb.data() + i * ldx);
        std::vector<float> y(static_cast<std::size_t>(M * N), -7.f);
        kernels::linear(be, tensor_view<const float, 2>(xb.data(), {M, K}, {ldx, 1}), w(), bias ? bs.data() : nullptr,
                        tensor_view<float, 2>(y.data(), {M, N}));
        return y;
    }
};

}  // namespace

// The property that makes a sequence's logits independent of the rest of its batch (issue 11, item 4): every
// pool row is run alone on one thread, then inside batches of M = 1 … 300 rows at rotating offsets (so it lands
// at every position of a register tile and of an L2 row block) on 1, 2 and 16 threads; its outputs must be the same
// bits. Shapes: K a multiple of the SIMD width and not, N not a multiple of the tile width, a row stride > K, and
// a K large enough for several row blocks.
TEST_CASE("linear is batch-invariant: a row's outputs are bit-identical at any position in any batch size") {
    // {N, K, row stride of x, seed}; N 16 is a GDN layer's gate projection, split over rows as well as columns on 16
    // threads (for_column_groups), as is N 130 there.
    const std::int64_t shapes[][4] = {{37, 771, 771, 12}, {130, 256, 260, 13}, {771, 768, 768, 14}, {45, 4099, 4101, 15}, {16, 1024, 1030, 16}};
    for (const auto& sh : shapes) {
        const std::int64_t P = 301;
        const invariance_case ic(P, sh[0], sh[1], sh[2], static_cast<std::uint64_t>(sh[3]) * 1000);
        for (bool bias : {false, true}) {
            const cpu_backend one(1);
            std::vector<std::vector<float>> alone(static_cast<std::size_t>(P));
            for (std::int64_t p = 0; p < P; ++p) alone[static_cast<std::size_t>(p)] = ic.run(one, {p}, bias);
            for (int threads : {1, 2, 16}) {  // 16: more threads than cores here, for the row split of few columns
                const cpu_backend be(threads);
                for (std::int64_t M : {1, 2, 3, 7, 8, 9, 17, 64, 300}) {
                    for (std::int64_t offset : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{3}, P - M / 2}) {
                        std::vector<std::int64_t> rows(static_cast<std::size_t>(M));
                        for (std::int64_t i = 0; i < M; ++i) rows[static_cast<std::size_t>(i)] = (offset + i) % P;
                        const auto y = ic.run(be, rows, bias);
                        std::int64_t mismatches = 0;
                        for (std::int64_t i = 0; i < M; ++i) {
                            const auto& a = alone[static_cast<std::size_t>(rows[static_cast<std::size_t>(i)])];
                            for (std::int64_t n = 0; n < ic.N; ++n)
                                mismatches += bits(y[static_cast<std::size_t>(i * ic.N + n)]) != bits(a[static_cast<std::size_t>(n)]);
                        }
                        CAPTURE(ic.N);
                        CAPTURE(ic.K);
                        CAPTURE(bias);
                        CAPTURE(threads);
                        CAPTURE(M);
                        CAPTURE(offset);
                        CHECK(mismatches == 0);
                    }
                }
            }
        }
    }
}

// The order the kernel promises (linear.hpp, detail): lane l sums x·w over k ≡ l (mod W) with one multiply-add per
// term (fused on FMA hardware), the lanes are summed by halving, then the bias is added. Emulated here in scalar
// code with std::fma; the kernel must reproduce it bit for bit for every tile shape it uses (M, N over 2 tiles).
template <class Backend>
void check_documented_order() {
    constexpr std::int64_t W = static_cast<std::int64_t>(Backend::simd_width());
    const Backend be(1);
    for (std::int64_t K : {std::int64_t{1}, W - 1, W, 3 * W + 5, std::int64_t{200}, std::int64_t{2085}}) {  // 2085: K ranges
        const std::int64_t M = 9, N = 17;
        const auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, 70 + K);
        const auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, 71 + K);
        const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, 72 + K);
        std::int64_t mismatches = 0;
        for (std::int64_t rows : {M, std::int64_t{1}, std::int64_t{2}}) {  // row blocks of 4 (3) and of 1 or 2 rows
            std::vector<float> y(static_cast<std::size_t>(rows * N));
            kernels::linear(be, tensor_view<const float, 2>(xs.data(), {rows, K}), tensor_view<const float, 2>(ws.data(), {N, K}),
                            bs.data(), tensor_view<float, 2>(y.data(), {rows, N}));
            for (std::int64_t m = 0; m < rows; ++m)
                for (std::int64_t n = 0; n < N; ++n) {
                    std::vector<float> lane(static_cast<std::size_t>(W), 0.f);
                    for (std::int64_t k = 0; k < K; ++k) {
                        float& l = lane[static_cast<std::size_t>(k % W)];
                        const float a = xs[static_cast<std::size_t>(m * K + k)], b = ws[static_cast<std::size_t>(n * K + k)];
                        if constexpr (kernels::detail::mul_add_is_fused<typename Backend::arch>()) {
                            l = std::fma(a, b, l);
                        } else {
                            const volatile float p = a * b;  // rounded on its own: no contraction into an fma
                            l = p + l;
                        }
                    }
                    for (std::size_t h = static_cast<std::size_t>(W) / 2; h >= 1; h /= 2)
                        for (std::size_t i = 0; i < h; ++i) lane[i] = lane[i] + lane[i + h];
                    const float expect = lane[0] + bs[static_cast<std::size_t>(n)];
                    mismatches += bits(expect) != bits(y[static_cast<std::size_t>(m * N + n)]);
                }
        }
        CAPTURE(W);
        CAPTURE(K);
        CHECK(mismatches == 0);
    }
}

TEST_CASE("linear sums each output in the documented order (fma per lane, halving lane tree, then bias)") {
    check_documented_order<cpu_backend>();
    if constexpr (xsimd::avx2::supported())
        check_documented_order<basic_cpu_backend<xsimd::avx2>>();  // 8 lanes: the generic tree and tail paths
    else
        MESSAGE("SKIPPED the AVX2 variant: this build has no AVX2");
}

// Other SIMD widths take the generic paths (3 × 3 tiles, a lane-by-lane tree, zero-padded tails): the same
// properties hold there.
TEST_CASE("linear on an AVX2 backend (8 lanes): matches linear_ref and is batch-invariant") {
    using avx2_backend = basic_cpu_backend<xsimd::avx2>;
    if constexpr (xsimd::avx2::supported()) {
        const avx2_backend be1(1), be2(2);
        const std::int64_t P = 40, N = 29, K = 83;
        const auto xs = test::uniform(static_cast<std::size_t>(P * K), -1.f, 1.f, 91);
        const auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, 92);
        const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, 93);
        const tensor_view<const float, 2> w(ws.data(), {N, K});  // [N, K]
        std::vector<float> all(static_cast<std::size_t>(P * N));
        kernels::linear(be2, tensor_view<const float, 2>(xs.data(), {P, K}), w, bs.data(), tensor_view<float, 2>(all.data(), {P, N}));
        std::vector<double> ref(all.size());
        kernels::linear_ref(tensor_view<const float, 2>(xs.data(), {P, K}), w, bs.data(), tensor_view<double, 2>(ref.data(), {P, N}));
        CHECK(test::rel_error(all, ref) < 1e-5);
        std::int64_t mismatches = 0;
        for (std::int64_t p = 0; p < P; ++p) {
            std::vector<float> one(static_cast<std::size_t>(N));
            kernels::linear(be1, tensor_view<const float, 2>(xs.data() + p * K, {1, K}), w, bs.data(),
                            tensor_view<float, 2>(one.data(), {1, N}));
            for (std::size_t n = 0; n < one.size(); ++n)
                mismatches += bits(one[n]) != bits(all[static_cast<std::size_t>(p * N) + n]);
        }
        CHECK(mismatches == 0);
    } else {
        MESSAGE("SKIPPED: this build has no AVX2");
    }
}

namespace {

/// 16-bit weights (bf16, f16): linear on the stored weights must give the f32 kernel's bits on their widened
/// values, for every M (so batch invariance carries over), and match linear_ref on the stored weights. Values span
/// f16's subnormals (|w| < 6.1e-5) and bf16's full range; tails of every length K % W.
template <class TW, class Backend>
void check_16bit_weights(const char* arch_name) {
    CAPTURE(arch_name);
    const std::int64_t Ms[] = {1, 2, 3, 5, 8, 13, 64, 131};
    // The last two are large enough for decode (M 1, 2) to split its columns between 2 threads.
    const std::int64_t NKs[][2] = {{1, 1}, {7, 15}, {37, 53}, {29, 128}, {50, 1100}, {24, 2061}, {101, 2061}, {99, 4096}};
    std::uint64_t seed = 700;
    for (int threads : {1, 2}) {
        const Backend be(threads);
        for (const auto& nk : NKs) {
            const std::int64_t N = nk[0], K = nk[1];
            auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, seed += 5);
            for (std::size_t i = 0; i < ws.size(); i += 7) ws[i] *= 1e-5f;  // f16 subnormals, tiny bf16 values
            std::vector<TW> w16(ws.size());
            std::vector<float> wide(ws.size());
            for (std::size_t i = 0; i < ws.size(); ++i) {
                w16[i] = TW::from_float(ws[i]);
                wide[i] = w16[i].to_float();
            }
            const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, seed + 1);
            for (auto M : Ms) {
                CAPTURE(threads);
                CAPTURE(N);
                CAPTURE(K);
                CAPTURE(M);
                const auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, seed + 2 + static_cast<std::uint64_t>(M));
                const tensor_view<const float, 2> x(xs.data(), {M, K});
                std::vector<float> y16(static_cast<std::size_t>(M * N), -7.f), y32(y16.size(), -9.f);
                kernels::linear(be, x, tensor_view<const TW, 2>(w16.data(), {N, K}), bs.data(), tensor_view<float, 2>(y16.data(), {M, N}));
                kernels::linear(be, x, tensor_view<const float, 2>(wide.data(), {N, K}), bs.data(), tensor_view<float, 2>(y32.data(), {M, N}));
                std::int64_t mismatches = 0;
                for (std::size_t i = 0; i < y16.size(); ++i) mismatches += bits(y16[i]) != bits(y32[i]);
                CHECK(mismatches == 0);
                std::vector<double> ref(y16.size());
                kernels::linear_ref<float, TW, double, float>(x, tensor_view<const TW, 2>(w16.data(), {N, K}), bs.data(),
                                                              tensor_view<double, 2>(ref.data(), {M, N}));
                CHECK(test::rel_error(y16, ref) < 1e-5);
            }
        }
    }
}

template <class TW>
void check_16bit_weights_all_widths() {
    check_16bit_weights<TW, cpu_backend>("native");
    if constexpr (xsimd::avx2::supported())
        check_16bit_weights<TW, basic_cpu_backend<xsimd::avx2>>("avx2");
    else
        MESSAGE("SKIPPED the AVX2 variant: this build has no AVX2");
    if constexpr (xsimd::sse4_2::supported())
        check_16bit_weights<TW, basic_cpu_backend<xsimd::sse4_2>>("sse4.2");
    else
        MESSAGE("SKIPPED the SSE4.2 variant: this build has no SSE4.2");
}

}  // namespace

TEST_CASE("linear with bf16 weights = the f32 kernel on the widened weights, bit for bit, at every SIMD width") {
    check_16bit_weights_all_widths<bf16>();
}

TEST_CASE("linear with f16 weights = the f32 kernel on the widened weights, bit for bit (subnormals included)") {
    check_16bit_weights_all_widths<f16>();
}

TEST_CASE("linear with 16-bit weights rejects mismatched shapes, naming the weight") {
    const cpu_backend be(1);
    std::vector<float> xs(12), y(8);
    std::vector<bf16> w(15);
    CHECK_THROWS_WITH_AS(kernels::linear(be, tensor_view<const float, 2>(xs.data(), {3, 4}), tensor_view<const bf16, 2>(w.data(), {3, 5}),
                                         nullptr, tensor_view<float, 2>(y.data(), {3, 3})),
                         doctest::Contains("weight"), shape_error);
}

TEST_CASE("ops::linear takes bf16 and f16 weights on the CPU and reference backends") {
    const std::int64_t M = 5, N = 19, K = 41;
    const auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, 801);
    const auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, 802);
    const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, 803);
    const tensor_view<const float, 2> x(xs.data(), {M, K});
    auto check = [&](auto tag) {
        using TW = decltype(tag);
        std::vector<TW> w(ws.size());
        for (std::size_t i = 0; i < ws.size(); ++i) w[i] = TW::from_float(ws[i]);
        const tensor_view<const TW, 2> wv(w.data(), {N, K});
        std::vector<float> cpu(static_cast<std::size_t>(M * N)), ref(cpu.size()), direct(cpu.size());
        ops::linear(cpu_backend(2), x, wv, bs.data(), tensor_view<float, 2>(cpu.data(), {M, N}));
        ops::linear(reference_backend{}, x, wv, bs.data(), tensor_view<float, 2>(ref.data(), {M, N}));
        kernels::linear(cpu_backend(1), x, wv, bs.data(), tensor_view<float, 2>(direct.data(), {M, N}));
        std::vector<double> refd(ref.begin(), ref.end());
        CHECK(test::rel_error(cpu, refd) < 1e-5);
        CHECK(cpu == direct);
    };
    check(bf16{});
    check(f16{});
}

namespace {

/// An 8-bit weight built through linear_weight (per-row absmax quantization) from uniform values with a few rows of
/// very different magnitudes and one all-zero row, so every scale path is taken.
linear_weight q8_weight(std::int64_t N, std::int64_t K, std::uint64_t seed) {
    auto ws = test::uniform(static_cast<std::size_t>(N * K), -1.f, 1.f, seed);
    for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t k = 0; k < K; ++k) ws[static_cast<std::size_t>(n * K + k)] *= n % 3 == 1 ? 1e-3f : (n % 5 == 2 ? 40.f : 1.f);
    if (N > 3)
        for (std::int64_t k = 0; k < K; ++k) ws[static_cast<std::size_t>(3 * K + k)] = 0.f;
    tensor<float> t({N, K});
    std::copy(ws.begin(), ws.end(), t.data());
    linear_weight w(std::move(t));
    w.store_as(dtype::i8, "w");
    return w;
}

template <class Backend>
void check_q8_weights(const char* arch_name) {
    CAPTURE(arch_name);
    const std::int64_t Ms[] = {1, 2, 3, 5, 8, 13, 64, 131};
    // The last two are large enough for decode (M 1, 2) to split its columns between 2 threads.
    const std::int64_t NKs[][2] = {{1, 1}, {7, 15}, {37, 53}, {29, 128}, {50, 1100}, {24, 2061}, {101, 2061}, {99, 4096}};
    std::uint64_t seed = 900;
    for (int threads : {1, 2, 16}) {  // 16: rows split as well as columns (few columns per thread)
        const Backend be(threads);
        for (const auto& nk : NKs) {
            const std::int64_t N = nk[0], K = nk[1];
            const linear_weight w = q8_weight(N, K, seed += 5);
            const q8_view q = w.q8();
            const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, seed + 1);
            std::vector<float> alone;  // row 0 of x by itself: every batch must reproduce its bits
            for (auto M : Ms) {
                CAPTURE(threads);
                CAPTURE(N);
                CAPTURE(K);
                CAPTURE(M);
                auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, seed + 2 + static_cast<std::uint64_t>(M));
                const auto x0 = test::uniform(static_cast<std::size_t>(K), -1.f, 1.f, seed + 3);
                std::copy(x0.begin(), x0.end(), xs.begin() + (M - 1) * K);  // the same row, last in every batch
                const tensor_view<const float, 2> x(xs.data(), {M, K});
                std::vector<float> y(static_cast<std::size_t>(M * N), -7.f), yw(y.size(), -9.f);
                kernels::linear(be, x, q, bs.data(), tensor_view<float, 2>(y.data(), {M, N}));
                kernels::linear(be, x, w, bs.data(), tensor_view<float, 2>(yw.data(), {M, N}));
                CHECK(y == yw);
                std::vector<double> ref(y.size());
                kernels::linear_q8_ref<float, double>(x, q, bs.data(), tensor_view<double, 2>(ref.data(), {M, N}));
                CHECK(test::rel_error(y, ref) < 1e-5);
                const std::vector<float> last(y.end() - N, y.end());
                if (alone.empty()) alone = last;
                std::int64_t mismatches = 0;
                for (std::int64_t n = 0; n < N; ++n) mismatches += bits(last[static_cast<std::size_t>(n)]) != bits(alone[static_cast<std::size_t>(n)]);
                CHECK(mismatches == 0);
            }
        }
    }
}

}  // namespace

TEST_CASE("linear with i8 weights (per-row scales) matches linear_q8_ref and is batch-invariant, at every SIMD width") {
    check_q8_weights<cpu_backend>("native");
    if constexpr (xsimd::avx2::supported())
        check_q8_weights<basic_cpu_backend<xsimd::avx2>>("avx2");
    else
        MESSAGE("SKIPPED the AVX2 variant: this build has no AVX2");
    if constexpr (xsimd::sse4_2::supported())
        check_q8_weights<basic_cpu_backend<xsimd::sse4_2>>("sse4.2");
    else
        MESSAGE("SKIPPED the SSE4.2 variant: this build has no SSE4.2");
}

TEST_CASE("linear with i8 weights: the scale, then the bias, is applied once per output (the documented form)") {
    // y = fp32(Σ x·q) · scale (+ b): with integer x and q every sum is exact, so without a bias the result is the one
    // rounding of sum · scale, bit for bit (with a bias the compiler may fuse the multiply and the add: within 1e-6).
    const std::int64_t M = 3, N = 5, K = 9;
    linear_weight w(tensor<float>({N, K}));
    for (std::int64_t i = 0; i < N * K; ++i) w.data()[i] = static_cast<float>((i * 37) % 255 - 127) / 127.f * (1.f + static_cast<float>(i / K));
    w.store_as(dtype::i8, "w");
    const q8_view q = w.q8();
    std::vector<float> xs(static_cast<std::size_t>(M * K)), bs{0.5f, -1.f, 0.f, 3.f, 1e-3f}, y(static_cast<std::size_t>(M * N));
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
    std::vector<float> yb(y.size());
    kernels::linear(cpu_backend(1), tensor_view<const float, 2>(xs.data(), {M, K}), q, nullptr, tensor_view<float, 2>(y.data(), {M, N}));
    kernels::linear(cpu_backend(1), tensor_view<const float, 2>(xs.data(), {M, K}), q, bs.data(), tensor_view<float, 2>(yb.data(), {M, N}));
    for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
            float s = 0;
            for (std::int64_t k = 0; k < K; ++k) s += xs[static_cast<std::size_t>(m * K + k)] * static_cast<float>(q.q(n, k));
            const std::size_t i = static_cast<std::size_t>(m * N + n);
            const volatile float prod = s * q.scale[n];  // volatile: one rounding, never fused with the add below
            CHECK(bits(y[i]) == bits(prod));
            CHECK(std::abs(yb[i] - (prod + bs[static_cast<std::size_t>(n)])) <= 1e-6f * (std::abs(prod) + 1.f));
        }
}

TEST_CASE("ops::linear takes i8 weights on the CPU and reference backends; shapes are checked, naming the weight") {
    const std::int64_t M = 5, N = 19, K = 41;
    const auto xs = test::uniform(static_cast<std::size_t>(M * K), -1.f, 1.f, 811);
    const auto bs = test::uniform(static_cast<std::size_t>(N), -1.f, 1.f, 813);
    const tensor_view<const float, 2> x(xs.data(), {M, K});
    const linear_weight w = q8_weight(N, K, 812);
    std::vector<float> cpu(static_cast<std::size_t>(M * N)), ref(cpu.size()), direct(cpu.size());
    ops::linear(cpu_backend(2), x, w, bs.data(), tensor_view<float, 2>(cpu.data(), {M, N}));
    ops::linear(reference_backend{}, x, w, bs.data(), tensor_view<float, 2>(ref.data(), {M, N}));
    kernels::linear(cpu_backend(1), x, w.q8(), bs.data(), tensor_view<float, 2>(direct.data(), {M, N}));
    CHECK(test::rel_error(cpu, std::vector<double>(ref.begin(), ref.end())) < 1e-5);
    CHECK(cpu == direct);
    std::vector<float> y(static_cast<std::size_t>(M * 3));
    const linear_weight narrow = q8_weight(3, K + 1, 814);
    CHECK_THROWS_WITH_AS(kernels::linear(cpu_backend(1), x, narrow.q8(), nullptr, tensor_view<float, 2>(y.data(), {M, 3})),
                         doctest::Contains("weight"), shape_error);
    CHECK_THROWS_WITH_AS(ops::linear(reference_backend{}, x, narrow, nullptr, tensor_view<float, 2>(y.data(), {M, 3})),
                         doctest::Contains("weight"), shape_error);
}
