// ops::linear_backward (kernels/linear_backward.hpp): the fp64 twin against central finite differences of the fp64
// forward (spec.md §0, y = x Wᵀ + b); the CPU fp32 kernel on 1 and 2 threads against the reference backend on odd
// sizes and strided views (native, AVX2 and SSE2 tiles); = / += semantics, skipped outputs, bit-identical results for 1 and 2 threads, and
// shape errors naming the argument.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "hymix/kernels/linear.hpp"
#include "hymix/ops/linear_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

using view2d = tensor_view<double, 2>;
using cview2d = tensor_view<const double, 2>;

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("linear_backward_ref matches fp64 finite differences (x, w, b), = and += semantics") {
    for (const auto& mnk : {std::array<std::int64_t, 3>{1, 5, 19}, {7, 19, 5}, {3, 1, 1}, {33, 6, 7}}) {
        const std::int64_t M = mnk[0], N = mnk[1], K = mnk[2];
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(K);
        const std::uint64_t seed = static_cast<std::uint64_t>(M * 100 + N * 10 + K);
        auto x = to_double(test::uniform(std::size_t(M * K), -1.f, 1.f, seed));
        auto w = to_double(test::uniform(std::size_t(N * K), -1.f, 1.f, seed + 1));
        auto b = to_double(test::uniform(std::size_t(N), -1.f, 1.f, seed + 2));
        const auto c = test::cotangent(std::size_t(M * N), seed + 3);  // dy
        auto loss = [&] {
            std::vector<double> y(std::size_t(M * N));
            kernels::linear_ref<double, double, double>(cview2d(x.data(), {M, K}), cview2d(w.data(), {N, K}), b.data(),
                                                        view2d(y.data(), {M, N}));
            return test::dot(c, y);
        };
        std::vector<double> dx(x.size(), 123.0);  // overwritten
        const auto dw0 = to_double(test::uniform(w.size(), -1.f, 1.f, seed + 4));
        const auto db0 = to_double(test::uniform(b.size(), -1.f, 1.f, seed + 5));
        auto dw = dw0, db = db0;  // accumulated onto
        kernels::linear_backward_ref<double>(cview2d(x.data(), {M, K}), cview2d(w.data(), {N, K}), cview2d(c.data(), {M, N}),
                                             view2d(dx.data(), {M, K}), view2d(dw.data(), {N, K}), db.data());
        for (std::size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
        for (std::size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
        test::check_gradient("dx", x, dx, loss);
        test::check_gradient("dw", w, dw, loss);
        test::check_gradient("db", b, db, loss);
    }
}

namespace {

/// Random problem with row strides (padding after each row) for every view.
struct problem {
    std::int64_t M, N, K, pad;
    std::vector<float> x, w, dy, dx, dw, db;
    problem(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t p, std::uint64_t seed)
        : M(m), N(n), K(k), pad(p), x(test::uniform(std::size_t(M * (K + p)), -1.f, 1.f, seed)),
          w(test::uniform(std::size_t(N * (K + p)), -1.f, 1.f, seed + 1)), dy(test::uniform(std::size_t(M * (N + p)), -1.f, 1.f, seed + 2)),
          dx(std::size_t(M * (K + p)), -9.f), dw(test::uniform(std::size_t(N * (K + p)), -1.f, 1.f, seed + 3)),
          db(test::uniform(std::size_t(N), -1.f, 1.f, seed + 4)) {}
    tensor_view<const float, 2> xv() const { return {x.data(), {M, K}, {K + pad, 1}}; }   // [M, K]
    tensor_view<const float, 2> wv() const { return {w.data(), {N, K}, {K + pad, 1}}; }   // [N, K]
    tensor_view<const float, 2> dyv() const { return {dy.data(), {M, N}, {N + pad, 1}}; } // [M, N]
    tensor_view<float, 2> dxv() { return {dx.data(), {M, K}, {K + pad, 1}}; }             // [M, K]
    tensor_view<float, 2> dwv() { return {dw.data(), {N, K}, {K + pad, 1}}; }             // [N, K]
    template <class B>
    void run(const B& be) {
        ops::linear_backward(be, xv(), wv(), dyv(), dxv(), dwv(), db.data());
    }
};

/// The rows × cols entries of a strided buffer (padding dropped).
std::vector<float> dense(const std::vector<float>& v, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
    std::vector<float> out;
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) out.push_back(v[std::size_t(r * stride + c)]);
    return out;
}

}  // namespace

/// The CPU kernel of one architecture on 1 and 2 threads against the reference backend: odd sizes (tails of the
/// SIMD width, of the register tile's rows and vectors), more than one pass of terms (N or M > 256), strided views.
template <class Backend>
void check_cpu_against_reference(const char* arch_name) {
    CAPTURE(arch_name);
    const reference_backend ref;
    std::uint64_t seed = 1000;
    for (std::int64_t M : {1, 7, 33, 300})
        for (std::int64_t N : {5, 19, 64, 130, 300})
            for (std::int64_t K : {5, 19, 64, 100})
                for (std::int64_t pad : {0, 3}) {
                    CAPTURE(M);
                    CAPTURE(N);
                    CAPTURE(K);
                    CAPTURE(pad);
                    problem r(M, N, K, pad, seed += 7);
                    r.run(ref);
                    std::vector<float> first_dx, first_dw, first_db;
                    for (int threads : {1, 2}) {
                        CAPTURE(threads);
                        problem p(M, N, K, pad, seed);
                        p.run(Backend(threads));
                        CHECK(test::rel_error(dense(p.dx, M, K, K + pad), dense(r.dx, M, K, K + pad)) < 1e-4);
                        CHECK(test::rel_error(dense(p.dw, N, K, K + pad), dense(r.dw, N, K, K + pad)) < 1e-4);
                        CHECK(test::rel_error(p.db, r.db) < 1e-4);
                        if (pad > 0)  // padding untouched
                            for (std::int64_t m = 0; m < M; ++m) CHECK(p.dx[std::size_t(m * (K + pad) + K)] == -9.f);
                        if (threads == 1) {
                            first_dx = p.dx;
                            first_dw = p.dw;
                            first_db = p.db;
                        } else {  // fixed partition: the thread count changes no bit
                            CHECK(p.dx == first_dx);
                            CHECK(p.dw == first_dw);
                            CHECK(p.db == first_db);
                        }
                    }
                }
}

TEST_CASE("linear_backward CPU fp32 (1 and 2 threads) matches the reference backend; odd sizes, strided views") {
    check_cpu_against_reference<cpu_backend>("native");
    if constexpr (xsimd::avx2::supported()) check_cpu_against_reference<basic_cpu_backend<xsimd::avx2>>("avx2");
    if constexpr (xsimd::sse2::supported()) check_cpu_against_reference<basic_cpu_backend<xsimd::sse2>>("sse2");
}

TEST_CASE("linear_backward on the reference backend equals linear_backward_ref on fp64 copies") {
    const std::int64_t M = 9, N = 11, K = 13;
    problem p(M, N, K, 0, 77);
    const auto dw0 = p.dw, db0 = p.db;
    p.run(reference_backend());
    std::vector<double> x(p.x.begin(), p.x.end()), w(p.w.begin(), p.w.end()), dy(p.dy.begin(), p.dy.end());
    std::vector<double> dx(p.dx.size()), dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
    kernels::linear_backward_ref<double>(cview2d(x.data(), {M, K}), cview2d(w.data(), {N, K}), cview2d(dy.data(), {M, N}),
                                         view2d(dx.data(), {M, K}), view2d(dw.data(), {N, K}), db.data());
    for (std::size_t i = 0; i < dx.size(); ++i) CHECK(p.dx[i] == static_cast<float>(dx[i]));
    for (std::size_t i = 0; i < dw.size(); ++i) CHECK(p.dw[i] == static_cast<float>(dw[i]));
    for (std::size_t i = 0; i < db.size(); ++i) CHECK(p.db[i] == static_cast<float>(db[i]));
}

TEST_CASE("linear_backward skips null outputs and accumulates dw, db across calls") {
    const std::int64_t M = 33, N = 19, K = 64;
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        const cpu_backend be(threads);
        problem p(M, N, K, 0, 5);
        const auto dx0 = p.dx, dw0 = p.dw, db0 = p.db;
        ops::linear_backward(be, p.xv(), p.wv(), p.dyv(), tensor_view<float, 2>(), tensor_view<float, 2>(), nullptr);
        CHECK(p.dx == dx0);
        CHECK(p.dw == dw0);
        CHECK(p.db == db0);
        // only dx
        ops::linear_backward(be, p.xv(), p.wv(), p.dyv(), p.dxv(), tensor_view<float, 2>(), nullptr);
        CHECK(p.dx != dx0);
        CHECK(p.dw == dw0);
        // dw and db from zero, twice: exactly twice the once value (accumulation, not overwrite)
        std::vector<float> dw(dw0.size(), 0.f), db(db0.size(), 0.f);
        ops::linear_backward(be, p.xv(), p.wv(), p.dyv(), tensor_view<float, 2>(), tensor_view<float, 2>(dw.data(), {N, K}), db.data());
        const auto dw1 = dw, db1 = db;
        ops::linear_backward(be, p.xv(), p.wv(), p.dyv(), tensor_view<float, 2>(), tensor_view<float, 2>(dw.data(), {N, K}), db.data());
        for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == 2 * dw1[i]);
        for (std::size_t i = 0; i < db.size(); ++i) CHECK(db[i] == 2 * db1[i]);
        // db alone (no dw)
        std::vector<float> db_only(db0.size(), 0.f);
        ops::linear_backward(be, p.xv(), p.wv(), p.dyv(), tensor_view<float, 2>(), tensor_view<float, 2>(), db_only.data());
        CHECK(db_only == db1);
    }
}

TEST_CASE("linear_backward: bad shapes and layouts throw shape_error naming the argument") {
    const std::int64_t M = 4, N = 3, K = 5;
    std::vector<float> x(40), w(40), dy(40), dx(40), dw(40);
    const tensor_view<const float, 2> xv(x.data(), {M, K}), wv(w.data(), {N, K}), dyv(dy.data(), {M, N});
    const tensor_view<float, 2> dxv(dx.data(), {M, K}), dwv(dw.data(), {N, K});
    for (int b = 0; b < 2; ++b) {
        auto call = [&](auto xa, auto wa, auto dya, auto dxa, auto dwa) {
            if (b == 0)
                ops::linear_backward(cpu_backend(1), xa, wa, dya, dxa, dwa, nullptr);
            else
                ops::linear_backward(reference_backend(), xa, wa, dya, dxa, dwa, nullptr);
        };
        CHECK_THROWS_WITH_AS(call(xv, tensor_view<const float, 2>(w.data(), {N, K + 1}), dyv, dxv, dwv), doctest::Contains("weight"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, tensor_view<const float, 2>(dy.data(), {M, N + 1}), dxv, dwv), doctest::Contains("dy"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, dyv, tensor_view<float, 2>(dx.data(), {M + 1, K}), dwv), doctest::Contains("dx"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, dyv, dxv, tensor_view<float, 2>(dw.data(), {N, K - 1})), doctest::Contains("dw"), shape_error);
        CHECK_THROWS_WITH_AS(call(tensor_view<const float, 2>(x.data(), {M, K}, {K, 2}), wv, dyv, dxv, dwv), doctest::Contains("x"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, dyv, tensor_view<float, 2>(dy.data(), {M, K}), dwv), doctest::Contains("dx overlaps dy"),
                             shape_error);
    }
}
