// SSD kernels (kernels/ssd.hpp): chunked and step paths against the fp64 recurrence, safe segsum,
// split invariance, multi-sequence isolation and argument checks (spec.md §3.3–3.4, §8 invariants 6, 7, 12, 16).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/ssd.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

/// A random SSD problem of R rows; float inputs plus fp64 copies for the reference.
struct problem {
    std::int64_t R, H, P, G, N;
    std::vector<float> x, dt, A, B, C, D;  // [R,H,P] [R,H] [H] [R,G,N] [R,G,N] [H] or [H*P]
    bool D_per_channel = false;

    problem(std::int64_t R_, std::int64_t H_, std::int64_t P_, std::int64_t G_, std::int64_t N_, std::uint64_t seed,
            float dt_lo = 0.001f, float dt_hi = 0.5f, float A_lo = -4.0f, float A_hi = -0.05f, bool d_hdim = false)
        : R(R_), H(H_), P(P_), G(G_), N(N_), D_per_channel(d_hdim) {
        x = uniform(std::size_t(R * H * P), -1.f, 1.f, seed);
        dt = uniform(std::size_t(R * H), dt_lo, dt_hi, seed + 1);
        A = uniform(std::size_t(H), A_lo, A_hi, seed + 2);
        B = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 3);
        C = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 4);
        D = uniform(std::size_t(d_hdim ? H * P : H), -1.f, 1.f, seed + 5);
    }
    kernels::ssd_inputs<float> inputs() const {
        kernels::ssd_inputs<float> in;
        in.x = tensor_view<const float, 3>(x.data(), {R, H, P});
        in.dt = tensor_view<const float, 2>(dt.data(), {R, H});
        in.A = A.data();
        in.B = tensor_view<const float, 3>(B.data(), {R, G, N});
        in.C = tensor_view<const float, 3>(C.data(), {R, G, N});
        in.D = D.data();
        in.D_per_channel = D_per_channel;
        return in;
    }
};

/// fp64 copies of a problem's inputs and the reference run over one or more sequences.
struct reference {
    std::vector<double> x, dt, A, B, C, D;
    kernels::ssd_inputs<double> in;
    explicit reference(const problem& p)
        : x(p.x.begin(), p.x.end()), dt(p.dt.begin(), p.dt.end()), A(p.A.begin(), p.A.end()), B(p.B.begin(), p.B.end()),
          C(p.C.begin(), p.C.end()), D(p.D.begin(), p.D.end()) {
        in.x = tensor_view<const double, 3>(x.data(), {p.R, p.H, p.P});
        in.dt = tensor_view<const double, 2>(dt.data(), {p.R, p.H});
        in.A = A.data();
        in.B = tensor_view<const double, 3>(B.data(), {p.R, p.G, p.N});
        in.C = tensor_view<const double, 3>(C.data(), {p.R, p.G, p.N});
        in.D = D.data();
        in.D_per_channel = p.D_per_channel;
    }
};

std::vector<float> slice(const std::vector<float>& v, std::int64_t begin, std::int64_t count) {
    return {v.begin() + begin, v.begin() + begin + count};
}
std::vector<double> slice(const std::vector<double>& v, std::int64_t begin, std::int64_t count) {
    return {v.begin() + begin, v.begin() + begin + count};
}

}  // namespace

TEST_CASE("ssd chunked and step equal the fp64 recurrence (invariant 6)") {
    const cpu_backend be(2);
    // Odd sizes (scalar tails everywhere), and d_state 80: the step's blocks of 4 SIMD widths plus a remainder.
    for (const auto& shape : std::vector<std::array<std::int64_t, 4>>{{6, 5, 3, 13}, {4, 37, 2, 80}})
    for (std::int64_t T : {1, 5, 50, 100})
        for (std::int64_t Q : {4, 16, 64})
            for (bool nonzero_init : {false, true})
                for (bool d_hdim : {false, true}) {
                    // Plain locals, not structured bindings: doctest's CAPTURE takes them into a lambda (clang < 16
                    // cannot capture a binding).
                    const std::int64_t H = shape[0], P = shape[1], G = shape[2], N = shape[3];
                    CAPTURE(P);
                    CAPTURE(T);
                    CAPTURE(Q);
                    CAPTURE(nonzero_init);
                    CAPTURE(d_hdim);
                    problem pb(T, H, P, G, N, std::uint64_t(1000 + T * 7 + Q), 0.001f, 0.5f, -4.0f, -0.05f, d_hdim);
                    reference ref(pb);
                    std::vector<float> s0 = nonzero_init ? uniform(std::size_t(H * P * N), -1.f, 1.f, 99)
                                                         : std::vector<float>(std::size_t(H * P * N), 0.f);
                    std::vector<double> sref(s0.begin(), s0.end());
                    std::vector<double> yref(std::size_t(T * H * P));
                    kernels::ssd_ref(ref.in, {0, T, sref.data()}, tensor_view<double, 3>(yref.data(), {T, H, P}));

                    // chunked
                    std::vector<float> s = s0, y(std::size_t(T * H * P), -7.f);
                    const kernels::ssd_sequence<float> seq{0, T, s.data()};
                    kernels::ssd_chunked(be, pb.inputs(), std::span(&seq, 1), Q, tensor_view<float, 3>(y.data(), {T, H, P}));
                    CHECK(rel_error(y, yref) < 1e-6);
                    CHECK(rel_error(s, sref) < 1e-6);

                    // step, token by token
                    std::vector<float> s2 = s0, y2(std::size_t(T * H * P), -7.f);
                    for (std::int64_t t = 0; t < T; ++t) {
                        const kernels::ssd_sequence<float> st{t, 1, s2.data()};
                        kernels::ssd_step(be, pb.inputs(), std::span(&st, 1), tensor_view<float, 3>(y2.data(), {T, H, P}));
                    }
                    CHECK(rel_error(y2, yref) < 1e-6);
                    CHECK(rel_error(s2, sref) < 1e-6);
                }
}

TEST_CASE("ssd chunked: split invariance, including splits inside a chunk and of length 1") {
    const cpu_backend be(2);
    const std::int64_t T = 61, H = 4, P = 8, G = 2, N = 16, Q = 16;
    problem pb(T, H, P, G, N, 7);
    std::vector<float> s_full(std::size_t(H * P * N), 0.f), y_full(std::size_t(T * H * P));
    const kernels::ssd_sequence<float> all{0, T, s_full.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&all, 1), Q, tensor_view<float, 3>(y_full.data(), {T, H, P}));
    for (const auto& splits : std::vector<std::vector<std::int64_t>>{{16, 16, 29}, {1, 60}, {3, 58}, {17, 1, 1, 42}, {60, 1}, {5, 0, 56}}) {
        std::vector<float> s(std::size_t(H * P * N), 0.f), y(std::size_t(T * H * P));
        std::int64_t t0 = 0;
        for (auto len : splits) {
            const kernels::ssd_sequence<float> seq{t0, len, s.data()};
            kernels::ssd_chunked(be, pb.inputs(), std::span(&seq, 1), Q, tensor_view<float, 3>(y.data(), {T, H, P}));
            t0 += len;
        }
        CHECK(rel_error(y, y_full) < 1e-6);
        CHECK(rel_error(s, s_full) < 1e-6);
    }
}

TEST_CASE("ssd: T = 0 passes the state through; an initial state equals the tail of the concatenated run (invariant 7)") {
    const cpu_backend be(1);
    const std::int64_t T = 40, H = 2, P = 4, G = 1, N = 8;
    problem pb(T, H, P, G, N, 21);
    std::vector<float> s = uniform(std::size_t(H * P * N), -1.f, 1.f, 5);
    const std::vector<float> s_before = s;
    std::vector<float> y(std::size_t(T * H * P), 3.f);
    const kernels::ssd_sequence<float> empty{10, 0, s.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&empty, 1), 8, tensor_view<float, 3>(y.data(), {T, H, P}));
    CHECK(s == s_before);
    for (float v : y) CHECK(v == 3.f);  // nothing written

    // run [0, 13) then [13, 40) from that state == one run
    std::vector<float> sa(std::size_t(H * P * N), 0.f), ya(y.size());
    const kernels::ssd_sequence<float> whole{0, T, sa.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&whole, 1), 8, tensor_view<float, 3>(ya.data(), {T, H, P}));
    std::vector<float> sb(std::size_t(H * P * N), 0.f), yb(y.size());
    const kernels::ssd_sequence<float> head{0, 13, sb.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&head, 1), 8, tensor_view<float, 3>(yb.data(), {T, H, P}));
    problem tail = pb;  // rows 13.. as their own tensor, starting from the carried state
    tail.R = T - 13;
    tail.x = slice(pb.x, 13 * H * P, (T - 13) * H * P);
    tail.dt = slice(pb.dt, 13 * H, (T - 13) * H);
    tail.B = slice(pb.B, 13 * G * N, (T - 13) * G * N);
    tail.C = slice(pb.C, 13 * G * N, (T - 13) * G * N);
    std::vector<float> yt(std::size_t((T - 13) * H * P));
    const kernels::ssd_sequence<float> rest{0, T - 13, sb.data()};
    kernels::ssd_chunked(be, tail.inputs(), std::span(&rest, 1), 8, tensor_view<float, 3>(yt.data(), {T - 13, H, P}));
    CHECK(rel_error(yt, slice(ya, 13 * H * P, (T - 13) * H * P)) < 1e-6);
    CHECK(rel_error(sb, sa) < 1e-6);
}

TEST_CASE("ssd: sequences of one call are independent (packed == separate runs)") {
    const cpu_backend be(2);
    const std::int64_t H = 4, P = 6, G = 2, N = 10, Q = 8;
    const std::vector<std::int64_t> lens{5, 3, 9, 0, 15};
    const std::int64_t R = 32;
    problem pb(R, H, P, G, N, 33);
    for (std::int64_t i = 27 * H * P; i < 32 * H * P; ++i) pb.x[std::size_t(i)] *= 1e3f;  // loud neighbour
    std::vector<std::vector<float>> states;
    for (std::size_t i = 0; i < lens.size(); ++i) states.push_back(uniform(std::size_t(H * P * N), -1.f, 1.f, 100 + i));
    const auto init = states;
    std::vector<kernels::ssd_sequence<float>> seqs;
    std::int64_t r = 0;
    for (std::size_t i = 0; i < lens.size(); ++i) {
        seqs.push_back({r, lens[i], states[i].data()});
        r += lens[i];
    }
    std::vector<float> y(std::size_t(R * H * P));
    kernels::ssd_chunked(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(seqs), Q,
                         tensor_view<float, 3>(y.data(), {R, H, P}));
    reference ref(pb);
    for (std::size_t i = 0; i < lens.size(); ++i) {
        CAPTURE(i);
        std::vector<double> s(init[i].begin(), init[i].end()), yr(std::size_t(R * H * P));
        kernels::ssd_ref(ref.in, {seqs[i].start, lens[i], s.data()}, tensor_view<double, 3>(yr.data(), {R, H, P}));
        const auto b = seqs[i].start * H * P, n = lens[i] * H * P;
        if (n) CHECK(rel_error(slice(y, b, n), slice(yr, b, n)) < 1e-6);
        CHECK(rel_error(states[i], s) < 1e-6);
    }
    CHECK(states[3] == init[3]);  // empty sequence: untouched
}

TEST_CASE("ssd segment sums of a row: the SIMD form gives the scalar formula's bits (NaN, ±0, ±inf, subnormals)") {
    // α: a decreasing cumsum with a repeated value (differences of ±0), a NaN and an infinity in it.
    std::vector<double> alpha(70);
    double acc = 0;
    const auto steps = uniform(alpha.size(), -3.f, 0.f, 41);
    for (std::size_t j = 0; j < alpha.size(); ++j) alpha[j] = acc += steps[j];
    alpha[9] = alpha[8];  // a +0 difference
    alpha[23] = std::numeric_limits<double>::quiet_NaN();
    alpha[41] = -std::numeric_limits<double>::infinity();
    alpha[50] = 0.0;   // with alpha[52] = -0: differences −0 − (+0) = −0 and +0 − (−0) = +0
    alpha[52] = -0.0;
    alpha[59] = 1e-39;  // differences below the fp32 normal range (rows 60 and 61): fp32 subnormals
    alpha[60] = 0.0;
    alpha[61] = -3e-39;
    for (std::int64_t i : {0, 1, 7, 8, 9, 15, 16, 17, 23, 31, 40, 41, 50, 52, 59, 60, 61, 63, 69}) {
        CAPTURE(i);
        std::vector<float> got(std::size_t(i + 1), 42.f);
        kernels::detail::segsum_row<cpu_backend::arch>(alpha.data(), i, got.data());
        for (std::int64_t j = 0; j <= i; ++j) {
            const float want = static_cast<float>(std::min(alpha[std::size_t(i)] - alpha[std::size_t(j)], 0.0));
            const float g = got[std::size_t(j)];
            CHECK((std::isnan(want) ? std::isnan(g) : std::memcmp(&want, &g, sizeof g) == 0));
        }
    }
}

TEST_CASE("ssd segsum is finite at extreme decay with zeros above the diagonal (invariant 12)") {
    std::vector<float> a(64, -1e7f);
    std::vector<float> out(64 * 64, 42.f);
    kernels::ssd_segsum_exp(std::span<const float>(a), tensor_view<float, 2>(out.data(), {64, 64}));
    for (int i = 0; i < 64; ++i)
        for (int j = 0; j < 64; ++j) {
            const float v = out[std::size_t(i * 64 + j)];
            REQUIRE(std::isfinite(v));
            if (j == i) CHECK(v == 1.f);
            else CHECK(v == 0.f);
        }
    // moderate decays: lower triangle equals exp of the segment sum
    const auto b = uniform(23, -0.7f, 0.f, 3);
    std::vector<float> o2(23 * 23);
    kernels::ssd_segsum_exp(std::span<const float>(b), tensor_view<float, 2>(o2.data(), {23, 23}));
    double worst = 0;
    for (int i = 0; i < 23; ++i)
        for (int j = 0; j < 23; ++j) {
            double seg = 0;
            for (int m = j + 1; m <= i; ++m) seg += b[std::size_t(m)];
            const double want = j <= i ? std::exp(seg) : 0.0;
            worst = std::max(worst, std::abs(o2[std::size_t(i * 23 + j)] - want));
        }
    CHECK(worst < 1e-6);
    // A positive log-decay would be clamped silently: rejected, naming the entry; a strided out is rejected too.
    std::vector<float> pos(b.begin(), b.end());
    pos[5] = 0.25f;
    CHECK_THROWS_WITH_AS(kernels::ssd_segsum_exp(std::span<const float>(pos), tensor_view<float, 2>(o2.data(), {23, 23})),
                         doctest::Contains("a[5]"), value_error);
    std::vector<float> wide(2 * 23 * 23);
    CHECK_THROWS_WITH_AS(kernels::ssd_segsum_exp(std::span<const float>(b), tensor_view<float, 2>(wide.data(), {23, 23}, {46, 2})),
                         doctest::Contains("out [L, L] needs a unit stride"), shape_error);
}

TEST_CASE("ssd chunked at extreme decay: finite, equals the memoryless limit (invariant 12)") {
    const cpu_backend be(2);
    const std::int64_t T = 130, H = 1, P = 4, G = 1, N = 8, Q = 64;
    problem pb(T, H, P, G, N, 77, 10.f, 10.f, -1e6f, -1e6f);
    std::vector<float> s = uniform(std::size_t(H * P * N), -1.f, 1.f, 8), y(std::size_t(T * H * P));
    const kernels::ssd_sequence<float> seq{0, T, s.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&seq, 1), Q, tensor_view<float, 3>(y.data(), {T, H, P}));
    std::vector<double> expect(y.size());
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t p = 0; p < P; ++p) {
            double cb = 0;
            for (std::int64_t n = 0; n < N; ++n) cb += double(pb.C[std::size_t(t * N + n)]) * pb.B[std::size_t(t * N + n)];
            const double xv = pb.x[std::size_t(t * P + p)];
            expect[std::size_t(t * P + p)] = cb * 10.0 * xv + double(pb.D[0]) * xv;
        }
    for (float v : y) REQUIRE(std::isfinite(v));
    for (float v : s) REQUIRE(std::isfinite(v));
    CHECK(rel_error(y, expect) < 1e-5);
    // the step path agrees
    std::vector<float> s2(s.size(), 0.f), y2(y.size());
    for (std::int64_t t = 0; t < T; ++t) {
        const kernels::ssd_sequence<float> st{t, 1, s2.data()};
        kernels::ssd_step(be, pb.inputs(), std::span(&st, 1), tensor_view<float, 3>(y2.data(), {T, H, P}));
    }
    CHECK(rel_error(y2, expect) < 1e-5);
    CHECK(rel_error(s2, s) < 1e-5);
}

TEST_CASE("ssd chunked is causal: a future token never changes a past output") {
    const cpu_backend be(2);
    const std::int64_t T = 45, H = 3, P = 4, G = 1, N = 8, Q = 16, t0 = 20;
    problem pb(T, H, P, G, N, 55);
    std::vector<float> y1(std::size_t(T * H * P)), y2(y1.size());
    std::vector<float> s1(std::size_t(H * P * N)), s2(s1.size());
    const kernels::ssd_sequence<float> a{0, T, s1.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&a, 1), Q, tensor_view<float, 3>(y1.data(), {T, H, P}));
    problem pc = pb;
    for (std::int64_t i = t0 * H * P; i < T * H * P; ++i) pc.x[std::size_t(i)] += 5.f;
    for (std::int64_t i = t0 * G * N; i < T * G * N; ++i) pc.B[std::size_t(i)] -= 2.f;
    for (std::int64_t i = t0 * H; i < T * H; ++i) pc.dt[std::size_t(i)] *= 3.f;
    const kernels::ssd_sequence<float> b{0, T, s2.data()};
    kernels::ssd_chunked(be, pc.inputs(), std::span(&b, 1), Q, tensor_view<float, 3>(y2.data(), {T, H, P}));
    CHECK(rel_error(slice(y2, 0, t0 * H * P), slice(y1, 0, t0 * H * P)) < 1e-6);
    CHECK(rel_error(slice(y2, t0 * H * P, H * P), slice(y1, t0 * H * P, H * P)) > 1e-3);  // the change is visible at t0
}

TEST_CASE("ssd chunked: a NaN at one token inside a chunk reaches no earlier output (the chunk's products are causal)") {
    const cpu_backend be(2);
    const std::int64_t T = 45, H = 3, P = 4, G = 1, N = 8, Q = 16, t0 = 21;  // t0 inside the second chunk [16, 32)
    problem pb(T, H, P, G, N, 56);
    std::vector<float> y1(std::size_t(T * H * P)), y2(y1.size());
    std::vector<float> s1(std::size_t(H * P * N)), s2(s1.size());
    const kernels::ssd_sequence<float> a{0, T, s1.data()};
    kernels::ssd_chunked(be, pb.inputs(), std::span(&a, 1), Q, tensor_view<float, 3>(y1.data(), {T, H, P}));
    problem pc = pb;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    pc.x[std::size_t(t0 * H * P + 1)] = nan;
    pc.B[std::size_t(t0 * G * N + 2)] = nan;
    pc.C[std::size_t(t0 * G * N + 3)] = nan;
    const kernels::ssd_sequence<float> b{0, T, s2.data()};
    kernels::ssd_chunked(be, pc.inputs(), std::span(&b, 1), Q, tensor_view<float, 3>(y2.data(), {T, H, P}));
    CHECK(slice(y2, 0, t0 * H * P) == slice(y1, 0, t0 * H * P));  // the same bits before t0
    CHECK(std::isnan(y2[std::size_t(t0 * H * P + 1)]));             // and the NaN shows at t0
}

TEST_CASE("ssd: bad arguments throw") {
    const cpu_backend be(1);
    problem pb(10, 4, 3, 2, 5, 1);
    std::vector<float> y(10 * 4 * 3), s(4 * 3 * 5);
    const kernels::ssd_sequence<float> two{0, 2, s.data()};
    CHECK_THROWS_AS(kernels::ssd_step(be, pb.inputs(), std::span(&two, 1), tensor_view<float, 3>(y.data(), {10, 4, 3})), shape_error);
    CHECK_THROWS_AS(kernels::ssd_chunked(be, pb.inputs(), std::span(&two, 1), 4, tensor_view<float, 3>(y.data(), {10, 3, 4})),
                    shape_error);
    const kernels::ssd_sequence<float> out_of_range{8, 5, s.data()};
    CHECK_THROWS_AS(kernels::ssd_chunked(be, pb.inputs(), std::span(&out_of_range, 1), 4,
                                         tensor_view<float, 3>(y.data(), {10, 4, 3})),
                    shape_error);
    CHECK_THROWS_AS(kernels::ssd_chunked(be, pb.inputs(), std::span(&two, 1), 0, tensor_view<float, 3>(y.data(), {10, 4, 3})),
                    config_error);
    problem bad(10, 5, 3, 2, 5, 1);  // 5 heads, 2 groups
    std::vector<float> y5(10 * 5 * 3);
    CHECK_THROWS_AS(kernels::ssd_chunked(be, bad.inputs(), std::span(&two, 1), 4, tensor_view<float, 3>(y5.data(), {10, 5, 3})),
                    shape_error);
}

TEST_CASE("ssd: every view argument's stride assumption is checked, naming the argument (issue 11)") {
    const cpu_backend be(1);
    const std::int64_t R = 6, H = 2, P = 3, G = 1, N = 4;
    problem pb(R, H, P, G, N, 5);
    std::vector<float> y(std::size_t(R * H * P)), s(std::size_t(H * P * N)), wide(std::size_t(4 * R * H * P * N));
    const kernels::ssd_sequence<float> seq{0, R, s.data()}, one{0, 1, s.data()};
    const tensor_view<float, 3> yv(y.data(), {R, H, P});
    using doctest::Contains;
    // A view whose last dimension is strided (every second element), as a column-major or sliced tensor would be.
    auto run_all = [&](const kernels::ssd_inputs<float>& in, tensor_view<float, 3> out, const char* name) {
        CAPTURE(name);
        CHECK_THROWS_WITH_AS(kernels::ssd_chunked(be, in, std::span(&seq, 1), 4, out), Contains(name), shape_error);
        CHECK_THROWS_WITH_AS(kernels::ssd_step(be, in, std::span(&one, 1), out), Contains(name), shape_error);
    };
    auto in = pb.inputs();
    in.x = tensor_view<const float, 3>(wide.data(), {R, H, P}, {2 * H * P, 2 * P, 2});
    run_all(in, yv, "x [R, H, P] needs a unit stride");
    in = pb.inputs();
    in.B = tensor_view<const float, 3>(wide.data(), {R, G, N}, {2 * G * N, 2 * N, 2});
    run_all(in, yv, "B [R, G, N] needs a unit stride");
    in = pb.inputs();
    in.C = tensor_view<const float, 3>(wide.data(), {R, G, N}, {2 * G * N, 2 * N, 2});
    run_all(in, yv, "C [R, G, N] needs a unit stride");
    run_all(pb.inputs(), tensor_view<float, 3>(wide.data(), {R, H, P}, {2 * H * P, 2 * P, 2}), "y [R, H, P] needs a unit stride");
    // Any other strides are fine: x and y as slices of wider rows, dt transposed.
    std::vector<float> xw(std::size_t(R * H * (P + 2))), yw(xw.size()), dtT(std::size_t(H * R));
    for (std::int64_t t = 0; t < R; ++t)
        for (std::int64_t h = 0; h < H; ++h) {
            dtT[std::size_t(h * R + t)] = pb.dt[std::size_t(t * H + h)];
            for (std::int64_t p = 0; p < P; ++p) xw[std::size_t((t * H + h) * (P + 2) + p)] = pb.x[std::size_t((t * H + h) * P + p)];
        }
    in = pb.inputs();
    in.x = tensor_view<const float, 3>(xw.data(), {R, H, P}, {H * (P + 2), P + 2, 1});
    in.dt = tensor_view<const float, 2>(dtT.data(), {R, H}, {1, R});
    std::vector<float> s1(s.size(), 0.f), s2(s.size(), 0.f);
    const kernels::ssd_sequence<float> q1{0, R, s1.data()}, q2{0, R, s2.data()};
    kernels::ssd_chunked(be, in, std::span(&q1, 1), 4, tensor_view<float, 3>(yw.data(), {R, H, P}, {H * (P + 2), P + 2, 1}));
    kernels::ssd_chunked(be, pb.inputs(), std::span(&q2, 1), 4, yv);
    for (std::int64_t t = 0; t < R; ++t)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t p = 0; p < P; ++p) CHECK(yw[std::size_t((t * H + h) * (P + 2) + p)] == y[std::size_t((t * H + h) * P + p)]);
    CHECK(s1 == s2);
}

TEST_CASE("ssd: preconditions on values are checked in release builds (issue 11)") {
    const cpu_backend be(1);
    const std::int64_t R = 8, H = 2, P = 3, G = 1, N = 4;
    using doctest::Contains;
    std::vector<float> y(std::size_t(R * H * P)), s(std::size_t(H * P * N)), s_other(s.size());
    const kernels::ssd_sequence<float> seq{0, 5, s.data()}, one{2, 1, s.data()};
    const tensor_view<float, 3> yv(y.data(), {R, H, P});
    auto expect_value_error = [&](const problem& pb, const char* what) {
        CAPTURE(what);
        CHECK_THROWS_WITH_AS(kernels::ssd_chunked(be, pb.inputs(), std::span(&seq, 1), 4, yv), Contains(what), value_error);
        CHECK_THROWS_WITH_AS(kernels::ssd_step(be, pb.inputs(), std::span(&one, 1), yv), Contains(what), value_error);
        reference ref(pb);
        std::vector<double> yd(y.size()), sd(s.size());
        CHECK_THROWS_AS(kernels::ssd_ref(ref.in, {0, 5, sd.data()}, tensor_view<double, 3>(yd.data(), {R, H, P})), value_error);
    };
    problem neg(R, H, P, G, N, 6);
    neg.dt[2 * H + 1] = -1e-3f;  // row 2, head 1
    expect_value_error(neg, "dt[2, 1]");
    problem inf(R, H, P, G, N, 6);
    inf.dt[2 * H] = std::numeric_limits<float>::infinity();
    expect_value_error(inf, "dt[2, 0]");
    problem posA(R, H, P, G, N, 6);
    posA.A[1] = 0.25f;
    expect_value_error(posA, "A[1]");
    problem nanA(R, H, P, G, N, 6);
    nanA.A[0] = std::nanf("");
    expect_value_error(nanA, "A[0]");

    // Rows outside every sequence are not read: a negative Δ there is no error.
    problem pad(R, H, P, G, N, 6);
    for (std::int64_t i = 5 * H; i < R * H; ++i) pad.dt[std::size_t(i)] = -5.f;
    CHECK_NOTHROW(kernels::ssd_chunked(be, pad.inputs(), std::span(&seq, 1), 4, yv));

    // A NaN Δ is let through and stays in its own sequence: the other sequence equals its solo run.
    problem nan(R, H, P, G, N, 6);
    nan.dt[1 * H] = std::nanf("");
    std::fill(s.begin(), s.end(), 0.f);
    const std::vector<kernels::ssd_sequence<float>> two{{0, 4, s.data()}, {4, 4, s_other.data()}};
    std::fill(y.begin(), y.end(), 0.f);
    CHECK_NOTHROW(kernels::ssd_chunked(be, nan.inputs(), std::span<const kernels::ssd_sequence<float>>(two), 4, yv));
    CHECK(std::isnan(y[std::size_t(1 * H * P)]));
    std::vector<float> y_solo(y.size(), 0.f), s_solo(s.size(), 0.f);
    const kernels::ssd_sequence<float> solo{4, 4, s_solo.data()};
    kernels::ssd_chunked(be, nan.inputs(), std::span(&solo, 1), 4, tensor_view<float, 3>(y_solo.data(), {R, H, P}));
    CHECK(slice(y, 4 * H * P, 4 * H * P) == slice(y_solo, 4 * H * P, 4 * H * P));
    CHECK(s_other == s_solo);
}

TEST_CASE("ssd: sequences of one call may share neither token rows nor a state (issue 11)") {
    const cpu_backend be(1);
    const std::int64_t R = 8, H = 2, P = 3, G = 1, N = 4;
    problem pb(R, H, P, G, N, 9);
    std::vector<float> y(std::size_t(R * H * P)), s(std::size_t(3 * H * P * N));
    const tensor_view<float, 3> yv(y.data(), {R, H, P});
    using doctest::Contains;
    const std::vector<kernels::ssd_sequence<float>> rows{{0, 4, s.data()}, {3, 4, s.data() + H * P * N}};
    CHECK_THROWS_WITH_AS(kernels::ssd_chunked(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(rows), 4, yv),
                         Contains("share token rows"), shape_error);
    const std::vector<kernels::ssd_sequence<float>> state{{0, 4, s.data()}, {4, 4, s.data() + H * P * N - 1}};
    CHECK_THROWS_WITH_AS(kernels::ssd_chunked(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(state), 4, yv),
                         Contains("share a state"), shape_error);
    const std::vector<kernels::ssd_sequence<float>> steps{{0, 1, s.data()}, {1, 1, s.data()}};
    CHECK_THROWS_AS(kernels::ssd_step(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(steps), yv), shape_error);
    // Many sequences (the sorted path): adjacent ones are fine, a repeated state is not.
    std::vector<float> many_states(std::size_t(R * H * P * N));
    std::vector<kernels::ssd_sequence<float>> many;
    for (std::int64_t i = 0; i < 70; ++i) many.push_back({i % R, i < R ? 1 : 0, many_states.data() + (i % R) * H * P * N});
    CHECK_THROWS_AS(kernels::ssd_step(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(many), yv), shape_error);  // states repeat
    std::vector<kernels::ssd_sequence<float>> many_ok(many.begin(), many.begin() + R);
    CHECK_NOTHROW(kernels::ssd_step(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(many_ok), yv));
    for (std::int64_t i = R; i < 70; ++i) many[std::size_t(i)] = {i % R, 0, nullptr};
    CHECK_NOTHROW(kernels::ssd_chunked(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(many), 4, yv));
    many[69].state = many_states.data();
    many[69].length = 0;
    CHECK_THROWS_WITH_AS(kernels::ssd_chunked(be, pb.inputs(), std::span<const kernels::ssd_sequence<float>>(many), 4, yv), Contains("share a state"),
                         shape_error);
}
