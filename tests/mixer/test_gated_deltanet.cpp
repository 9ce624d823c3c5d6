// The Gated DeltaNet mixer layer (spec.md §4.2, §4.4, §4.7) against the whole-layer fp64 reference: prefill and
// decode, dispatch by token count and split invariance (invariants 4, 5), batches, slots, packing, padding and
// invalid entries (16, 19), causality, T = 0, extreme gates and argument errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "support/mixer_harness.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

gated_deltanet_config small_config(std::int64_t chunk = 16) {
    gated_deltanet_config c;
    c.d_model = 40;
    c.n_k_heads = 2;
    c.n_v_heads = 4;
    c.d_k = 12;
    c.d_v = 10;
    c.d_conv = 4;
    c.chunk_size = chunk;
    return c;
}

/// Random weights with projections scaled up so that activations, gates and the norm are O(1), and non-trivial
/// dt_bias / norm weights.
gated_deltanet_weights test_weights(const gated_deltanet_config& c, std::uint64_t seed) {
    auto w = gated_deltanet_weights::random(c, seed);
    for (auto* t : {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_a, &w.in_proj_b})
        for (auto& x : t->span()) x *= 8.f;
    const auto nb = hymix::test::uniform(static_cast<std::size_t>(c.d_v), 0.5f, 1.5f, seed + 1);
    std::copy(nb.begin(), nb.end(), w.norm_weight.data());
    const auto db = hymix::test::uniform(static_cast<std::size_t>(c.n_v_heads), -2.f, 2.f, seed + 2);
    std::copy(db.begin(), db.end(), w.dt_bias.data());
    return w;
}

std::vector<float> random_x(std::int64_t rows, std::int64_t d, std::uint64_t seed) {
    return hymix::test::uniform(static_cast<std::size_t>(rows * d), -1.f, 1.f, seed);
}

/// A state whose slots hold random values (a sequence already in progress).
gated_deltanet_state random_state(const gated_deltanet& m, std::int64_t slots, std::uint64_t seed) {
    auto s = m.make_state(slots);
    const auto a = hymix::test::uniform(static_cast<std::size_t>(s.ssm.numel()), -0.5f, 0.5f, seed);
    const auto b = hymix::test::uniform(static_cast<std::size_t>(s.conv.numel()), -1.f, 1.f, seed + 1);
    std::copy(a.begin(), a.end(), s.ssm.data());
    std::copy(b.begin(), b.end(), s.conv.data());
    return s;
}

std::vector<float> forward(const gated_deltanet& m, gated_deltanet_state& st, const seq_batch& b, const std::vector<float>& x,
                           bool use_step = false, int threads = 2) {
    cpu_backend be(threads);
    const std::int64_t d = m.config().d_model;
    std::vector<float> y(static_cast<std::size_t>(b.n_rows * d), 3.f);
    tensor_view<const float, 2> xv(x.data(), {b.n_rows, d});
    tensor_view<float, 2> yv(y.data(), {b.n_rows, d});
    if (use_step)
        m.step(be, st, b, xv, yv);
    else
        m.forward(be, st, b, xv, yv);
    return y;
}

struct ref_out {
    std::vector<double> y, ssm, conv;
};
ref_out reference(const gated_deltanet& m, const gated_deltanet_state& st, const seq_batch& b, const std::vector<float>& x) {
    const auto& c = m.config();
    ref_out r{std::vector<double>(static_cast<std::size_t>(b.n_rows * c.d_model)),
              std::vector<double>(st.ssm.data(), st.ssm.data() + st.ssm.numel()),
              std::vector<double>(st.conv.data(), st.conv.data() + st.conv.numel())};
    const std::vector<double> xd(x.begin(), x.end());
    const std::int64_t S = st.n_slots();
    gated_deltanet_ref<double>(c, m.weights(), b, tensor_view<const double, 2>(xd.data(), {b.n_rows, c.d_model}),
                               tensor_view<double, 4>(r.ssm.data(), {S, c.n_v_heads, c.d_k, c.d_v}),
                               tensor_view<double, 3>(r.conv.data(), {S, c.conv_dim(), c.d_conv - 1}),
                               tensor_view<double, 2>(r.y.data(), {b.n_rows, c.d_model}));
    return r;
}

std::vector<float> ssm_of(const gated_deltanet_state& s) { return {s.ssm.data(), s.ssm.data() + s.ssm.numel()}; }
std::vector<float> conv_of(const gated_deltanet_state& s) { return {s.conv.data(), s.conv.data() + s.conv.numel()}; }
std::vector<float> rows(const std::vector<float>& x, std::int64_t r0, std::int64_t n, std::int64_t d) {
    return {x.begin() + r0 * d, x.begin() + (r0 + n) * d};
}
bool all_finite(const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

}  // namespace

TEST_CASE("config, weights and state contract") {
    const auto c = small_config();
    CHECK(c.key_dim() == 24);
    CHECK(c.value_dim() == 40);
    CHECK(c.conv_dim() == 88);
    const auto w = gated_deltanet_weights::random(c, 1);
    CHECK(w.in_proj_qkv.shape() == std::vector<std::int64_t>{88, 40});
    CHECK(w.conv1d_weight.shape() == std::vector<std::int64_t>{88, 4});
    CHECK(w.out_proj.shape() == std::vector<std::int64_t>{40, 40});
    for (float a : w.A_log.span()) {
        CHECK(a >= std::log(0.01f) - 1e-6f);
        CHECK(a <= std::log(16.f) + 1e-6f);
    }
    CHECK(w.dt_bias[0] == 1.f);
    CHECK(w.norm_weight[3] == 1.f);
    gated_deltanet m(c, w);
    auto s = random_state(m, 3, 5);
    CHECK(s.n_slots() == 3);
    CHECK(s.ssm.shape() == std::vector<std::int64_t>{3, 4, 12, 10});
    CHECK(s.conv.shape() == std::vector<std::int64_t>{3, 88, 3});
    s.copy_slot(2, 0);
    CHECK(std::equal(s.ssm.data(), s.ssm.data() + 480, s.ssm.data() + 960));
    CHECK(std::equal(s.conv.data(), s.conv.data() + 264, s.conv.data() + 528));
    s.reset_slot(1);
    CHECK(std::all_of(s.ssm.data() + 480, s.ssm.data() + 960, [](float f) { return f == 0.f; }));
    CHECK(std::all_of(s.conv.data() + 264, s.conv.data() + 528, [](float f) { return f == 0.f; }));
    CHECK(s.ssm.data()[0] != 0.f);
    CHECK_THROWS_AS(s.reset_slot(3), shape_error);
    CHECK_THROWS_AS(s.copy_slot(-1, 0), shape_error);
}

TEST_CASE("forward and step equal the fp64 whole-layer reference") {
    for (std::int64_t chunk : {4, 16, 64}) {
        const auto c = small_config(chunk);
        gated_deltanet m(c, test_weights(c, 10 + static_cast<std::uint64_t>(chunk)));
        for (std::int64_t T : {1, 5, 37, 100}) {
            for (bool fresh : {true, false}) {
                CAPTURE(chunk);
                CAPTURE(T);
                CAPTURE(fresh);
                auto st = fresh ? m.make_state(1) : random_state(m, 1, 20 + static_cast<std::uint64_t>(T));
                const auto x = random_x(T, c.d_model, 30 + static_cast<std::uint64_t>(T));
                const auto ref = reference(m, st, seq_batch::dense(1, T), x);
                const auto y = forward(m, st, seq_batch::dense(1, T), x);
                CHECK(rel_error(y, ref.y) < 1e-5);
                CHECK(rel_error(ssm_of(st), ref.ssm) < 1e-5);
                CHECK(rel_error(conv_of(st), ref.conv) < 1e-6);
            }
        }
    }
    // The shared checkpoints' layer shape: d_model 256, 4 key / 4 value heads of 64.
    gated_deltanet_config c;
    c.d_model = 256;
    c.n_k_heads = c.n_v_heads = 4;
    c.d_k = c.d_v = 64;
    gated_deltanet m(c, test_weights(c, 77));
    auto st = random_state(m, 1, 78);
    const auto x = random_x(70, 256, 79);
    const auto ref = reference(m, st, seq_batch::dense(1, 70), x);
    const auto y = forward(m, st, seq_batch::dense(1, 70), x);
    CHECK(rel_error(y, ref.y) < 1e-5);
    CHECK(rel_error(ssm_of(st), ref.ssm) < 1e-5);
    const auto x1 = random_x(1, 256, 80);
    const auto ref1 = reference(m, st, seq_batch::dense(1, 1), x1);
    const auto y1 = forward(m, st, seq_batch::dense(1, 1), x1, true);
    CHECK(rel_error(y1, ref1.y) < 1e-5);
    CHECK(rel_error(ssm_of(st), ref1.ssm) < 1e-5);
}

TEST_CASE("dispatch by token count and split invariance (invariants 4, 5)") {
    const auto c = small_config(8);
    gated_deltanet m(c, test_weights(c, 40));
    const auto st0 = random_state(m, 1, 41);
    SUBCASE("prefill 10, then 3, 1 (step) and 4 tokens equal one 18-token call") {
        const auto x = random_x(18, c.d_model, 42);
        auto s_one = st0;
        const auto y_one = forward(m, s_one, seq_batch::dense(1, 18), x);
        auto s = st0;
        std::vector<float> y;
        std::int64_t r0 = 0;
        for (std::int64_t len : {10, 3, 1, 4}) {
            const auto part = forward(m, s, seq_batch::dense(1, len), rows(x, r0, len, c.d_model), len == 1);
            y.insert(y.end(), part.begin(), part.end());
            r0 += len;
        }
        CHECK(rel_error(y, y_one) < 1e-6);
        CHECK(rel_error(ssm_of(s), ssm_of(s_one)) < 1e-6);
        CHECK(rel_error(conv_of(s), conv_of(s_one)) < 1e-6);  // projections of different row counts round differently
        const auto ref = reference(m, st0, seq_batch::dense(1, 18), x);
        CHECK(rel_error(y, ref.y) < 1e-5);
    }
    SUBCASE("splits 8+8+4, 1+19, 2+18, 19+1, 1+1+1+17") {
        const auto x = random_x(20, c.d_model, 43);
        auto s_one = st0;
        const auto y_one = forward(m, s_one, seq_batch::dense(1, 20), x);
        for (const std::vector<std::int64_t>& split :
             {std::vector<std::int64_t>{8, 8, 4}, {1, 19}, {2, 18}, {19, 1}, {1, 1, 1, 17}}) {
            CAPTURE(split[0]);
            CAPTURE(split.size());
            auto s = st0;
            std::vector<float> y;
            std::int64_t r0 = 0;
            for (auto len : split) {
                const auto part = forward(m, s, seq_batch::dense(1, len), rows(x, r0, len, c.d_model));
                y.insert(y.end(), part.begin(), part.end());
                r0 += len;
            }
            CHECK(rel_error(y, y_one) < 1e-6);
            CHECK(rel_error(ssm_of(s), ssm_of(s_one)) < 1e-6);
            CHECK(rel_error(conv_of(s), conv_of(s_one)) < 1e-6);  // projections of different row counts round differently
        }
    }
    SUBCASE("step rejects more than one token") {
        auto s = st0;
        const auto x = random_x(2, c.d_model, 44);
        CHECK_THROWS_AS(forward(m, s, seq_batch::dense(1, 2), x, true), shape_error);
        CHECK(ssm_of(s) == ssm_of(st0));  // nothing touched
    }
}

TEST_CASE("batch independence, slots, micro-batches (invariant 19)") {
    const auto c = small_config(8);
    gated_deltanet m(c, test_weights(c, 50));
    const std::vector<std::int64_t> lens{3, 7, 12, 1}, slots{5, 2, 7, 0};
    const std::vector<std::int64_t> cu{0, 3, 10, 22, 23};
    const auto x = random_x(23, c.d_model, 51);
    const auto pool0 = random_state(m, 8, 52);
    // Solo runs: each sequence alone in a one-slot state holding its pool slot's initial values.
    std::vector<std::vector<float>> y_solo(4), ssm_solo(4), conv_solo(4);
    for (std::size_t i = 0; i < 4; ++i) {
        auto s = m.make_state(1);
        s.copy_slot(0, 0);
        std::copy_n(pool0.ssm.data() + slots[i] * 480, 480, s.ssm.data());
        std::copy_n(pool0.conv.data() + slots[i] * 264, 264, s.conv.data());
        y_solo[i] = forward(m, s, seq_batch::dense(1, lens[i]), rows(x, cu[i], lens[i], c.d_model));
        ssm_solo[i] = ssm_of(s);
        conv_solo[i] = conv_of(s);
    }
    auto check_pool = [&](const gated_deltanet_state& pool, const std::vector<float>& y, const std::vector<std::int64_t>& row0) {
        for (std::size_t i = 0; i < 4; ++i) {
            CAPTURE(i);
            CHECK(rel_error(rows(y, row0[i], lens[i], c.d_model), y_solo[i]) < 1e-6);
            const std::vector<float> ps(pool.ssm.data() + slots[i] * 480, pool.ssm.data() + (slots[i] + 1) * 480);
            const std::vector<float> pc(pool.conv.data() + slots[i] * 264, pool.conv.data() + (slots[i] + 1) * 264);
            CHECK(rel_error(ps, ssm_solo[i]) < 1e-6);
            CHECK(rel_error(pc, conv_solo[i]) < 1e-6);
        }
        for (std::int64_t u : {1, 3, 4, 6})  // unused slots stay bit-identical
            CHECK(std::equal(pool.ssm.data() + u * 480, pool.ssm.data() + (u + 1) * 480, pool0.ssm.data() + u * 480));
    };
    SUBCASE("packed together equals solo runs") {
        auto pool = pool0;
        const auto y = forward(m, pool, seq_batch::packed(cu, slots), x);
        check_pool(pool, y, {0, 3, 10, 22});
    }
    SUBCASE("permuting the batch permutes the outputs") {
        // Order: sequence 2, 0, 3, 1.
        const std::vector<std::size_t> perm{2, 0, 3, 1};
        std::vector<float> xp;
        std::vector<std::int64_t> cup{0}, slp, row0(4);
        for (auto i : perm) {
            row0[i] = cup.back();
            const auto r = rows(x, cu[i], lens[i], c.d_model);
            xp.insert(xp.end(), r.begin(), r.end());
            cup.push_back(cup.back() + lens[i]);
            slp.push_back(slots[i]);
        }
        auto pool = pool0;
        const auto y = forward(m, pool, seq_batch::packed(cup, slp), xp);
        check_pool(pool, y, row0);
    }
    SUBCASE("prompts in micro-batches of 1, 3, 7 or 64 tokens, then one decode step together") {
        const auto xs = random_x(4, c.d_model, 53);
        std::vector<float> y_dec_solo;
        std::vector<std::vector<float>> ssm_dec(4);
        for (std::size_t i = 0; i < 4; ++i) {
            auto s = m.make_state(1);
            std::copy_n(pool0.ssm.data() + slots[i] * 480, 480, s.ssm.data());
            std::copy_n(pool0.conv.data() + slots[i] * 264, 264, s.conv.data());
            forward(m, s, seq_batch::dense(1, lens[i]), rows(x, cu[i], lens[i], c.d_model));
            const auto yd = forward(m, s, seq_batch::dense(1, 1), rows(xs, static_cast<std::int64_t>(i), 1, c.d_model), true);
            y_dec_solo.insert(y_dec_solo.end(), yd.begin(), yd.end());
            ssm_dec[i] = ssm_of(s);
        }
        for (std::int64_t mb : {1, 3, 7, 64}) {
            CAPTURE(mb);
            auto pool = pool0;
            // Each micro-batch call advances every unfinished sequence by up to mb tokens (packed).
            std::vector<std::int64_t> done(4, 0);
            while (true) {
                std::vector<std::int64_t> cup{0}, slp;
                std::vector<float> xm;
                for (std::size_t i = 0; i < 4; ++i) {
                    const std::int64_t take = std::min(mb, lens[i] - done[i]);
                    if (take == 0) continue;
                    const auto r = rows(x, cu[i] + done[i], take, c.d_model);
                    xm.insert(xm.end(), r.begin(), r.end());
                    cup.push_back(cup.back() + take);
                    slp.push_back(slots[i]);
                    done[i] += take;
                }
                if (slp.empty()) break;
                forward(m, pool, seq_batch::packed(cup, slp), xm);
            }
            const auto yd = forward(m, pool, seq_batch::decode(slots), xs, true);
            CHECK(rel_error(yd, y_dec_solo) < 1e-6);
            for (std::size_t i = 0; i < 4; ++i) {
                const std::vector<float> ps(pool.ssm.data() + slots[i] * 480, pool.ssm.data() + (slots[i] + 1) * 480);
                CHECK(rel_error(ps, ssm_dec[i]) < 1e-6);
            }
        }
    }
    SUBCASE("clearing slot 2 and starting a new sequence there equals a fresh run") {
        auto pool = pool0;
        forward(m, pool, seq_batch::packed(cu, slots), x);
        pool.reset_slot(2);
        const auto xn = random_x(4, c.d_model, 54);
        const std::vector<std::int64_t> cu1{0, 4}, sl1{2};
        const auto y = forward(m, pool, seq_batch::packed(cu1, sl1), xn);
        auto fresh = m.make_state(1);
        const auto yf = forward(m, fresh, seq_batch::dense(1, 4), xn);
        CHECK(y == yf);
        CHECK(std::equal(pool.ssm.data() + 2 * 480, pool.ssm.data() + 3 * 480, fresh.ssm.data()));
    }
}

TEST_CASE("packed, padded and invalid entries (invariant 16)") {
    const auto c = small_config(8);
    gated_deltanet m(c, test_weights(c, 60));
    // Lengths [5, 3, 9] packed into 17 (chunk 8: boundaries mid-chunk and on a chunk edge) plus a 15-token dummy
    // sequence of inputs x1e3.
    const std::vector<std::int64_t> cu{0, 5, 8, 17, 32}, slots{1, 3, 0, 2};
    auto x = random_x(32, c.d_model, 61);
    for (std::size_t i = static_cast<std::size_t>(17 * c.d_model); i < x.size(); ++i) x[i] *= 1e3f;
    const auto pool0 = random_state(m, 4, 62);
    auto pool = pool0;
    const auto y = forward(m, pool, seq_batch::packed(cu, slots), x);
    CHECK(all_finite(y));
    const auto ref = reference(m, pool0, seq_batch::packed(cu, slots), x);
    CHECK(rel_error(rows(y, 0, 17, c.d_model), std::vector<double>(ref.y.begin(), ref.y.begin() + 17 * 40)) < 1e-5);
    CHECK(rel_error(ssm_of(pool), ref.ssm) < 1e-5);
    SUBCASE("invalid slot -1: zero output, no state touched, neighbours unchanged") {
        const std::vector<std::int64_t> sl2{1, -1, 0, 2};
        auto p2 = pool0;
        const auto y2 = forward(m, p2, seq_batch::packed(cu, sl2), x);
        for (std::int64_t i = 5 * 40; i < 8 * 40; ++i) CHECK(y2[static_cast<std::size_t>(i)] == 0.f);
        CHECK(std::equal(p2.ssm.data() + 3 * 480, p2.ssm.data() + 4 * 480, pool0.ssm.data() + 3 * 480));
        CHECK(std::equal(p2.conv.data() + 3 * 264, p2.conv.data() + 4 * 264, pool0.conv.data() + 3 * 264));
        CHECK(std::equal(y2.begin(), y2.begin() + 5 * 40, y.begin()));
        CHECK(std::equal(y2.begin() + 8 * 40, y2.end(), y.begin() + 8 * 40));
        // Decode step with an invalid entry.
        const std::vector<std::int64_t> ds{2, -1, 0};
        auto p3 = pool0;
        const auto xd = random_x(3, c.d_model, 63);
        const auto yd = forward(m, p3, seq_batch::decode(ds), xd, true);
        for (std::int64_t i = 40; i < 80; ++i) CHECK(yd[static_cast<std::size_t>(i)] == 0.f);
        const auto rd = reference(m, pool0, seq_batch::decode(ds), xd);
        CHECK(rel_error(yd, rd.y) < 1e-5);
        CHECK(rel_error(ssm_of(p3), rd.ssm) < 1e-5);
        CHECK(std::equal(p3.ssm.data() + 480, p3.ssm.data() + 480 * 2, pool0.ssm.data() + 480));
    }
    SUBCASE("right padding with lengths: padding rows zero and ignored, even when NaN") {
        const std::vector<std::int64_t> lengths{5, 8, 0, 2};
        auto xp = random_x(4 * 8, c.d_model, 64);
        for (std::int64_t b = 0; b < 4; ++b)
            for (std::int64_t t = lengths[static_cast<std::size_t>(b)]; t < 8; ++t)
                for (std::int64_t i = 0; i < 40; ++i) xp[static_cast<std::size_t>((b * 8 + t) * 40 + i)] = std::nanf("");
        auto p = pool0;
        const auto yp = forward(m, p, seq_batch::padded(8, lengths), xp);
        CHECK(all_finite(yp));
        for (std::int64_t b = 0; b < 4; ++b) {
            CAPTURE(b);
            const auto len = lengths[static_cast<std::size_t>(b)];
            auto s = m.make_state(1);
            std::copy_n(pool0.ssm.data() + b * 480, 480, s.ssm.data());
            std::copy_n(pool0.conv.data() + b * 264, 264, s.conv.data());
            const auto ys = forward(m, s, seq_batch::dense(1, len), rows(xp, b * 8, len, 40));
            CHECK(rel_error(rows(yp, b * 8, len, 40), ys) < 1e-6);
            const std::vector<float> ps(p.ssm.data() + b * 480, p.ssm.data() + (b + 1) * 480),
                pc(p.conv.data() + b * 264, p.conv.data() + (b + 1) * 264);
            CHECK(rel_error(ps, ssm_of(s)) < 1e-6);
            CHECK(rel_error(pc, conv_of(s)) < 1e-6);
            for (std::int64_t i = (b * 8 + len) * 40; i < (b + 1) * 8 * 40; ++i) CHECK(yp[static_cast<std::size_t>(i)] == 0.f);
        }
    }
}

TEST_CASE("causality and T = 0 pass-through (invariants 7, 22)") {
    const auto c = small_config(16);
    gated_deltanet m(c, test_weights(c, 70));
    const auto st0 = random_state(m, 1, 71);
    const auto x = random_x(50, c.d_model, 72);
    auto s = st0;
    const auto y = forward(m, s, seq_batch::dense(1, 50), x);
    for (std::int64_t t0 : {0, 7, 16, 33, 49}) {
        CAPTURE(t0);
        auto xp = x;
        for (std::size_t i = static_cast<std::size_t>(t0 * 40); i < xp.size(); ++i) xp[i] = xp[i] * -3.f + 0.5f;
        auto sp = st0;
        const auto yp = forward(m, sp, seq_batch::dense(1, 50), xp);
        CHECK(std::equal(yp.begin(), yp.begin() + t0 * 40, y.begin()));
        CHECK_FALSE(std::equal(yp.begin() + t0 * 40, yp.end(), y.begin() + t0 * 40));
    }
    // T = 0: nothing changes, no output rows.
    auto s0 = st0;
    seq_batch b;
    b.add(0, 0, 0);
    b.n_rows = 0;
    const auto y0 = forward(m, s0, b, {});
    CHECK(y0.empty());
    CHECK(ssm_of(s0) == ssm_of(st0));
    CHECK(conv_of(s0) == conv_of(st0));
    // A length-0 sequence next to a real one.
    const std::vector<std::int64_t> cu{0, 0, 6};
    auto s2 = m.make_state(2);
    s2.copy_slot(0, 0);
    std::copy_n(st0.ssm.data(), 480, s2.ssm.data());
    const auto before = ssm_of(s2);
    forward(m, s2, seq_batch::packed(cu), rows(x, 0, 6, 40));
    CHECK(std::equal(s2.ssm.data(), s2.ssm.data() + 480, before.begin()));
}

TEST_CASE("extreme gates and negative eigenvalues stay finite and accurate") {
    auto c = small_config(64);
    c.allow_neg_eigval = true;
    auto w = test_weights(c, 80);
    // Very strong decay on head 0 (A = 16, large a) and almost none on head 3.
    w.A_log[0] = std::log(16.f);
    w.dt_bias[0] = 20.f;
    w.A_log[3] = std::log(0.01f);
    w.dt_bias[3] = -12.f;
    gated_deltanet m(c, w);
    auto st = random_state(m, 1, 81);
    const auto x = random_x(130, c.d_model, 82);
    const auto ref = reference(m, st, seq_batch::dense(1, 130), x);
    const auto y = forward(m, st, seq_batch::dense(1, 130), x);
    CHECK(all_finite(y));
    CHECK(all_finite(ssm_of(st)));
    CHECK(rel_error(y, ref.y) < 1e-5);
    CHECK(rel_error(ssm_of(st), ref.ssm) < 1e-5);
}

TEST_CASE("thread count does not change results") {
    const auto c = small_config(16);
    gated_deltanet m(c, test_weights(c, 90));
    const auto x = random_x(45, c.d_model, 91);
    auto s1 = m.make_state(1), s2 = m.make_state(1);
    const auto y1 = forward(m, s1, seq_batch::dense(1, 45), x, false, 1);
    const auto y2 = forward(m, s2, seq_batch::dense(1, 45), x, false, 2);
    CHECK(rel_error(y1, y2) < 1e-6);
    CHECK(rel_error(ssm_of(s1), ssm_of(s2)) < 1e-6);
}

TEST_CASE("bad arguments throw") {
    const auto c = small_config();
    const auto w = gated_deltanet_weights::random(c, 100);
    SUBCASE("config") {
        auto bad = c;
        bad.n_v_heads = 3;
        CHECK_THROWS_AS(bad.validate(), config_error);
        CHECK_THROWS_AS(gated_deltanet(bad, w), config_error);
        bad = c;
        bad.d_k = 0;
        CHECK_THROWS_AS(bad.validate(), config_error);
        bad = c;
        bad.chunk_size = -1;
        CHECK_THROWS_AS(bad.validate(), config_error);
        bad.chunk_size = 0;  // the backend's choice
        CHECK_NOTHROW(bad.validate());
        CHECK(gated_deltanet(bad, w).chunk_for(cpu_backend(1)) == ops::gated_delta_chunk_length(cpu_backend(1), c.d_k, c.d_v));
    }
    SUBCASE("weights") {
        auto bw = w;
        bw.out_proj = tensor<float>({40, 41});
        CHECK_THROWS_AS(gated_deltanet(c, bw), shape_error);
        bw = w;
        bw.conv1d_weight = tensor<float>({88, 1, 4});
        CHECK_THROWS_AS(gated_deltanet(c, bw), shape_error);
        try {
            bw = w;
            bw.A_log = tensor<float>({5});
            gated_deltanet m(c, bw);
            FAIL("expected shape_error");
        } catch (const shape_error& e) {
            CHECK(std::string(e.what()).find("A_log") != std::string::npos);
        }
    }
    SUBCASE("calls") {
        gated_deltanet m(c, w);
        cpu_backend be(1);
        auto st = m.make_state(2);
        std::vector<float> x(5 * 40), y(5 * 40);
        tensor_view<const float, 2> xv(x.data(), {5, 40});
        tensor_view<float, 2> yv(y.data(), {5, 40});
        // x / y rows differ from the batch.
        CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 4), xv, yv), shape_error);
        // y width wrong.
        tensor_view<float, 2> yw(y.data(), {5, 39});
        CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 5), xv, yw), shape_error);
        // Slot beyond the state.
        const std::vector<std::int64_t> cu{0, 5}, sl{2};
        CHECK_THROWS_AS(m.forward(be, st, seq_batch::packed(cu, sl), xv, yv), shape_error);
        // State from a different layer shape.
        auto c2 = c;
        c2.d_v = 8;
        gated_deltanet m2(c2, gated_deltanet_weights::random(c2, 1));
        auto st2 = m2.make_state(2);
        CHECK_THROWS_AS(m.forward(be, st2, seq_batch::dense(1, 5), xv, yv), shape_error);
        // step with 5 tokens.
        CHECK_THROWS_AS(m.step(be, st, seq_batch::dense(1, 5), xv, yv), shape_error);
        CHECK_THROWS_AS(m.make_state(-1), shape_error);
    }
}

// The shared invariants of every mixer (tests/support/mixer_harness.hpp), on every backend; GQA 2:1, chunk 16.
HYMIX_MIXER_HARNESS("gated_deltanet", gated_deltanet(small_config(), test_weights(small_config(), 12)))
