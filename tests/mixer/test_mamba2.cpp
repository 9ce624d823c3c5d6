// The Mamba-2 mixer layer (mixer/mamba2.hpp) against its fp64 whole-layer reference, and the layer-level
// invariants of spec.md §8: 3 (split invariance), 4 (dispatch by token count), 6, 7, 9 (dt path), 10 (softplus),
// 16 (varlen isolation), 18 (right padding), 19 (slots), causality and argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "support/mixer_harness.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

/// Invariant 3's layer: d = 64, expand 2, P = 16, N = 16, K = 4, Q = 16 (H = 8).
mamba2_config small_config(std::int64_t G = 1) {
    mamba2_config c;
    c.d_model = 64;
    c.expand = 2;
    c.n_heads = 8;
    c.head_dim = 16;
    c.d_state = 16;
    c.n_groups = G;
    c.d_conv = 4;
    c.chunk_size = 16;
    return c;
}

std::vector<float> run(const mamba2& m, const cpu_backend& be, mamba2_state& st, const seq_batch& b, const std::vector<float>& x,
                       bool use_step = false) {
    const std::int64_t d = m.config().d_model;
    std::vector<float> y(std::size_t(b.n_rows * d), -123.f);
    tensor_view<const float, 2> xv(x.data(), {b.n_rows, d});
    tensor_view<float, 2> yv(y.data(), {b.n_rows, d});
    if (use_step) m.step(be, st, b, xv, yv);
    else m.forward(be, st, b, xv, yv);
    return y;
}

/// Rows [start, start + len) of x [·, d] in double.
std::vector<double> rows_d(const std::vector<float>& x, std::int64_t start, std::int64_t len, std::int64_t d) {
    return {x.begin() + start * d, x.begin() + (start + len) * d};
}
template <class V>
V rows(const V& v, std::int64_t start, std::int64_t len, std::int64_t d) {
    return {v.begin() + start * d, v.begin() + (start + len) * d};
}

std::vector<float> ssm_of(const mamba2_state& st, std::int64_t slot) {
    return {st.ssm_slot(slot), st.ssm_slot(slot) + st.ssm_slot_size()};
}
std::vector<float> conv_of(const mamba2_state& st, std::int64_t slot) {
    return {st.conv_slot(slot), st.conv_slot(slot) + st.conv_slot_size()};
}

/// Random non-zero state in slot i (as after some earlier prompt), mirrored into an fp64 reference state.
void random_slot(mamba2_state& st, std::int64_t slot, mamba2_ref_state& ref, std::uint64_t seed) {
    const auto s = uniform(std::size_t(st.ssm_slot_size()), -1.f, 1.f, seed);
    const auto c = uniform(std::size_t(st.conv_slot_size()), -1.f, 1.f, seed + 1);
    std::copy(s.begin(), s.end(), st.ssm_slot(slot));
    std::copy(c.begin(), c.end(), st.conv_slot(slot));
    ref.ssm.assign(s.begin(), s.end());
    ref.conv.assign(c.begin(), c.end());
}

}  // namespace

TEST_CASE("mamba2 layer: chunked forward and step equal the fp64 layer reference (invariant 6)") {
    const cpu_backend be(2);
    struct variant {
        const char* name;
        mamba2_config cfg;
    };
    std::vector<variant> vs;
    vs.push_back({"G=1", small_config(1)});
    vs.push_back({"G=2 grouped norm", small_config(2)});
    {
        auto c = small_config(2);
        c.norm_group_size = c.d_inner();
        vs.push_back({"G=2 full-width norm", c});
    }
    {
        auto c = small_config(4);
        c.D_has_hdim = true;
        c.proj_bias = true;
        c.conv_bias = false;
        c.d_state = 13;
        c.head_dim = 12;
        c.n_heads = 12;
        c.expand = 0;
        c.chunk_size = 7;
        vs.push_back({"odd sizes, D per channel, proj bias, no conv bias", c});
    }
    {
        auto c = small_config(1);
        c.dt_limit = {0.01f, 0.05f};
        vs.push_back({"dt limits", c});
    }
    {
        auto c = small_config(2);
        c.chunk_size = 0;  // the backend's chunk length (64 on the CPU: T = 100 spans two chunks)
        vs.push_back({"chunk length of the backend", c});
    }
    for (const auto& v : vs) {
        CAPTURE(v.name);
        auto w = mamba2_weights::random(v.cfg, 11);
        if (v.cfg.proj_bias) {
            const auto b1 = uniform(std::size_t(v.cfg.d_in_proj()), -0.5f, 0.5f, 12);
            const auto b2 = uniform(std::size_t(v.cfg.d_model), -0.5f, 0.5f, 13);
            std::copy(b1.begin(), b1.end(), w.in_proj_bias.data());
            std::copy(b2.begin(), b2.end(), w.out_proj_bias.data());
        }
        if (v.cfg.D_has_hdim) {
            const auto dd = uniform(std::size_t(v.cfg.d_inner()), -1.f, 2.f, 14);
            std::copy(dd.begin(), dd.end(), w.D.data());
        }
        const auto nw = uniform(std::size_t(v.cfg.d_inner()), 0.5f, 1.5f, 15);
        std::copy(nw.begin(), nw.end(), w.norm_weight.data());
        const mamba2 m(v.cfg, w);
        const std::int64_t d = v.cfg.d_model;
        for (std::int64_t T : {1, 5, 50, 100})
            for (bool nonzero : {false, true}) {
                CAPTURE(T);
                CAPTURE(nonzero);
                const auto x = uniform(std::size_t(T * d), -1.f, 1.f, std::uint64_t(T + 100));
                auto st = m.make_state(1);
                mamba2_ref_state ref(v.cfg);
                if (nonzero) random_slot(st, 0, ref, 7);
                auto st2 = st;
                const auto y = run(m, be, st, seq_batch::dense(1, T), x);
                const auto yref = mamba2_reference(v.cfg, w, rows_d(x, 0, T, d), T, ref);
                CHECK(rel_error(y, yref) < 4e-6);
                CHECK(rel_error(ssm_of(st, 0), ref.ssm) < 4e-6);
                CHECK(rel_error(conv_of(st, 0), ref.conv) < 1e-6);
                // step path, token by token
                std::vector<float> ys;
                for (std::int64_t t = 0; t < T; ++t) {
                    const std::vector<std::int64_t> slot{0};
                    const auto yt = run(m, be, st2, seq_batch::decode(slot), rows(x, t, 1, d), true);
                    ys.insert(ys.end(), yt.begin(), yt.end());
                }
                CHECK(rel_error(ys, yref) < 4e-6);
                CHECK(rel_error(ssm_of(st2, 0), ref.ssm) < 4e-6);
            }
    }
}

TEST_CASE("mamba2 split invariance: 16+16+18, 1+49, 3+47, 17+1+1+31 equal one call (invariant 3)") {
    const cpu_backend be(2);
    const auto cfg = small_config(1);
    const mamba2 m(cfg, mamba2_weights::random(cfg, 3));
    const std::int64_t T = 50, d = cfg.d_model;
    const auto x = uniform(std::size_t(T * d), -1.f, 1.f, 4);
    auto st = m.make_state(1);
    const auto y = run(m, be, st, seq_batch::dense(1, T), x);
    for (const auto& splits : std::vector<std::vector<std::int64_t>>{{16, 16, 18}, {1, 49}, {3, 47}, {17, 1, 1, 31}}) {
        auto s2 = m.make_state(1);
        std::vector<float> ys;
        std::int64_t t0 = 0;
        for (auto len : splits) {
            const auto yp = run(m, be, s2, seq_batch::dense(1, len), rows(x, t0, len, d));
            ys.insert(ys.end(), yp.begin(), yp.end());
            t0 += len;
        }
        CHECK(rel_error(ys, y) < 1e-6);
        CHECK(rel_error(ssm_of(s2, 0), ssm_of(st, 0)) < 1e-6);
        CHECK(rel_error(conv_of(s2, 0), conv_of(st, 0)) < 1e-6);  // projections of different row counts round differently
    }
}

TEST_CASE("mamba2 dispatch by token count: 10 + 3 + 1 + 4 equals 18; step rejects T > 1 (invariant 4)") {
    const cpu_backend be(2);
    auto cfg = small_config(2);
    cfg.chunk_size = 4;
    const mamba2 m(cfg, mamba2_weights::random(cfg, 5));
    const std::int64_t d = cfg.d_model;
    const auto x = uniform(std::size_t(18 * d), -1.f, 1.f, 6);
    auto st = m.make_state(1);
    const auto y = run(m, be, st, seq_batch::dense(1, 18), x);
    auto s2 = m.make_state(1);
    std::vector<float> ys;
    std::int64_t t0 = 0;
    for (std::int64_t len : {10, 3, 1, 4}) {
        const auto yp = run(m, be, s2, seq_batch::dense(1, len), rows(x, t0, len, d));
        ys.insert(ys.end(), yp.begin(), yp.end());
        t0 += len;
    }
    CHECK(rel_error(ys, y) < 1e-6);
    CHECK(rel_error(ssm_of(s2, 0), ssm_of(st, 0)) < 1e-6);
    CHECK(rel_error(conv_of(s2, 0), conv_of(st, 0)) < 1e-6);
    auto s3 = m.make_state(1);
    std::vector<float> y2(std::size_t(2 * d));
    CHECK_THROWS_AS(m.step(be, s3, seq_batch::dense(1, 2), tensor_view<const float, 2>(x.data(), {2, d}),
                           tensor_view<float, 2>(y2.data(), {2, d})),
                    shape_error);
}

TEST_CASE("mamba2 state pass-through: T = 0 leaves the state unchanged; initial state continues the sequence (invariant 7)") {
    const cpu_backend be(1);
    const auto cfg = small_config(2);
    const mamba2 m(cfg, mamba2_weights::random(cfg, 8));
    auto st = m.make_state(2);
    mamba2_ref_state ref(cfg);
    random_slot(st, 1, ref, 9);
    const auto before = st;
    std::vector<float> none;
    const std::vector<std::int64_t> cu{0, 0};
    const std::vector<std::int64_t> slot{1};
    run(m, be, st, seq_batch::packed(cu, slot), none);
    CHECK(ssm_of(st, 1) == ssm_of(before, 1));
    CHECK(conv_of(st, 1) == conv_of(before, 1));
    CHECK(ssm_of(st, 0) == ssm_of(before, 0));
}

TEST_CASE("mamba2 varlen isolation: packed [5, 3, 9] + loud dummy equal standalone runs (invariant 16)") {
    const cpu_backend be(2);
    auto cfg = small_config(2);
    cfg.chunk_size = 8;
    const auto w = mamba2_weights::random(cfg, 17);
    const mamba2 m(cfg, w);
    const std::int64_t d = cfg.d_model;
    for (bool nonzero : {false, true}) {
        CAPTURE(nonzero);
        // sequences 5, 3, 9 (= 17 rows), then a 15-token dummy of values ×1e3 in an invalid slot, then the same in slot 3
        const std::vector<std::int64_t> cu{0, 5, 8, 17, 32, 47};
        const std::vector<std::int64_t> slots{0, 1, 2, -1, 3};
        auto x = uniform(std::size_t(47 * d), -1.f, 1.f, 18);
        for (std::size_t i = std::size_t(17 * d); i < x.size(); ++i) x[i] *= 1e3f;
        auto st = m.make_state(5);
        std::vector<mamba2_ref_state> refs(4, mamba2_ref_state(cfg));
        if (nonzero)
            for (int s = 0; s < 4; ++s) random_slot(st, s, refs[std::size_t(s)], std::uint64_t(40 + 2 * s));
        random_slot(st, 4, refs[0], 60);  // slot 4 is not used by this call
        if (nonzero) random_slot(st, 0, refs[0], 40);
        else {
            refs[0] = mamba2_ref_state(cfg);
            std::fill_n(st.ssm_slot(0), st.ssm_slot_size(), 0.f);
            std::fill_n(st.conv_slot(0), st.conv_slot_size(), 0.f);
        }
        const auto before = st;
        const auto y = run(m, be, st, seq_batch::packed(cu, slots), x);
        for (int s : {0, 1, 2, 4}) {
            CAPTURE(s);
            const std::int64_t slot = slots[std::size_t(s)], b = cu[std::size_t(s)], len = cu[std::size_t(s) + 1] - b;
            auto& ref = refs[std::size_t(slot)];
            const auto yr = mamba2_reference(cfg, w, rows_d(x, b, len, d), len, ref);
            CHECK(rel_error(rows(y, b, len, d), yr) < 4e-6);
            CHECK(rel_error(ssm_of(st, slot), ref.ssm) < 4e-6);
            CHECK(rel_error(conv_of(st, slot), ref.conv) < 1e-6);
        }
        // the invalid entry: zero outputs, no state touched (slot 4 bit-identical)
        for (float v : rows(y, 17, 15, d)) REQUIRE(v == 0.f);
        CHECK(ssm_of(st, 4) == ssm_of(before, 4));
        CHECK(conv_of(st, 4) == conv_of(before, 4));

        // reordering / removing neighbours changes nothing for sequence [5..8) (3 tokens)
        auto st2 = before;
        const std::vector<std::int64_t> cu2{0, 3, 12};
        const std::vector<std::int64_t> slots2{1, 2};
        std::vector<float> x2 = rows(x, 5, 3, d);
        const auto x9 = rows(x, 8, 9, d);
        x2.insert(x2.end(), x9.begin(), x9.end());
        const auto y2 = run(m, be, st2, seq_batch::packed(cu2, slots2), x2);
        CHECK(rel_error(rows(y2, 0, 3, d), rows(y, 5, 3, d)) < 1e-6);
        CHECK(rel_error(rows(y2, 3, 9, d), rows(y, 8, 9, d)) < 1e-6);
        CHECK(rel_error(ssm_of(st2, 1), ssm_of(st, 1)) < 1e-6);
        CHECK(ssm_of(st2, 0) == ssm_of(before, 0));
    }
}

TEST_CASE("mamba2 right padding with lengths 5 and 8 (invariant 18)") {
    const cpu_backend be(2);
    auto cfg = small_config(1);
    cfg.chunk_size = 4;
    auto w = mamba2_weights::random(cfg, 19);
    w.dt_bias.fill(1.0f);
    const mamba2 m(cfg, w);
    const std::int64_t d = cfg.d_model, T = 8, K = cfg.d_conv, cd = cfg.conv_dim(), di = cfg.d_inner();
    const std::vector<std::int64_t> lens{5, 8};
    const auto x = uniform(std::size_t(2 * T * d), -1.f, 1.f, 20);
    auto st = m.make_state(2);
    const auto y = run(m, be, st, seq_batch::padded(T, lens), x);
    for (float v : rows(y, 5, 3, d)) REQUIRE(v == 0.f);  // padding rows
    // row 0 alone
    auto s0 = m.make_state(1);
    const auto y0 = run(m, be, s0, seq_batch::dense(1, 5), rows(x, 0, 5, d));
    CHECK(rel_error(rows(y, 0, 5, d), y0) < 1e-6);
    CHECK(rel_error(ssm_of(st, 0), ssm_of(s0, 0)) < 1e-6);
    // cached conv state = pre-conv xBC of inputs 2..4 of row 0 (x · W_inᵀ, columns [d_inner, d_inner + conv_dim))
    const auto conv0 = conv_of(st, 0);
    double worst = 0;
    for (std::int64_t c = 0; c < cd; ++c)
        for (std::int64_t j = 0; j < K - 1; ++j) {
            const std::int64_t t = 2 + j;
            double acc = 0;
            for (std::int64_t i = 0; i < d; ++i) acc += double(w.in_proj[(di + c) * d + i]) * x[std::size_t(t * d + i)];
            worst = std::max(worst, std::abs(conv0[std::size_t(c * (K - 1) + j)] - acc));
        }
    CHECK(worst < 4e-6);
    // one decode step of both rows equals row 0's 5-token prefill + 1 decode alone
    const auto xn = uniform(std::size_t(2 * d), -1.f, 1.f, 21);
    const std::vector<std::int64_t> slots{0, 1};
    const auto yn = run(m, be, st, seq_batch::decode(slots), xn, true);
    const std::vector<std::int64_t> slot0{0};
    const auto yn0 = run(m, be, s0, seq_batch::decode(slot0), rows(xn, 0, 1, d), true);
    CHECK(rel_error(rows(yn, 0, 1, d), yn0) < 1e-6);
    CHECK(rel_error(ssm_of(st, 0), ssm_of(s0, 0)) < 1e-6);
}

TEST_CASE("mamba2 batch independence and slot reuse: lengths 3, 7, 12, 1 in slots 5, 2, 7, 0 (invariant 19)") {
    const cpu_backend be(2);
    auto cfg = small_config(2);
    cfg.chunk_size = 4;
    const auto w = mamba2_weights::random(cfg, 23);
    const mamba2 m(cfg, w);
    const std::int64_t d = cfg.d_model;
    const std::vector<std::int64_t> lens{3, 7, 12, 1}, slots{5, 2, 7, 0};
    std::vector<std::int64_t> cu{0};
    for (auto l : lens) cu.push_back(cu.back() + l);
    const auto x = uniform(std::size_t(cu.back() * d), -1.f, 1.f, 24);
    auto pool = m.make_state(8);
    const auto y = run(m, be, pool, seq_batch::packed(cu, slots), x);
    // then decode 2 steps together
    const auto xd = uniform(std::size_t(2 * 4 * d), -1.f, 1.f, 25);
    std::vector<float> yd;
    for (int k = 0; k < 2; ++k) {
        const auto yk = run(m, be, pool, seq_batch::decode(slots), rows(xd, 4 * k, 4, d), true);
        yd.insert(yd.end(), yk.begin(), yk.end());
    }
    for (std::size_t i = 0; i < lens.size(); ++i) {
        CAPTURE(i);
        mamba2_ref_state ref(cfg);
        const auto yr = mamba2_reference(cfg, w, rows_d(x, cu[i], lens[i], d), lens[i], ref);
        CHECK(rel_error(rows(y, cu[i], lens[i], d), yr) < 4e-6);
        for (int k = 0; k < 2; ++k) {
            const auto yrk = mamba2_reference(cfg, w, rows_d(xd, 4 * k + std::int64_t(i), 1, d), 1, ref);
            CHECK(rel_error(rows(yd, 4 * k + std::int64_t(i), 1, d), yrk) < 4e-6);
        }
        CHECK(rel_error(ssm_of(pool, slots[i]), ref.ssm) < 4e-6);
    }
    // permuting the batch permutes the outputs
    auto pool2 = m.make_state(8);
    run(m, be, pool2, seq_batch::packed(cu, slots), x);
    const std::vector<std::int64_t> perm{2, 0, 3, 1};
    std::vector<std::int64_t> pslots;
    std::vector<float> px;
    for (auto p : perm) {
        pslots.push_back(slots[std::size_t(p)]);
        const auto r = rows(xd, p, 1, d);
        px.insert(px.end(), r.begin(), r.end());
    }
    const auto yp = run(m, be, pool2, seq_batch::decode(pslots), px, true);
    for (std::size_t j = 0; j < perm.size(); ++j) CHECK(rows(yp, std::int64_t(j), 1, d) == rows(yd, perm[j], 1, d));
    // clearing slot 2 and starting a new 4-token sequence there equals a fresh run
    pool.reset_slot(2);
    const auto xn = uniform(std::size_t(4 * d), -1.f, 1.f, 26);
    const std::vector<std::int64_t> cun{0, 4}, sn{2};
    const auto yn = run(m, be, pool, seq_batch::packed(cun, sn), xn);
    auto fresh = m.make_state(1);
    const auto yf = run(m, be, fresh, seq_batch::dense(1, 4), xn);
    CHECK(yn == yf);
    CHECK(ssm_of(pool, 2) == ssm_of(fresh, 0));
    // micro-batches of 1, 3, 7 or 64 tokens give the same prompt results
    const std::int64_t Tp = 40;
    const auto xp = uniform(std::size_t(Tp * d), -1.f, 1.f, 27);
    auto sref = m.make_state(1);
    const auto yref = run(m, be, sref, seq_batch::dense(1, Tp), xp);
    for (std::int64_t mb : {1, 3, 7, 64}) {
        CAPTURE(mb);
        auto s = m.make_state(1);
        std::vector<float> ym;
        for (std::int64_t t0 = 0; t0 < Tp; t0 += mb) {
            const std::int64_t len = std::min(mb, Tp - t0);
            const auto yk = run(m, be, s, seq_batch::dense(1, len), rows(xp, t0, len, d));
            ym.insert(ym.end(), yk.begin(), yk.end());
        }
        CHECK(rel_error(ym, yref) < 1e-6);
        CHECK(rel_error(ssm_of(s, 0), ssm_of(sref, 0)) < 1e-6);
    }
}

TEST_CASE("mamba2 dt path and softplus at extreme pre-activations (invariants 9, 10)") {
    const cpu_backend be(2);
    mamba2_config cfg;
    cfg.d_model = 16;
    cfg.n_heads = 2;
    cfg.head_dim = 4;
    cfg.d_state = 4;
    cfg.n_groups = 1;
    cfg.chunk_size = 4;
    // dt rows of in_proj read input column 0 only, so x[t, 0] is dt_raw[t].
    auto make_weights = [&](const mamba2_config& c, std::vector<float> dt_bias, float A) {
        auto w = mamba2_weights::random(c, 31);
        const std::int64_t np = c.d_in_proj(), d = c.d_model;
        for (std::int64_t o = 0; o < np - c.n_heads; ++o) w.in_proj[o * d] = 0.f;  // column 0 feeds dt only
        for (std::int64_t h = 0; h < c.n_heads; ++h)
            for (std::int64_t i = 0; i < d; ++i) w.in_proj[(np - c.n_heads + h) * d + i] = i == 0 ? 1.f : 0.f;
        std::copy(dt_bias.begin(), dt_bias.end(), w.dt_bias.data());
        if (A != 0) w.A_log.fill(std::log(-A));
        return w;
    };
    auto inputs = [&](const std::vector<float>& dt_raw) {
        auto x = uniform(std::size_t(std::int64_t(dt_raw.size()) * cfg.d_model), -1.f, 1.f, 32);
        for (std::size_t t = 0; t < dt_raw.size(); ++t) x[t * std::size_t(cfg.d_model)] = dt_raw[t];
        return x;
    };
    auto check_paths = [&](const mamba2_config& c, const mamba2_weights& w, const std::vector<float>& x, std::int64_t T) {
        const mamba2 m(c, w);
        auto s1 = m.make_state(1), s2 = m.make_state(1);
        const auto y1 = run(m, be, s1, seq_batch::dense(1, T), x);
        std::vector<float> y2;
        const std::vector<std::int64_t> slot{0};
        for (std::int64_t t = 0; t < T; ++t) {
            const auto yt = run(m, be, s2, seq_batch::decode(slot), rows(x, t, 1, c.d_model), true);
            y2.insert(y2.end(), yt.begin(), yt.end());
        }
        mamba2_ref_state ref(c);
        const auto yr = mamba2_reference(c, w, rows_d(x, 0, T, c.d_model), T, ref);
        for (float v : y1) REQUIRE(std::isfinite(v));
        CHECK(rel_error(y1, yr) < 4e-6);
        CHECK(rel_error(y2, yr) < 4e-6);
        CHECK(rel_error(ssm_of(s1, 0), ref.ssm) < 4e-6);
        CHECK(rel_error(ssm_of(s2, 0), ref.ssm) < 4e-6);
        return y1;
    };
    SUBCASE("invariant 9: dt_raw [-30, -5, 0, 5, 30], dt_bias [0.5, -2]") {
        const std::vector<float> dt_raw{-30.f, -5.f, 0.f, 5.f, 30.f};
        const auto w = make_weights(cfg, {0.5f, -2.f}, 0.f);
        check_paths(cfg, w, inputs(dt_raw), 5);
        CHECK(softplus(-29.5f) > 0.f);
        CHECK(softplus(-29.5f) == doctest::Approx(1.5e-13).epsilon(0.05));
        auto lim = cfg;
        lim.dt_limit = {0.01f, 0.1f};
        const auto y_a = check_paths(lim, w, inputs(dt_raw), 5);
        // pinned tokens: moving dt_raw further out changes nothing, bit for bit
        const auto y_b = check_paths(lim, w, inputs({-40.f, -5.f, 0.f, 5.f, 40.f}), 5);
        CHECK(y_a == y_b);
        const auto y_c = check_paths(lim, w, inputs({-30.f, -4.4f, 0.f, 5.f, 30.f}), 5);  // head 0 not pinned: visible
        CHECK(rel_error(y_c, y_a) > 1e-6);
    }
    SUBCASE("invariant 10: pre-activations {19.9, 20.1, 50, 100, -50, 0}, A = -1e-3") {
        const std::vector<float> pre{19.9f, 20.1f, 50.f, 100.f, -50.f, 0.f};
        for (float v : pre) CHECK(std::isfinite(softplus(v)));
        for (float v : {20.1f, 50.f, 100.f}) CHECK(softplus(v) == v);
        CHECK(std::abs(softplus(20.0 + 1e-9) - softplus(20.0 - 1e-9)) < 1e-8);
        const auto w = make_weights(cfg, {0.f, 0.f}, -1e-3f);
        check_paths(cfg, w, inputs(pre), 6);
    }
}

TEST_CASE("mamba2 is causal and finite at extreme gates") {
    const cpu_backend be(2);
    const auto cfg = small_config(2);
    auto w = mamba2_weights::random(cfg, 41);
    const std::int64_t d = cfg.d_model, T = 40, t0 = 19;
    const mamba2 m(cfg, w);
    auto x = uniform(std::size_t(T * d), -1.f, 1.f, 42);
    auto s1 = m.make_state(1);
    const auto y1 = run(m, be, s1, seq_batch::dense(1, T), x);
    for (std::size_t i = std::size_t(t0 * d); i < x.size(); ++i) x[i] = -3.f * x[i] + 0.5f;
    auto s2 = m.make_state(1);
    const auto y2 = run(m, be, s2, seq_batch::dense(1, T), x);
    CHECK(rows(y2, 0, t0, d) == rows(y1, 0, t0, d));
    CHECK(rows(y2, t0, 1, d) != rows(y1, t0, 1, d));

    for (float bias : {-20.f, 20.f, 60.f}) {
        for (std::int64_t h = 0; h < cfg.n_heads; ++h) w.dt_bias[h] = bias;
        w.A_log.fill(std::log(16.f));
        const mamba2 me(cfg, w);
        const auto xe = uniform(std::size_t(T * d), -10.f, 10.f, 43);
        auto s = me.make_state(1);
        const auto ye = run(me, be, s, seq_batch::dense(1, T), xe);
        for (float v : ye) REQUIRE(std::isfinite(v));
        for (float v : ssm_of(s, 0)) REQUIRE(std::isfinite(v));
        mamba2_ref_state ref(cfg);
        const auto yr = mamba2_reference(cfg, w, rows_d(xe, 0, T, d), T, ref);
        CHECK(rel_error(ye, yr) < 4e-6);
    }
}

TEST_CASE("mamba2: chunk size changes cost, never results") {
    const cpu_backend be(2);
    auto cfg = small_config(1);
    const auto w = mamba2_weights::random(cfg, 51);
    const std::int64_t d = cfg.d_model, T = 77;
    const auto x = uniform(std::size_t(T * d), -1.f, 1.f, 52);
    std::vector<float> y0;
    for (std::int64_t Q : {1, 7, 16, 64, 256}) {
        CAPTURE(Q);
        cfg.chunk_size = Q;
        const mamba2 m(cfg, w);
        auto s = m.make_state(1);
        const auto y = run(m, be, s, seq_batch::dense(1, T), x);
        if (y0.empty()) y0 = y;
        else CHECK(rel_error(y, y0) < 1e-6);
        mamba2::release_scratch();  // the next call allocates afresh: same results
    }
}

TEST_CASE("mamba2: bad configs, weights, states and batches throw") {
    const cpu_backend be(1);
    auto cfg = small_config(1);
    {
        auto c = cfg;
        c.n_groups = 3;
        CHECK_THROWS_AS(c.validate(), config_error);
        c = cfg;
        c.d_ssm = 64;
        CHECK_THROWS_AS(c.validate(), config_error);
        c = cfg;
        c.expand = 3;
        CHECK_THROWS_AS(c.validate(), config_error);
        c = cfg;
        c.norm_group_size = 7;
        CHECK_THROWS_AS(c.validate(), config_error);
        c = cfg;
        c.dt_limit = {0.1f, 0.01f};
        CHECK_THROWS_AS(c.validate(), config_error);
    }
    auto w = mamba2_weights::random(cfg, 1);
    {
        auto bad = w;
        bad.conv1d_weight = tensor<float>({cfg.conv_dim(), 1, cfg.d_conv});
        try {
            mamba2 m(cfg, bad);
            FAIL("expected shape_error");
        } catch (const shape_error& e) {
            CHECK(std::string(e.what()).find("conv1d.weight") != std::string::npos);
        }
        bad = w;
        bad.A_log = tensor<float>({cfg.n_heads + 1});
        CHECK_THROWS_AS(mamba2(cfg, bad), shape_error);
    }
    const mamba2 m(cfg, w);
    const std::int64_t d = cfg.d_model;
    std::vector<float> x(std::size_t(6 * d)), y(std::size_t(6 * d));
    auto st = m.make_state(2);
    tensor_view<const float, 2> xv(x.data(), {6, d});
    CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 6), xv, tensor_view<float, 2>(y.data(), {6, d - 1})), shape_error);
    CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(1, 5), xv, tensor_view<float, 2>(y.data(), {6, d})), shape_error);
    CHECK_THROWS_AS(m.forward(be, st, seq_batch::dense(3, 2), xv, tensor_view<float, 2>(y.data(), {6, d})), shape_error);  // slot 2
    mamba2_state wrong(small_config(2), 2);
    wrong.ssm = tensor<float>({2, cfg.n_heads, cfg.head_dim, cfg.d_state + 1});
    CHECK_THROWS_AS(m.forward(be, wrong, seq_batch::dense(1, 6), xv, tensor_view<float, 2>(y.data(), {6, d})), shape_error);
    CHECK_THROWS_AS(st.reset_slot(2), shape_error);
    CHECK_THROWS_AS(st.copy_slot(0, -1), shape_error);
}

TEST_CASE("mamba2 at the shared checkpoints' layer shape (d 256, 8×64 heads, N 64, chunk 64) equals the fp64 reference") {
    const cpu_backend be(2);
    mamba2_config cfg;
    cfg.d_model = 256;
    cfg.n_heads = 8;
    cfg.head_dim = 64;
    cfg.d_state = 64;
    cfg.chunk_size = 64;
    const auto w = mamba2_weights::random(cfg, 61);
    const mamba2 m(cfg, w);
    const std::int64_t d = cfg.d_model;
    const std::vector<std::int64_t> cu{0, 150, 214, 215};  // 150 (chunk tail of 22), 64 (one full chunk), 1
    const auto x = uniform(std::size_t(cu.back() * d), -1.f, 1.f, 62);
    auto st = m.make_state(3);
    const auto y = run(m, be, st, seq_batch::packed(cu), x);
    for (std::int64_t s = 0; s < 3; ++s) {
        CAPTURE(s);
        mamba2_ref_state ref(cfg);
        const std::int64_t b = cu[std::size_t(s)], len = cu[std::size_t(s) + 1] - b;
        const auto yr = mamba2_reference(cfg, w, rows_d(x, b, len, d), len, ref);
        CHECK(rel_error(rows(y, b, len, d), yr) < 4e-6);
        CHECK(rel_error(ssm_of(st, s), ref.ssm) < 4e-6);
        CHECK(rel_error(conv_of(st, s), ref.conv) < 1e-6);
    }
}

// The shared invariants of every mixer (tests/support/mixer_harness.hpp), on every backend; G = 2 groups, chunk 16.
HYMIX_MIXER_HARNESS("mamba2", mamba2(small_config(2), mamba2_weights::random(small_config(2), 11)))

TEST_CASE("mamba2 layer: chunk_size 0 runs at the backend's chunk length, a checkpoint's 256 changes only rounding") {
    const cpu_backend be(2);
    auto c = small_config(2);
    c.chunk_size = 0;
    const auto w = mamba2_weights::random(c, 21);
    const mamba2 autoq(c, w);
    CHECK(autoq.chunk_for(be) == ops::ssd_chunk_length(be, c.head_dim, c.d_state));
    CHECK(autoq.chunk_for(be) == 64);
    c.chunk_size = 64;
    const mamba2 q64(c, w);
    c.chunk_size = 256;
    const mamba2 q256(c, w);
    const std::int64_t T = 300;
    const auto x = uniform(std::size_t(T * c.d_model), -1.f, 1.f, 22);
    auto s1 = autoq.make_state(1), s2 = q64.make_state(1), s3 = q256.make_state(1);
    const auto y1 = run(autoq, be, s1, seq_batch::dense(1, T), x), y2 = run(q64, be, s2, seq_batch::dense(1, T), x),
               y3 = run(q256, be, s3, seq_batch::dense(1, T), x);
    CHECK(y1 == y2);
    CHECK(ssm_of(s1, 0) == ssm_of(s2, 0));
    CHECK(rel_error(y3, y1) < 1e-5);
    CHECK(rel_error(ssm_of(s3, 0), ssm_of(s1, 0)) < 1e-5);
    c.chunk_size = -1;
    CHECK_THROWS_AS(c.validate(), config_error);
}
