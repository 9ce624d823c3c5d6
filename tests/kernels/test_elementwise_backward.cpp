// ops::embedding_backward and ops::mul_sigmoid_backward (kernels/elementwise_backward.hpp): fp64 twins against
// central finite differences of the fp64 forwards, CPU fp32 on 1 and 2 threads against the reference backend
// (odd sizes, strided views, repeated tokens, masks, in place), bit-identical results for 1 and 2 threads, and
// argument errors naming the argument.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/core/linear_weight.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/elementwise_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

std::vector<std::int32_t> random_tokens(std::size_t n, std::int32_t V, std::uint64_t seed) {
    const auto u = test::uniform(n, 0.f, float(V), seed);
    std::vector<std::int32_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = std::min(V - 1, static_cast<std::int32_t>(u[i]));
    return t;
}

std::vector<unsigned char> random_mask(std::size_t n, std::uint64_t seed) {
    const auto u = test::uniform(n, 0.f, 1.f, seed);
    std::vector<unsigned char> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = u[i] < 0.75f ? 1 : 0;
    if (n > 0) m[0] = 1;
    return m;
}

}  // namespace

TEST_CASE("embedding_backward_ref matches fp64 finite differences of the masked gather") {
    const std::int64_t n = 7, V = 5, d = 3;
    const auto tokens = random_tokens(std::size_t(n), V, 1);
    const auto mask = random_mask(std::size_t(n), 2);
    const auto tf = test::uniform(std::size_t(V * d), -1.f, 1.f, 3);
    std::vector<double> table(tf.begin(), tf.end());
    const auto c = test::cotangent(std::size_t(n * d), 4);
    auto loss = [&] {
        double s = 0;
        for (std::int64_t r = 0; r < n; ++r)
            if (mask[std::size_t(r)])
                for (std::int64_t k = 0; k < d; ++k) s += c[std::size_t(r * d + k)] * table[std::size_t(tokens[std::size_t(r)] * d + k)];
        return s;
    };
    std::vector<double> dtable(table.size(), 0.0);
    kernels::embedding_backward_ref<double>(tokens, mask, tensor_view<const double, 2>(c.data(), {n, d}),
                                            tensor_view<double, 2>(dtable.data(), {V, d}));
    test::check_gradient("dtable", table, dtable, loss);
}

TEST_CASE("embedding_backward CPU (1, 2 threads) matches the reference backend; deterministic, +=, strided") {
    std::uint64_t seed = 10;
    for (std::int64_t n : {1, 7, 33, 300})
        for (std::int64_t d : {5, 19, 64, 130})
            for (std::int64_t pad : {0, 3}) {
                CAPTURE(n);
                CAPTURE(d);
                CAPTURE(pad);
                seed += 7;
                const std::int32_t V = 11;  // few ids: many repeats
                const auto tokens = random_tokens(std::size_t(n), V, seed);
                const auto mask = random_mask(std::size_t(n), seed + 1);
                const auto dxs = test::uniform(std::size_t(n * (d + pad)), -1.f, 1.f, seed + 2);
                const tensor_view<const float, 2> dx(dxs.data(), {n, d}, {d + pad, 1});  // [n, d]
                const auto table0 = test::uniform(std::size_t(V * (d + pad)), -1.f, 1.f, seed + 3);
                auto run = [&](const auto& be) {
                    auto t = table0;
                    ops::embedding_backward(be, tokens, mask, dx, tensor_view<float, 2>(t.data(), {V, d}, {d + pad, 1}));
                    return t;
                };
                const auto ref = run(reference_backend());
                const auto one = run(cpu_backend(1)), two = run(cpu_backend(2));
                CHECK(test::rel_error(one, ref) < 1e-6);
                CHECK(one == two);
                // rows of tokens that no masked row uses are untouched
                for (std::int32_t v = 0; v < V; ++v) {
                    bool used = false;
                    for (std::size_t r = 0; r < tokens.size(); ++r) used = used || (mask[r] && tokens[r] == v);
                    if (!used)
                        for (std::int64_t k = 0; k < d + pad; ++k)
                            CHECK(one[std::size_t(v * (d + pad) + k)] == table0[std::size_t(v * (d + pad) + k)]);
                }
            }
}

TEST_CASE("embedding_backward: errors name the argument; ids of masked-out rows are not used") {
    const std::int64_t n = 4, V = 3, d = 2;
    std::vector<std::int32_t> tokens{0, 2, 7, 1};
    std::vector<unsigned char> mask{1, 1, 0, 1};  // row 2 (id 7) is masked out: fine
    std::vector<float> dx(std::size_t(n * d), 1.f), table(std::size_t(V * d), 0.f);
    const tensor_view<const float, 2> dxv(dx.data(), {n, d});
    const tensor_view<float, 2> tv(table.data(), {V, d});
    const cpu_backend cpu(2);
    ops::embedding_backward(cpu, tokens, mask, dxv, tv);
    CHECK(table == std::vector<float>{1.f, 1.f, 1.f, 1.f, 1.f, 1.f});
    mask[2] = 1;
    CHECK_THROWS_WITH_AS(ops::embedding_backward(cpu, tokens, mask, dxv, tv), doctest::Contains("tokens[2] = 7"), value_error);
    CHECK_THROWS_WITH_AS(ops::embedding_backward(reference_backend(), tokens, mask, dxv, tv), doctest::Contains("tokens[2] = 7"), value_error);
    tokens[2] = -1;
    CHECK_THROWS_WITH_AS(ops::embedding_backward(cpu, tokens, mask, dxv, tv), doctest::Contains("tokens[2] = -1"), value_error);
    tokens[2] = 0;
    CHECK_THROWS_WITH_AS(ops::embedding_backward(cpu, std::span<const std::int32_t>(tokens).first(3), mask, dxv, tv),
                         doctest::Contains("tokens"), shape_error);
    CHECK_THROWS_WITH_AS(ops::embedding_backward(cpu, tokens, std::span<const unsigned char>(mask).first(3), dxv, tv),
                         doctest::Contains("mask"), shape_error);
    CHECK_THROWS_WITH_AS(ops::embedding_backward(cpu, tokens, mask, dxv, tensor_view<float, 2>(table.data(), {2, 3})),
                         doctest::Contains("dtable"), shape_error);
}

namespace {

/// A [N, H, d] buffer with padded strides [H·(d + pad), d + pad, 1].
struct buf3 {
    std::int64_t N, H, d, pad;
    std::vector<float> v;
    buf3(std::int64_t n, std::int64_t h, std::int64_t dd, std::int64_t p, float lo, float hi, std::uint64_t seed)
        : N(n), H(h), d(dd), pad(p), v(test::uniform(std::size_t(n * h * (dd + p)), lo, hi, seed)) {}
    tensor_view<float, 3> view() { return {v.data(), {N, H, d}, {H * (d + pad), d + pad, 1}}; }
    tensor_view<const float, 3> cview() const { return {v.data(), {N, H, d}, {H * (d + pad), d + pad, 1}}; }
};

}  // namespace

TEST_CASE("mul_sigmoid_backward_ref matches fp64 finite differences (a, gate), masked rows pass through") {
    const std::int64_t N = 5, H = 2, d = 3;
    const auto af = test::uniform(std::size_t(N * H * d), -2.f, 2.f, 1), gf = test::uniform(af.size(), -6.f, 6.f, 2);
    std::vector<double> a(af.begin(), af.end()), g(gf.begin(), gf.end());
    const auto mask = random_mask(std::size_t(N), 3);
    const auto c = test::cotangent(a.size(), 4);
    auto loss = [&] {
        double s = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
            s += c[i] * (mask[i / std::size_t(H * d)] ? a[i] * sigmoid(g[i]) : a[i]);
        return s;
    };
    std::vector<double> da(a.size(), 9.0), dg(a.size(), 9.0);
    using cv3 = tensor_view<const double, 3>;
    kernels::mul_sigmoid_backward_ref<double>(cv3(a.data(), {N, H, d}), cv3(g.data(), {N, H, d}), cv3(c.data(), {N, H, d}),
                                              tensor_view<double, 3>(da.data(), {N, H, d}), tensor_view<double, 3>(dg.data(), {N, H, d}), mask);
    test::check_gradient("da", a, da, loss);
    test::check_gradient("dgate", g, dg, loss);
}

TEST_CASE("mul_sigmoid_backward CPU (1, 2 threads) matches the reference backend; strided, in place, unmasked rows") {
    std::uint64_t seed = 100;
    for (std::int64_t N : {1, 7, 33})
        for (std::int64_t d : {5, 19, 64})
            for (std::int64_t pad : {0, 2})
                for (bool in_place : {false, true}) {
                    CAPTURE(N);
                    CAPTURE(d);
                    CAPTURE(pad);
                    CAPTURE(in_place);
                    seed += 5;
                    const std::int64_t H = 3;
                    const buf3 a(N, H, d, pad, -2.f, 2.f, seed), g(N, H, d, pad, -8.f, 8.f, seed + 1);
                    const auto mask = random_mask(std::size_t(N), seed + 2);
                    auto run = [&](const auto& be, std::vector<float>& dgate) {
                        buf3 dout(N, H, d, pad, -1.f, 1.f, seed + 3), da(N, H, d, pad, -9.f, -9.f, 0), dg(N, H, d, pad, -9.f, -9.f, 0);
                        buf3& dao = in_place ? dout : da;
                        ops::mul_sigmoid_backward(be, a.cview(), g.cview(), dout.cview(), dao.view(), dg.view(), mask);
                        dgate = dg.v;
                        return dao.v;
                    };
                    std::vector<float> dg_ref, dg1, dg2;
                    const auto da_ref = run(reference_backend(), dg_ref);
                    const auto da1 = run(cpu_backend(1), dg1), da2 = run(cpu_backend(2), dg2);
                    CHECK(test::rel_error(da1, da_ref) < 1e-5);
                    CHECK(test::rel_error(dg1, dg_ref) < 1e-5);
                    CHECK(da1 == da2);
                    CHECK(dg1 == dg2);
                    const buf3 dout(N, H, d, pad, -1.f, 1.f, seed + 3);
                    for (std::int64_t r = 0; r < N; ++r)
                        if (!mask[std::size_t(r)])
                            for (std::int64_t i = 0; i < H * (d + pad); ++i) {
                                const auto at = std::size_t(r * H * (d + pad) + i);
                                if (i % (d + pad) >= d) continue;  // padding
                                CHECK(da1[at] == dout.v[at]);
                                CHECK(dg1[at] == 0.f);
                            }
                }
}

TEST_CASE("mul_sigmoid_backward: errors name the argument") {
    std::vector<float> a(24), g(24), d(24), o(24), p(24);
    using cv3 = tensor_view<const float, 3>;
    using v3 = tensor_view<float, 3>;
    const std::vector<unsigned char> mask(2, 1);
    const cpu_backend cpu(1);
    CHECK_THROWS_WITH_AS(ops::mul_sigmoid_backward(cpu, cv3(a.data(), {2, 3, 4}), cv3(g.data(), {2, 4, 3}), cv3(d.data(), {2, 3, 4}),
                                                   v3(o.data(), {2, 3, 4}), v3(p.data(), {2, 3, 4}), mask),
                         doctest::Contains("gate"), shape_error);
    CHECK_THROWS_WITH_AS(ops::mul_sigmoid_backward(cpu, cv3(a.data(), {2, 3, 4}), cv3(g.data(), {2, 3, 4}), cv3(d.data(), {2, 3, 4}),
                                                   v3(o.data(), {2, 3, 4}), v3(p.data(), {2, 3, 4}), std::span(mask).first(1)),
                         doctest::Contains("mask"), shape_error);
    CHECK_THROWS_WITH_AS(ops::mul_sigmoid_backward(reference_backend(), cv3(a.data(), {2, 3, 4}), cv3(g.data(), {2, 3, 4}),
                                                   cv3(d.data(), {2, 3, 4}), v3(o.data(), {2, 3, 4}), v3(o.data(), {2, 3, 4}), mask),
                         doctest::Contains("dgate overlaps"), shape_error);
}

TEST_CASE("embedding and the row ops: a 16-bit table is widened exactly; widths and strides are checked on both backends") {
    const std::int64_t V = 7, d = 5, n = 4;
    const auto vals = test::uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, 41);
    linear_weight table = tensor<float>({V, d});
    std::copy(vals.begin(), vals.end(), table.data());
    const std::vector<std::int32_t> tokens{3, 0, 6, 3};
    const std::vector<unsigned char> mask{1, 1, 0, 1};
    const cpu_backend cpu(2);
    for (dtype t : {dtype::bf16, dtype::f16}) {
        CAPTURE(weight_dtype_name(t));
        linear_weight half = table;
        half.store_as(t);
        tensor<float> x({n, d}), xr({n, d});
        ops::embedding(cpu, half, tokens, mask, x.view<2>());
        ops::embedding(reference_backend(), half, tokens, mask, xr.view<2>());
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t c = 0; c < d; ++c) {
                const float v = vals[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)] * d + c)];
                const float want = !mask[static_cast<std::size_t>(r)] ? 0.0f
                                   : t == dtype::bf16            ? bf16::from_float(v).to_float()
                                                                 : f16::from_float(v).to_float();
                CHECK(x.view<2>()(r, c) == want);
                CHECK(xr.view<2>()(r, c) == want);
            }
    }
    // An 8-bit table: each row is its scale times its integers (q8_view::at), on both backends.
    linear_weight q8 = table;
    q8.store_as(dtype::i8);
    tensor<float> xq({n, d}), xqr({n, d});
    ops::embedding(cpu, q8, tokens, mask, xq.view<2>());
    ops::embedding(reference_backend(), q8, tokens, mask, xqr.view<2>());
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t c = 0; c < d; ++c) {
            const float want = mask[static_cast<std::size_t>(r)] ? q8.q8().at(tokens[static_cast<std::size_t>(r)], c) : 0.0f;
            CHECK(xq.view<2>()(r, c) == want);
            CHECK(xqr.view<2>()(r, c) == want);
            if (mask[static_cast<std::size_t>(r)])
                CHECK(std::abs(want - vals[static_cast<std::size_t>(tokens[static_cast<std::size_t>(r)] * d + c)]) <= q8.q8().scale[tokens[static_cast<std::size_t>(r)]] * 0.5001f);
        }
    std::vector<float> buf(static_cast<std::size_t>(2 * n * d));
    const tensor_view<float, 2> strided(buf.data(), {n, d}, {2 * d, 2});  // inner stride 2
    const tensor_view<float, 2> wide(buf.data(), {n, d + 1});
    tensor<float> y({n, d});
    const std::vector<std::int64_t> rows{0, 1, -1, 2};
    auto both = [&](auto&& f) {
        f(cpu);
        f(reference_backend());
    };
    both([&](const auto& be) {
        CHECK_THROWS_WITH_AS(ops::embedding(be, table, tokens, mask, wide), "embedding: the table has 5 columns, x 6", shape_error);
        CHECK_THROWS_WITH_AS(ops::embedding(be, table, tokens, mask, strided), "embedding: x needs unit inner stride, found 2", shape_error);
        CHECK_THROWS_WITH_AS(ops::gather_rows(be, tensor_view<const float, 2>(strided), rows, y.view<2>()),
                             "gather_rows: src needs unit inner stride, found 2", shape_error);
        CHECK_THROWS_WITH_AS(ops::scatter_rows(be, tensor_view<const float, 2>(y.view<2>()), rows, strided),
                             "scatter_rows: dst needs unit inner stride, found 2", shape_error);
        CHECK_THROWS_WITH_AS(ops::zero_rows(be, strided, mask), "zero_rows: y needs unit inner stride, found 2", shape_error);
        CHECK_THROWS_WITH_AS(ops::add_rows(be, y.view<2>(), tensor_view<const float, 2>(strided), mask),
                             "add_rows: y needs unit inner stride, found 2", shape_error);
    });
}
