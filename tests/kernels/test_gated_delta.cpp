// The gated delta rule kernels (spec.md §4.1, §4.3): chunked WY/UT prefill and decode step against the fp64
// recurrence, split invariance, extreme decays, causality, varlen isolation and the invariants 5, 6, 7, 13–16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

/// Random kernel inputs for n_rows tokens: L2-normalised q, k; g in [g_lo, g_hi]; β in [b_lo, b_hi].
struct inputs {
    std::int64_t n, Hk, Hv, dk, dv;
    std::vector<float> q, k, v, g, beta;
    inputs(std::int64_t n_, std::int64_t Hk_, std::int64_t Hv_, std::int64_t dk_, std::int64_t dv_, std::uint64_t seed,
           float g_lo = -2.f, float g_hi = -1e-3f, float v_lo = -1.f, float v_hi = 1.f, float b_lo = 0.f, float b_hi = 1.f)
        : n(n_), Hk(Hk_), Hv(Hv_), dk(dk_), dv(dv_) {
        const auto N = static_cast<std::size_t>(n);
        q = hymix::test::uniform(N * Hk * dk, -1.f, 1.f, seed);
        k = hymix::test::uniform(N * Hk * dk, -1.f, 1.f, seed + 1);
        v = hymix::test::uniform(N * Hv * dv, v_lo, v_hi, seed + 2);
        g = hymix::test::uniform(N * Hv, g_lo, g_hi, seed + 3);
        beta = hymix::test::uniform(N * Hv, b_lo, b_hi, seed + 4);
        normalise(q);
        normalise(k);
    }
    /// L2-normalises the head vectors of x (all, or those starting at element `from`).
    void normalise(std::vector<float>& x, std::size_t from = 0) const {
        for (std::size_t r = from; r < x.size(); r += static_cast<std::size_t>(dk)) {
            double ss = 0;
            for (std::int64_t a = 0; a < dk; ++a) ss += double(x[r + a]) * x[r + a];
            for (std::int64_t a = 0; a < dk; ++a) x[r + a] = static_cast<float>(x[r + a] / std::sqrt(ss + 1e-6));
        }
    }
    float scale() const { return 1.f / std::sqrt(static_cast<float>(dk)); }
    std::size_t state_size(std::int64_t S) const { return static_cast<std::size_t>(S * Hv * dk * dv); }
    std::size_t out_size() const { return static_cast<std::size_t>(n * Hv * dv); }
};

template <class T>
std::vector<T> cast(const std::vector<float>& x) {
    return std::vector<T>(x.begin(), x.end());
}

enum class path { chunked, step, ref };

/// Runs one kernel over `batch` on the given inputs; state (S slots) is updated in place, returns o.
std::vector<float> run(path p, const inputs& in, const seq_batch& batch, std::vector<float>& state, std::int64_t S,
                       std::int64_t chunk = 64, int threads = 2) {
    cpu_backend be(threads);
    std::vector<float> o(in.out_size(), 7.f);  // garbage that must be overwritten
    tensor_view<const float, 3> q(in.q.data(), {in.n, in.Hk, in.dk}), k(in.k.data(), {in.n, in.Hk, in.dk}),
        v(in.v.data(), {in.n, in.Hv, in.dv});
    tensor_view<const float, 2> g(in.g.data(), {in.n, in.Hv}), b(in.beta.data(), {in.n, in.Hv});
    tensor_view<float, 4> st(state.data(), {S, in.Hv, in.dk, in.dv});
    tensor_view<float, 3> ov(o.data(), {in.n, in.Hv, in.dv});
    if (p == path::chunked) {
        kernels::gated_delta_rule_chunked(be, batch, q, k, v, g, b, in.scale(), st, ov, chunk);
    } else if (p == path::step) {
        kernels::gated_delta_rule_step(be, batch, q, k, v, g, b, in.scale(), st, ov);
    } else {
        auto qd = cast<double>(in.q), kd = cast<double>(in.k), vd = cast<double>(in.v), gd = cast<double>(in.g),
             bd = cast<double>(in.beta), sd = cast<double>(state);
        std::vector<double> od(in.out_size());
        kernels::gated_delta_rule_ref<double>(
            batch, tensor_view<const double, 3>(qd.data(), {in.n, in.Hk, in.dk}),
            tensor_view<const double, 3>(kd.data(), {in.n, in.Hk, in.dk}),
            tensor_view<const double, 3>(vd.data(), {in.n, in.Hv, in.dv}),
            tensor_view<const double, 2>(gd.data(), {in.n, in.Hv}), tensor_view<const double, 2>(bd.data(), {in.n, in.Hv}),
            1.0 / std::sqrt(static_cast<double>(in.dk)), tensor_view<double, 4>(sd.data(), {S, in.Hv, in.dk, in.dv}),
            tensor_view<double, 3>(od.data(), {in.n, in.Hv, in.dv}));
        std::copy(sd.begin(), sd.end(), state.begin());
        std::copy(od.begin(), od.end(), o.begin());
    }
    return o;
}

/// fp64 reference keeping double state and outputs (for precise comparisons).
struct ref_result {
    std::vector<double> o, state;
};
ref_result run_ref(const inputs& in, const seq_batch& batch, const std::vector<float>& state0, std::int64_t S) {
    auto qd = cast<double>(in.q), kd = cast<double>(in.k), vd = cast<double>(in.v), gd = cast<double>(in.g),
         bd = cast<double>(in.beta);
    ref_result r{std::vector<double>(in.out_size()), cast<double>(state0)};
    kernels::gated_delta_rule_ref<double>(
        batch, tensor_view<const double, 3>(qd.data(), {in.n, in.Hk, in.dk}),
        tensor_view<const double, 3>(kd.data(), {in.n, in.Hk, in.dk}),
        tensor_view<const double, 3>(vd.data(), {in.n, in.Hv, in.dv}), tensor_view<const double, 2>(gd.data(), {in.n, in.Hv}),
        tensor_view<const double, 2>(bd.data(), {in.n, in.Hv}), 1.0 / std::sqrt(static_cast<double>(in.dk)),
        tensor_view<double, 4>(r.state.data(), {S, in.Hv, in.dk, in.dv}), tensor_view<double, 3>(r.o.data(), {in.n, in.Hv, in.dv}));
    return r;
}

/// Inputs restricted to rows [r0, r0 + len).
inputs slice(const inputs& in, std::int64_t r0, std::int64_t len) {
    inputs s = in;
    s.n = len;
    auto cut = [&](const std::vector<float>& x, std::int64_t w) {
        return std::vector<float>(x.begin() + r0 * w, x.begin() + (r0 + len) * w);
    };
    s.q = cut(in.q, in.Hk * in.dk);
    s.k = cut(in.k, in.Hk * in.dk);
    s.v = cut(in.v, in.Hv * in.dv);
    s.g = cut(in.g, in.Hv);
    s.beta = cut(in.beta, in.Hv);
    return s;
}

bool all_finite(const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

}  // namespace

TEST_CASE("chunked and step equal the fp64 recurrence (invariant 6)") {
    // Odd sizes, grouped value heads (H_v = 2 H_k), d_k != d_v; d_v = 133 also runs the step's column tiles (128 or
    // 4 × 32 columns) and their scalar tail.
    for (std::int64_t dv : {11, 133})
    for (std::int64_t T : {1, 5, 50, 100}) {
        for (std::int64_t C : {4, 16, 64}) {
            for (bool nonzero_state : {false, true}) {
                CAPTURE(T);
                CAPTURE(C);
                CAPTURE(nonzero_state);
                CAPTURE(dv);
                inputs in(T, 2, 4, 13, dv, std::uint64_t(100 + T * 7 + C + dv));
                std::vector<float> s0(in.state_size(1), 0.f);
                if (nonzero_state) s0 = hymix::test::uniform(in.state_size(1), -0.5f, 0.5f, 9 + T);
                const auto ref = run_ref(in, seq_batch::dense(1, T), s0, 1);
                auto sc = s0;
                const auto oc = run(path::chunked, in, seq_batch::dense(1, T), sc, 1, C);
                CHECK(rel_error(oc, ref.o) < 2e-6);
                CHECK(rel_error(sc, ref.state) < 2e-6);
                // Step path, one token per call.
                auto ss = s0;
                std::vector<float> os;
                for (std::int64_t t = 0; t < T; ++t) {
                    const auto o = run(path::step, slice(in, t, 1), seq_batch::dense(1, 1), ss, 1);
                    os.insert(os.end(), o.begin(), o.end());
                }
                CHECK(rel_error(os, ref.o) < 2e-6);
                CHECK(rel_error(ss, ref.state) < 2e-6);
            }
        }
    }
}

TEST_CASE("split invariance (invariant 5)") {
    // H = 2, d_k = d_v = 16, T = 20, g in [-2, 0).
    inputs in(20, 2, 2, 16, 16, 555, -2.f, -1e-6f);
    const auto s0 = hymix::test::uniform(in.state_size(1), -0.3f, 0.3f, 556);
    for (std::int64_t C : {4, 8, 64}) {
        auto s_one = s0;
        const auto o_one = run(path::chunked, in, seq_batch::dense(1, 20), s_one, 1, C);
        const auto ref = run_ref(in, seq_batch::dense(1, 20), s0, 1);
        CHECK(rel_error(o_one, ref.o) < 2e-6);
        for (const std::vector<std::int64_t>& split : {std::vector<std::int64_t>{8, 8, 4}, {1, 19}, {2, 18}, {19, 1}, {3, 1, 1, 15}}) {
            CAPTURE(C);
            CAPTURE(split.size());
            CAPTURE(split[0]);
            auto s = s0;
            std::vector<float> o;
            std::int64_t r0 = 0;
            for (auto len : split) {
                const auto part = slice(in, r0, len);
                // A one-token part goes through the step kernel, the rest through the chunked one.
                const auto op = run(len == 1 ? path::step : path::chunked, part, seq_batch::dense(1, len), s, 1, C);
                o.insert(o.end(), op.begin(), op.end());
                r0 += len;
            }
            CHECK(rel_error(o, o_one) < 1e-6);
            CHECK(rel_error(s, s_one) < 1e-6);
            CHECK(rel_error(o, ref.o) < 2e-6);
        }
    }
}

TEST_CASE("state pass-through: T = 0 and continuation (invariant 7)") {
    inputs in(30, 1, 3, 8, 6, 77);
    const auto s0 = hymix::test::uniform(in.state_size(2), -1.f, 1.f, 78);
    // T = 0: a batch whose sequence has no tokens leaves the state unchanged (bit-identical).
    {
        auto s = s0;
        seq_batch b;
        b.add(0, 0, 1);
        b.n_rows = 0;
        inputs empty = slice(in, 0, 0);
        run(path::chunked, empty, b, s, 2);
        CHECK(s == s0);
        run(path::ref, empty, b, s, 2);
        CHECK(s == s0);
    }
    // State after 12 tokens as initial state for the remaining 18 equals the tail of the 30-token run.
    auto s_full = s0;
    const auto o_full = run(path::chunked, in, seq_batch::dense(1, 30), s_full, 2, 8);
    auto s = s0;
    run(path::chunked, slice(in, 0, 12), seq_batch::dense(1, 12), s, 2, 8);
    const auto o_tail = run(path::chunked, slice(in, 12, 18), seq_batch::dense(1, 18), s, 2, 8);
    const std::vector<float> want(o_full.begin() + 12 * 3 * 6, o_full.end());
    CHECK(rel_error(o_tail, want) < 1e-6);
    CHECK(rel_error(s, s_full) < 1e-6);
    // Slot 1 was never touched by the dense batch (slot 0 only).
    CHECK(std::equal(s.begin() + in.state_size(1), s.end(), s0.begin() + in.state_size(1)));
}

TEST_CASE("extreme log-decay: finite, accurate, causal (invariant 13)") {
    // H = 2, T = 128, C = 64, g in [-20, -1e-4] with a few -20 and one -300.
    inputs in(128, 2, 2, 16, 16, 1313, -20.f, -1e-4f);
    for (std::int64_t t : {3, 40, 63, 64, 100}) in.g[static_cast<std::size_t>(t * 2)] = -20.f;
    in.g[static_cast<std::size_t>(70 * 2 + 1)] = -300.f;
    // Many tiny decays, so exp(γ_i − γ_j) matters over long spans.
    for (std::int64_t t = 80; t < 128; ++t) in.g[static_cast<std::size_t>(t * 2 + 1)] = -1e-4f;
    const auto s0 = hymix::test::uniform(in.state_size(1), -1.f, 1.f, 1314);
    const auto ref = run_ref(in, seq_batch::dense(1, 128), s0, 1);
    auto sc = s0;
    const auto oc = run(path::chunked, in, seq_batch::dense(1, 128), sc, 1, 64);
    CHECK(all_finite(oc));
    CHECK(all_finite(sc));
    CHECK(rel_error(oc, ref.o) < 2e-6);
    CHECK(rel_error(sc, ref.state) < 2e-6);
    auto ss = s0;
    std::vector<float> os;
    for (std::int64_t t = 0; t < 128; ++t) {
        const auto o = run(path::step, slice(in, t, 1), seq_batch::dense(1, 1), ss, 1);
        os.insert(os.end(), o.begin(), o.end());
    }
    CHECK(rel_error(os, ref.o) < 2e-6);
    // Causality: perturbing g, k, v or β at positions >= t0 leaves outputs before t0 bit-identical.
    for (std::int64_t t0 : {1, 30, 64, 65, 127}) {
        for (int which = 0; which < 4; ++which) {
            CAPTURE(t0);
            CAPTURE(which);
            inputs p = in;
            std::mt19937 gen(static_cast<unsigned>(t0 * 4 + which));
            std::uniform_real_distribution<float> d(-3.f, 3.f);
            for (std::int64_t t = t0; t < 128; ++t) {
                for (std::int64_t h = 0; h < 2; ++h) {
                    const auto i = static_cast<std::size_t>(t * 2 + h);
                    if (which == 0) p.g[i] = -std::abs(d(gen)) * 10.f;
                    if (which == 3) p.beta[i] = std::abs(d(gen)) / 3.f;
                    for (std::int64_t a = 0; a < 16; ++a) {
                        if (which == 1) p.k[i * 16 + a] = d(gen);
                        if (which == 2) p.v[i * 16 + a] = d(gen) * 100.f;
                    }
                }
            }
            if (which == 1) p.normalise(p.k, static_cast<std::size_t>(t0 * 2 * 16));
            auto s = s0;
            const auto op = run(path::chunked, p, seq_batch::dense(1, 128), s, 1, 64);
            const std::size_t prefix = static_cast<std::size_t>(t0 * 2 * 16);
            CHECK(std::equal(op.begin(), op.begin() + prefix, oc.begin()));
            CHECK_FALSE(std::equal(op.begin() + prefix, op.end(), oc.begin() + prefix));
        }
    }
}

TEST_CASE("gate limits (invariant 14)") {
    // B = H = 1, T = 100, d = 32.
    const std::int64_t T = 100, d = 32;
    SUBCASE("g = 0 is the ungated delta rule, error not growing with T") {
        inputs in(T, 1, 1, d, d, 1400, 0.f, 0.f);
        std::fill(in.g.begin(), in.g.end(), 0.f);
        std::vector<float> s0(in.state_size(1), 0.f);
        const auto ref = run_ref(in, seq_batch::dense(1, T), s0, 1);
        for (path p : {path::chunked, path::step}) {
            auto s = s0;
            std::vector<float> o;
            if (p == path::chunked) {
                o = run(p, in, seq_batch::dense(1, T), s, 1, 16);
            } else {
                for (std::int64_t t = 0; t < T; ++t) {
                    const auto ot = run(p, slice(in, t, 1), seq_batch::dense(1, 1), s, 1);
                    o.insert(o.end(), ot.begin(), ot.end());
                }
            }
            const std::size_t half = static_cast<std::size_t>(T / 2 * d);
            const double e1 = rel_error(o.data(), ref.o.data(), half);
            const double e2 = rel_error(o.data() + half, ref.o.data() + half, half);
            CHECK(e1 < 2e-6);
            CHECK(e2 < 2e-6);
            CHECK(rel_error(s, ref.state) < 2e-6);
        }
    }
    SUBCASE("g = -30 forgets everything: o_t = β_t (q_t·k_t) v_t / sqrt(d_k)") {
        inputs in(T, 1, 1, d, d, 1401);
        std::fill(in.g.begin(), in.g.end(), -30.f);
        for (path p : {path::chunked, path::step}) {
            std::vector<float> s = hymix::test::uniform(in.state_size(1), -1.f, 1.f, 3);
            std::vector<float> o;
            if (p == path::chunked) {
                o = run(p, in, seq_batch::dense(1, T), s, 1, 64);
            } else {
                for (std::int64_t t = 0; t < T; ++t) {
                    const auto ot = run(p, slice(in, t, 1), seq_batch::dense(1, 1), s, 1);
                    o.insert(o.end(), ot.begin(), ot.end());
                }
            }
            std::vector<double> want(o.size());
            for (std::int64_t t = 0; t < T; ++t) {
                double qk = 0;
                for (std::int64_t a = 0; a < d; ++a) qk += double(in.q[t * d + a]) * in.k[t * d + a];
                for (std::int64_t b = 0; b < d; ++b)
                    want[t * d + b] = in.beta[t] * qk * in.v[t * d + b] / std::sqrt(double(d));
            }
            CHECK(rel_error(o, want) < 1e-6);
        }
    }
    SUBCASE("g = -1e-6 is accurate") {
        inputs in(T, 1, 1, d, d, 1402);
        std::fill(in.g.begin(), in.g.end(), -1e-6f);
        const auto s0 = hymix::test::uniform(in.state_size(1), -1.f, 1.f, 4);
        const auto ref = run_ref(in, seq_batch::dense(1, T), s0, 1);
        auto s = s0;
        const auto o = run(path::chunked, in, seq_batch::dense(1, T), s, 1, 64);
        CHECK(rel_error(o, ref.o) < 2e-6);
        CHECK(rel_error(s, ref.state) < 2e-6);
    }
}

TEST_CASE("bounded delta-rule state and agreement with fp64 (invariant 15)") {
    // L2-normalised q/k, g in U[-20, -1e-4], v in U[-0.3, 5], β in U[0, 1]; H = 4, d = 64.
    for (std::int64_t T : {255, 256, 257}) {
        CAPTURE(T);
        inputs in(T, 4, 4, 64, 64, 1500 + T, -20.f, -1e-4f, -0.3f, 5.f);
        std::vector<float> s0(in.state_size(1), 0.f);
        const auto ref = run_ref(in, seq_batch::dense(1, T), s0, 1);
        auto s = s0;
        const auto o = run(path::chunked, in, seq_batch::dense(1, T), s, 1, 64);
        CHECK(all_finite(o));
        CHECK(rel_error(o, ref.o) < 1e-5);
        CHECK(rel_error(s, ref.state) < 1e-5);
    }
    // ‖S_t‖_F ≤ ‖S_{t−1}‖_F + β_t ‖v_t‖, checked per head along a step-by-step fp64 run.
    inputs in(120, 1, 2, 24, 24, 1510, -20.f, -1e-4f, -0.3f, 5.f);
    std::vector<float> sf(in.state_size(1), 0.f);
    std::vector<double> prev(in.state_size(1), 0.0);
    bool bounded = true;
    for (std::int64_t t = 0; t < in.n; ++t) {
        const auto r = run_ref(slice(in, t, 1), seq_batch::dense(1, 1), sf, 1);
        for (std::int64_t h = 0; h < 2; ++h) {
            const std::size_t off = static_cast<std::size_t>(h * 24 * 24), len = 24 * 24;
            auto fro = [&](const std::vector<double>& x) {
                double s = 0;
                for (std::size_t i = off; i < off + len; ++i) s += x[i] * x[i];
                return std::sqrt(s);
            };
            double vn = 0;
            for (std::int64_t b = 0; b < 24; ++b) vn += double(in.v[(t * 2 + h) * 24 + b]) * in.v[(t * 2 + h) * 24 + b];
            if (fro(r.state) > fro(prev) + in.beta[t * 2 + h] * std::sqrt(vn) + 1e-9) bounded = false;
        }
        prev = r.state;
        sf.assign(r.state.begin(), r.state.end());
    }
    CHECK(bounded);
}

TEST_CASE("varlen isolation: packed sequences, slots, invalid entries (invariant 16)") {
    // Lengths [5, 3, 9] packed into 17 (chunk 8), plus a 15-token dummy sequence with values x1e3.
    const std::vector<std::int64_t> cu{0, 5, 8, 17, 32};
    inputs in(32, 2, 2, 8, 8, 1600);
    for (std::size_t i = static_cast<std::size_t>(17 * 2 * 8); i < in.v.size(); ++i) in.v[i] *= 1e3f;
    const std::int64_t S = 6;
    const auto s0 = hymix::test::uniform(in.state_size(S), -1.f, 1.f, 1601);
    const std::vector<std::int64_t> slots{4, 0, 2, 5};
    for (path p : {path::chunked, path::ref}) {
        auto s = s0;
        const auto o = run(p, in, seq_batch::packed(cu, slots), s, S, 8);
        for (std::size_t i = 0; i < 4; ++i) {
            CAPTURE(i);
            const std::int64_t len = cu[i + 1] - cu[i];
            std::vector<float> solo_state(s0.begin() + slots[i] * in.state_size(1), s0.begin() + (slots[i] + 1) * in.state_size(1));
            const auto o_solo = run(p, slice(in, cu[i], len), seq_batch::dense(1, len), solo_state, 1, 8);
            const std::size_t w = static_cast<std::size_t>(2 * 8);
            const std::vector<float> got(o.begin() + cu[i] * w, o.begin() + cu[i + 1] * w);
            CHECK(rel_error(got, o_solo) < 1e-6);
            const std::vector<float> got_state(s.begin() + slots[i] * in.state_size(1), s.begin() + (slots[i] + 1) * in.state_size(1));
            CHECK(rel_error(got_state, solo_state) < 1e-6);
        }
        // Untouched slots 1 and 3 stay bit-identical.
        for (std::int64_t u : {1, 3})
            CHECK(std::equal(s.begin() + u * in.state_size(1), s.begin() + (u + 1) * in.state_size(1), s0.begin() + u * in.state_size(1)));
    }
    // Reordered batch and an invalid entry (slot −1) for the middle sequence: zeros out, slot 0 untouched.
    {
        auto s = s0;
        const std::vector<std::int64_t> slots2{4, -1, 2, 5};
        const auto o = run(path::chunked, in, seq_batch::packed(cu, slots2), s, S, 8);
        for (std::size_t i = static_cast<std::size_t>(5 * 16); i < static_cast<std::size_t>(8 * 16); ++i) CHECK(o[i] == 0.f);
        CHECK(std::equal(s.begin(), s.begin() + in.state_size(1), s0.begin()));
        auto s_ref = s0;
        const auto o_ref = run(path::chunked, in, seq_batch::packed(cu, slots), s_ref, S, 8);
        // Other sequences unchanged, bit-exact (each (sequence, head) is computed independently).
        CHECK(std::equal(o.begin(), o.begin() + 5 * 16, o_ref.begin()));
        CHECK(std::equal(o.begin() + 8 * 16, o.end(), o_ref.begin() + 8 * 16));
    }
    // Step kernel with slots permuted and an invalid entry.
    {
        inputs d1 = slice(in, 0, 3);
        const std::vector<std::int64_t> sl{3, -1, 1};
        auto s = s0;
        const auto o = run(path::step, d1, seq_batch::decode(sl), s, S);
        auto sr = s0;
        const auto orf = run(path::ref, d1, seq_batch::decode(sl), sr, S);
        CHECK(rel_error(o, orf) < 2e-6);
        CHECK(rel_error(s, sr) < 2e-6);
        for (std::size_t i = 16; i < 32; ++i) CHECK(o[i] == 0.f);
        for (std::int64_t u : {0, 2, 4, 5})
            CHECK(std::equal(s.begin() + u * in.state_size(1), s.begin() + (u + 1) * in.state_size(1), s0.begin() + u * in.state_size(1)));
    }
}

TEST_CASE("right padding with lengths: padding rows are zero and ignored") {
    const std::vector<std::int64_t> lengths{5, 8, 0, 2};
    inputs in(4 * 8, 1, 2, 8, 8, 1700);
    for (std::size_t i = 0; i < in.v.size(); ++i)  // NaN in padding must not leak
        if ((i / 16) % 8 >= static_cast<std::size_t>(lengths[(i / 16) / 8])) in.v[i] = std::nanf("");
    std::vector<float> s(in.state_size(4), 0.f);
    const auto o = run(path::chunked, in, seq_batch::padded(8, lengths), s, 4, 4);
    CHECK(all_finite(o));
    for (std::int64_t b = 0; b < 4; ++b) {
        CAPTURE(b);
        std::vector<float> solo(in.state_size(1), 0.f);
        const auto os = run(path::chunked, slice(in, b * 8, lengths[b]), seq_batch::dense(1, lengths[b]), solo, 1, 4);
        const std::vector<float> got(o.begin() + b * 8 * 16, o.begin() + (b * 8 + lengths[b]) * 16);
        CHECK(rel_error(got, os) < 1e-6);
        for (std::int64_t t = lengths[b]; t < 8; ++t)
            for (std::int64_t i = 0; i < 16; ++i) CHECK(o[(b * 8 + t) * 16 + i] == 0.f);
    }
}

TEST_CASE("thread count does not change results") {
    inputs in(77, 2, 4, 16, 16, 1800);
    std::vector<float> s1(in.state_size(1), 0.f), s2 = s1;
    const auto o1 = run(path::chunked, in, seq_batch::dense(1, 77), s1, 1, 16, 1);
    const auto o2 = run(path::chunked, in, seq_batch::dense(1, 77), s2, 1, 16, 2);
    CHECK(o1 == o2);
    CHECK(s1 == s2);
}

TEST_CASE("bad arguments throw") {
    cpu_backend be(1);
    inputs in(4, 2, 4, 8, 8, 1900);
    std::vector<float> st(in.state_size(2), 0.f), o(in.out_size());
    tensor_view<const float, 3> q(in.q.data(), {4, 2, 8}), k(in.k.data(), {4, 2, 8}), v(in.v.data(), {4, 4, 8});
    tensor_view<const float, 2> g(in.g.data(), {4, 4}), b(in.beta.data(), {4, 4});
    tensor_view<float, 4> s(st.data(), {2, 4, 8, 8});
    tensor_view<float, 3> ov(o.data(), {4, 4, 8});
    // Step given a 2-token sequence.
    CHECK_THROWS_AS(kernels::gated_delta_rule_step(be, seq_batch::dense(2, 2), q, k, v, g, b, 0.3f, s, ov), shape_error);
    // Wrong state head count.
    tensor_view<float, 4> s_bad(st.data(), {2, 2, 8, 16});
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked(be, seq_batch::dense(1, 4), q, k, v, g, b, 0.3f, s_bad, ov), shape_error);
    // Slot beyond the state.
    const std::vector<std::int64_t> slots{5};
    seq_batch sb = seq_batch::decode(slots);
    sb.n_rows = 4;
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked(be, sb, q, k, v, g, b, 0.3f, s, ov), shape_error);
    // H_v not a multiple of H_k: 3 value heads over 2 key heads.
    std::vector<float> v3(4 * 3 * 8), g3(12), b3(12), st3(2 * 3 * 64), o3(4 * 3 * 8);
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked(be, seq_batch::dense(1, 4), q, k, tensor_view<const float, 3>(v3.data(), {4, 3, 8}),
                                                      tensor_view<const float, 2>(g3.data(), {4, 3}),
                                                      tensor_view<const float, 2>(b3.data(), {4, 3}), 0.3f,
                                                      tensor_view<float, 4>(st3.data(), {2, 3, 8, 8}),
                                                      tensor_view<float, 3>(o3.data(), {4, 3, 8})),
                    config_error);
    // Token-count mismatch between x-like inputs and the batch.
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked(be, seq_batch::dense(1, 3), q, k, v, g, b, 0.3f, s, ov), shape_error);
    CHECK_THROWS_AS(kernels::gated_delta_rule_chunked(be, seq_batch::dense(1, 4), q, k, v, g, b, 0.3f, s, ov, 0), config_error);
}

TEST_CASE("log-decay and beta helpers (invariant 11)") {
    // raw {−5, 0, 5} with A_log = 0, dt_bias = 0, floor 0.1: {−0.1, −0.693, −5.007}.
    const float want[3] = {-0.1f, -0.693147f, -5.006715f};
    const float raw[3] = {-5.f, 0.f, 5.f};
    for (int i = 0; i < 3; ++i) {
        const float gv = kernels::gdn_log_decay(raw[i], 0.f, 0.f, 0.1f);
        CHECK(gv == doctest::Approx(want[i]).epsilon(1e-5));
        CHECK(gv <= -0.1f);
        CHECK(std::exp(gv) > 0.f);
        CHECK(std::exp(gv) <= 1.f);
    }
    // Without a floor: g = −exp(A_log)·softplus(a + dt_bias), finite for extreme inputs, decay in [0, 1].
    for (float a : {-100.f, -20.f, 0.f, 19.9f, 20.1f, 100.f}) {
        const float gv = kernels::gdn_log_decay(a, 1.f, std::log(16.f));
        CHECK(std::isfinite(gv));
        CHECK(gv <= 0.f);
        CHECK(std::exp(gv) <= 1.f);
    }
    CHECK(kernels::gdn_log_decay(0.5f, 1.f, std::log(3.f)) == doctest::Approx(-3.0 * std::log1p(std::exp(1.5))).epsilon(1e-6));
    CHECK(kernels::gdn_beta(0.f, false) == doctest::Approx(0.5));
    CHECK(kernels::gdn_beta(0.f, true) == doctest::Approx(1.0));
    CHECK(kernels::gdn_beta(100.f, true) == doctest::Approx(2.0));
}

TEST_CASE("every view argument's stride assumption is checked, naming the argument (issue 11)") {
    cpu_backend be(1);
    const std::int64_t n = 4, Hk = 2, Hv = 4, d = 8;
    inputs in(n, Hk, Hv, d, d, 1950);
    std::vector<float> st(in.state_size(1), 0.f), o(in.out_size()), wide(std::size_t(4 * n * Hv * d * d));
    const tensor_view<const float, 3> q(in.q.data(), {n, Hk, d}), k(in.k.data(), {n, Hk, d}), v(in.v.data(), {n, Hv, d});
    const tensor_view<const float, 2> g(in.g.data(), {n, Hv}), b(in.beta.data(), {n, Hv});
    const tensor_view<float, 4> s(st.data(), {1, Hv, d, d});
    const tensor_view<float, 3> ov(o.data(), {n, Hv, d});
    const tensor_view<const float, 3> q_bad(wide.data(), {n, Hk, d}, {2 * Hk * d, 2 * d, 2}), v_bad(wide.data(), {n, Hv, d}, {2 * Hv * d, 2 * d, 2});
    const tensor_view<float, 3> o_bad(wide.data(), {n, Hv, d}, {2 * Hv * d, 2 * d, 2});
    const tensor_view<float, 4> s_bad(wide.data(), {1, Hv, d, d}, {Hv * d * d, d * d, 1, d});  // each matrix transposed
    using doctest::Contains;
    auto all = [&](auto&& call, const char* name) {
        CAPTURE(name);
        CHECK_THROWS_WITH_AS(call(0), Contains(name), shape_error);
        CHECK_THROWS_WITH_AS(call(1), Contains(name), shape_error);
    };
    const auto batch = seq_batch::dense(1, n);
    std::vector<std::int64_t> slot0{0};
    seq_batch dec = seq_batch::decode(slot0);
    auto run_with = [&](tensor_view<const float, 3> qq, tensor_view<const float, 3> kk, tensor_view<const float, 3> vv, tensor_view<float, 4> ss,
                        tensor_view<float, 3> oo) {
        return [=, &be](int which) {
            if (which == 0) kernels::gated_delta_rule_chunked(be, batch, qq, kk, vv, g, b, 0.3f, ss, oo);
            else
                kernels::gated_delta_rule_step(be, dec, qq.slice(0, 1), kk.slice(0, 1), vv.slice(0, 1), g.slice(0, 1), b.slice(0, 1), 0.3f,
                                               ss, oo.slice(0, 1));
        };
    };
    all(run_with(q_bad, k, v, s, ov), "q [n_rows, H_k, d_k] needs a unit stride");
    all(run_with(q, q_bad, v, s, ov), "k [n_rows, H_k, d_k] needs a unit stride");
    all(run_with(q, k, v_bad, s, ov), "v [n_rows, H_v, d_v] needs a unit stride");
    all(run_with(q, k, v, s, o_bad), "o [n_rows, H_v, d_v] needs a unit stride");
    all(run_with(q, k, v, s_bad, ov), "state [S, H_v, d_k, d_v] matrix");
    // g and β are read element by element: a transposed g is fine.
    std::vector<float> gT(in.g.size());
    for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t h = 0; h < Hv; ++h) gT[std::size_t(h * n + t)] = in.g[std::size_t(t * Hv + h)];
    std::vector<float> o2(o.size()), st2(st.size(), 0.f);
    kernels::gated_delta_rule_chunked(be, batch, q, k, v, tensor_view<const float, 2>(gT.data(), {n, Hv}, {1, n}), b, 0.3f, s, ov);
    kernels::gated_delta_rule_chunked(be, batch, q, k, v, g, b, 0.3f, tensor_view<float, 4>(st2.data(), {1, Hv, d, d}),
                                      tensor_view<float, 3>(o2.data(), {n, Hv, d}));
    CHECK(o == o2);
    CHECK(st == st2);
}

TEST_CASE("a positive log-decay is a value_error in release builds; padding, invalid entries and NaN pass (issue 11)") {
    cpu_backend be(1);
    const std::int64_t n = 12, Hk = 1, Hv = 2, d = 4;
    using doctest::Contains;
    const std::vector<std::int64_t> cu{0, 5, 9}, slots{0, 1};
    seq_batch batch = seq_batch::packed(cu, slots);
    batch.n_rows = n;  // rows 9..11 are padding
    for (path p : {path::chunked, path::ref}) {
        CAPTURE(int(p));
        inputs in(n, Hk, Hv, d, d, 1960);
        in.g[std::size_t(6 * Hv + 1)] = 1e-3f;  // row 6 (sequence 1), head 1
        std::vector<float> st(in.state_size(2), 0.f);
        CHECK_THROWS_WITH_AS(run(p, in, batch, st, 2, 4), Contains("g[6, 1]"), value_error);
        // The same value on a padding row, or in a sequence whose slot is −1, is not read.
        inputs ok(n, Hk, Hv, d, d, 1960);
        ok.g[std::size_t(10 * Hv + 1)] = 2.f;
        ok.g[std::size_t(6 * Hv + 1)] = 2.f;
        const std::vector<std::int64_t> skip{0, -1};
        seq_batch b2 = seq_batch::packed(cu, skip);
        b2.n_rows = n;
        CHECK_NOTHROW(run(p, ok, b2, st, 2, 4));
    }
    // Step: the row of each sequence.
    inputs one(2, Hk, Hv, d, d, 1961);
    one.g[3] = 0.5f;  // row 1, head 1
    const std::vector<std::int64_t> dslots{1, 0};
    std::vector<float> st(one.state_size(2), 0.f);
    CHECK_THROWS_WITH_AS(run(path::step, one, seq_batch::decode(dslots), st, 2), Contains("g[1, 1]"), value_error);
    // A NaN log-decay is let through and stays in its own sequence: the other sequence equals its solo run.
    inputs nan(n, Hk, Hv, d, d, 1962);
    nan.g[std::size_t(2 * Hv)] = std::nanf("");  // sequence 0
    std::vector<float> s2(nan.state_size(2), 0.f);
    const auto o = run(path::chunked, nan, batch, s2, 2, 4);
    CHECK(std::isnan(o[std::size_t(2 * Hv * d)]));
    std::vector<float> solo(nan.state_size(1), 0.f);
    const auto o_solo = run(path::chunked, slice(nan, 5, 4), seq_batch::dense(1, 4), solo, 1, 4);
    CHECK(std::equal(o_solo.begin(), o_solo.end(), o.begin() + 5 * Hv * d));
    CHECK(std::equal(solo.begin(), solo.end(), s2.begin() + std::int64_t(nan.state_size(1))));
}
