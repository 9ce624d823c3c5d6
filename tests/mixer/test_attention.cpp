// The attention mixer (spec.md §2, invariants 19, 21, 22): whole layer vs the fp64 layer reference for gated /
// ungated, GQA / MHA / MQA, qk-norm flavours, RoPE pairings and windows; split invariance, prefill → decode
// handover, packed / padded batches, slot pools with invalid entries, causality, T = 0, bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/attention.hpp"
#include "support/mixer_harness.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

/// Qwen3.5-style: output gate, zero-centred qk-norm, rotate-half with partial factor 0.25, GQA 2:1.
attention_config cfg_gated() {
    attention_config c;
    c.d_model = 48;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.rope = {rope_mode::rotate_half, 1e4, 0.25};
    c.qk_norm = {qk_norm_mode::zero_centered, 1e-6};
    c.output_gate = true;
    return c;
}
/// MHA, plain qk-norm, interleaved RoPE, explicit scale, sliding window 9, odd head count.
attention_config cfg_window() {
    attention_config c;
    c.d_model = 40;
    c.n_heads = 5;
    c.n_kv_heads = 5;
    c.head_dim = 8;
    c.rope = {rope_mode::interleaved, 5e5, 1.0};
    c.qk_norm = {qk_norm_mode::plain, 1e-5};
    c.scale = 0.3;
    c.sliding_window = 9;
    return c;
}
/// MQA without RoPE (NoPE) or qk-norm, odd head_dim.
attention_config cfg_nope() {
    attention_config c;
    c.d_model = 24;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.head_dim = 10;
    c.rope.mode = rope_mode::none;
    return c;
}

/// fp64 layer reference over one whole sequence x [T, d] (from position 0) → y [T, d].
std::vector<double> layer_ref(const attention& m, const std::vector<float>& x) {
    const std::int64_t d = m.config().d_model, T = static_cast<std::int64_t>(x.size()) / d;
    std::vector<double> xd(x.begin(), x.end()), y(x.size());
    attention_layer_ref(m.config(), m.weights(), tensor_view<const double, 2>(xd.data(), {T, d}), tensor_view<double, 2>(y.data(), {T, d}));
    return y;
}

std::vector<float> run(const attention& m, const cpu_backend& be, attention_state& st, const seq_batch& b,
                       const std::vector<float>& x, bool step = false) {
    const std::int64_t d = m.config().d_model;
    std::vector<float> y(x.size(), 777.f);  // garbage: every row must be written
    const tensor_view<const float, 2> xv(x.data(), {b.n_rows, d});
    const tensor_view<float, 2> yv(y.data(), {b.n_rows, d});
    if (step) m.step(be, st, b, xv, yv);
    else m.forward(be, st, b, xv, yv);
    return y;
}

std::vector<float> rows(const std::vector<float>& x, std::int64_t d, std::int64_t r0, std::int64_t n) {
    return {x.begin() + r0 * d, x.begin() + (r0 + n) * d};
}
template <class V>
V cat(const V& a, const V& b) {
    V r = a;
    r.insert(r.end(), b.begin(), b.end());
    return r;
}

}  // namespace

TEST_CASE("attention mixer: whole layer vs fp64 reference (three configurations, T crossing tiles)") {
    const cpu_backend be(2);
    int i = 0;
    for (const auto& c : {cfg_gated(), cfg_window(), cfg_nope()}) {
        CAPTURE(i);
        const attention m(c, attention_weights::random(c, 10 + static_cast<std::uint64_t>(i)));
        const std::int64_t T = 150;
        const auto x = test::uniform(static_cast<std::size_t>(T * c.d_model), -1.f, 1.f, 20 + static_cast<std::uint64_t>(i));
        auto st = m.make_state(1);
        const auto y = run(m, be, st, seq_batch::dense(1, T), x);
        CHECK(test::rel_error(y, layer_ref(m, x)) < 1e-5);
        CHECK(st.length(0) == T);
        ++i;
    }
}

TEST_CASE("attention mixer: shared-checkpoint layer shape (d 256, 4/2 heads x 64, gate, zero-centred, factor 0.25)") {
    const cpu_backend be(2);
    attention_config c = cfg_gated();
    c.d_model = 256;
    c.head_dim = 64;
    c.rope.theta = 1e7;
    const attention m(c, attention_weights::random(c, 3));
    const auto x = test::uniform(static_cast<std::size_t>(100 * 256), -1.f, 1.f, 4);
    auto st = m.make_state(1);
    const auto y = run(m, be, st, seq_batch::dense(1, 100), x);
    CHECK(test::rel_error(y, layer_ref(m, x)) < 1e-5);
}

TEST_CASE("attention mixer: split invariance and prefill -> decode handover") {
    const cpu_backend be(2);
    for (const auto& c : {cfg_gated(), cfg_window()}) {
        const attention m(c, attention_weights::random(c, 7));
        const std::int64_t T = 70, d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(T * d), -1.f, 1.f, 8);
        const auto ref = layer_ref(m, x);
        auto st1 = m.make_state(1);
        const auto whole = run(m, be, st1, seq_batch::dense(1, T), x);
        const std::vector<std::vector<std::int64_t>> splits{{1, 69}, {16, 16, 38}, {17, 1, 1, 51}, {64, 6}, {3, 1, 1, 1, 64}, {10, 3, 1, 4, 52}};
        for (const auto& sp : splits) {
            CAPTURE(sp.size());
            auto st = m.make_state(1);
            std::vector<float> y;
            std::int64_t t0 = 0;
            for (auto n : sp) {
                y = cat(y, run(m, be, st, seq_batch::dense(1, n), rows(x, d, t0, n)));
                t0 += n;
            }
            CHECK(test::rel_error(y, ref) < 1e-5);
            CHECK(test::rel_error(y, whole) < 1e-6);
            REQUIRE(st.length(0) == T);
            // The keys both caches still hold (a sliding window evicts what no later query can see) agree.
            const std::int64_t f = std::max(st.first(0), st1.first(0));
            if (c.sliding_window > 0) CHECK(T - f >= c.sliding_window);
            const auto ka = st.key_range(0, f, T), kb = st1.key_range(0, f, T);
            for (std::int64_t h = 0; h < c.n_kv_heads; ++h)
                for (std::int64_t t = 0; t < T - f; ++t)
                    CHECK(test::rel_error(&ka(t, h, 0), &kb(t, h, 0), static_cast<std::size_t>(c.head_dim)) < 1e-6);
        }
        // Prefill 10, then 60 step() calls.
        auto st = m.make_state(1);
        auto y = run(m, be, st, seq_batch::dense(1, 10), rows(x, d, 0, 10));
        for (std::int64_t t = 10; t < T; ++t) y = cat(y, run(m, be, st, seq_batch::dense(1, 1), rows(x, d, t, 1), true));
        CHECK(test::rel_error(y, ref) < 1e-5);
    }
}

TEST_CASE("attention mixer: batch independence, slots 5, 2, 7, 0 of an 8-slot pool, permutations, slot reuse") {
    const cpu_backend be(2);
    const auto c = cfg_gated();
    const attention m(c, attention_weights::random(c, 11));
    const std::int64_t d = c.d_model;
    const std::vector<std::int64_t> len{3, 7, 12, 1}, slot{5, 2, 7, 0};
    const std::int64_t steps = 4;
    std::vector<std::vector<float>> xs;  // each sequence's prompt + decode tokens
    for (std::size_t i = 0; i < 4; ++i)
        xs.push_back(test::uniform(static_cast<std::size_t>((len[i] + steps) * d), -1.f, 1.f, 50 + i));

    auto st = m.make_state(8);
    std::vector<std::int64_t> cu{0};
    std::vector<float> xp;
    for (std::size_t i = 0; i < 4; ++i) {
        cu.push_back(cu.back() + len[i]);
        xp = cat(xp, rows(xs[i], d, 0, len[i]));
    }
    const auto yp = run(m, be, st, seq_batch::packed(cu, slot), xp);
    std::vector<std::vector<float>> got(4);
    for (std::size_t i = 0; i < 4; ++i) got[i] = rows(yp, d, cu[i], len[i]);
    for (std::int64_t s = 0; s < steps; ++s) {
        // Decode all four together, in a permuted order each step.
        std::vector<std::size_t> order{3, 0, 2, 1};
        std::rotate(order.begin(), order.begin() + s, order.end());
        std::vector<std::int64_t> sl;
        std::vector<float> xd;
        for (auto i : order) {
            sl.push_back(slot[i]);
            xd = cat(xd, rows(xs[i], d, len[i] + s, 1));
        }
        const auto yd = run(m, be, st, seq_batch::decode(sl), xd, s % 2 == 0);
        for (std::size_t j = 0; j < 4; ++j) got[order[j]] = cat(got[order[j]], rows(yd, d, static_cast<std::int64_t>(j), 1));
    }
    for (std::size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        CHECK(st.length(slot[i]) == len[i] + steps);
        CHECK(test::rel_error(got[i], layer_ref(m, xs[i])) < 1e-5);
        // A solo run in a fresh state agrees closely too.
        auto solo = m.make_state(1);
        const auto ys = run(m, be, solo, seq_batch::dense(1, len[i] + steps), xs[i]);
        CHECK(test::rel_error(got[i], ys) < 1e-6);
    }
    for (std::int64_t s : {1, 3, 4, 6}) CHECK(st.length(s) == 0);  // untouched slots

    // Clearing slot 2 and starting a new 4-token sequence there equals a fresh run.
    st.reset_slot(2);
    const auto xn = test::uniform(static_cast<std::size_t>(4 * d), -1.f, 1.f, 99);
    const std::vector<std::int64_t> cu1{0, 4}, sl1{2};
    const auto yn = run(m, be, st, seq_batch::packed(cu1, sl1), xn);
    CHECK(test::rel_error(yn, layer_ref(m, xn)) < 1e-5);

    // Prompts processed in micro-batches of 1, 3, 7 or 64 tokens agree.
    const auto xl = test::uniform(static_cast<std::size_t>(40 * d), -1.f, 1.f, 98);
    const auto rl = layer_ref(m, xl);
    for (std::int64_t mb : {1, 3, 7, 64}) {
        auto s2 = m.make_state(2);
        std::vector<float> y;
        for (std::int64_t t = 0; t < 40; t += mb) {
            const std::int64_t n = std::min<std::int64_t>(mb, 40 - t);
            const std::vector<std::int64_t> cu2{0, n}, sl2{1};
            y = cat(y, run(m, be, s2, seq_batch::packed(cu2, sl2), rows(xl, d, t, n)));
        }
        CAPTURE(mb);
        CHECK(test::rel_error(y, rl) < 1e-5);
    }
}

TEST_CASE("attention mixer: packed varlen with an invalid slot (-1) and padding rows") {
    const cpu_backend be(2);
    const auto c = cfg_window();
    const attention m(c, attention_weights::random(c, 13));
    const std::int64_t d = c.d_model;
    // Lengths 5, 3, 9 plus a 15-token dummy sequence of values x1e3 whose slot is -1, plus 2 rows of no sequence.
    const std::vector<std::int64_t> cu{0, 5, 8, 17, 32}, slots{0, 1, 2, -1};
    auto x = test::uniform(static_cast<std::size_t>(34 * d), -1.f, 1.f, 14);
    for (std::int64_t i = 17 * d; i < 32 * d; ++i) x[static_cast<std::size_t>(i)] *= 1e3f;
    auto b = seq_batch::packed(cu, slots);
    b.n_rows = 34;
    auto st = m.make_state(4);
    // Slot 3 holds an unrelated sequence: it must stay bit-identical.
    const auto x3 = test::uniform(static_cast<std::size_t>(6 * d), -1.f, 1.f, 15);
    const std::vector<std::int64_t> cu3{0, 6}, sl3{3};
    (void)run(m, be, st, seq_batch::packed(cu3, sl3), x3);
    std::vector<float> k3(st.keys(3).data, st.keys(3).data + st.keys(3).numel());
    const auto y = run(m, be, st, b, x);
    for (std::int64_t i = 17 * d; i < 34 * d; ++i) REQUIRE(y[static_cast<std::size_t>(i)] == 0.f);
    for (std::size_t s = 0; s < 3; ++s) {
        const auto xs = rows(x, d, cu[s], cu[s + 1] - cu[s]);
        CHECK(test::rel_error(rows(y, d, cu[s], cu[s + 1] - cu[s]), layer_ref(m, xs)) < 1e-5);
        CHECK(st.length(static_cast<std::int64_t>(s)) == cu[s + 1] - cu[s]);
    }
    CHECK(st.length(3) == 6);
    CHECK(std::memcmp(k3.data(), st.keys(3).data, k3.size() * sizeof(float)) == 0);
    // Reordering the sequences in the packed batch changes nothing for each of them.
    auto st2 = m.make_state(4);
    const std::vector<std::int64_t> cu_r{0, 9, 14, 17}, sl_r{2, 0, 1};
    const auto xr = cat(cat(rows(x, d, 8, 9), rows(x, d, 0, 5)), rows(x, d, 5, 3));
    const auto yr = run(m, be, st2, seq_batch::packed(cu_r, sl_r), xr);
    CHECK(test::rel_error(rows(yr, d, 0, 9), rows(y, d, 8, 9)) < 1e-6);
    CHECK(test::rel_error(rows(yr, d, 9, 5), rows(y, d, 0, 5)) < 1e-6);
}

TEST_CASE("attention mixer: right padding with lengths, then one decode step of row 0") {
    const cpu_backend be(1);
    const auto c = cfg_gated();
    const attention m(c, attention_weights::random(c, 17));
    const std::int64_t d = c.d_model;
    const std::vector<std::int64_t> lens{5, 8};
    auto x = test::uniform(static_cast<std::size_t>(16 * d), -1.f, 1.f, 18);
    for (std::int64_t i = 5 * d; i < 8 * d; ++i) x[static_cast<std::size_t>(i)] = std::nanf("");  // padding may hold anything
    auto st = m.make_state(2);
    const auto y = run(m, be, st, seq_batch::padded(8, lens), x);
    for (std::int64_t i = 5 * d; i < 8 * d; ++i) CHECK(y[static_cast<std::size_t>(i)] == 0.f);
    CHECK(st.length(0) == 5);
    CHECK(st.length(1) == 8);
    const auto x6 = test::uniform(static_cast<std::size_t>(d), -1.f, 1.f, 19);
    const std::vector<std::int64_t> sl{0};
    const auto y6 = run(m, be, st, seq_batch::decode(sl), x6, true);
    const auto ref = layer_ref(m, cat(rows(x, d, 0, 5), x6));
    CHECK(test::rel_error(cat(rows(y, d, 0, 5), y6), ref) < 1e-5);
    CHECK(test::rel_error(rows(y, d, 8, 8), layer_ref(m, rows(x, d, 8, 8))) < 1e-5);
}

TEST_CASE("attention mixer: causality (bit-exact) and T = 0 pass-through") {
    const cpu_backend be(2);
    for (const auto& c : {cfg_gated(), cfg_nope()}) {
        const attention m(c, attention_weights::random(c, 21));
        const std::int64_t d = c.d_model, T = 90;
        const auto x = test::uniform(static_cast<std::size_t>(T * d), -1.f, 1.f, 22);
        for (std::int64_t t0 : {1, 40, 64, 89}) {
            auto x2 = x;
            for (std::int64_t i = t0 * d; i < T * d; ++i) x2[static_cast<std::size_t>(i)] = -3.f * x2[static_cast<std::size_t>(i)] + 0.5f;
            auto s1 = m.make_state(1), s2 = m.make_state(1);
            const auto y1 = run(m, be, s1, seq_batch::dense(1, T), x);
            const auto y2 = run(m, be, s2, seq_batch::dense(1, T), x2);
            CAPTURE(t0);
            CHECK(std::equal(y1.begin(), y1.begin() + t0 * d, y2.begin()));
            CHECK(!std::equal(y1.begin() + t0 * d, y1.end(), y2.begin() + t0 * d));
            for (std::int64_t h = 0; h < c.n_kv_heads; ++h) {
                CHECK(std::memcmp(&s1.keys(0)(h, 0, 0), &s2.keys(0)(h, 0, 0), sizeof(float) * static_cast<std::size_t>(t0 * c.head_dim)) == 0);
                CHECK(std::memcmp(&s1.values(0)(h, 0, 0), &s2.values(0)(h, 0, 0), sizeof(float) * static_cast<std::size_t>(t0 * c.head_dim)) == 0);
            }
        }
        // T = 0: nothing changes.
        auto st = m.make_state(2);
        (void)run(m, be, st, seq_batch::dense(1, 12), rows(x, d, 0, 12));
        std::vector<float> kb(st.keys(0).data, st.keys(0).data + st.keys(0).numel());
        const std::vector<std::int64_t> cu{0, 0, 0};
        std::vector<float> none;
        (void)run(m, be, st, seq_batch::packed(cu), none);
        CHECK(st.length(0) == 12);
        CHECK(st.length(1) == 0);
        CHECK(std::memcmp(kb.data(), st.keys(0).data, kb.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("attention mixer: copy_slot, reserve (decode allocates nothing), growth keeps contents") {
    const cpu_backend be(1);
    const auto c = cfg_gated();
    const attention m(c, attention_weights::random(c, 31));
    const std::int64_t d = c.d_model;
    const auto x = test::uniform(static_cast<std::size_t>(30 * d), -1.f, 1.f, 32);
    auto st = m.make_state(3);
    st.reserve(40);
    CHECK(st.capacity() == 40);
    (void)run(m, be, st, seq_batch::dense(1, 30), x);
    st.copy_slot(0, 2);
    CHECK(st.length(2) == 30);
    const float* before = st.keys(0).data;
    const auto xt = test::uniform(static_cast<std::size_t>(2 * d), -1.f, 1.f, 33);
    const std::vector<std::int64_t> sl{0, 2};
    const auto y = run(m, be, st, seq_batch::decode(sl), xt, true);
    CHECK(st.keys(0).data == before);  // no reallocation within the reserved capacity
    CHECK(st.capacity() == 40);
    const auto ref = layer_ref(m, cat(x, rows(xt, d, 0, 1)));
    CHECK(test::rel_error(rows(y, d, 0, 1), rows(std::vector<float>(ref.begin(), ref.end()), d, 30, 1)) < 1e-5);
    // Slot 2 (a copy of slot 0 before the step) given token 1 matches the reference of that continuation.
    const auto ref2 = layer_ref(m, cat(x, rows(xt, d, 1, 1)));
    CHECK(test::rel_error(rows(y, d, 1, 1), rows(std::vector<float>(ref2.begin(), ref2.end()), d, 30, 1)) < 1e-5);
    // Growing past the capacity (geometric) keeps every cached token.
    const auto xg = test::uniform(static_cast<std::size_t>(25 * d), -1.f, 1.f, 34);
    const std::vector<std::int64_t> cu{0, 25}, sl2{2};
    const auto yg = run(m, be, st, seq_batch::packed(cu, sl2), xg);
    CHECK(st.capacity() >= 80);
    CHECK(st.length(2) == 56);
    const auto ref3 = layer_ref(m, cat(cat(x, rows(xt, d, 1, 1)), xg));
    CHECK(test::rel_error(yg, rows(std::vector<float>(ref3.begin(), ref3.end()), d, 31, 25)) < 1e-5);
}

TEST_CASE("attention mixer: large inputs stay finite") {
    const cpu_backend be(2);
    for (const auto& c : {cfg_gated(), cfg_nope()}) {
        const attention m(c, attention_weights::random(c, 41));
        const auto x = test::uniform(static_cast<std::size_t>(80 * c.d_model), -100.f, 100.f, 42);
        auto st = m.make_state(1);
        const auto y = run(m, be, st, seq_batch::dense(1, 80), x);
        for (float v : y) REQUIRE(std::isfinite(v));
        CHECK(test::rel_error(y, layer_ref(m, x)) < 1e-4);  // logits of magnitude ~1e2–1e3 without qk-norm
    }
}

TEST_CASE("attention mixer: extreme output-gate pre-activations saturate cleanly") {
    const cpu_backend be(2);
    const auto c = cfg_gated();
    auto w = attention_weights::random(c, 61);
    // Scale the gate half of every head's q_proj rows so σ(gate) sees pre-activations of order ±1e3.
    const std::int64_t dh = c.head_dim;
    for (std::int64_t h = 0; h < c.n_heads; ++h)
        for (std::int64_t r = dh; r < 2 * dh; ++r)
            for (std::int64_t k = 0; k < c.d_model; ++k) w.q_proj.view<2>()(h * 2 * dh + r, k) *= 3e3f;
    const attention m(c, w);
    const auto x = test::uniform(static_cast<std::size_t>(60 * c.d_model), -1.f, 1.f, 62);
    auto st = m.make_state(1);
    const auto y = run(m, be, st, seq_batch::dense(1, 60), x);
    for (float v : y) REQUIRE(std::isfinite(v));
    CHECK(test::rel_error(y, layer_ref(m, x)) < 1e-5);
}

TEST_CASE("attention mixer: bad arguments throw") {
    const cpu_backend be(1);
    const auto c = cfg_gated();
    const attention m(c, attention_weights::random(c, 51));
    const std::int64_t d = c.d_model;
    auto st = m.make_state(2);
    std::vector<float> x(static_cast<std::size_t>(4 * (d + 1))), y(x.size());
    // x / y shape mismatch
    CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 4), tensor_view<const float, 2>(x.data(), {4, d + 1}),
                              tensor_view<float, 2>(y.data(), {4, d})),
                    shape_error);
    CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 4), tensor_view<const float, 2>(x.data(), {4, d}),
                              tensor_view<float, 2>(y.data(), {3, d})),
                    shape_error);
    // step() with 2 tokens
    CHECK_THROWS_AS(m.step(be, st, seq_batch::dense(1, 2), tensor_view<const float, 2>(x.data(), {2, d}),
                           tensor_view<float, 2>(y.data(), {2, d})),
                    shape_error);
    // slot out of range, state of another layer shape
    const std::vector<std::int64_t> sl{5};
    CHECK_THROWS_AS(m.step(be, st, seq_batch::decode(sl), tensor_view<const float, 2>(x.data(), {1, d}),
                           tensor_view<float, 2>(y.data(), {1, d})),
                    shape_error);
    attention_state wrong(2, 3, 16);
    CHECK_THROWS_AS(m.forward(be, wrong, seq_batch::dense(1, 4), tensor_view<const float, 2>(x.data(), {4, d}),
                              tensor_view<float, 2>(y.data(), {4, d})),
                    shape_error);
    CHECK(st.length(0) == 0);  // nothing was appended by the failed calls
    // config errors
    auto bad = c;
    bad.n_kv_heads = 3;
    CHECK_THROWS_AS(bad.validate(), config_error);
    bad = c;
    bad.rope.partial_rotary_factor = 0.1;  // int(16 * 0.1) = 1: odd
    CHECK_THROWS_AS(bad.validate(), config_error);
    bad = c;
    bad.sliding_window = -1;
    CHECK_THROWS_AS(bad.validate(), config_error);
    // weights of the wrong shape name the tensor
    auto w = attention_weights::random(c, 1);
    w.q_proj = tensor<float>({c.n_heads * c.head_dim, d});  // missing the gate half
    try {
        attention bad_m(c, w);
        FAIL("expected shape_error");
    } catch (const shape_error& e) {
        CHECK(std::string(e.what()).find("q_proj") != std::string::npos);
    }
    w = attention_weights::random(c, 1);
    w.k_norm = tensor<float>();
    CHECK_THROWS_AS(attention(c, w), shape_error);
}

// The shared invariants of every mixer (tests/support/mixer_harness.hpp), on every backend: Qwen3.5-style gated GQA
// with partial RoPE and zero-centred qk-norm, and MQA without RoPE.
HYMIX_MIXER_HARNESS("attention (gated GQA)", attention(cfg_gated(), attention_weights::random(cfg_gated(), 13)))
HYMIX_MIXER_HARNESS("attention (MQA, NoPE)", attention(cfg_nope(), attention_weights::random(cfg_nope(), 14)))

// A 16-bit KV cache (attention_config::kv_dtype): keys and values are rounded once, when cached, so every invariant
// between runs of the layer keeps the f32 tolerance (splits, decode = prefill, packing, slot reuse, causality), while
// the layer moves from the fp64 reference (which caches exact values) by the rounding: bf16 keeps 8 significant bits,
// f16 11. Gated GQA (the Qwen3.5 shape) and a sliding window, which evicts from the 16-bit cache.
namespace {
attention with_kv(attention_config c, dtype t, std::uint64_t seed) {
    c.kv_dtype = t;
    return attention(c, attention_weights::random(c, seed));
}
constexpr test::harness_tolerance bf16_kv_cpu{2e-2, 1e-5}, bf16_kv_ref{2e-2, 1e-6};
constexpr test::harness_tolerance f16_kv_cpu{3e-3, 1e-5}, f16_kv_ref{3e-3, 1e-6};
}  // namespace

TEST_CASE("attention, bf16 KV cache: spec invariants on the CPU backend") {
    test::run_mixer_harness(with_kv(cfg_gated(), dtype::bf16, 13), cpu_backend(2), bf16_kv_cpu);
}
TEST_CASE("attention, bf16 KV cache: spec invariants on the CPU backend, one thread") {
    test::run_mixer_harness(with_kv(cfg_window(), dtype::bf16, 15), cpu_backend(1), bf16_kv_cpu);
}
TEST_CASE("attention, bf16 KV cache: spec invariants on the reference backend") {
    test::run_mixer_harness(with_kv(cfg_gated(), dtype::bf16, 13), reference_backend(), bf16_kv_ref);
}
TEST_CASE("attention, f16 KV cache: spec invariants on the CPU backend") {
    test::run_mixer_harness(with_kv(cfg_window(), dtype::f16, 16), cpu_backend(2), f16_kv_cpu);
}
TEST_CASE("attention, f16 KV cache: spec invariants on the reference backend") {
    test::run_mixer_harness(with_kv(cfg_nope(), dtype::f16, 14), reference_backend(), f16_kv_ref);
}

TEST_CASE("attention, 16-bit KV cache: the cache holds the f32 cache's keys and values rounded to nearest even; "
          "the output stays within the rounding of the f32 cache's") {
    const cpu_backend be(2);
    for (dtype t : {dtype::bf16, dtype::f16}) {
        CAPTURE(static_cast<int>(t));
        const auto c = cfg_gated();
        const attention m32(c, attention_weights::random(c, 21)), m16 = with_kv(c, t, 21);
        const std::int64_t T = 90, d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(T * d), -1.f, 1.f, 22);
        auto s32 = m32.make_state(1), s16 = m16.make_state(1);
        CHECK(s16.kv_dtype() == t);
        const auto y32 = run(m32, be, s32, seq_batch::dense(1, T), x), y16 = run(m16, be, s16, seq_batch::dense(1, T), x);
        CHECK(s16.bytes() * 2 == s32.bytes());
        const double tol = t == dtype::bf16 ? 2e-2 : 3e-3;
        CHECK(test::rel_error(y16, y32) < tol);
        CHECK(test::rel_error(y16, y32) > 0);  // the rounding is real
        const auto same_as_rounded = [&](auto tag) {
            using KV = decltype(tag);
            const auto k32 = s32.key_range(0, 0, T), v32 = s32.value_range(0, 0, T);
            const auto k16 = s16.key_range<KV>(0, 0, T), v16 = s16.value_range<KV>(0, 0, T);
            std::int64_t mismatches = 0;
            for (std::int64_t i = 0; i < T; ++i)
                for (std::int64_t h = 0; h < c.n_kv_heads; ++h)
                    for (std::int64_t e = 0; e < c.head_dim; ++e) {
                        mismatches += !(KV::from_float(k32(i, h, e)) == k16(i, h, e));
                        mismatches += !(KV::from_float(v32(i, h, e)) == v16(i, h, e));
                    }
            CHECK(mismatches == 0);
        };
        if (t == dtype::bf16)
            same_as_rounded(bf16{});
        else
            same_as_rounded(f16{});
    }
}

TEST_CASE("attention, 16-bit KV cache: bad dtypes and reads of the wrong type throw") {
    auto c = cfg_gated();
    c.kv_dtype = dtype::i8;
    CHECK_THROWS_AS(c.validate(), config_error);
    CHECK_THROWS_AS(attention(c, attention_weights::random(cfg_gated(), 1)), config_error);
    attention m(cfg_gated(), attention_weights::random(cfg_gated(), 1));
    CHECK_THROWS_AS(m.set_kv_dtype(dtype::f64), config_error);
    CHECK(m.config().kv_dtype == dtype::f32);  // unchanged by the failed call
    m.set_kv_dtype(dtype::bf16);
    const auto st = m.make_state(2);
    CHECK(st.kv_dtype() == dtype::bf16);
    CHECK_THROWS_AS(st.key_range(0, 0, 0), dtype_error);  // f32 view of a bf16 cache
    CHECK_THROWS_AS(st.values<f16>(1), dtype_error);
    CHECK_NOTHROW(st.key_range<bf16>(0, 0, 0));
    CHECK_THROWS_AS(kv_cache(1, 2, 8, 0, dtype::i32), dtype_error);
}
