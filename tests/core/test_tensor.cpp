// Tensor views, owning tensors, Eigen interop, dtype conversions, linear_weight storage and the error hierarchy.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "hymix/core/convert.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "support/random.hpp"

using namespace hymix;

TEST_CASE("owning tensor is zeroed, 64-byte aligned and viewable") {
    tensor<float> t({3, 5, 7});
    CHECK(t.numel() == 105);
    CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
    for (float v : t.span()) CHECK(v == 0.0f);
    auto v = t.view<3>();
    v(2, 4, 6) = 1.5f;
    CHECK(t[104] == 1.5f);
    CHECK(v[2](4, 6) == 1.5f);
    CHECK(v.is_contiguous());
    CHECK_THROWS_AS(t.view<2>(), shape_error);
}

TEST_CASE("copy and reshape keep contents; bad reshape names both shapes") {
    tensor<float> a({2, 3});
    for (int i = 0; i < 6; ++i) a[i] = float(i);
    tensor<float> b = a;
    b.reshape({3, 2});
    CHECK(b.view<2>()(2, 1) == 5.0f);
    try {
        b.reshape({4, 2});
        FAIL("expected shape_error");
    } catch (const shape_error& e) {
        CHECK(std::string(e.what()).find("[3, 2]") != std::string::npos);
        CHECK(std::string(e.what()).find("[4, 2]") != std::string::npos);
    }
}

TEST_CASE("require_shape reports expected and found") {
    tensor<float> t({4, 8});
    auto v = t.view<2>();
    CHECK_NOTHROW(v.require_shape({4, -1}, "x"));
    try {
        v.require_shape({4, 9}, "in_proj.weight");
        FAIL("expected shape_error");
    } catch (const error& e) {
        const std::string m = e.what();
        CHECK(m.find("in_proj.weight") != std::string::npos);
        CHECK(m.find("[4, 9]") != std::string::npos);
        CHECK(m.find("[4, 8]") != std::string::npos);
    }
}

TEST_CASE("strided views map onto Eigen without copying") {
    tensor<float> t({4, 6});
    for (int i = 0; i < 24; ++i) t[i] = float(i);
    auto v = t.view<2>();
    tensor_view<float, 2> cols(v.data + 2, {4, 3}, {6, 1});  // columns 2..4
    auto m = cols.matrix();
    CHECK(m(3, 2) == t[3 * 6 + 4]);
    m(0, 0) = -1;
    CHECK(t[2] == -1);
    tensor_view<const float, 2> cv = cols;
    CHECK(cv.matrix()(1, 1) == t[6 + 3]);
}

namespace {
float sum_view(tensor_view<const float, 2> v) {
    float s = 0;
    for (std::int64_t i = 0; i < v.dim(0); ++i)
        for (std::int64_t j = 0; j < v.dim(1); ++j) s += v(i, j);
    return s;
}
void fill_view(tensor_view<float, 2> v, float x) {
    for (std::int64_t i = 0; i < v.dim(0); ++i)
        for (std::int64_t j = 0; j < v.dim(1); ++j) v(i, j) = x;
}
}  // namespace

TEST_CASE("an owning tensor is accepted where a view of its rank is expected; a wrong rank throws") {
    tensor<float> t({2, 3});
    fill_view(t, 2.0f);  // tensor<float>& -> tensor_view<float, 2>
    CHECK(t[5] == 2.0f);
    CHECK(sum_view(t) == 12.0f);  // tensor<float>& -> tensor_view<const float, 2>
    const tensor<float>& ct = t;
    CHECK(sum_view(ct) == 12.0f);  // const tensor<float>& -> tensor_view<const float, 2>
    const tensor_view<float, 2> v = t;
    CHECK(v.data == t.data());
    CHECK(v.shape == std::array<std::int64_t, 2>{2, 3});
    CHECK(v.is_contiguous());
    tensor<float> flat({6});
    CHECK_THROWS_WITH_AS(fill_view(flat, 1.0f), "view of rank 2 requested for a tensor of shape [6]", shape_error);
    CHECK_THROWS_AS(sum_view(flat), shape_error);
    // Only lvalues convert (a view of a temporary would dangle); a const tensor never gives a mutable view.
    static_assert(!std::is_convertible_v<tensor<float>, tensor_view<const float, 2>>);
    static_assert(!std::is_convertible_v<const tensor<float>&, tensor_view<float, 2>>);
    static_assert(std::is_convertible_v<tensor<float>&, tensor_view<float, 3>>);
    static_assert(!std::is_convertible_v<tensor<double>&, tensor_view<float, 2>>);
}

TEST_CASE("bf16 conversion: round to nearest even, NaN, Inf, vectorised == scalar") {
    CHECK(bf16::from_float(1.0f).bits == 0x3f80);
    CHECK(bf16::from_float(1.00390625f).bits == 0x3f80);  // exact tie -> even
    CHECK(bf16::from_float(1.01171875f).bits == 0x3f82);  // tie -> even (up)
    CHECK(std::isnan(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
    CHECK(std::isinf(bf16::from_float(std::numeric_limits<float>::infinity()).to_float()));
    auto x = test::uniform(1003, -1e4f, 1e4f, 7);
    x[5] = std::numeric_limits<float>::quiet_NaN();
    x[17] = -std::numeric_limits<float>::infinity();
    std::vector<bf16> v(x.size());
    convert(x.data(), v.data(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i])) {
            CHECK(std::isnan(v[i].to_float()));
            continue;
        }
        CHECK(v[i].bits == bf16::from_float(x[i]).bits);
    }
    std::vector<float> back(x.size());
    convert(v.data(), back.data(), v.size());
    for (std::size_t i = 0; i < x.size(); ++i)
        if (!std::isnan(x[i]) && !std::isinf(x[i])) CHECK(std::abs(back[i] - x[i]) <= std::abs(x[i]) * (1.0f / 256));
}

TEST_CASE("f16 conversion: normals, subnormals, overflow, round trip of every f16") {
    CHECK(f16::from_float(1.0f).bits == 0x3c00);
    CHECK(f16::from_float(65504.0f).bits == 0x7bff);
    CHECK(f16::from_float(1e6f).bits == 0x7c00);
    CHECK(f16::from_float(-2.0f).bits == 0xc000);
    CHECK(f16::from_float(5.9604644775390625e-8f).bits == 0x0001);  // smallest subnormal
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
        const f16 h = f16::from_bits(static_cast<std::uint16_t>(b));
        const float f = h.to_float();
        if (std::isnan(f)) continue;
        CHECK(f16::from_float(f).bits == h.bits);
    }
}

TEST_CASE("dtype names round-trip and unknown names are rejected") {
    for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16, dtype::i32, dtype::i64, dtype::i8})
        CHECK(parse_dtype(dtype_name(t)) == t);
    CHECK(dtype_size(dtype::i8) == 1);
    CHECK_THROWS_AS(parse_dtype("F8_E4M3"), dtype_error);
    CHECK(dtype_size(dtype::bf16) == 2);
    CHECK(dtype_of_v<const float> == dtype::f32);
}

TEST_CASE("vectorised f16 conversions are bit-identical to the scalar ones") {
    // every f16 bit pattern -> f32
    std::vector<f16> all(0x10000);
    for (std::uint32_t b = 0; b < 0x10000; ++b) all[b] = f16::from_bits(static_cast<std::uint16_t>(b));
    std::vector<float> wide(all.size());
    convert(all.data(), wide.data(), all.size());
    for (std::size_t b = 0; b < all.size(); ++b) {
        const float want = all[b].to_float();
        if (std::isnan(want)) {
            CHECK(std::isnan(wide[b]));
            continue;
        }
        CHECK(std::bit_cast<std::uint32_t>(wide[b]) == std::bit_cast<std::uint32_t>(want));
    }
    // f32 -> f16 on random values over the whole range, ties, subnormals, overflow, Inf and NaN
    auto x = test::uniform(4099, -7e4f, 7e4f, 21);
    auto small = test::uniform(2003, -1e-4f, 1e-4f, 22);
    x.insert(x.end(), small.begin(), small.end());
    x.insert(x.end(), {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, 5.96e-8f, 2.98e-8f, 2.9802322e-8f,
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), 1.00048828125f, 1.00146484375f});
    std::vector<f16> h(x.size());
    convert(x.data(), h.data(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) CHECK_MESSAGE(h[i].bits == f16::from_float(x[i]).bits, "x = " << x[i]);
}

TEST_CASE("linear_weight: f32 by default, bf16 / f16 storage rounds to nearest even, widens back exactly") {
    linear_weight w = tensor<float>({3, 5});
    CHECK(w.storage() == dtype::f32);
    for (std::int64_t i = 0; i < w.numel(); ++i) w[i] = 1.0f + static_cast<float>(i) * 0.001953125f + 1e-7f * static_cast<float>(i % 3);
    w[7] = std::numeric_limits<float>::infinity();
    w[8] = -3.0e-6f;  // an f16 subnormal
    const tensor<float> orig = w.f32();
    CHECK(w.stored_bytes() == 15 * 4);
    for (dtype d : {dtype::bf16, dtype::f16}) {
        CAPTURE(weight_dtype_name(d));
        linear_weight h = w;
        h.store_as(d, "w");
        CHECK(h.storage() == d);
        CHECK(h.stored_bytes() == 15 * 2);
        CHECK(h.shape() == std::vector<std::int64_t>{3, 5});  // the stored shape, whatever the storage
        CHECK(h.rank() == 2);
        CHECK(h.dim(1) == 5);
        CHECK(h.numel() == 15);
        CHECK_THROWS_WITH_AS((void)h.data(), doctest::Contains("stored as"), value_error);
        CHECK_THROWS_AS((void)h.view<2>(), value_error);
        CHECK_THROWS_AS((void)h.span(), value_error);
        h.visit_stored<2>([&]<class T>(tensor_view<const T, 2> v) {
            CHECK(dtype_of<T>::value == d);
            for (std::int64_t i = 0; i < 15; ++i) {
                const float want = d == dtype::bf16 ? bf16::from_float(orig[i]).to_float() : f16::from_float(orig[i]).to_float();
                CHECK(std::bit_cast<std::uint32_t>(static_cast<float>(v(i / 5, i % 5))) == std::bit_cast<std::uint32_t>(want));
            }
        });
        const linear_weight copy = h;  // copies keep the storage
        CHECK(copy.storage() == d);
        h.store_as(dtype::f32);
        CHECK(h.storage() == dtype::f32);
        for (std::int64_t i = 0; i < 15; ++i) {
            const float want = d == dtype::bf16 ? bf16::from_float(orig[i]).to_float() : f16::from_float(orig[i]).to_float();
            CHECK(std::bit_cast<std::uint32_t>(h[i]) == std::bit_cast<std::uint32_t>(want));
        }
        // Assigning an f32 tensor makes it f32 again.
        linear_weight a = copy;
        a = tensor<float>({2, 2});
        CHECK(a.storage() == dtype::f32);
        CHECK(a.numel() == 4);
    }
    // bf16 → f16 goes through the exact f32 values; f16 overflow is named and leaves the weight as it was.
    linear_weight big = tensor<float>({1, 3});
    big[1] = 70000.0f;
    big.store_as(dtype::bf16, "layers.0.mixer.out_proj.weight");
    CHECK_THROWS_WITH_AS(big.store_as(dtype::f16, "layers.0.mixer.out_proj.weight"),
                         doctest::Contains("layers.0.mixer.out_proj.weight: value 70144.000000 at [0, 1] overflows f16"), value_error);
    CHECK(big.storage() == dtype::bf16);
    CHECK_THROWS_AS(big.check_storable(dtype::f16), value_error);
    CHECK_THROWS_AS(big.store_as(dtype::i32), config_error);
    // f16's largest finite value is 65504: round-to-nearest-even sends |w| < 65520 there, |w| >= 65520 to infinity.
    linear_weight edge = tensor<float>({1, 2});
    edge[0] = 65519.0f;
    edge[1] = -65519.0f;
    edge.store_as(dtype::f16, "edge");
    edge.visit_stored<2>([&]<class T>(tensor_view<const T, 2> v) {
        CHECK(static_cast<float>(v(0, 0)) == 65504.0f);
        CHECK(static_cast<float>(v(0, 1)) == -65504.0f);
    });
    linear_weight over = tensor<float>({1, 1});
    over[0] = -65520.0f;
    CHECK_THROWS_WITH_AS(over.store_as(dtype::f16, "over"), doctest::Contains("over: value -65520.000000 at [0, 0] overflows f16"),
                         value_error);
    CHECK(parse_weight_dtype("bfloat16") == dtype::bf16);
    CHECK(parse_weight_dtype("fp16") == dtype::f16);
    CHECK(parse_weight_dtype("int8") == dtype::i8);
    CHECK(parse_weight_dtype("q8") == dtype::i8);
    CHECK_THROWS_WITH_AS(parse_weight_dtype("int4"), "weight dtype: expected f32, bf16, f16 or i8, found \"int4\"", config_error);
}

TEST_CASE("linear_weight: i8 storage quantizes each row by its absmax (error at most half a step), refuses non-finite values") {
    const std::int64_t N = 4, K = 37;
    linear_weight w = tensor<float>({N, K});
    for (std::int64_t i = 0; i < N * K; ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * (i / K == 1 ? 1e-4f : 3.f);
    for (std::int64_t k = 0; k < K; ++k) w[2 * K + k] = 0.f;  // an all-zero row: scale 0, exact
    w[3 * K + 5] = -9.f;                                       // row 3's absmax, negative
    const tensor<float> orig = w.f32();
    linear_weight q = w;
    q.store_as(dtype::i8, "w");
    CHECK(q.storage() == dtype::i8);
    CHECK(q.stored_bytes() == static_cast<std::size_t>(N * K + N * 4));
    CHECK(q.shape() == std::vector<std::int64_t>{N, K});
    CHECK(q.numel() == N * K);
    CHECK_THROWS_WITH_AS((void)q.data(), doctest::Contains("stored as i8"), value_error);
    // A visitor that takes a q8_view gets one; a visitor of tensor views only meets a clear error.
    CHECK_THROWS_WITH_AS(q.visit_stored<2>([](auto v) -> int {
                             if constexpr (is_q8_view_v<decltype(v)>) throw std::logic_error("got the q8_view");
                             else return static_cast<int>(v.dim(0));
                         }),
                         "got the q8_view", std::logic_error);
    CHECK_THROWS_WITH_AS(q.visit_stored<2>([]<class T>(tensor_view<const T, 2>) {}), doctest::Contains("stored as i8"), value_error);
    CHECK_THROWS_AS(((void)q.stored_view<bf16, 2>()), value_error);
    CHECK_THROWS_AS((void)w.q8(), value_error);
    const q8_view v = q.q8();
    for (std::int64_t n = 0; n < N; ++n) {
        CAPTURE(n);
        float amax = 0;
        for (std::int64_t k = 0; k < K; ++k) amax = std::max(amax, std::abs(orig[n * K + k]));
        CHECK(v.scale[n] == amax / 127.f);
        int extreme = 0;
        for (std::int64_t k = 0; k < K; ++k) {
            CHECK(std::abs(static_cast<int>(v.q(n, k))) <= 127);
            extreme = std::max(extreme, std::abs(static_cast<int>(v.q(n, k))));
            CHECK(std::abs(v.at(n, k) - orig[n * K + k]) <= 0.5f * v.scale[n] * (1.f + 1e-5f));
        }
        CHECK(extreme == (n == 2 ? 0 : 127));
    }
    CHECK(v.q(3, 5) == -127);
    // Back to f32: scale · q; to bf16 through those values; quantizing again is exact (a fixed point).
    linear_weight back = q;
    back.store_as(dtype::f32);
    for (std::int64_t i = 0; i < N * K; ++i) CHECK(back[i] == v.at(i / K, i % K));
    linear_weight again = back;
    again.store_as(dtype::i8);
    for (std::int64_t i = 0; i < N * K; ++i) CHECK(again.q8().q(i / K, i % K) == v.q(i / K, i % K));
    linear_weight b16 = q;
    b16.store_as(dtype::bf16);
    CHECK(b16.storage() == dtype::bf16);
    b16.visit_stored<2>([&]<class T>(tensor_view<const T, 2> bv) {
        for (std::int64_t i = 0; i < N * K; ++i) CHECK(static_cast<float>(bv(i / K, i % K)) == bf16::from_float(v.at(i / K, i % K)).to_float());
    });
    // From 16 bits to i8: the widened values are quantized (the same integers here: bf16 keeps each row's absmax).
    linear_weight h16 = w;
    h16.store_as(dtype::f16);
    h16.store_as(dtype::i8);
    CHECK(h16.storage() == dtype::i8);
    for (std::int64_t i = 0; i < N * K; ++i) CHECK(std::abs(h16.q8().at(i / K, i % K) - orig[i]) <= 0.5f * h16.q8().scale[i / K] + 2e-3f * std::abs(orig[i]));
    // i8 → f16 checks the range of the dequantized values.
    linear_weight huge = tensor<float>({1, 2});
    huge[0] = 1e6f;
    huge.store_as(dtype::i8);
    CHECK_THROWS_WITH_AS(huge.store_as(dtype::f16, "huge"), doctest::Contains("overflows f16"), value_error);
    CHECK(huge.storage() == dtype::i8);
    // A [0, K] weight keeps its width.
    linear_weight empty_rows = tensor<float>({0, 5});
    empty_rows.store_as(dtype::i8);
    CHECK(empty_rows.q8().dim(0) == 0);
    CHECK(empty_rows.q8().dim(1) == 5);
    // Non-finite values cannot be carried by a scale: named, and the weight is left as it was.
    linear_weight bad = w;
    bad[K + 3] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(bad.store_as(dtype::i8, "layers.1.mixer.in_proj.weight"),
                         doctest::Contains("layers.1.mixer.in_proj.weight: value nan at [1, 3] cannot be quantized to i8"), nonfinite_error);
    CHECK(bad.storage() == dtype::f32);
    CHECK(std::isnan(bad[K + 3]));
    // Rows of a rank-3 weight are its first dimension.
    linear_weight cube = tensor<float>({2, 3, 4});
    for (std::int64_t i = 0; i < 24; ++i) cube[i] = static_cast<float>(i) - 11.5f;
    cube.store_as(dtype::i8);
    CHECK(cube.q8().dim(0) == 2);
    CHECK(cube.q8().dim(1) == 12);
    CHECK(cube.q8().scale[0] == 11.5f / 127.f);
}

TEST_CASE("linear_weight: moves leave an empty f32 weight; rows stack in any storage; fp32 visitors refuse 16-bit weights") {
    linear_weight a = tensor<float>({2, 3}), b = tensor<float>({1, 3});
    for (std::int64_t i = 0; i < 6; ++i) a[i] = 0.1f * static_cast<float>(i + 1);
    for (std::int64_t i = 0; i < 3; ++i) b[i] = -0.3f * static_cast<float>(i + 1);
    for (dtype d : {dtype::f32, dtype::bf16, dtype::f16, dtype::i8}) {
        CAPTURE(weight_dtype_name(d));
        linear_weight x = a, y = b;
        x.store_as(d);
        y.store_as(d);
        const linear_weight xy = linear_weight::concat_rows(x, y, "gate_up");
        CHECK(xy.storage() == d);
        CHECK(xy.shape() == std::vector<std::int64_t>{3, 3});
        linear_weight wide = xy, wx = x, wy = y;
        wide.store_as(dtype::f32);
        wx.store_as(dtype::f32);
        wy.store_as(dtype::f32);
        for (std::int64_t i = 0; i < 6; ++i) CHECK(wide[i] == wx[i]);
        for (std::int64_t i = 0; i < 3; ++i) CHECK(wide[6 + i] == wy[i]);

        // A moved-from weight is an empty f32 weight, whatever it held.
        linear_weight moved = std::move(x);
        CHECK(moved.storage() == d);
        CHECK(moved.numel() == 6);
        CHECK(x.storage() == dtype::f32);  // NOLINT(bugprone-use-after-move): the state after a move is specified
        CHECK(x.rank() == 0);  // absent, as a default-constructed weight
        linear_weight assigned;
        assigned = std::move(moved);
        CHECK(assigned.numel() == 6);
        CHECK(moved.rank() == 0);  // NOLINT(bugprone-use-after-move)

        // A visitor that takes tensor<float>& gets the fp32 tensor, and a 16-bit weight throws naming the parameter.
        int seen = 0;
        auto fp32_visitor = [&](const std::string&, tensor<float>& t) { seen += static_cast<int>(t.numel()); };
        if (d == dtype::f32) {
            visit_param(fp32_visitor, std::string("layers.0.mlp.up_proj"), y);
            CHECK(seen == 3);
        } else {
            CHECK_THROWS_WITH_AS(visit_param(fp32_visitor, std::string("layers.0.mlp.up_proj"), y),
                                 doctest::Contains("layers.0.mlp.up_proj: stored as"), value_error);
            CHECK(seen == 0);
        }
        // A generic visitor gets the weight itself.
        bool got_weight = false;
        visit_param([&](const std::string&, auto& t) { got_weight = is_linear_weight_v<decltype(t)>; }, std::string("w"), y);
        CHECK(got_weight);
    }
    linear_weight h = a;
    h.store_as(dtype::bf16);
    CHECK_THROWS_AS((void)linear_weight::concat_rows(h, b), value_error);           // storages differ
    CHECK_THROWS_AS((void)linear_weight::concat_rows(a, linear_weight(tensor<float>({2, 4}))), shape_error);  // widths differ
}
