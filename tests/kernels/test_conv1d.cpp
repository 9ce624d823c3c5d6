// Causal depthwise conv1d (kernels/conv1d.hpp): orientation and causality (spec.md §8 invariant 1), conv state
// handover and split invariance (invariant 2), fp32 vs an fp64 loop reference on odd sizes and strided views.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/conv1d.hpp"
#include "hymix/ops/conv1d.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

/// out_t[c] = b[c] + Σ_j w[c, j] · in_{t−K+1+j}[c] over [state ; x], then optional SiLU — the formula as written.
std::vector<double> conv_ref(const std::vector<float>& x, std::int64_t T, std::int64_t C, const std::vector<float>& w, std::int64_t K,
                             const float* bias, const std::vector<float>& state, bool act) {
    std::vector<double> y(std::size_t(T * C));
    auto input = [&](std::int64_t t, std::int64_t c) -> double {  // t may be negative: from the state
        if (t >= 0) return x[std::size_t(t * C + c)];
        const std::int64_t col = (K - 1) + t;  // state column, oldest in column 0
        return col >= 0 && !state.empty() ? double(state[std::size_t(c * (K - 1) + col)]) : 0.0;
    };
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t c = 0; c < C; ++c) {
            double acc = bias ? bias[c] : 0.0;
            for (std::int64_t j = 0; j < K; ++j) acc += double(w[std::size_t(c * K + j)]) * input(t - K + 1 + j, c);
            y[std::size_t(t * C + c)] = act ? acc / (1.0 + std::exp(-acc)) : acc;
        }
    return y;
}

std::vector<float> conv(const std::vector<float>& x, std::int64_t T, std::int64_t C, const std::vector<float>& w, std::int64_t K,
                        const float* bias, float* state, kernels::conv_activation act) {
    std::vector<float> y(std::size_t(T * C), -9.f);
    kernels::causal_conv1d<float>(tensor_view<const float, 2>(x.data(), {T, C}), tensor_view<const float, 2>(w.data(), {C, K}), bias,
                                  state, act, tensor_view<float, 2>(y.data(), {T, C}));
    return y;
}

}  // namespace

TEST_CASE("conv1d orientation: impulse at t = 3 gives [0,0,0,4,3,2,1,0] (invariant 1)") {
    const std::int64_t C = 2, K = 4, T = 8;
    const std::vector<float> w{1, 2, 3, 4, 1, 2, 3, 4};
    std::vector<float> x(std::size_t(T * C), 0.f);
    x[3 * C + 0] = 1.f;
    x[3 * C + 1] = 1.f;
    std::vector<float> zero_state(std::size_t(C * (K - 1)), 0.f);
    for (float* st : {static_cast<float*>(nullptr), zero_state.data()}) {
        const auto y = conv(x, T, C, w, K, nullptr, st, kernels::conv_activation::none);
        REQUIRE(y.size() == std::size_t(T * C));
        const std::vector<float> want{0, 0, 0, 4, 3, 2, 1, 0};
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c) CHECK(y[std::size_t(t * C + c)] == want[std::size_t(t)]);
    }
}

TEST_CASE("conv1d is causal: changing x[t0] never changes y[t < t0]") {
    const std::int64_t C = 9, K = 4, T = 20;
    const auto w = uniform(std::size_t(C * K), -1.f, 1.f, 1);
    const auto b = uniform(std::size_t(C), -1.f, 1.f, 2);
    auto x = uniform(std::size_t(T * C), -1.f, 1.f, 3);
    for (std::int64_t t0 : {0, 1, 7, 19}) {
        const auto y1 = conv(x, T, C, w, K, b.data(), nullptr, kernels::conv_activation::silu);
        auto x2 = x;
        for (std::int64_t c = 0; c < C; ++c) x2[std::size_t(t0 * C + c)] += 3.f;
        const auto y2 = conv(x2, T, C, w, K, b.data(), nullptr, kernels::conv_activation::silu);
        for (std::int64_t i = 0; i < t0 * C; ++i) CHECK(y1[std::size_t(i)] == y2[std::size_t(i)]);
        CHECK(y1[std::size_t(t0 * C)] != y2[std::size_t(t0 * C)]);
    }
}

TEST_CASE("conv1d state handover: [a,b,c] → [b,c,x0] → [c,x0,x1] → last three (invariant 2)") {
    const std::int64_t C = 1, K = 4;
    const std::vector<float> w{0.5f, -1.f, 2.f, 0.25f};
    const float a = 10, b = 20, c = 30;
    for (std::int64_t T : {1, 2, 3, 5}) {
        CAPTURE(T);
        std::vector<float> st{a, b, c};
        std::vector<float> x(static_cast<std::size_t>(T));
        std::iota(x.begin(), x.end(), 1.f);
        conv(x, T, C, w, K, nullptr, st.data(), kernels::conv_activation::none);
        std::vector<float> all{a, b, c};
        all.insert(all.end(), x.begin(), x.end());
        const std::vector<float> want(all.end() - 3, all.end());
        CHECK(st == want);
    }
}

TEST_CASE("conv1d split invariance: any split of a sequence, one-token decode steps included, gives the bits of one call") {
    // The decode step (one token) has its own loop; it must sum in the prefill loop's order: vector bodies and
    // scalar tails (C = 7, 37, 130), every kernel width, bias and SiLU.
    const std::int64_t T = 5;
    for (std::int64_t K : {1, 2, 3, 4, 5})
        for (std::int64_t Cn : {7, 37, 130}) {
            CAPTURE(K);
            CAPTURE(Cn);
            const auto wn = uniform(std::size_t(Cn * K), -1.f, 1.f, std::uint64_t(4 + K));
            const auto bn = uniform(std::size_t(Cn), -1.f, 1.f, 5);
            const auto x = uniform(std::size_t(T * Cn), -1.f, 1.f, 6);
            const auto s0 = uniform(std::size_t(Cn * (K - 1)), -1.f, 1.f, 7);
            auto s_one = s0;
            const auto y_one = conv(x, T, Cn, wn, K, bn.data(), s_one.data(), kernels::conv_activation::silu);
            const auto yref = conv_ref(x, T, Cn, wn, K, bn.data(), s0, true);
            CHECK(rel_error(y_one, yref) < 1e-6);
            for (const auto& splits : std::vector<std::vector<std::int64_t>>{{1, 1, 1, 1, 1}, {1, 1, 3}, {2, 3}, {4, 1}, {0, 5}}) {
                auto s = s0;
                std::vector<float> y;
                std::int64_t t0 = 0;
                for (auto len : splits) {
                    const std::vector<float> xp(x.begin() + t0 * Cn, x.begin() + (t0 + len) * Cn);
                    const auto yp = conv(xp, len, Cn, wn, K, bn.data(), s.data(), kernels::conv_activation::silu);
                    y.insert(y.end(), yp.begin(), yp.end());
                    t0 += len;
                }
                CAPTURE(splits.size());
                CAPTURE(splits[0]);
                CHECK(y == y_one);
                CHECK(s == s_one);
            }
        }
}

TEST_CASE("conv1d fp32 equals the fp64 formula on odd sizes, strided views and kernel widths 1..5") {
    for (std::int64_t K : {1, 2, 3, 4, 5})
        for (bool silu : {false, true})
        for (std::int64_t T : {29, 1}) {  // T = 1: the decode step's loop
            CAPTURE(K);
            CAPTURE(silu);
            CAPTURE(T);
            const std::int64_t C = 37, ld = 50;  // x rows live in a wider matrix (row stride 50)
            const auto w = uniform(std::size_t(C * K), -1.f, 1.f, std::uint64_t(10 + K));
            const auto b = uniform(std::size_t(C), -1.f, 1.f, 11);
            const auto wide = uniform(std::size_t(T * ld), -2.f, 2.f, 12);
            std::vector<float> x(std::size_t(T * C));
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t c = 0; c < C; ++c) x[std::size_t(t * C + c)] = wide[std::size_t(t * ld + 5 + c)];
            const auto s0 = uniform(std::size_t(C * (K - 1)), -1.f, 1.f, 13);
            auto s = s0;
            std::vector<float> out(std::size_t(T * ld), 0.f);
            kernels::causal_conv1d<float>(tensor_view<const float, 2>(wide.data() + 5, {T, C}, {ld, 1}),
                                          tensor_view<const float, 2>(w.data(), {C, K}), b.data(), s.data(),
                                          silu ? kernels::conv_activation::silu : kernels::conv_activation::none,
                                          tensor_view<float, 2>(out.data() + 3, {T, C}, {ld, 1}));
            std::vector<float> y(std::size_t(T * C));
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t c = 0; c < C; ++c) y[std::size_t(t * C + c)] = out[std::size_t(t * ld + 3 + c)];
            CHECK(rel_error(y, conv_ref(x, T, C, w, K, b.data(), s0, silu)) < 1e-6);
            CHECK(out[0] == 0.f);  // nothing written outside the view
            // final state = last K−1 inputs of [state ; x]
            for (std::int64_t c = 0; c < C; ++c)
                for (std::int64_t j = 0; j < K - 1; ++j) {
                    const std::int64_t t = T - K + 1 + j;  // < 0: still from the old state
                    CHECK(s[std::size_t(c * (K - 1) + j)] == (t >= 0 ? x[std::size_t(t * C + c)] : s0[std::size_t(c * (K - 1) + T + j)]));
                }
        }
}

TEST_CASE("conv1d: bad shapes throw") {
    std::vector<float> x(12), w(12), y(12);
    CHECK_THROWS_AS(kernels::causal_conv1d<float>(tensor_view<const float, 2>(x.data(), {4, 3}), tensor_view<const float, 2>(w.data(), {4, 3}),
                                                  nullptr, nullptr, kernels::conv_activation::none,
                                                  tensor_view<float, 2>(y.data(), {4, 3})),
                    shape_error);
    CHECK_THROWS_AS(kernels::causal_conv1d<float>(tensor_view<const float, 2>(x.data(), {4, 3}), tensor_view<const float, 2>(w.data(), {3, 4}),
                                                  nullptr, nullptr, kernels::conv_activation::none,
                                                  tensor_view<float, 2>(y.data(), {3, 4})),
                    shape_error);
}

TEST_CASE("conv1d: every view argument's stride rules are checked (shape_error naming it) or general strides work") {
    const std::int64_t C = 5, K = 4, T = 7, S = K - 1;
    const auto x = uniform(std::size_t(T * C), -1.f, 1.f, 40);
    const auto w = uniform(std::size_t(C * K), -1.f, 1.f, 41);
    const auto b = uniform(std::size_t(C), -1.f, 1.f, 42);
    const auto s0 = uniform(std::size_t(C * S), -1.f, 1.f, 43);
    const tensor_view<const float, 2> xv(x.data(), {T, C}), wv(w.data(), {C, K});
    auto s_ref = s0;
    const auto y_ref = conv(x, T, C, w, K, b.data(), s_ref.data(), kernels::conv_activation::silu);
    std::vector<float> y(std::size_t(T * C));
    const tensor_view<float, 2> yv(y.data(), {T, C});
    auto call = [&](tensor_view<const float, 2> xa, tensor_view<const float, 2> wa, const float* ba, tensor_view<float, 2> st,
                    tensor_view<float, 2> out) {
        kernels::causal_conv1d<float>(xa, wa, ba, st, kernels::conv_activation::silu, out);
    };

    SUBCASE("the issue's case: a column-major x (inner stride != 1) is rejected, not computed wrongly") {
        std::vector<float> xt(std::size_t(T * C));  // x stored [C, T]
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c) xt[std::size_t(c * T + t)] = x[std::size_t(t * C + c)];
        auto s = s0;
        CHECK_THROWS_WITH_AS(call(tensor_view<const float, 2>(xt.data(), {T, C}, {1, T}), wv, b.data(),
                                  tensor_view<float, 2>(s.data(), {C, S}), yv),
                             doctest::Contains("causal_conv1d: x [7, 5] needs unit stride along axis 1"), shape_error);
        CHECK(s == s0);  // nothing was touched
    }
    SUBCASE("output: column-major, overlapping rows, overlapping the weight, the bias or the state") {
        auto s = s0;
        const tensor_view<float, 2> sv(s.data(), {C, S});
        std::vector<float> big(200);
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), sv, tensor_view<float, 2>(big.data(), {T, C}, {1, T})),
                             doctest::Contains("causal_conv1d: output"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), sv, tensor_view<float, 2>(big.data(), {T, C}, {C - 1, 1})),
                             doctest::Contains("causal_conv1d: output [7, 5] is written, but its strides [4, 1] make elements overlap"),
                             shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), sv, tensor_view<float, 2>(big.data(), {T, C}, {0, 1})),
                             doctest::Contains("overlap"), shape_error);
        std::vector<float> wb(std::size_t(T * C) + 40), bb(std::size_t(T * C) + 40);
        std::copy(w.begin(), w.end(), wb.begin() + 2);
        std::copy(b.begin(), b.end(), bb.begin() + 2);
        CHECK_THROWS_WITH_AS(call(xv, tensor_view<const float, 2>(wb.data() + 2, {C, K}), b.data(), sv, tensor_view<float, 2>(wb.data() + 10, {T, C})),
                             doctest::Contains("causal_conv1d: output overlaps weight"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, bb.data() + 2, sv, tensor_view<float, 2>(bb.data(), {T, C})),
                             doctest::Contains("causal_conv1d: output overlaps bias"), shape_error);
        std::vector<float> sb(std::size_t(T * C) + 40);
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), tensor_view<float, 2>(sb.data(), {C, S}), tensor_view<float, 2>(sb.data() + 5, {T, C})),
                             doctest::Contains("causal_conv1d: output overlaps state"), shape_error);
    }
    SUBCASE("state: wrong shape or overlapping itself") {
        auto s = s0;
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), tensor_view<float, 2>(s.data(), {C, K}), yv),
                             doctest::Contains("causal_conv1d: state: expected shape [5, 3], found [5, 4]"), shape_error);
        CHECK_THROWS_WITH_AS(call(xv, wv, b.data(), tensor_view<float, 2>(s.data(), {C, S}, {1, 1}), yv),
                             doctest::Contains("causal_conv1d: state"), shape_error);
    }
    SUBCASE("general strides of the weight and the state give the contiguous result") {
        std::vector<float> wt(std::size_t(K * C)), st(std::size_t(S * C));  // both stored transposed
        for (std::int64_t c = 0; c < C; ++c) {
            for (std::int64_t j = 0; j < K; ++j) wt[std::size_t(j * C + c)] = w[std::size_t(c * K + j)];
            for (std::int64_t j = 0; j < S; ++j) st[std::size_t(j * C + c)] = s0[std::size_t(c * S + j)];
        }
        call(xv, tensor_view<const float, 2>(wt.data(), {C, K}, {1, C}), b.data(), tensor_view<float, 2>(st.data(), {C, S}, {1, C}), yv);
        CHECK(y == y_ref);
        for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t j = 0; j < S; ++j) CHECK(st[std::size_t(j * C + c)] == s_ref[std::size_t(c * S + j)]);
    }
    SUBCASE("out may be x itself (x is read before out is written)") {
        auto inout = x;
        auto s = s0;
        call(tensor_view<const float, 2>(inout.data(), {T, C}), wv, b.data(), tensor_view<float, 2>(s.data(), {C, S}),
             tensor_view<float, 2>(inout.data(), {T, C}));
        CHECK(inout == y_ref);
        CHECK(s == s_ref);
    }
    SUBCASE("preconditions: kernel width >= 1, a known activation") {
        CHECK_THROWS_WITH_AS(kernels::causal_conv1d<float>(xv, tensor_view<const float, 2>(w.data(), {C, 0}), nullptr, nullptr,
                                                           kernels::conv_activation::none, yv),
                             doctest::Contains("kernel width must be >= 1"), shape_error);
        CHECK_THROWS_WITH_AS(kernels::causal_conv1d<float>(xv, wv, nullptr, nullptr, static_cast<kernels::conv_activation>(7), yv),
                             doctest::Contains("causal_conv1d: unknown activation 7"), value_error);
    }
}

TEST_CASE("ops::causal_conv1d on many threads cuts few problems into channel pieces: the bits of the whole problem") {
    // One problem per sequence (a decode step, or a Mamba-2 prefill), with and without L2 groups over the first channels
    // (the GDN layer's q and k heads; 176 channels: not a multiple of the pieces' width), rows strided as in the GDN
    // decode's token-major buffer. On 16 threads (more than the cores here) each problem is cut into pieces of whole
    // groups (or of 64 channels); outputs and states must be those of the kernel run on the whole problem, then the
    // L2 groups, bit for bit; on 1 thread nothing is cut.
    for (std::int64_t T : {std::int64_t{1}, std::int64_t{37}}) {
        for (std::int64_t n_prob : {std::int64_t{1}, std::int64_t{3}}) {
            for (bool l2 : {false, true}) {
                const std::int64_t C = 333, K = 4, ld = C + 7;  // row stride of x and out
                const auto x = uniform(static_cast<std::size_t>(n_prob * T * ld), -2.f, 2.f, 11 + static_cast<std::uint64_t>(T));
                const auto w = uniform(static_cast<std::size_t>(C * K), -1.f, 1.f, 12);
                const auto b = uniform(static_cast<std::size_t>(C), -1.f, 1.f, 13);
                const auto st0 = uniform(static_cast<std::size_t>(n_prob * C * (K - 1)), -1.f, 1.f, 14);
                const std::int64_t group = 16, l2_channels = 176;
                auto xv = [&](std::int64_t i) { return tensor_view<const float, 2>(x.data() + i * T * ld, {T, C}, {ld, 1}); };
                // The whole problem through the kernel, then the groups, as the op did before it cut problems.
                std::vector<float> y_ref(x.size(), -9.f), st_ref = st0;
                for (std::int64_t i = 0; i < n_prob; ++i) {
                    tensor_view<float, 2> out(y_ref.data() + i * T * ld, {T, C}, {ld, 1});
                    kernels::causal_conv1d<float>(xv(i), tensor_view<const float, 2>(w.data(), {C, K}), b.data(), st_ref.data() + i * C * (K - 1),
                                                  kernels::conv_activation::silu, out);
                    if (l2)
                        for (std::int64_t t = 0; t < T; ++t) {
                            float* row = &out(t, 0);
                            for (std::int64_t g0 = 0; g0 + group <= l2_channels; g0 += group) {
                                float ss = 0.f;  // the op's grouped norm is SIMD: compared below within rounding only
                                for (std::int64_t c = g0; c < g0 + group; ++c) ss += row[c] * row[c];
                                const float inv = 1.f / std::sqrt(ss + 1e-6f);
                                for (std::int64_t c = g0; c < g0 + group; ++c) row[c] *= inv;
                            }
                        }
                }
                auto run = [&](int threads, std::vector<float>& st) {
                    const cpu_backend be(threads);
                    std::vector<float> y(x.size(), -9.f);
                    std::vector<ops::conv_problem<>> ps(static_cast<std::size_t>(n_prob));
                    for (std::int64_t i = 0; i < n_prob; ++i) {
                        auto& p = ps[static_cast<std::size_t>(i)];
                        p.x = xv(i);
                        p.w = tensor_view<const float, 2>(w.data(), {C, K});
                        p.bias = b.data();
                        p.state = st.data() + i * C * (K - 1);
                        p.out = tensor_view<float, 2>(y.data() + i * T * ld, {T, C}, {ld, 1});
                        if (l2) {
                            p.l2_group = group;
                            p.l2_channels = l2_channels;
                            p.l2_eps = 1e-6f;
                        }
                    }
                    ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(ps), kernels::conv_activation::silu);
                    return y;
                };
                auto st1 = st0, st16 = st0;
                const auto y1 = run(1, st1), y16 = run(16, st16);
                CAPTURE(T);
                CAPTURE(n_prob);
                CAPTURE(l2);
                CHECK(std::memcmp(y1.data(), y16.data(), y1.size() * sizeof(float)) == 0);  // cut or not: the same bits
                CHECK(std::memcmp(st1.data(), st16.data(), st1.size() * sizeof(float)) == 0);
                CHECK(st1 == st_ref);
                if (!l2) {
                    CHECK(std::memcmp(y1.data(), y_ref.data(), y1.size() * sizeof(float)) == 0);
                } else {
                    double worst = 0;
                    for (std::size_t i = 0; i < y1.size(); ++i) worst = std::max(worst, double(std::abs(y1[i] - y_ref[i])));
                    CHECK(worst < 1e-5);
                }
                CHECK(st1 != st0);
            }
        }
    }
}

TEST_CASE("ops::causal_conv1d checks a problem whole before cutting it (shape_error, nothing written)") {
    const cpu_backend be(16);
    const std::int64_t C = 300, K = 4;
    const auto x = uniform(static_cast<std::size_t>(C), -1.f, 1.f, 21);
    const auto w = uniform(static_cast<std::size_t>((C - 10) * K), -1.f, 1.f, 22);  // 10 rows short
    std::vector<float> st(static_cast<std::size_t>(C * (K - 1)), 0.5f), y(static_cast<std::size_t>(C), -9.f);
    ops::conv_problem<> p;
    p.x = tensor_view<const float, 2>(x.data(), {1, C});
    p.w = tensor_view<const float, 2>(w.data(), {C - 10, K});
    p.state = st.data();
    p.out = tensor_view<float, 2>(y.data(), {1, C});
    CHECK_THROWS_AS(ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(&p, 1), kernels::conv_activation::silu), shape_error);
    CHECK(y == std::vector<float>(static_cast<std::size_t>(C), -9.f));
    CHECK(st == std::vector<float>(static_cast<std::size_t>(C * (K - 1)), 0.5f));
}
