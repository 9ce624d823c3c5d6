// SSD backward (kernels/ssd_backward.hpp, ops/ssd_backward.hpp): the fp64 BPTT reference against central finite
// differences of the fp64 recurrence, the chunked fp32 backward against the reference, varlen isolation, extreme decay,
// T = 0, accumulation semantics and argument checks (spec.md §3.2–3.3, §8 invariants 6, 7, 12, 16, 17).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/kernels/ssd_backward.hpp"
#include "hymix/ops/ssd_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

/// Token rows of one sequence and whether its forward starts from / its final state receives something.
struct seq_spec {
    std::int64_t start, length;
    bool has_state0 = false, has_dfinal = false;
};

/// A random SSD problem: fp32 inputs, initial states, upstream gradients (dy and of the final states).
struct problem {
    std::int64_t R, H, P, G, N;
    bool D_per_channel;
    std::vector<seq_spec> seqs;
    std::vector<float> x, dt, A, B, C, D, dy;        // [R,H,P] [R,H] [H] [R,G,N] [R,G,N] [H or H·P] [R,H,P]
    std::vector<std::vector<float>> state0, dfinal;  // per sequence [H,P,N] (empty: none)

    problem(std::int64_t R_, std::int64_t H_, std::int64_t P_, std::int64_t G_, std::int64_t N_, std::vector<seq_spec> s,
            std::uint64_t seed, bool d_hdim = false, float dt_lo = 0.001f, float dt_hi = 0.5f, float A_lo = -4.f, float A_hi = -0.05f)
        : R(R_), H(H_), P(P_), G(G_), N(N_), D_per_channel(d_hdim), seqs(std::move(s)) {
        x = uniform(std::size_t(R * H * P), -1.f, 1.f, seed);
        dt = uniform(std::size_t(R * H), dt_lo, dt_hi, seed + 1);
        A = uniform(std::size_t(H), A_lo, A_hi, seed + 2);
        B = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 3);
        C = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 4);
        D = uniform(std::size_t(d_hdim ? H * P : H), -1.f, 1.f, seed + 5);
        dy = uniform(std::size_t(R * H * P), -1.f, 1.f, seed + 6);
        for (std::size_t i = 0; i < seqs.size(); ++i) {
            state0.push_back(seqs[i].has_state0 ? uniform(std::size_t(S()), -1.f, 1.f, seed + 10 + i) : std::vector<float>{});
            dfinal.push_back(seqs[i].has_dfinal ? uniform(std::size_t(S()), -1.f, 1.f, seed + 50 + i) : std::vector<float>{});
        }
    }
    std::int64_t S() const { return H * P * N; }
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

/// Gradients of one call in T, with the views the kernels take; input gradients pre-filled with NaN (they must be
/// overwritten), parameter gradients with `acc0` (they must be accumulated onto).
template <class T>
struct grads {
    std::vector<T> dx, ddt, dB, dC, dA, dD;
    std::vector<std::vector<T>> dstate0;
    kernels::ssd_grads<T> g;
    grads(const problem& p, T acc0 = T(0)) {
        const T nan = std::numeric_limits<T>::quiet_NaN();
        dx.assign(std::size_t(p.R * p.H * p.P), nan);
        ddt.assign(std::size_t(p.R * p.H), nan);
        dB.assign(std::size_t(p.R * p.G * p.N), nan);
        dC.assign(dB.size(), nan);
        dA.assign(std::size_t(p.H), acc0);
        dD.assign(p.D.size(), acc0);
        for (std::size_t i = 0; i < p.seqs.size(); ++i) dstate0.emplace_back(std::size_t(p.S()), nan);
        g.dx = tensor_view<T, 3>(dx.data(), {p.R, p.H, p.P});
        g.ddt = tensor_view<T, 2>(ddt.data(), {p.R, p.H});
        g.dB = tensor_view<T, 3>(dB.data(), {p.R, p.G, p.N});
        g.dC = tensor_view<T, 3>(dC.data(), {p.R, p.G, p.N});
        g.dA = dA.data();
        g.dD = dD.data();
    }
    std::vector<kernels::ssd_backward_sequence<T>> seqs(const problem& p, const std::vector<std::vector<T>>& s0,
                                                        const std::vector<std::vector<T>>& df) {
        std::vector<kernels::ssd_backward_sequence<T>> out;
        for (std::size_t i = 0; i < p.seqs.size(); ++i)
            out.push_back({p.seqs[i].start, p.seqs[i].length, s0[i].empty() ? nullptr : s0[i].data(), dstate0[i].data(),
                           df[i].empty() ? nullptr : df[i].data()});
        return out;
    }
};

template <class T>
std::vector<std::vector<T>> cast_all(const std::vector<std::vector<float>>& v) {
    std::vector<std::vector<T>> out;
    for (const auto& e : v) out.emplace_back(e.begin(), e.end());
    return out;
}

/// fp64 copies of a problem (perturbable in place: the views point into the vectors) and its loss
/// L = Σ dy·y + Σ_s ⟨dfinal_s, final state_s⟩ through the token recurrence kernels::ssd_ref.
struct fp64 {
    const problem& p;
    std::vector<double> x, dt, A, B, C, D, dy;
    std::vector<std::vector<double>> state0, dfinal;
    kernels::ssd_inputs<double> in;
    explicit fp64(const problem& pb)
        : p(pb), x(pb.x.begin(), pb.x.end()), dt(pb.dt.begin(), pb.dt.end()), A(pb.A.begin(), pb.A.end()), B(pb.B.begin(), pb.B.end()),
          C(pb.C.begin(), pb.C.end()), D(pb.D.begin(), pb.D.end()), dy(pb.dy.begin(), pb.dy.end()), state0(cast_all<double>(pb.state0)),
          dfinal(cast_all<double>(pb.dfinal)) {
        in.x = tensor_view<const double, 3>(x.data(), {p.R, p.H, p.P});
        in.dt = tensor_view<const double, 2>(dt.data(), {p.R, p.H});
        in.A = A.data();
        in.B = tensor_view<const double, 3>(B.data(), {p.R, p.G, p.N});
        in.C = tensor_view<const double, 3>(C.data(), {p.R, p.G, p.N});
        in.D = D.data();
        in.D_per_channel = p.D_per_channel;
    }
    double loss() const {
        std::vector<double> y(std::size_t(p.R * p.H * p.P), 0.0);
        double L = 0;
        for (std::size_t i = 0; i < p.seqs.size(); ++i) {
            std::vector<double> st = state0[i].empty() ? std::vector<double>(std::size_t(p.S()), 0.0) : state0[i];
            kernels::ssd_ref(in, {p.seqs[i].start, p.seqs[i].length, st.data()}, tensor_view<double, 3>(y.data(), {p.R, p.H, p.P}));
            if (!dfinal[i].empty()) L += test::dot(dfinal[i], st);
        }
        return L + test::dot(dy, y);
    }
    grads<double> backward() {
        grads<double> g(p);
        const auto s = g.seqs(p, state0, dfinal);
        kernels::ssd_backward_ref<double>(in, std::span<const kernels::ssd_backward_sequence<double>>(s),
                                          tensor_view<const double, 3>(dy.data(), {p.R, p.H, p.P}), g.g);
        return g;
    }
};

/// The chunked fp32 backward of a problem on backend `be` (through the op).
template <class Backend>
grads<float> chunked(const Backend& be, const problem& p, std::int64_t Q, float acc0 = 0.f) {
    grads<float> g(p, acc0);
    const auto s = g.seqs(p, p.state0, p.dfinal);
    ops::ssd_chunked_backward(be, p.inputs(), std::span<const kernels::ssd_backward_sequence<float>>(s), Q,
                              tensor_view<const float, 3>(p.dy.data(), {p.R, p.H, p.P}), g.g);
    return g;
}

/// Every gradient of `a` within rel of `b` (relative Frobenius error per tensor).
template <class TA, class TB>
void check_close(const grads<TA>& a, const grads<TB>& b, double rel) {
    CHECK(rel_error(a.dx, b.dx) < rel);
    CHECK(rel_error(a.ddt, b.ddt) < rel);
    CHECK(rel_error(a.dB, b.dB) < rel);
    CHECK(rel_error(a.dC, b.dC) < rel);
    CHECK(rel_error(a.dA, b.dA) < rel);
    CHECK(rel_error(a.dD, b.dD) < rel);
    for (std::size_t i = 0; i < a.dstate0.size(); ++i) CHECK(rel_error(a.dstate0[i], b.dstate0[i]) < rel);
}

template <class T>
bool all_finite(const grads<T>& g) {
    for (const auto* v : {&g.dx, &g.ddt, &g.dB, &g.dC, &g.dA, &g.dD})
        for (T e : *v)
            if (!std::isfinite(e)) return false;
    for (const auto& v : g.dstate0)
        for (T e : v)
            if (!std::isfinite(e)) return false;
    return true;
}

/// Finite-difference check of every gradient of the fp64 reference.
void check_reference_gradients(const problem& p) {
    fp64 f(p);
    auto g = f.backward();
    const auto loss = [&] { return f.loss(); };
    test::check_gradient("x", f.x, g.dx, loss);
    test::check_gradient("dt", f.dt, g.ddt, loss);
    test::check_gradient("A", f.A, g.dA, loss);
    test::check_gradient("B", f.B, g.dB, loss);
    test::check_gradient("C", f.C, g.dC, loss);
    test::check_gradient("D", f.D, g.dD, loss);
    for (std::size_t i = 0; i < p.seqs.size(); ++i)
        if (!f.state0[i].empty()) test::check_gradient("state0[" + std::to_string(i) + "]", f.state0[i], g.dstate0[i], loss);
}

}  // namespace

TEST_CASE("ssd backward reference equals central finite differences of the recurrence (odd sizes, gaps, initial states)") {
    for (std::int64_t G : {1, 3}) {
        CAPTURE(G);
        // rows [0, 6) and [7, 13): row 6 belongs to no sequence; both start from a state; one final state carries a gradient
        problem p(13, 3, 5, G, 7, {{0, 6, true, true}, {7, 6, true, false}}, std::uint64_t(10 + G), G == 3);
        check_reference_gradients(p);
        fp64 f(p);
        const auto g = f.backward();
        for (std::int64_t i = 6 * 3 * 5; i < 7 * 3 * 5; ++i) CHECK(g.dx[std::size_t(i)] == 0.0);  // the free row
    }
}

TEST_CASE("ssd chunked backward (fp32) equals the fp64 recurrence backward (chunk 4, 16, 64; 1 and 2 threads)") {
    const std::int64_t H = 3, P = 5, N = 7;
    for (std::int64_t G : {1, 3})
        for (std::int64_t T : {1, 5, 50, 100})
            for (bool init : {false, true}) {
                CAPTURE(G);
                CAPTURE(T);
                CAPTURE(init);
                problem p(T, H, P, G, N, {{0, T, init, init}}, std::uint64_t(100 + T + G), init);
                fp64 f(p);
                const auto ref = f.backward();
                for (std::int64_t Q : {4, 16, 64})
                    for (int threads : {1, 2}) {
                        CAPTURE(Q);
                        CAPTURE(threads);
                        const auto g = chunked(cpu_backend(threads), p, Q);
                        check_close(g, ref, 1e-4);
                    }
                // the reference backend's op is the fp64 reference rounded to fp32
                const auto r = chunked(reference_backend(), p, 16);
                check_close(r, ref, 1e-6);
            }
}

TEST_CASE("ssd chunked backward: identical results for 1 and 2 threads; dA and dD accumulate, input gradients overwrite") {
    problem p(77, 4, 6, 2, 8, {{0, 30, true, false}, {30, 0}, {35, 42, false, true}}, 5);
    const auto a = chunked(cpu_backend(1), p, 16, 0.5f);
    const auto b = chunked(cpu_backend(2), p, 16, 0.5f);
    CHECK(a.dx == b.dx);
    CHECK(a.ddt == b.ddt);
    CHECK(a.dB == b.dB);
    CHECK(a.dC == b.dC);
    CHECK(a.dA == b.dA);
    CHECK(a.dD == b.dD);
    CHECK(a.dstate0 == b.dstate0);
    CHECK(all_finite(a));  // every NaN pre-filled into the input gradients was overwritten, free rows included
    for (std::int64_t i = 30 * 4 * 6; i < 35 * 4 * 6; ++i) CHECK(a.dx[std::size_t(i)] == 0.f);
    const auto z = chunked(cpu_backend(2), p, 16, 0.f);
    for (std::size_t h = 0; h < a.dA.size(); ++h) CHECK(a.dA[h] == doctest::Approx(z.dA[h] + 0.5f).epsilon(1e-6));
    for (std::size_t e = 0; e < a.dD.size(); ++e) CHECK(a.dD[e] == doctest::Approx(z.dD[e] + 0.5f).epsilon(1e-6));
    fp64 f(p);
    check_close(z, f.backward(), 1e-4);
}

TEST_CASE("ssd backward varlen: lengths 5 and 7 packed into T = 12 equal the per-sequence gradients (invariant 17)") {
    const std::int64_t T = 12, H = 2, P = 4, G = 1, N = 4, Q = 8;
    problem packed(T, H, P, G, N, {{0, 5, true, false}, {5, 7, true, false}}, 17);
    check_reference_gradients(packed);
    const auto ref = fp64(packed).backward();
    const auto cpu = chunked(cpu_backend(2), packed, Q);
    const auto rb = chunked(reference_backend(), packed, Q);
    check_close(cpu, ref, 1e-4);
    // each sequence alone: its own rows as their own tensors
    std::vector<double> dA(std::size_t(H), 0.0), dD(packed.D.size(), 0.0);
    for (std::size_t s = 0; s < 2; ++s) {
        CAPTURE(s);
        const std::int64_t r0 = packed.seqs[s].start, L = packed.seqs[s].length;
        problem solo = packed;
        solo.R = L;
        solo.seqs = {{0, L, true, false}};
        solo.state0 = {packed.state0[s]};
        solo.dfinal = {{}};
        const auto rows = [&](const std::vector<float>& v, std::int64_t w) { return std::vector<float>(v.begin() + r0 * w, v.begin() + (r0 + L) * w); };
        solo.x = rows(packed.x, H * P);
        solo.dy = rows(packed.dy, H * P);
        solo.dt = rows(packed.dt, H);
        solo.B = rows(packed.B, G * N);
        solo.C = rows(packed.C, G * N);
        const auto part = [&](const auto& v, std::int64_t w) { return std::vector<double>(v.begin() + r0 * w, v.begin() + (r0 + L) * w); };
        const auto sr = fp64(solo).backward();
        const auto sc = chunked(cpu_backend(2), solo, Q);
        for (const auto* g : {&cpu, &rb}) {
            CHECK(rel_error(part(g->dx, H * P), sc.dx) < 1e-6);
            CHECK(rel_error(part(g->ddt, H), sc.ddt) < 1e-6);
            CHECK(rel_error(part(g->dB, G * N), sc.dB) < 1e-6);
            CHECK(rel_error(part(g->dC, G * N), sc.dC) < 1e-6);
            CHECK(rel_error(g->dstate0[s], sc.dstate0[0]) < 1e-6);
        }
        CHECK(rel_error(part(ref.dx, H * P), sr.dx) < 1e-12);
        CHECK(rel_error(part(ref.ddt, H), sr.ddt) < 1e-12);
        CHECK(rel_error(part(ref.dB, G * N), sr.dB) < 1e-12);
        CHECK(rel_error(part(ref.dC, G * N), sr.dC) < 1e-12);
        CHECK(rel_error(ref.dstate0[s], sr.dstate0[0]) < 1e-12);
        for (std::size_t h = 0; h < dA.size(); ++h) dA[h] += sr.dA[h];
        for (std::size_t e = 0; e < dD.size(); ++e) dD[e] += sr.dD[e];
    }
    CHECK(rel_error(ref.dA, dA) < 1e-12);  // parameter gradients: the sum of the sequences' contributions
    CHECK(rel_error(ref.dD, dD) < 1e-12);
    CHECK(rel_error(cpu.dA, dA) < 1e-5);
    CHECK(rel_error(cpu.dD, dD) < 1e-5);
}

TEST_CASE("ssd chunked backward at extreme decay: finite, equals the reference (invariant 12)") {
    const std::int64_t T = 130, H = 1, P = 4, G = 1, N = 8, Q = 64;
    problem p(T, H, P, G, N, {{0, T, true, true}}, 77, false, 10.f, 10.f, -1e6f, -1e6f);
    const auto g = chunked(cpu_backend(2), p, Q);
    REQUIRE(all_finite(g));
    const auto ref = fp64(p).backward();
    REQUIRE(all_finite(ref));
    check_close(g, ref, 1e-4);
    // the memoryless limit: dx_t = Δ (C_t·B_t) dy_t + D dy_t (the last token also sees the final state's gradient)
    double worst = 0;
    for (std::int64_t t = 0; t + 1 < T; ++t) {
        double cb = 0;
        for (std::int64_t n = 0; n < N; ++n) cb += double(p.C[std::size_t(t * N + n)]) * p.B[std::size_t(t * N + n)];
        for (std::int64_t q = 0; q < P; ++q) {
            const double want = (10.0 * cb + p.D[0]) * p.dy[std::size_t(t * P + q)];
            worst = std::max(worst, std::abs(g.dx[std::size_t(t * P + q)] - want) / std::max(1.0, std::abs(want)));
        }
    }
    CHECK(worst < 1e-5);
}

TEST_CASE("ssd backward: a T = 0 sequence passes the final-state gradient to the initial state (invariant 7)") {
    problem p(6, 2, 3, 1, 4, {{3, 0, true, true}, {0, 0, false, false}}, 9);
    for (int b = 0; b < 2; ++b) {
        const auto g = b == 0 ? chunked(cpu_backend(2), p, 4, 0.25f) : chunked(reference_backend(), p, 4, 0.25f);
        CHECK(g.dstate0[0] == p.dfinal[0]);
        for (float v : g.dstate0[1]) CHECK(v == 0.f);
        for (const auto* v : {&g.dx, &g.ddt, &g.dB, &g.dC})
            for (float e : *v) CHECK(e == 0.f);  // no row belongs to a sequence
        for (float v : g.dA) CHECK(v == 0.25f);
        for (float v : g.dD) CHECK(v == 0.25f);
    }
}

TEST_CASE("ssd backward: null gradients are skipped; the others are unchanged") {
    problem p(20, 2, 3, 1, 5, {{0, 20, true, false}}, 31);
    const auto full = chunked(cpu_backend(1), p, 8);
    grads<float> g(p);
    g.g.dx = {};
    g.g.dB = {};
    g.g.dA = nullptr;
    std::vector<kernels::ssd_backward_sequence<float>> s{{0, 20, p.state0[0].data(), nullptr, nullptr}};
    kernels::ssd_chunked_backward(cpu_backend(1), p.inputs(), std::span<const kernels::ssd_backward_sequence<float>>(s), 8,
                                  tensor_view<const float, 3>(p.dy.data(), {p.R, p.H, p.P}), g.g);
    CHECK(g.ddt == full.ddt);
    CHECK(g.dC == full.dC);
    CHECK(g.dD == full.dD);
    CHECK(std::isnan(g.dx[0]));
}

TEST_CASE("ssd backward: bad arguments throw, naming the argument") {
    problem p(10, 4, 3, 2, 5, {{0, 10, true, false}}, 1);
    const cpu_backend be(1);
    const reference_backend rb;
    const auto run = [&](const auto& backend, const problem& q, std::vector<kernels::ssd_backward_sequence<float>> s, std::int64_t Q,
                         tensor_view<const float, 3> dy, const kernels::ssd_grads<float>& g) {
        ops::ssd_chunked_backward(backend, q.inputs(), std::span<const kernels::ssd_backward_sequence<float>>(s), Q, dy, g);
    };
    grads<float> g(p);
    const std::vector<kernels::ssd_backward_sequence<float>> ok{{0, 10, nullptr, g.dstate0[0].data(), nullptr}};
    const tensor_view<const float, 3> dy(p.dy.data(), {10, 4, 3});
    const auto check_both = [&](auto&& f, const char* text, auto tag) {
        using E = decltype(tag);
        CHECK_THROWS_WITH_AS(f(be), doctest::Contains(text), E);
        CHECK_THROWS_WITH_AS(f(rb), doctest::Contains(text), E);
    };
    check_both([&](const auto& b) { run(b, p, ok, 4, tensor_view<const float, 3>(p.dy.data(), {10, 3, 4}), g.g); }, "dy [R, H, P]", shape_error{""});
    auto bad = g.g;
    bad.dx = tensor_view<float, 3>(g.dx.data(), {10, 3, 4});
    check_both([&](const auto& b) { run(b, p, ok, 4, dy, bad); }, "dx [R, H, P]", shape_error{""});
    bad = g.g;
    bad.dB = tensor_view<float, 3>(g.dB.data(), {10, 1, 10});
    check_both([&](const auto& b) { run(b, p, ok, 4, dy, bad); }, "dB [R, G, N]", shape_error{""});
    bad = g.g;
    bad.dC = tensor_view<float, 3>(g.dC.data(), {10, 2, 5}, {10, 5, 2});
    check_both([&](const auto& b) { run(b, p, ok, 4, dy, bad); }, "dC [R, G, N] needs a unit stride", shape_error{""});
    check_both([&](const auto& b) { run(b, p, {{0, 6}, {5, 5}}, 4, dy, g.g); }, "share token rows", shape_error{""});
    check_both([&](const auto& b) { run(b, p, {{4, 7}}, 4, dy, g.g); }, "outside [0, 10)", shape_error{""});
    check_both([&](const auto& b) { run(b, p, ok, 0, dy, g.g); }, "chunk size must be >= 1", config_error{""});
    problem pos = p;
    pos.A[1] = 0.5f;
    check_both([&](const auto& b) { run(b, pos, ok, 4, dy, g.g); }, "A[1]", value_error{""});
    problem neg = p;
    neg.dt[7] = -1.f;
    check_both([&](const auto& b) { run(b, neg, ok, 4, dy, g.g); }, "dt[1, 3]", value_error{""});
}
