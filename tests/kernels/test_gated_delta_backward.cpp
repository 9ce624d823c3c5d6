// Backward of the gated delta rule (spec.md §4.1, §4.3; issue 8): the fp64 BPTT reference against central finite
// differences, the chunked fp32 backward against the reference (chunks 4/16/64, 1 and 2 threads, zero and non-zero
// initial states), packed varlen isolation, extreme log-decays (§8.13, §8.14), causality of gradients, the ops on
// both backends, and argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/kernels/gated_delta_backward.hpp"
#include "hymix/ops/gated_delta_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

/// Inputs of one call: q, k L2-normalised, g in [g_lo, g_hi] ≤ 0, β in [0, 1], an initial state per slot, d_o.
struct problem {
    std::int64_t n, Hk, Hv, dk, dv, S;
    std::vector<double> q, k, v, g, beta, s0, d_o;
    problem(std::int64_t n_, std::int64_t Hk_, std::int64_t Hv_, std::int64_t dk_, std::int64_t dv_, std::int64_t S_, std::uint64_t seed,
            bool nonzero_state = true, float g_lo = -2.f, float g_hi = -1e-3f)
        : n(n_), Hk(Hk_), Hv(Hv_), dk(dk_), dv(dv_), S(S_) {
        const auto N = static_cast<std::size_t>(n);
        auto dbl = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
        q = dbl(test::uniform(N * Hk * dk, -1.f, 1.f, seed));
        k = dbl(test::uniform(N * Hk * dk, -1.f, 1.f, seed + 1));
        v = dbl(test::uniform(N * Hv * dv, -1.f, 1.f, seed + 2));
        g = dbl(test::uniform(N * Hv, g_lo, g_hi, seed + 3));
        beta = dbl(test::uniform(N * Hv, 0.f, 1.f, seed + 4));
        s0 = nonzero_state ? dbl(test::uniform(static_cast<std::size_t>(S * Hv * dk * dv), -0.5f, 0.5f, seed + 5))
                           : std::vector<double>(static_cast<std::size_t>(S * Hv * dk * dv), 0.0);
        d_o = test::cotangent(N * Hv * dv, seed + 6);
        normalise(q);
        normalise(k);
        // fp32-representable values, so the fp32 kernel and the fp64 reference see the same inputs.
        for (auto* x : {&q, &k, &v, &g, &beta, &s0, &d_o})
            for (auto& e : *x) e = static_cast<double>(static_cast<float>(e));
    }
    void normalise(std::vector<double>& x, std::size_t from = 0) const {
        for (std::size_t r = from; r < x.size(); r += static_cast<std::size_t>(dk)) {
            double ss = 0;
            for (std::int64_t a = 0; a < dk; ++a) ss += x[r + a] * x[r + a];
            for (std::int64_t a = 0; a < dk; ++a) x[r + a] /= std::sqrt(ss + 1e-6);
        }
    }
    double scale() const { return static_cast<double>(1.f / std::sqrt(static_cast<float>(dk))); }
};

/// Gradients, in the precision of T.
template <class T>
struct grads {
    std::vector<T> dq, dk, dv, dg, dbeta, ds0;
    explicit grads(const problem& p)
        : dq(p.q.size(), T(-7)), dk(p.k.size(), T(-7)), dv(p.v.size(), T(-7)), dg(p.g.size(), T(-7)), dbeta(p.beta.size(), T(-7)),
          ds0(p.s0.size(), T(-7)) {}  // garbage that must be overwritten
};

/// fp64 forward (the recurrence) from s0: o.
std::vector<double> forward_ref(const problem& p, const seq_batch& batch) {
    std::vector<double> st = p.s0, o(p.v.size());
    kernels::gated_delta_rule_ref<double>(
        batch, tensor_view<const double, 3>(p.q.data(), {p.n, p.Hk, p.dk}), tensor_view<const double, 3>(p.k.data(), {p.n, p.Hk, p.dk}),
        tensor_view<const double, 3>(p.v.data(), {p.n, p.Hv, p.dv}), tensor_view<const double, 2>(p.g.data(), {p.n, p.Hv}),
        tensor_view<const double, 2>(p.beta.data(), {p.n, p.Hv}), p.scale(), tensor_view<double, 4>(st.data(), {p.S, p.Hv, p.dk, p.dv}),
        tensor_view<double, 3>(o.data(), {p.n, p.Hv, p.dv}));
    return o;
}

grads<double> backward_ref(const problem& p, const seq_batch& batch, bool with_state = true) {
    grads<double> r(p);
    kernels::gated_delta_backward_ref<double>(
        batch, tensor_view<const double, 3>(p.q.data(), {p.n, p.Hk, p.dk}), tensor_view<const double, 3>(p.k.data(), {p.n, p.Hk, p.dk}),
        tensor_view<const double, 3>(p.v.data(), {p.n, p.Hv, p.dv}), tensor_view<const double, 2>(p.g.data(), {p.n, p.Hv}),
        tensor_view<const double, 2>(p.beta.data(), {p.n, p.Hv}), p.scale(),
        tensor_view<const double, 4>(with_state ? p.s0.data() : nullptr, {p.S, p.Hv, p.dk, p.dv}),
        tensor_view<const double, 3>(p.d_o.data(), {p.n, p.Hv, p.dv}), tensor_view<double, 3>(r.dq.data(), {p.n, p.Hk, p.dk}),
        tensor_view<double, 3>(r.dk.data(), {p.n, p.Hk, p.dk}), tensor_view<double, 3>(r.dv.data(), {p.n, p.Hv, p.dv}),
        tensor_view<double, 2>(r.dg.data(), {p.n, p.Hv}), tensor_view<double, 2>(r.dbeta.data(), {p.n, p.Hv}),
        tensor_view<double, 4>(r.ds0.data(), {p.S, p.Hv, p.dk, p.dv}));
    return r;
}

/// fp32 copies of a problem's inputs.
struct f32_inputs {
    std::vector<float> q, k, v, g, beta, s0, d_o;
    explicit f32_inputs(const problem& p)
        : q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()), v(p.v.begin(), p.v.end()), g(p.g.begin(), p.g.end()),
          beta(p.beta.begin(), p.beta.end()), s0(p.s0.begin(), p.s0.end()), d_o(p.d_o.begin(), p.d_o.end()) {}
};

/// The chunked fp32 backward through an op (CPU backend by default) on the fp32 inputs `in` (of problem p). Bit-for-bit
/// comparisons reuse one `in`: Eigen's rounding of some tiny products follows the alignment of the input buffers.
template <class Backend = cpu_backend>
grads<float> backward_op(const problem& p, const f32_inputs& in, const seq_batch& batch, std::int64_t chunk, int threads = 2,
                         bool with_state = true) {
    grads<float> r(p);
    Backend be(threads);
    ops::gated_delta_chunked_backward(
        be, batch, tensor_view<const float, 3>(in.q.data(), {p.n, p.Hk, p.dk}), tensor_view<const float, 3>(in.k.data(), {p.n, p.Hk, p.dk}),
        tensor_view<const float, 3>(in.v.data(), {p.n, p.Hv, p.dv}), tensor_view<const float, 2>(in.g.data(), {p.n, p.Hv}),
        tensor_view<const float, 2>(in.beta.data(), {p.n, p.Hv}), static_cast<float>(p.scale()),
        tensor_view<const float, 4>(with_state ? in.s0.data() : nullptr, {p.S, p.Hv, p.dk, p.dv}),
        tensor_view<const float, 3>(in.d_o.data(), {p.n, p.Hv, p.dv}), tensor_view<float, 3>(r.dq.data(), {p.n, p.Hk, p.dk}),
        tensor_view<float, 3>(r.dk.data(), {p.n, p.Hk, p.dk}), tensor_view<float, 3>(r.dv.data(), {p.n, p.Hv, p.dv}),
        tensor_view<float, 2>(r.dg.data(), {p.n, p.Hv}), tensor_view<float, 2>(r.dbeta.data(), {p.n, p.Hv}),
        tensor_view<float, 4>(r.ds0.data(), {p.S, p.Hv, p.dk, p.dv}), chunk);
    return r;
}
template <class Backend = cpu_backend>
grads<float> backward_op(const problem& p, const seq_batch& batch, std::int64_t chunk, int threads = 2, bool with_state = true) {
    const f32_inputs in(p);
    return backward_op<Backend>(p, in, batch, chunk, threads, with_state);
}

/// Every gradient of `a` within rel (||a − b|| / ||b||) of `b`.
template <class A, class B>
void check_close(const grads<A>& a, const grads<B>& b, double rel) {
    CHECK(rel_error(a.dq, b.dq) < rel);
    CHECK(rel_error(a.dk, b.dk) < rel);
    CHECK(rel_error(a.dv, b.dv) < rel);
    CHECK(rel_error(a.dg, b.dg) < rel);
    CHECK(rel_error(a.dbeta, b.dbeta) < rel);
    CHECK(rel_error(a.ds0, b.ds0) < rel);
}

template <class T>
bool all_finite(const grads<T>& r) {
    for (const auto* x : {&r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.ds0})
        for (T e : *x)
            if (!std::isfinite(e)) return false;
    return true;
}

/// Rows [r0, r0 + len) of a per-row tensor of width w.
template <class T>
std::vector<T> rows(const std::vector<T>& x, std::int64_t r0, std::int64_t len, std::int64_t w) {
    return std::vector<T>(x.begin() + r0 * w, x.begin() + (r0 + len) * w);
}

/// The problem restricted to rows [r0, r0 + len), with slot `slot`'s initial state as its only slot.
problem solo(const problem& p, std::int64_t r0, std::int64_t len, std::int64_t slot) {
    problem s = p;
    s.n = len;
    s.S = 1;
    s.q = rows(p.q, r0, len, p.Hk * p.dk);
    s.k = rows(p.k, r0, len, p.Hk * p.dk);
    s.v = rows(p.v, r0, len, p.Hv * p.dv);
    s.g = rows(p.g, r0, len, p.Hv);
    s.beta = rows(p.beta, r0, len, p.Hv);
    s.d_o = rows(p.d_o, r0, len, p.Hv * p.dv);
    s.s0 = rows(p.s0, slot, 1, p.Hv * p.dk * p.dv);
    return s;
}

}  // namespace

TEST_CASE("gated delta backward reference equals central finite differences of the fp64 recurrence") {
    // Odd sizes, grouped value heads (H_k = 1, H_v = 2), d_k = 5, d_v = 3; a packed batch of lengths 7 and 4 (the chunked
    // kernel would cut them at 4), non-zero initial states in slots 2 and 0, slot 1 unused, one padding row.
    const std::vector<std::int64_t> cu{0, 7, 11};
    seq_batch batch = seq_batch::packed(cu, std::vector<std::int64_t>{2, 0});
    batch.n_rows = 12;
    problem p(12, 1, 2, 5, 3, 3, 42);
    const auto an = backward_ref(p, batch);
    const auto loss = [&] { return test::dot(p.d_o, forward_ref(p, batch)); };
    test::check_gradient("dq", p.q, an.dq, loss);
    test::check_gradient("dk", p.k, an.dk, loss);
    test::check_gradient("dv", p.v, an.dv, loss);
    test::check_gradient("dg", p.g, an.dg, loss);
    test::check_gradient("dbeta", p.beta, an.dbeta, loss);
    test::check_gradient("dstate0", p.s0, an.ds0, loss);
    // Slot 1 and the padding row get exact zeros.
    for (std::int64_t i = 0; i < 2 * 5 * 3; ++i) CHECK(an.ds0[static_cast<std::size_t>(2 * 5 * 3 + i)] == 0.0);
    for (std::int64_t i = 0; i < 2 * 3; ++i) CHECK(an.dv[static_cast<std::size_t>(11 * 2 * 3 + i)] == 0.0);
}

TEST_CASE("gated delta backward reference: zero initial state (null) equals an explicit zero state") {
    problem p(9, 2, 4, 4, 6, 1, 77, false);
    const auto a = backward_ref(p, seq_batch::dense(1, 9), true), b = backward_ref(p, seq_batch::dense(1, 9), false);
    CHECK(a.dq == b.dq);
    CHECK(a.dk == b.dk);
    CHECK(a.dg == b.dg);
    CHECK(a.ds0 == b.ds0);
    // And the finite-difference check with a zero state (only the gradients of the state itself differ in kind).
    const auto loss = [&] { return test::dot(p.d_o, forward_ref(p, seq_batch::dense(1, 9))); };
    test::check_gradient("dstate0 at zero", p.s0, a.ds0, loss);
    test::check_gradient("dg at zero state", p.g, a.dg, loss);
}

TEST_CASE("chunked fp32 backward equals the fp64 recurrence backward (chunks 4, 16, 64; 1 and 2 threads)") {
    for (std::int64_t T : {1, 5, 50, 100}) {
        for (bool nonzero : {false, true}) {
            problem p(T, 2, 4, 13, 11, 1, 1000 + static_cast<std::uint64_t>(T), nonzero);
            const auto batch = seq_batch::dense(1, T);
            const auto ref = backward_ref(p, batch);
            for (std::int64_t C : {4, 16, 64}) {
                CAPTURE(T);
                CAPTURE(C);
                CAPTURE(nonzero);
                const f32_inputs in(p);
                const auto g1 = backward_op(p, in, batch, C, 1), g2 = backward_op(p, in, batch, C, 2);
                check_close(g1, ref, 1e-4);
                MESSAGE("T " << T << " C " << C << " dq " << rel_error(g1.dq, ref.dq) << " dk " << rel_error(g1.dk, ref.dk) << " dv "
                             << rel_error(g1.dv, ref.dv) << " dg " << rel_error(g1.dg, ref.dg) << " dbeta "
                             << rel_error(g1.dbeta, ref.dbeta) << " ds0 " << rel_error(g1.ds0, ref.ds0));
                // The thread count does not change a bit.
                CHECK(g1.dq == g2.dq);
                CHECK(g1.dk == g2.dk);
                CHECK(g1.dv == g2.dv);
                CHECK(g1.dg == g2.dg);
                CHECK(g1.dbeta == g2.dbeta);
                CHECK(g1.ds0 == g2.ds0);
            }
        }
    }
}

TEST_CASE("chunked backward: wider heads, one key head per value head, larger decays") {
    // H_k = H_v (no staging), d_k = d_v = 32, g in [-6, 0), two sequences in one dense batch.
    problem p(2 * 70, 3, 3, 32, 32, 2, 2024, true, -6.f, -1e-5f);
    const auto batch = seq_batch::dense(2, 70);
    check_close(backward_op(p, batch, 16), backward_ref(p, batch), 1e-4);
    check_close(backward_op(p, batch, 64), backward_ref(p, batch), 1e-4);
}

TEST_CASE("the ops: the reference backend runs the fp64 reference; the CPU op equals the kernel") {
    const std::vector<std::int64_t> cu{0, 6, 13};
    const auto batch = seq_batch::packed(cu);
    problem p(13, 1, 3, 7, 5, 2, 31);
    const auto ref = backward_ref(p, batch);
    const auto rb = backward_op<reference_backend>(p, batch, 4);
    // The reference backend's op is the fp64 reference rounded once to fp32.
    auto rounded = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
    CHECK(rb.dq == rounded(ref.dq));
    CHECK(rb.dk == rounded(ref.dk));
    CHECK(rb.dv == rounded(ref.dv));
    CHECK(rb.dg == rounded(ref.dg));
    CHECK(rb.dbeta == rounded(ref.dbeta));
    CHECK(rb.ds0 == rounded(ref.ds0));
    // The CPU op and the kernel called directly agree bit for bit.
    const f32_inputs in(p);
    grads<float> kr(p);
    cpu_backend be(2);
    kernels::gated_delta_rule_chunked_backward(
        be, batch, tensor_view<const float, 3>(in.q.data(), {13, 1, 7}), tensor_view<const float, 3>(in.k.data(), {13, 1, 7}),
        tensor_view<const float, 3>(in.v.data(), {13, 3, 5}), tensor_view<const float, 2>(in.g.data(), {13, 3}),
        tensor_view<const float, 2>(in.beta.data(), {13, 3}), static_cast<float>(p.scale()),
        tensor_view<const float, 4>(in.s0.data(), {2, 3, 7, 5}), tensor_view<const float, 3>(in.d_o.data(), {13, 3, 5}),
        tensor_view<float, 3>(kr.dq.data(), {13, 1, 7}), tensor_view<float, 3>(kr.dk.data(), {13, 1, 7}),
        tensor_view<float, 3>(kr.dv.data(), {13, 3, 5}), tensor_view<float, 2>(kr.dg.data(), {13, 3}),
        tensor_view<float, 2>(kr.dbeta.data(), {13, 3}), tensor_view<float, 4>(kr.ds0.data(), {2, 3, 7, 5}), 4);
    const auto cpu = backward_op(p, batch, 4);
    CHECK(cpu.dq == kr.dq);
    CHECK(cpu.dg == kr.dg);
    CHECK(cpu.ds0 == kr.ds0);
    check_close(cpu, ref, 1e-4);
}

TEST_CASE("null gradient outputs are skipped and change nothing else") {
    problem p(23, 2, 4, 6, 5, 1, 55);
    const auto batch = seq_batch::dense(1, 23);
    const auto full = backward_op(p, batch, 8);
    const f32_inputs in(p);
    std::vector<float> dv(p.v.size()), dbeta(p.beta.size());
    cpu_backend be(2);
    for (const bool cpu : {true, false}) {
        auto run = [&](const auto& b) {
            ops::gated_delta_chunked_backward(
                b, batch, tensor_view<const float, 3>(in.q.data(), {23, 2, 6}), tensor_view<const float, 3>(in.k.data(), {23, 2, 6}),
                tensor_view<const float, 3>(in.v.data(), {23, 4, 5}), tensor_view<const float, 2>(in.g.data(), {23, 4}),
                tensor_view<const float, 2>(in.beta.data(), {23, 4}), static_cast<float>(p.scale()),
                tensor_view<const float, 4>(in.s0.data(), {1, 4, 6, 5}), tensor_view<const float, 3>(in.d_o.data(), {23, 4, 5}),
                tensor_view<float, 3>(), tensor_view<float, 3>(), tensor_view<float, 3>(dv.data(), {23, 4, 5}), tensor_view<float, 2>(),
                tensor_view<float, 2>(dbeta.data(), {23, 4}), tensor_view<float, 4>(), 8);
        };
        if (cpu) {
            run(be);
            CHECK(dv == full.dv);
            CHECK(dbeta == full.dbeta);
        } else {
            run(reference_backend{});
            const auto ref = backward_ref(p, batch);
            CHECK(rel_error(dv, ref.dv) < 1e-6);
            CHECK(rel_error(dbeta, ref.dbeta) < 1e-6);
        }
    }
}

TEST_CASE("packed varlen: each sequence's gradients equal its standalone run (invariant 16)") {
    // Lengths [5, 3, 9] packed into 17 (chunk 8: boundaries mid-chunk and on a chunk edge), a 15-token dummy sequence of
    // values x1e3, an invalid entry (slot −1) and a padding row; slots permuted; slot 1 unused.
    const std::vector<std::int64_t> cu{0, 5, 8, 17, 32, 35};
    seq_batch batch = seq_batch::packed(cu, std::vector<std::int64_t>{4, 0, 2, 5, -1});
    batch.n_rows = 36;
    problem p(36, 2, 4, 8, 6, 6, 1600);
    for (std::size_t i = static_cast<std::size_t>(17 * 4 * 6); i < static_cast<std::size_t>(32 * 4 * 6); ++i) p.v[i] *= 1e3;
    f32_inputs in(p);
    const auto all = backward_op(p, in, batch, 8);
    const auto all_ref = backward_ref(p, batch);
    check_close(all, all_ref, 1e-4);
    const std::int64_t wk = p.Hk * p.dk, wv = p.Hv * p.dv, ws = p.Hv * p.dk * p.dv;
    for (std::size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        const std::int64_t r0 = cu[i], len = cu[i + 1] - cu[i], slot = batch.slots[i];
        const auto one = backward_op(solo(p, r0, len, slot), seq_batch::dense(1, len), 8);
        CHECK(rel_error(rows(all.dq, r0, len, wk), one.dq) < 1e-6);
        CHECK(rel_error(rows(all.dk, r0, len, wk), one.dk) < 1e-6);
        CHECK(rel_error(rows(all.dv, r0, len, wv), one.dv) < 1e-6);
        CHECK(rel_error(rows(all.dg, r0, len, p.Hv), one.dg) < 1e-6);
        CHECK(rel_error(rows(all.dbeta, r0, len, p.Hv), one.dbeta) < 1e-6);
        CHECK(rel_error(rows(all.ds0, slot, 1, ws), one.ds0) < 1e-6);
    }
    // The invalid entry, the padding row and the unused slots 1 and 3 get zeros.
    for (std::int64_t r = 32; r < 36; ++r) {
        for (auto x : rows(all.dq, r, 1, wk)) CHECK(x == 0.f);
        for (auto x : rows(all.dv, r, 1, wv)) CHECK(x == 0.f);
        for (auto x : rows(all.dg, r, 1, p.Hv)) CHECK(x == 0.f);
    }
    for (std::int64_t u : {1, 3})
        for (auto x : rows(all.ds0, u, 1, ws)) CHECK(x == 0.f);
    // Changing another sequence (the dummy's d_o and keys) changes nothing, bit for bit.
    for (std::size_t i = static_cast<std::size_t>(17 * wv); i < static_cast<std::size_t>(32 * wv); ++i) in.d_o[i] *= -3.f;
    for (std::size_t i = static_cast<std::size_t>(17 * wk); i < static_cast<std::size_t>(32 * wk); ++i) in.k[i] *= 0.5f;
    const auto all2 = backward_op(p, in, batch, 8);
    CHECK(rows(all2.dk, 0, 17, wk) == rows(all.dk, 0, 17, wk));
    CHECK(rows(all2.dg, 0, 17, p.Hv) == rows(all.dg, 0, 17, p.Hv));
    CHECK(rows(all2.ds0, 0, 5, ws) == rows(all.ds0, 0, 5, ws));
    CHECK(rows(all2.dk, 17, 15, wk) != rows(all.dk, 17, 15, wk));
}

TEST_CASE("extreme log-decay: finite gradients equal to the fp64 recurrence (invariant 13)") {
    // H = 2, T = 128, C = 64, g in [-20, -1e-4] with a few -20 and one -300.
    problem p(128, 2, 2, 16, 16, 1, 1313, true, -20.f, -1e-4f);
    for (std::int64_t t : {3, 40, 63, 64, 100}) p.g[static_cast<std::size_t>(t * 2)] = -20.0;
    p.g[static_cast<std::size_t>(70 * 2 + 1)] = -300.0;
    for (std::int64_t t = 80; t < 128; ++t) p.g[static_cast<std::size_t>(t * 2 + 1)] = -1e-4;
    const auto batch = seq_batch::dense(1, 128);
    const auto ref = backward_ref(p, batch);
    CHECK(all_finite(ref));
    for (std::int64_t C : {16, 64}) {
        CAPTURE(C);
        const auto got = backward_op(p, batch, C);
        CHECK(all_finite(got));
        check_close(got, ref, 1e-4);
    }
}

TEST_CASE("gate limits: g = 0, g = -30 and g = -1e-6 (invariant 14)") {
    for (const double gv : {0.0, -30.0, -1e-6}) {
        CAPTURE(gv);
        problem p(100, 1, 1, 32, 32, 1, 1400);
        std::fill(p.g.begin(), p.g.end(), gv);
        const auto batch = seq_batch::dense(1, 100);
        const auto ref = backward_ref(p, batch);
        const auto got = backward_op(p, batch, 64);
        CHECK(all_finite(got));
        check_close(got, ref, 1e-4);
        if (gv == -30.0) {
            // o_t = β_t (q_t·k_t) v_t·scale plus e^{-30}-small terms: dv_t = β_t (q_t·k_t) scale d_o_t.
            std::vector<double> want(p.v.size());
            for (std::int64_t t = 0; t < 100; ++t) {
                double qk = 0;
                for (std::int64_t a = 0; a < 32; ++a) qk += p.q[static_cast<std::size_t>(t * 32 + a)] * p.k[static_cast<std::size_t>(t * 32 + a)];
                for (std::int64_t b = 0; b < 32; ++b)
                    want[static_cast<std::size_t>(t * 32 + b)] = p.beta[static_cast<std::size_t>(t)] * qk * p.scale() * p.d_o[static_cast<std::size_t>(t * 32 + b)];
            }
            CHECK(test::max_abs_diff(got.dv, want) < 1e-6);
        }
    }
}

TEST_CASE("causality of gradients: perturbing positions >= t0 leaves prefix-loss gradients at < t0 unchanged (invariant 13)") {
    problem base(128, 2, 2, 16, 16, 1, 1313, true, -20.f, -1e-4f);
    base.g[static_cast<std::size_t>(70 * 2 + 1)] = -300.0;
    const auto batch = seq_batch::dense(1, 128);
    for (std::int64_t t0 : {1, 30, 64, 65, 127}) {
        problem p = base;
        // Prefix loss: d_o = 0 at positions >= t0.
        std::fill(p.d_o.begin() + t0 * 2 * 16, p.d_o.end(), 0.0);
        f32_inputs in(p);
        const f32_inputs saved = in;
        const auto a = backward_op(p, in, batch, 64);
        for (int which = 0; which < 5; ++which) {
            CAPTURE(t0);
            CAPTURE(which);
            in = saved;
            std::mt19937 gen(static_cast<unsigned>(t0 * 5 + which));
            std::uniform_real_distribution<float> d(-3.f, 3.f);
            for (std::int64_t t = t0; t < 128; ++t)
                for (std::int64_t h = 0; h < 2; ++h) {
                    const auto i = static_cast<std::size_t>(t * 2 + h);
                    if (which == 0) in.g[i] = -std::abs(d(gen)) * 10.f;
                    if (which == 4) in.beta[i] = std::abs(d(gen)) / 3.f;
                    for (std::int64_t e = 0; e < 16; ++e) {
                        if (which == 1) in.k[i * 16 + e] = d(gen);
                        if (which == 2) in.v[i * 16 + e] = d(gen) * 100.f;
                        if (which == 3) in.q[i * 16 + e] = d(gen);
                    }
                }
            const auto b = backward_op(p, in, batch, 64);
            const std::size_t pk = static_cast<std::size_t>(t0 * 2 * 16), pg = static_cast<std::size_t>(t0 * 2);
            CHECK(std::equal(a.dq.begin(), a.dq.begin() + pk, b.dq.begin()));
            CHECK(std::equal(a.dk.begin(), a.dk.begin() + pk, b.dk.begin()));
            CHECK(std::equal(a.dv.begin(), a.dv.begin() + pk, b.dv.begin()));
            CHECK(std::equal(a.dg.begin(), a.dg.begin() + pg, b.dg.begin()));
            CHECK(std::equal(a.dbeta.begin(), a.dbeta.begin() + pg, b.dbeta.begin()));
            CHECK(a.ds0 == b.ds0);
            // The gradients at positions >= t0 are exactly zero for a prefix loss (no output there depends on them).
            CHECK(std::all_of(b.dv.begin() + pk, b.dv.end(), [](float x) { return x == 0.f; }));
        }
    }
}

TEST_CASE("gated delta backward: bad arguments throw, naming the tensor") {
    problem p(6, 2, 4, 8, 8, 2, 9);
    const f32_inputs in(p);
    grads<float> r(p);
    cpu_backend be(1);
    const tensor_view<const float, 3> q(in.q.data(), {6, 2, 8}), k(in.k.data(), {6, 2, 8}), v(in.v.data(), {6, 4, 8}),
        d_o(in.d_o.data(), {6, 4, 8});
    const tensor_view<const float, 2> g(in.g.data(), {6, 4}), b(in.beta.data(), {6, 4});
    const tensor_view<const float, 4> s0(in.s0.data(), {2, 4, 8, 8});
    const tensor_view<float, 3> dq(r.dq.data(), {6, 2, 8}), dk(r.dk.data(), {6, 2, 8}), dv(r.dv.data(), {6, 4, 8});
    const tensor_view<float, 2> dg(r.dg.data(), {6, 4}), db(r.dbeta.data(), {6, 4});
    const tensor_view<float, 4> ds(r.ds0.data(), {2, 4, 8, 8});
    const auto batch = seq_batch::dense(1, 6);
    auto call = [&](tensor_view<const float, 2> g_, tensor_view<const float, 3> do_, tensor_view<float, 4> ds_) {
        kernels::gated_delta_rule_chunked_backward(be, batch, q, k, v, g_, b, 0.3f, s0, do_, dq, dk, dv, dg, db, ds_, 4);
    };
    CHECK_NOTHROW(call(g, d_o, ds));
    // d_o with the wrong head width.
    CHECK_THROWS_WITH_AS(call(g, tensor_view<const float, 3>(in.d_o.data(), {6, 4, 6}), ds), doctest::Contains("d_o"), shape_error);
    // dstate0 with another slot count than state0.
    CHECK_THROWS_WITH_AS(call(g, d_o, tensor_view<float, 4>(r.ds0.data(), {1, 4, 8, 8})), doctest::Contains("dstate0"), shape_error);
    // dg with the wrong row count.
    seq_batch short_batch = seq_batch::dense(1, 5);
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked_backward(be, short_batch, q, k, v, g, b, 0.3f, s0, d_o, dq, dk, dv, dg, db, ds, 4),
                    shape_error);
    // A positive log-decay, a chunk of 0, H_v not a multiple of H_k.
    std::vector<float> gp = in.g;
    gp[5] = 0.5f;
    CHECK_THROWS_AS(call(tensor_view<const float, 2>(gp.data(), {6, 4}), d_o, ds), value_error);
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked_backward(be, batch, q, k, v, g, b, 0.3f, s0, d_o, dq, dk, dv, dg, db, ds, 0),
                    config_error);
    const tensor_view<const float, 3> k3(in.k.data(), {6, 3, 8}), q3(in.q.data(), {6, 3, 8});
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked_backward(be, batch, q3, k3, v, g, b, 0.3f, s0, d_o, tensor_view<float, 3>(),
                                                               tensor_view<float, 3>(), dv, dg, db, ds, 4),
                    config_error);
    // The reference backend's op checks the same.
    CHECK_THROWS_AS(ops::gated_delta_chunked_backward(reference_backend{}, batch, q, k, v, g, b, 0.3f, s0,
                                                      tensor_view<const float, 3>(in.d_o.data(), {6, 4, 6}), dq, dk, dv, dg, db, ds, 4),
                    shape_error);
}
