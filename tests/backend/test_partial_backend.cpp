// A backend of one's own may implement an op for some argument types only: here a host backend whose projection and
// embedding run fp32 weights alone. Code that picks the weight's storage at run time (ops::linear and ops::embedding
// on a linear_weight, the entropy gate's head) then runs the storages it has and throws value_error naming the
// others, instead of failing to compile for every model.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/linear.hpp"
#include "support/host_backend.hpp"

namespace {

struct fp32_only_backend : hymix::test::minimal_host_backend {
    static constexpr const char* name = "fp32-only";
};
static_assert(hymix::host_backend<fp32_only_backend>);

}  // namespace

template <>
struct hymix::op_impl<hymix::ops::linear_op, fp32_only_backend> {
    static void run(const fp32_only_backend&, tensor_view<const float, 2> x, tensor_view<const float, 2> w, const float* b,
                    tensor_view<float, 2> y) {
        kernels::linear_ref<float, float, float>(x, w, b, y);
    }
};
template <>
struct hymix::op_impl<hymix::ops::embedding_op, fp32_only_backend> {
    static void run(const fp32_only_backend&, tensor_view<const float, 2> table, std::span<const std::int32_t> tokens,
                    std::span<const unsigned char> mask, tensor_view<float, 2> x) {
        for (std::int64_t r = 0; r < x.dim(0); ++r)
            for (std::int64_t k = 0; k < x.dim(1); ++k)
                x(r, k) = mask[static_cast<std::size_t>(r)] ? table(tokens[static_cast<std::size_t>(r)], k) : 0.f;
    }
};

namespace {
using namespace hymix;
using X = tensor_view<const float, 2>;
using Y = tensor_view<float, 2>;

// What each backend runs, as the dispatchers see it.
static_assert(runs_op<ops::linear_op, fp32_only_backend, X, tensor_view<const float, 2>, const float*, Y>);
static_assert(!runs_op<ops::linear_op, fp32_only_backend, X, tensor_view<const bf16, 2>, const float*, Y>);
static_assert(!runs_op<ops::linear_op, fp32_only_backend, X, q8_view, const float*, Y>);
static_assert(runs_op<ops::linear_op, cpu_backend, X, q8_view, const float*, Y>);
static_assert(runs_op<ops::linear_op, reference_backend, X, tensor_view<const f16, 2>, const float*, Y>);
static_assert(!runs_op<ops::linear_op, cpu_backend, X, tensor_view<const double, 2>, const float*, Y>);

linear_weight random_weight(std::int64_t n, std::int64_t k, unsigned seed) {
    tensor<float> w({n, k});
    std::mt19937 g(seed);
    std::normal_distribution<float> d;
    for (auto& v : w.span()) v = d(g);
    return linear_weight(std::move(w));
}
}  // namespace

TEST_CASE("a backend that runs fp32 weights only: f32 linear_weights run, other storages throw value_error naming them") {
    const fp32_only_backend be;
    const std::int64_t M = 3, N = 5, K = 7;
    auto w = random_weight(N, K, 1);
    tensor<float> x({M, K}), y({M, N}), want({M, N});
    std::mt19937 g(2);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : x.span()) v = u(g);

    ops::linear(be, x.view<2>(), w, nullptr, y.view<2>());
    ops::linear(reference_backend{}, x.view<2>(), w, nullptr, want.view<2>());
    for (std::int64_t i = 0; i < y.numel(); ++i) CHECK(y.data()[i] == want.data()[i]);

    for (const dtype d : {dtype::bf16, dtype::f16, dtype::i8}) {
        CAPTURE(weight_dtype_name(d));
        auto ws = w;
        ws.store_as(d);
        const std::string want_text = "[5, 7] stored as " + std::string(d == dtype::i8 ? "i8 (per-row scales)" : weight_dtype_name(d));
        CHECK_THROWS_WITH_AS(ops::linear(be, x.view<2>(), ws, nullptr, y.view<2>()), doctest::Contains(want_text.c_str()), value_error);
        // The backends that take every storage still run it.
        CHECK_NOTHROW(ops::linear(cpu_backend(1), x.view<2>(), ws, nullptr, y.view<2>()));
    }
}

TEST_CASE("a backend that runs fp32 tables only: embedding from an f32 table runs, from an i8 one throws") {
    const fp32_only_backend be;
    auto table = random_weight(11, 4, 3);
    const std::vector<std::int32_t> tokens{3, 0, 10};
    const std::vector<unsigned char> mask{1, 0, 1};
    tensor<float> x({3, 4});
    ops::embedding(be, table, tokens, mask, x.view<2>());
    for (std::int64_t k = 0; k < 4; ++k) {
        CHECK(x.view<2>()(0, k) == table.f32().view<2>()(3, k));
        CHECK(x.view<2>()(1, k) == 0.f);
        CHECK(x.view<2>()(2, k) == table.f32().view<2>()(10, k));
    }
    table.store_as(dtype::i8);
    CHECK_THROWS_WITH_AS(ops::embedding(be, table, tokens, mask, x.view<2>()), doctest::Contains("stored as i8"), value_error);
}
