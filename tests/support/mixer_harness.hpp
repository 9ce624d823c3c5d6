// One test harness for every mixer on every backend: the spec.md §8 invariants written once, as templates over
// (mixer, backend), and instantiated per mixer with HYMIX_MIXER_HARNESS(name, factory). A mixer provides
// `make_ref_state(m, n_slots)` and `layer_ref(m, batch, x, ref_state, y)` (its fp64 whole-layer reference over a
// batch, continuing per-slot states); everything else comes from the mixer concept. Checked here:
//   - agreement with the fp64 layer reference: packed batches in scattered slots of a pool, continuation from
//     non-zero states, decode steps (invariants 6, 16, 19);
//   - split invariance and decode = prefill (3, 4, 5, 7): one call equals any split into calls, and a continuation
//     after either agrees (so the states agree);
//   - packed varlen = separate runs, right padding = packed with exact zeros on padding rows (16, 18);
//   - slot reuse: reset_slot gives a fresh sequence, copy_slot continues identically (19);
//   - causality: later inputs never change earlier outputs, bit for bit (22);
//   - NaN in one sequence stays in that sequence; an empty sequence and slot −1 touch nothing (7, 16);
//   - a one-token sequence beside prefilling ones gets its decode step's bits and leaves the same state (§0);
//   - step() rejects a sequence of more than one token.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "support/random.hpp"

namespace hymix::test {

/// Tolerances of one backend against the fp64 layer reference and between two runs of its own.
struct harness_tolerance {
    double vs_reference;  // relative Frobenius error per sequence
    double self;          // split vs one call, decode vs prefill, packed vs separate
};
inline constexpr harness_tolerance cpu_tolerance{1e-5, 1e-5};
inline constexpr harness_tolerance reference_tolerance{1e-6, 1e-6};

template <class M, class B>
struct mixer_harness {
    const M& m;
    const B& be;
    harness_tolerance tol;
    std::int64_t d = m.config().d_model;

    std::vector<float> random_rows(std::int64_t n, std::uint64_t seed) const {
        return uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, seed);
    }
    /// y [n_rows, d] = m.forward(x) on `st`.
    std::vector<float> run(typename M::state_type& st, const seq_batch& b, const std::vector<float>& x) const {
        std::vector<float> y(static_cast<std::size_t>(b.n_rows * d), -7.f);
        m.forward(be, st, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(y.data(), {b.n_rows, d}));
        return y;
    }
    std::vector<double> run_ref(auto& rst, const seq_batch& b, const std::vector<float>& x) const {
        std::vector<double> xd(x.begin(), x.end()), y(static_cast<std::size_t>(b.n_rows * d));
        layer_ref(m, b, tensor_view<const double, 2>(xd.data(), {b.n_rows, d}), rst, tensor_view<double, 2>(y.data(), {b.n_rows, d}));
        return y;
    }
    template <class VA, class VB>
    static double seq_error(const VA& a, const VB& ref, std::int64_t row0, std::int64_t rows, std::int64_t d) {
        return rel_error(a.data() + row0 * d, ref.data() + row0 * d, static_cast<std::size_t>(rows * d));
    }
    static std::vector<float> rows_of(const std::vector<float>& v, std::int64_t r0, std::int64_t n, std::int64_t d) {
        return std::vector<float>(v.begin() + r0 * d, v.begin() + (r0 + n) * d);
    }

    // ---- invariants ---------------------------------------------------------------------------------------------

    void matches_reference() const {
        const std::int64_t S = 8;
        auto st = m.make_state(S);
        auto rst = make_ref_state(m, S);
        const std::vector<std::int64_t> slots{5, 2, 7, 0};
        const std::vector<std::vector<std::int64_t>> rounds{{5, 0, 9, 1}, {3, 4, 2, 6}, {1, 1, 1, 1}, {17, 1, 2, 1}};
        std::uint64_t seed = 100;
        for (const auto& lens : rounds) {
            std::vector<std::int64_t> cu{0};
            for (auto l : lens) cu.push_back(cu.back() + l);
            const auto b = seq_batch::packed(cu, slots);
            const auto x = random_rows(b.n_rows, seed++);
            const auto y = run(st, b, x);
            const auto yr = run_ref(rst, b, x);
            for (std::size_t i = 0; i < lens.size(); ++i) {
                if (lens[i] == 0) continue;
                const double e = seq_error(y, yr, cu[i], lens[i], d);
                INFO("sequence " << i << " of a round with " << lens.size() << " sequences, rel error " << e);
                CHECK(e <= tol.vs_reference);
            }
        }
    }

    void split_invariance() const {
        const std::int64_t T = 23;
        const auto x = random_rows(T, 200);
        const auto nxt = random_rows(1, 201);
        auto whole = m.make_state(1);
        const auto y1 = run(whole, seq_batch::dense(1, T), x);
        const auto c1 = run(whole, seq_batch::dense(1, 1), nxt);
        for (const auto& parts : std::vector<std::vector<std::int64_t>>{{1, 22}, {7, 9, 7}, {15, 1, 1, 6}, {22, 1}}) {
            auto st = m.make_state(1);
            std::vector<float> y;
            std::int64_t r = 0;
            for (auto p : parts) {
                const auto yp = run(st, seq_batch::dense(1, p), rows_of(x, r, p, d));
                y.insert(y.end(), yp.begin(), yp.end());
                r += p;
            }
            const auto c = run(st, seq_batch::dense(1, 1), nxt);
            INFO("split into " << parts.size() << " calls, first " << parts[0]);
            CHECK(rel_error(y, y1) <= tol.self);
            CHECK(rel_error(c, c1) <= tol.self);
        }
    }

    void decode_equals_prefill() const {
        const std::int64_t T = 15;
        const auto x = random_rows(T, 300);
        auto a = m.make_state(1);
        const auto ya = run(a, seq_batch::dense(1, T), x);
        auto b = m.make_state(1);
        auto yb = run(b, seq_batch::dense(1, 10), rows_of(x, 0, 10, d));
        for (std::int64_t t = 10; t < T; ++t) {
            std::vector<float> y1(static_cast<std::size_t>(d));
            const auto xt = rows_of(x, t, 1, d);
            m.step(be, b, seq_batch::dense(1, 1), tensor_view<const float, 2>(xt.data(), {1, d}), tensor_view<float, 2>(y1.data(), {1, d}));
            yb.insert(yb.end(), y1.begin(), y1.end());
        }
        CHECK(rel_error(yb, ya) <= tol.self);
        // the step path rejects more than one token per sequence
        std::vector<float> x2 = random_rows(2, 301), y2(static_cast<std::size_t>(2 * d));
        CHECK_THROWS_AS(m.step(be, b, seq_batch::dense(1, 2), tensor_view<const float, 2>(x2.data(), {2, d}),
                               tensor_view<float, 2>(y2.data(), {2, d})),
                        shape_error);
    }

    void packed_and_padded() const {
        const std::vector<std::int64_t> lens{5, 3, 9};
        const std::vector<std::int64_t> cu{0, 5, 8, 17};
        const auto x = random_rows(17, 400);
        auto st = m.make_state(3);
        const auto y = run(st, seq_batch::packed(cu), x);
        for (std::size_t i = 0; i < lens.size(); ++i) {
            auto s1 = m.make_state(1);
            const auto yi = run(s1, seq_batch::dense(1, lens[i]), rows_of(x, cu[i], lens[i], d));
            INFO("sequence " << i);
            CHECK(rel_error(rows_of(y, cu[i], lens[i], d), yi) <= tol.self);
        }
        // right padding to 9 rows per sequence; padding rows give exact zeros
        const std::int64_t Tp = 9;
        std::vector<float> xp(static_cast<std::size_t>(3 * Tp * d), 0.5f);  // padding rows hold garbage, not zeros
        for (std::size_t i = 0; i < lens.size(); ++i)
            std::copy_n(x.begin() + cu[i] * d, lens[i] * d, xp.begin() + static_cast<std::int64_t>(i) * Tp * d);
        auto sp = m.make_state(3);
        const auto yp = run(sp, seq_batch::padded(Tp, lens), xp);
        for (std::size_t i = 0; i < lens.size(); ++i) {
            const std::int64_t r0 = static_cast<std::int64_t>(i) * Tp;
            CHECK(rel_error(rows_of(yp, r0, lens[i], d), rows_of(y, cu[i], lens[i], d)) <= tol.self);
            for (std::int64_t r = r0 + lens[i]; r < r0 + Tp; ++r)
                for (std::int64_t c = 0; c < d; ++c) REQUIRE(yp[static_cast<std::size_t>(r * d + c)] == 0.f);
        }
    }

    void slots_and_empty_entries() const {
        const auto a = random_rows(6, 500), bx = random_rows(4, 501), nxt = random_rows(1, 502);
        // reset_slot gives a fresh sequence
        auto st = m.make_state(4);
        const std::int64_t s2 = 2;
        (void)run(st, seq_batch::packed(std::vector<std::int64_t>{0, 6}, std::vector<std::int64_t>{s2}), a);
        st.reset_slot(2);
        const auto yb = run(st, seq_batch::packed(std::vector<std::int64_t>{0, 4}, std::vector<std::int64_t>{s2}), bx);
        auto fresh = m.make_state(4);
        const auto yf = run(fresh, seq_batch::packed(std::vector<std::int64_t>{0, 4}, std::vector<std::int64_t>{s2}), bx);
        CHECK(yb == yf);
        // copy_slot continues identically
        st.copy_slot(2, 3);
        const auto c2 = run(st, seq_batch::packed(std::vector<std::int64_t>{0, 1}, std::vector<std::int64_t>{2}), nxt);
        const auto c3 = run(st, seq_batch::packed(std::vector<std::int64_t>{0, 1}, std::vector<std::int64_t>{3}), nxt);
        CHECK(c2 == c3);
        // an empty sequence and an entry with slot -1 leave the states as they were and give zero rows
        auto e1 = m.make_state(2), e2 = m.make_state(2);
        const auto pre = random_rows(5, 503);
        (void)run(e1, seq_batch::dense(1, 5), pre);
        (void)run(e2, seq_batch::dense(1, 5), pre);
        seq_batch odd;
        odd.add(0, 0, 0);   // empty sequence in slot 0
        odd.add(0, 3, -1);  // skipped entry
        odd.n_rows = 3;
        const auto yo = run(e1, odd, random_rows(3, 504));
        for (auto v : yo) REQUIRE(v == 0.f);
        CHECK(run(e1, seq_batch::dense(1, 1), nxt) == run(e2, seq_batch::dense(1, 1), nxt));
        // no rows at all
        auto z = m.make_state(1);
        CHECK(run(z, seq_batch::dense(1, 0), {}).empty());
    }

    void causality_and_nan_isolation() const {
        const std::int64_t T = 20, t0 = 12;
        auto x = random_rows(T, 600);
        auto s1 = m.make_state(1), s2 = m.make_state(1);
        const auto y1 = run(s1, seq_batch::dense(1, T), x);
        auto x2 = x;
        for (std::int64_t i = t0 * d; i < T * d; ++i) x2[static_cast<std::size_t>(i)] = -x2[static_cast<std::size_t>(i)] * 3.f;
        const auto y2 = run(s2, seq_batch::dense(1, T), x2);
        CHECK(rows_of(y1, 0, t0, d) == rows_of(y2, 0, t0, d));
        // NaN in one packed sequence: the other sequence is unchanged, the poisoned one does not hide it
        const std::vector<std::int64_t> cu{0, 6, 13};
        auto xa = random_rows(13, 601);
        auto xb = xa;
        xb[static_cast<std::size_t>(2 * d + 1)] = std::numeric_limits<float>::quiet_NaN();
        auto sa = m.make_state(2), sb = m.make_state(2);
        const auto ya = run(sa, seq_batch::packed(cu), xa);
        const auto yb = run(sb, seq_batch::packed(cu), xb);
        const auto r1a = rows_of(ya, 6, 7, d), r1b = rows_of(yb, 6, 7, d);
        CHECK(rel_error(r1b, r1a) <= tol.self);
        for (auto v : r1b) REQUIRE(std::isfinite(v));
        bool poisoned = false;
        for (std::int64_t i = 2 * d; i < 6 * d; ++i) poisoned = poisoned || !std::isfinite(yb[static_cast<std::size_t>(i)]);
        CHECK(poisoned);
    }

    /// A one-token sequence (a continuation, or a fresh sequence) that shares a forward call with prefilling
    /// sequences gets the bits step() gives it alone, and leaves the state that step() leaves (batch invariance
    /// across call kinds, spec.md §0).
    void one_token_beside_prefill() const {
        const std::int64_t T = 13, L = 19;
        const auto x = random_rows(T, 700), nxt = random_rows(1, 701), after = random_rows(1, 702), other = random_rows(L, 703);
        const std::vector<std::int64_t> s0{0}, s1{1};
        auto step = [&](typename M::state_type& st, const std::vector<std::int64_t>& slot, const std::vector<float>& xt) {
            std::vector<float> y(static_cast<std::size_t>(d));
            m.step(be, st, seq_batch::decode(slot), tensor_view<const float, 2>(xt.data(), {1, d}), tensor_view<float, 2>(y.data(), {1, d}));
            return y;
        };
        auto a = m.make_state(3);
        (void)run(a, seq_batch::packed(std::vector<std::int64_t>{0, T}, s0), x);
        const auto r1 = step(a, s0, nxt), r2 = step(a, s0, after), rf = step(a, s1, nxt);

        auto b = m.make_state(3);
        (void)run(b, seq_batch::packed(std::vector<std::int64_t>{0, T}, s0), x);
        std::vector<float> xm = other;  // [other (slot 2) | nxt (slot 0) | nxt (slot 1, fresh)]
        xm.insert(xm.end(), nxt.begin(), nxt.end());
        xm.insert(xm.end(), nxt.begin(), nxt.end());
        const auto y = run(b, seq_batch::packed(std::vector<std::int64_t>{0, L, L + 1, L + 2}, std::vector<std::int64_t>{2, 0, 1}), xm);
        CHECK(rows_of(y, L, 1, d) == r1);
        CHECK(rows_of(y, L + 1, 1, d) == rf);
        CHECK(step(b, s0, after) == r2);
    }

    void run_all() const {
        SUBCASE("matches the fp64 layer reference (packed, scattered slots, continuation, decode)") { matches_reference(); }
        SUBCASE("split invariance") { split_invariance(); }
        SUBCASE("decode equals prefill") { decode_equals_prefill(); }
        SUBCASE("packed = separate, padded = packed") { packed_and_padded(); }
        SUBCASE("slot reuse, empty entries") { slots_and_empty_entries(); }
        SUBCASE("causality, NaN isolation") { causality_and_nan_isolation(); }
        SUBCASE("a one-token sequence beside prefilling ones = its decode step, bit for bit") { one_token_beside_prefill(); }
    }
};

template <class M, class B>
void run_mixer_harness(const M& m, const B& be, harness_tolerance tol) {
    mixer_harness<M, B>{m, be, tol}.run_all();
}

}  // namespace hymix::test

/// Instantiates the harness for one mixer on the CPU backend (1 and 2 threads) and on the reference backend.
/// FACTORY is an expression (called once per test case) giving the mixer.
#define HYMIX_MIXER_HARNESS(NAME, FACTORY)                                                                      \
    TEST_CASE(NAME ": spec invariants on the CPU backend") {                                                  \
        const auto mixer_ = (FACTORY);                                                                        \
        hymix::test::run_mixer_harness(mixer_, hymix::cpu_backend(2), hymix::test::cpu_tolerance);             \
    }                                                                                                         \
    TEST_CASE(NAME ": spec invariants on the CPU backend, one thread") {                                      \
        const auto mixer_ = (FACTORY);                                                                        \
        hymix::test::run_mixer_harness(mixer_, hymix::cpu_backend(1), hymix::test::cpu_tolerance);             \
    }                                                                                                         \
    TEST_CASE(NAME ": spec invariants on the reference backend") {                                            \
        const auto mixer_ = (FACTORY);                                                                        \
        hymix::test::run_mixer_harness(mixer_, hymix::reference_backend(), hymix::test::reference_tolerance);  \
    }
