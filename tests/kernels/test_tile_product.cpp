// The register-tile products of kernels/tile_product.hpp against plain fp64 loops, on AVX-512 (when this machine
// has it), AVX2 and SSE2 tiles: odd sizes (tails of the SIMD width, of the tile's rows and vectors), A read by rows
// and down columns (Aᵀ), strided rows, more than one pass of terms, = / += semantics, the lower-triangular forms'
// causality (entries above A's diagonal never read, so a NaN there reaches no output) for tril(A)·B and tril(A)ᵀ·B, the
// lower part of a product (written entries equal the whole product's), and the blocked transpose.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/kernels/tile_product.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

struct product_case {
    std::int64_t I, J, L, pad;
    bool a_transposed;  // A stored as [L, I] and read down its columns
    std::vector<float> a, b, c0;
    product_case(std::int64_t i, std::int64_t j, std::int64_t l, std::int64_t p, bool at, std::uint64_t seed)
        : I(i), J(j), L(l), pad(p), a_transposed(at), a(test::uniform(std::size_t(I * L + (at ? L : I) * p), -1.f, 1.f, seed)),
          b(test::uniform(std::size_t(L * (J + p)), -1.f, 1.f, seed + 1)), c0(test::uniform(std::size_t(I * (J + p)), -1.f, 1.f, seed + 2)) {}
    std::int64_t a_row() const { return a_transposed ? 1 : L + pad; }
    std::int64_t a_col() const { return a_transposed ? I + pad : 1; }
    float A(std::int64_t i, std::int64_t l) const { return a[std::size_t(i * a_row() + l * a_col())]; }
    enum class form { full, lower, lower_transposed };
    /// Every output of c (row stride J + pad) within fp32 rounding of fp64 C (+)= A · B, tril(A) · B or tril(A)ᵀ · B:
    /// |error| ≤ 1e-5 times the sum of the terms' magnitudes (the bound of a sum of ≤ 300 fp32 products, cancellation or
    /// not).
    bool matches(const std::vector<float>& c, bool accumulate, form f) const {
        for (std::int64_t i = 0; i < I; ++i)
            for (std::int64_t j = 0; j < J; ++j) {
                const double c_in = accumulate ? double(c0[std::size_t(i * (J + pad) + j)]) : 0.0;
                double s = c_in, mag = std::abs(c_in);
                const std::int64_t l0 = f == form::lower_transposed ? i : 0, l1 = f == form::lower ? i + 1 : L;
                for (std::int64_t l = l0; l < l1; ++l) {
                    const double t = double(f == form::lower_transposed ? A(l, i) : A(i, l)) * double(b[std::size_t(l * (J + pad) + j)]);
                    s += t;
                    mag += std::abs(t);
                }
                const double got = c[std::size_t(i * (J + pad) + j)];
                if (!(std::abs(got - s) <= 1e-5 * mag + 1e-30)) return false;
            }
        return true;
    }
};

template <class Arch>
void check_arch(const char* name) {
    CAPTURE(name);
    std::uint64_t seed = 77;
    for (std::int64_t I : {1, 5, 7, 13, 64})
        for (std::int64_t J : {1, 3, 16, 19, 64, 100, 128})
            for (std::int64_t pad : {0, 5})
                for (bool at : {false, true})
                    for (bool accumulate : {false, true}) {
                        CAPTURE(I);
                        CAPTURE(J);
                        CAPTURE(pad);
                        CAPTURE(at);
                        CAPTURE(accumulate);
                        for (std::int64_t L : {1, 4, 37, 300}) {
                            CAPTURE(L);
                            product_case p(I, J, L, pad, at, seed += 5);
                            auto c = p.c0;
                            kernels::detail::tile_product<Arch>(p.a.data(), p.a_row(), p.a_col(), p.b.data(), J + pad, c.data(), J + pad, I, J,
                                                                L, accumulate);
                            CHECK(p.matches(c, accumulate, product_case::form::full));
                            for (std::int64_t i = 0; i < I; ++i)  // padding untouched
                                for (std::int64_t e = J; e < J + pad; ++e) CHECK(c[std::size_t(i * (J + pad) + e)] == p.c0[std::size_t(i * (J + pad) + e)]);
                        }
                        // Lower-triangular form: A square [I, I] with NaN everywhere above the diagonal (never read, so
                        // no output may turn NaN: row i must not see a later row's entries).
                        product_case q(I, J, I, pad, at, seed += 5);
                        for (std::int64_t i = 0; i < I; ++i)
                            for (std::int64_t l = i + 1; l < I; ++l)
                                q.a[std::size_t(i * q.a_row() + l * q.a_col())] = std::numeric_limits<float>::quiet_NaN();
                        auto d = q.c0;
                        kernels::detail::tile_product_lower<Arch>(q.a.data(), q.a_row(), q.a_col(), q.b.data(), J + pad, d.data(), J + pad, I, J,
                                                                  accumulate);
                        for (float v : d) CHECK(std::isfinite(v));
                        CHECK(q.matches(d, accumulate, product_case::form::lower));
                        // tril(A)ᵀ · B with the same A: row i sums the rows l ≥ i.
                        auto e = q.c0;
                        kernels::detail::tile_product_lower_transposed<Arch>(q.a.data(), q.a_row(), q.a_col(), q.b.data(), J + pad, e.data(),
                                                                             J + pad, I, J, accumulate);
                        for (float v : e) CHECK(std::isfinite(v));
                        CHECK(q.matches(e, accumulate, product_case::form::lower_transposed));
                        for (std::int64_t i = 0; i < I; ++i)  // padding untouched on the reversed rows too
                            for (std::int64_t x = J; x < J + pad; ++x) CHECK(e[std::size_t(i * (J + pad) + x)] == q.c0[std::size_t(i * (J + pad) + x)]);
                    }
    // The lower part of a square product C = A · B [I, I], A by rows or down columns, padded rows of B and C: entries on
    // and below the diagonal as the whole product's (same bits), every other entry of C either untouched or the whole
    // product's, the padding past column I untouched.
    for (std::int64_t I : {1, 5, 7, 13, 16, 37, 64, 100})
        for (std::int64_t L : {1, 19, 128})
            for (std::int64_t pad : {0, 3})
                for (bool at : {false, true}) {
                    CAPTURE(I);
                    CAPTURE(L);
                    CAPTURE(pad);
                    CAPTURE(at);
                    const std::int64_t ld = I + pad, a_row = at ? 1 : L, a_col = at ? I : 1;
                    const auto a = test::uniform(std::size_t(I * L), -1.f, 1.f, seed += 5), b = test::uniform(std::size_t(L * ld), -1.f, 1.f, seed += 5);
                    std::vector<float> whole(std::size_t(I * ld), 7.f), part(whole.size(), 7.f);
                    kernels::detail::tile_product<Arch>(a.data(), a_row, a_col, b.data(), ld, whole.data(), ld, I, I, L, false);
                    kernels::detail::tile_product_lower_part<Arch>(a.data(), a_row, a_col, b.data(), ld, part.data(), ld, I, L);
                    bool ok = true;
                    for (std::int64_t i = 0; i < I; ++i)
                        for (std::int64_t j = 0; j < ld; ++j) {
                            const float got = part[std::size_t(i * ld + j)], want = whole[std::size_t(i * ld + j)];
                            if (j >= I) ok = ok && got == 7.f;
                            else if (j <= i) ok = ok && got == want;
                            else ok = ok && (got == want || got == 7.f);
                        }
                    CHECK(ok);
                }
}

}  // namespace

TEST_CASE("tile_product, tile_product_lower and tile_product_lower_transposed equal fp64 loops on every tile shape; odd sizes, Aᵀ, strides, passes") {
#if defined(__AVX512F__)
    check_arch<xsimd::avx512f>("avx512f");
#endif
    if constexpr (xsimd::avx2::supported()) check_arch<xsimd::avx2>("avx2");
    if constexpr (xsimd::sse2::supported()) check_arch<xsimd::sse2>("sse2");
}

TEST_CASE("transpose_rows: strided source and destination, sizes around the block of 8") {
    for (std::int64_t rows : {1, 7, 8, 9, 64})
        for (std::int64_t cols : {1, 5, 128}) {
            const std::int64_t lds = cols + 3, ldd = rows + 2;
            const auto src = test::uniform(std::size_t(rows * lds), -1.f, 1.f, std::uint64_t(rows * 1000 + cols));
            std::vector<float> dst(std::size_t(cols * ldd), 9.f);
            kernels::detail::transpose_rows(src.data(), lds, rows, cols, dst.data(), ldd);
            for (std::int64_t j = 0; j < cols; ++j)
                for (std::int64_t i = 0; i < ldd; ++i)
                    CHECK(dst[std::size_t(j * ldd + i)] == (i < rows ? src[std::size_t(i * lds + j)] : 9.f));
        }
}

TEST_CASE("tile_product: within one pass, the same product added twice onto zeros is exactly twice it; L = 0 overwrites with zeros") {
    using Arch = xsimd::default_arch;
    const std::int64_t I = 11, J = 37, L = 200;  // one pass of terms
    const auto a = test::uniform(std::size_t(I * L), -1.f, 1.f, 5), b = test::uniform(std::size_t(L * J), -1.f, 1.f, 6);
    std::vector<float> once(std::size_t(I * J), 0.f), twice(once);
    kernels::detail::tile_product<Arch>(a.data(), L, 1, b.data(), J, once.data(), J, I, J, L, false);
    kernels::detail::tile_product<Arch>(a.data(), L, 1, b.data(), J, twice.data(), J, I, J, L, true);
    kernels::detail::tile_product<Arch>(a.data(), L, 1, b.data(), J, twice.data(), J, I, J, L, true);
    for (std::size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == 2.f * once[i]);
    std::vector<float> c(std::size_t(I * J), 3.f);
    kernels::detail::tile_product<Arch>(a.data(), L, 1, b.data(), J, c.data(), J, I, J, 0, false);
    for (float v : c) CHECK(v == 0.f);
}
