// Attention kernels (spec.md §2, invariants 21, 22): tiled prefill and split-K decode vs the fp64 reference with a
// materialised mask — odd sizes, n_past (bottom-right alignment), GQA/MQA, sliding windows, fully masked rows and
// tiles, finite LSE, causality, batch independence, bad arguments; keys and values stored in bf16 / f16.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/convert.hpp"
#include "hymix/kernels/attention.hpp"
#include "support/random.hpp"

using namespace hymix;
using kernels::attention_params;
using kernels::attention_problem;

namespace {

/// Owns the tensors of one problem, in fp32 and as an fp64 copy for the reference.
struct case_data {
    std::int64_t Tq, Tk, H, Hkv, dh;
    std::vector<float> q, k, v, o, lse;
    std::vector<double> qd, kd, vd, od, lsed;

    case_data(std::int64_t Tq_, std::int64_t Tk_, std::int64_t H_, std::int64_t Hkv_, std::int64_t dh_, std::uint64_t seed,
              float amp = 1.f)
        : Tq(Tq_), Tk(Tk_), H(H_), Hkv(Hkv_), dh(dh_) {
        q = test::uniform(static_cast<std::size_t>(Tq * H * dh), -amp, amp, seed);
        k = test::uniform(static_cast<std::size_t>(Tk * Hkv * dh), -amp, amp, seed + 1);
        v = test::uniform(static_cast<std::size_t>(Tk * Hkv * dh), -1.f, 1.f, seed + 2);
        o.assign(static_cast<std::size_t>(Tq * H * dh), 123.f);  // garbage: the kernel must overwrite every entry
        lse.assign(static_cast<std::size_t>(Tq * H), 123.f);
        sync();
    }
    void sync() {
        qd.assign(q.begin(), q.end());
        kd.assign(k.begin(), k.end());
        vd.assign(v.begin(), v.end());
        od.assign(o.size(), 0.0);
        lsed.assign(lse.size(), 0.0);
    }
    attention_problem<float> problem() {
        return {tensor_view<const float, 3>(q.data(), {Tq, H, dh}), tensor_view<const float, 3>(k.data(), {Tk, Hkv, dh}),
                tensor_view<const float, 3>(v.data(), {Tk, Hkv, dh}), tensor_view<float, 3>(o.data(), {Tq, H, dh}),
                tensor_view<float, 2>(lse.data(), {Tq, H})};
    }
    void run_ref(const attention_params& prm) {
        sync();
        attention_problem<double> p{tensor_view<const double, 3>(qd.data(), {Tq, H, dh}),
                                    tensor_view<const double, 3>(kd.data(), {Tk, Hkv, dh}),
                                    tensor_view<const double, 3>(vd.data(), {Tk, Hkv, dh}), tensor_view<double, 3>(od.data(), {Tq, H, dh}),
                                    tensor_view<double, 2>(lsed.data(), {Tq, H})};
        kernels::attention_ref(p, prm);
    }
    /// Relative error of the finite LSE entries; checks −∞ entries agree exactly.
    double lse_error() const {
        std::vector<float> a;
        std::vector<double> b;
        for (std::size_t i = 0; i < lse.size(); ++i) {
            if (std::isinf(lsed[i])) {
                CHECK(lse[i] == -std::numeric_limits<float>::infinity());
                continue;
            }
            a.push_back(lse[i]);
            b.push_back(lsed[i]);
        }
        return a.empty() ? 0.0 : test::rel_error(a, b);
    }
};

void run_prefill(const cpu_backend& be, case_data& c, const attention_params& prm) {
    const auto p = c.problem();
    kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), prm);
}
void run_decode(const cpu_backend& be, case_data& c, const attention_params& prm) {
    const auto p = c.problem();
    kernels::attention_decode(be, std::span<const attention_problem<float>>(&p, 1), prm);
}

}  // namespace

TEST_CASE("attention prefill vs fp64 reference: odd sizes, n_past, GQA/MQA, windows") {
    const cpu_backend be(2);
    struct shape {
        std::int64_t Tq, Tk, H, Hkv, dh, window;
    };
    const shape shapes[] = {
        {77, 77, 4, 2, 24, 0},    // crosses a query tile; GQA 2:1
        {300, 300, 3, 1, 16, 0},  // crosses a key tile (256); MQA
        {37, 300, 2, 2, 20, 0},   // n_past = 263, bottom-right mask
        {1, 129, 2, 1, 8, 0},     // one query through the tiled path
        {150, 150, 2, 2, 12, 50}, // sliding window: early key tiles fully masked for late rows
        {70, 600, 2, 1, 16, 3},   // window 3 with a long past: only a sliver of one key tile visible
        {65, 65, 1, 1, 5, 1},     // window 1: each row sees only itself
        {3, 5, 2, 2, 64, 0},
    };
    for (const auto& s : shapes) {
        CAPTURE(s.Tq);
        CAPTURE(s.Tk);
        CAPTURE(s.window);
        case_data c(s.Tq, s.Tk, s.H, s.Hkv, s.dh, 100 + static_cast<std::uint64_t>(s.Tq * 7 + s.Tk));
        const attention_params prm{0.0, s.window};
        run_prefill(be, c, prm);
        c.run_ref(prm);
        CHECK(test::rel_error(c.o, c.od) < 2e-6);
        CHECK(c.lse_error() < 1e-6);
    }
}

TEST_CASE("attention: explicit scale, window 1 gives o = v of the same token and LSE = the one score") {
    const cpu_backend be(1);
    case_data c(40, 40, 2, 1, 8, 9);
    run_prefill(be, c, {0.37, 1});
    for (std::int64_t t = 0; t < 40; ++t)
        for (std::int64_t h = 0; h < 2; ++h) {
            double s = 0;
            for (std::int64_t ch = 0; ch < 8; ++ch) {
                const auto oi = static_cast<std::size_t>((t * 2 + h) * 8 + ch), vi = static_cast<std::size_t>(t * 8 + ch);
                REQUIRE(c.o[oi] == doctest::Approx(c.v[vi]).epsilon(1e-6));
                s += static_cast<double>(c.q[oi]) * c.k[vi];
            }
            REQUIRE(c.lse[static_cast<std::size_t>(t * 2 + h)] == doctest::Approx(0.37 * s).epsilon(1e-5));
        }
}

TEST_CASE("attention: rows with no visible key return 0 and LSE -inf (Tk < Tq); no NaN anywhere") {
    const cpu_backend be(2);
    case_data c(100, 30, 2, 2, 16, 21);  // rows 0..69 see no key
    run_prefill(be, c, {});
    c.run_ref({});
    for (std::int64_t t = 0; t < 100; ++t)
        for (std::int64_t h = 0; h < 2; ++h) {
            const float l = c.lse[static_cast<std::size_t>(t * 2 + h)];
            if (t < 70) {
                CHECK(l == -std::numeric_limits<float>::infinity());
                for (std::int64_t ch = 0; ch < 16; ++ch) CHECK(c.o[static_cast<std::size_t>((t * 2 + h) * 16 + ch)] == 0.f);
            } else {
                CHECK(std::isfinite(l));
            }
        }
    for (float x : c.o) CHECK(std::isfinite(x));
    CHECK(test::rel_error(c.o, c.od) < 2e-6);
    CHECK(c.lse_error() < 1e-6);
}

TEST_CASE("attention: finite LSE for huge logits; LSE(1e4, 1e4-1) = 1e4 + log(1 + e^-1)") {
    const cpu_backend be(1);
    // d_h = 1, scale 1, q = 1, keys 1e4 and 1e4 - 1 (exact in fp32): the one query (bottom row) sees both.
    case_data c(1, 2, 1, 1, 1, 1);
    c.q = {1.f};
    c.k = {1e4f, 1e4f - 1.f};
    c.v = {2.f, -3.f};
    const double want = 1e4 + std::log1p(std::exp(-1.0));
    const double p0 = 1.0 / (1.0 + std::exp(-1.0));
    for (int path = 0; path < 2; ++path) {
        if (path == 0) run_prefill(be, c, {1.0, 0});
        else run_decode(be, c, {1.0, 0});
        CHECK(std::abs(c.lse[0] - want) <= 1e-6 * want);
        CHECK(c.o[0] == doctest::Approx(2 * p0 - 3 * (1 - p0)).epsilon(1e-6));
    }
    c.run_ref({1.0, 0});
    CHECK(std::abs(c.lsed[0] - want) <= 1e-9 * want);
    // Large random logits (|s| up to ~1e3): no overflow, still close to the reference.
    case_data big(90, 90, 2, 1, 16, 77, 30.f);
    run_prefill(be, big, {});
    big.run_ref({});
    for (float x : big.o) REQUIRE(std::isfinite(x));
    for (float x : big.lse) REQUIRE(std::isfinite(x));
    CHECK(test::rel_error(big.o, big.od) < 1e-4);  // fp32 scores of magnitude ~1e3 carry ~1e-4 absolute error
    CHECK(big.lse_error() < 1e-6);
}

TEST_CASE("attention: a fully masked key tile contributes nothing (huge values there change nothing)") {
    const cpu_backend be(1);
    // Window 40 at the last query rows: keys 0..255 (the first key tile) are invisible to rows >= 296.
    case_data c(64, 360, 1, 1, 8, 5);
    case_data d = c;
    for (std::size_t i = 0; i < 256 * 8; ++i) {
        d.k[i] = 1e30f;
        d.v[i] = std::numeric_limits<float>::quiet_NaN();
    }
    run_prefill(be, c, {0.0, 40});
    run_prefill(be, d, {0.0, 40});
    CHECK(c.o == d.o);
    CHECK(c.lse == d.lse);
}

TEST_CASE("attention: causality — changing tokens >= t0 never changes rows < t0 (bit-exact)") {
    const cpu_backend be(2);
    for (std::int64_t t0 : {1, 63, 64, 100, 199}) {
        case_data a(200, 200, 2, 1, 12, 31);
        case_data b = a;
        for (std::int64_t t = t0; t < 200; ++t)
            for (std::int64_t ch = 0; ch < 12; ++ch) {
                b.k[static_cast<std::size_t>(t * 12 + ch)] += 5.f;
                b.v[static_cast<std::size_t>(t * 12 + ch)] -= 7.f;
                for (std::int64_t h = 0; h < 2; ++h) b.q[static_cast<std::size_t>((t * 2 + h) * 12 + ch)] *= -3.f;
            }
        run_prefill(be, a, {});
        run_prefill(be, b, {});
        CAPTURE(t0);
        const auto n = static_cast<std::ptrdiff_t>(t0 * 2 * 12);
        CHECK(std::equal(a.o.begin(), a.o.begin() + n, b.o.begin()));
        CHECK(!std::equal(a.o.begin() + n, a.o.end(), b.o.begin() + n));
    }
}

TEST_CASE("attention decode (split-K, LSE merge) vs reference and vs the tiled path") {
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        struct shape {
            std::int64_t Tk, H, Hkv, dh, window;
        };
        const shape shapes[] = {{0, 2, 1, 8, 0},       {1, 4, 2, 16, 0},      {5000, 4, 2, 24, 0}, {4097, 2, 2, 64, 0},
                                {3000, 3, 1, 17, 700}, {2500, 2, 1, 64, 1},   {700, 8, 8, 32, 0},
                                // register tiles of the decode kernel: 4 heads × keys (g 4, d_h 128), 1 head (g 3),
                                // 2 heads (g 6) with d_h vectors left over, key counts off the tile
                                {4100, 8, 2, 128, 0}, {1500, 6, 2, 48, 0},   {2051, 12, 2, 80, 0}, {37, 4, 1, 32, 0},
                                {1031, 8, 2, 128, 300}};
        for (const auto& s : shapes) {
            CAPTURE(threads);
            CAPTURE(s.Tk);
            case_data c(1, s.Tk, s.H, s.Hkv, s.dh, 200 + static_cast<std::uint64_t>(s.Tk));
            const attention_params prm{0.0, s.window};
            run_decode(be, c, prm);
            c.run_ref(prm);
            CHECK(test::rel_error(c.o, c.od) < 2e-6);
            CHECK(c.lse_error() < 1e-6);
            if (s.Tk == 0)
                for (float x : c.o) CHECK(x == 0.f);
            case_data t = c;
            run_prefill(be, t, prm);
            CHECK(test::rel_error(c.o, t.o) < 2e-6);
        }
    }
}

TEST_CASE("attention: batches of problems equal separate calls (prefill and decode)") {
    const cpu_backend be(2);
    std::vector<case_data> solo, batch;
    const std::int64_t Tq[] = {17, 1, 130, 64}, Tk[] = {17, 900, 200, 64};
    for (int i = 0; i < 4; ++i) solo.emplace_back(Tq[i], Tk[i], 4, 2, 16, 300 + static_cast<std::uint64_t>(i) * 10);
    batch = solo;
    std::vector<attention_problem<float>> probs;
    for (auto& c : batch) probs.push_back(c.problem());
    kernels::attention_prefill(be, std::span<const attention_problem<float>>(probs), {});
    for (std::size_t i = 0; i < solo.size(); ++i) {
        run_prefill(be, solo[i], {});
        CHECK(solo[i].o == batch[i].o);
        CHECK(solo[i].lse == batch[i].lse);
    }
    // Decode: single-row problems with very different cache lengths.
    std::vector<case_data> ds, db;
    const std::int64_t dk[] = {3, 9000, 1, 2049, 0};  // 9000 keys: 8 blocks alone, fewer under the old thread-based split
    for (int i = 0; i < 5; ++i) ds.emplace_back(1, dk[i], 4, 1, 32, 400 + static_cast<std::uint64_t>(i));
    db = ds;
    probs.clear();
    for (auto& c : db) probs.push_back(c.problem());
    kernels::attention_decode(be, std::span<const attention_problem<float>>(probs), {});
    const cpu_backend one(1);
    for (std::size_t i = 0; i < ds.size(); ++i) {
        run_decode(one, ds[i], {});
        ds[i].run_ref({});
        CHECK(test::rel_error(db[i].o, ds[i].od) < 2e-6);
        // Batch invariance (spec.md §0): the key blocks of a sequence do not depend on the batch or the threads.
        CAPTURE(i);
        CHECK(db[i].o == ds[i].o);
        CHECK(db[i].lse == ds[i].lse);
    }
}

TEST_CASE("attention: bad arguments throw shape_error") {
    const cpu_backend be(1);
    case_data c(4, 4, 3, 2, 8, 1);  // 3 query heads over 2 KV heads
    CHECK_THROWS_AS(run_prefill(be, c, {}), shape_error);
    case_data d(4, 4, 2, 2, 8, 1);
    auto p = d.problem();
    p.v = tensor_view<const float, 3>(d.v.data(), {3, 2, 8});
    CHECK_THROWS_AS(kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), {}), shape_error);
    CHECK_THROWS_AS(run_decode(be, d, {}), shape_error);  // 4 query rows given to the decode kernel
    p = d.problem();
    p.o = tensor_view<float, 3>(d.o.data(), {4, 2, 4});
    CHECK_THROWS_AS(kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), {}), shape_error);
}

TEST_CASE("attention: an AVX2 backend (8 lanes: other tile shapes) agrees with the reference") {
    using avx2_backend = basic_cpu_backend<xsimd::avx2>;
    if constexpr (xsimd::avx2::supported()) {
        const avx2_backend be(2);
        case_data c(45, 300, 4, 2, 20, 61);  // query tiles of 32 + 13 rows
        const auto p = c.problem();
        kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), {0.0, 100});
        c.run_ref({0.0, 100});
        CHECK(test::rel_error(c.o, c.od) < 2e-6);
        CHECK(c.lse_error() < 1e-6);
        case_data d(1, 3000, 4, 1, 24, 62);
        const auto pd = d.problem();
        kernels::attention_decode(be, std::span<const attention_problem<float>>(&pd, 1), {});
        d.run_ref({});
        CHECK(test::rel_error(d.o, d.od) < 2e-6);
    } else {
        MESSAGE("SKIPPED: this build has no AVX2");
    }
}

TEST_CASE("attention: the SSE2 backend (4 lanes, the baseline of a build without -march) agrees with the reference") {
    // Its tile scratch needs the most alignment slack relative to its lane count (a 64-byte-aligned start inside a
    // buffer sized for 4-lane slack overran it; the sanitize preset reports any overrun).
    using sse2_backend = basic_cpu_backend<xsimd::sse2>;
    if constexpr (xsimd::sse2::supported()) {
        const sse2_backend be(2);
        for (std::int64_t Tq : {1, 5, 16, 45}) {
            CAPTURE(Tq);
            case_data c(Tq, 300, 4, 2, 20, 71 + static_cast<std::uint64_t>(Tq));
            const auto p = c.problem();
            kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), {0.0, 100});
            c.run_ref({0.0, 100});
            CHECK(test::rel_error(c.o, c.od) < 2e-6);
            CHECK(c.lse_error() < 1e-6);
        }
        case_data d(1, 3000, 4, 1, 24, 72);
        const auto pd = d.problem();
        kernels::attention_decode(be, std::span<const attention_problem<float>>(&pd, 1), {});
        d.run_ref({});
        CHECK(test::rel_error(d.o, d.od) < 2e-6);
    } else {
        MESSAGE("SKIPPED: this build has no SSE2");
    }
}

TEST_CASE("attention: NaN in a visible key or value propagates (prefill and decode); a NaN key stays invisible to earlier rows") {
    const cpu_backend be(2);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (bool in_key : {true, false}) {
        for (std::int64_t bad : {0, 37, 150}) {
            CAPTURE(in_key);
            CAPTURE(bad);
            case_data c(200, 200, 2, 1, 16, 77);
            (in_key ? c.k : c.v)[static_cast<std::size_t>(bad * 16 + 3)] = nan;
            run_prefill(be, c, {});
            for (std::int64_t t = 0; t < 200; ++t)
                for (std::int64_t h = 0; h < 2; ++h) {
                    const float x = c.o[static_cast<std::size_t>((t * 2 + h) * 16 + 3)];  // channel 3 holds the NaN value
                    // A NaN key is masked by index for earlier rows. A NaN value still meets their zero weight
                    // (0 · NaN = NaN, as in a dense softmax(QKᵀ)·V), so only propagation is required there.
                    if (t >= bad) CHECK(std::isnan(x));
                    else if (in_key) CHECK(std::isfinite(x));
                }
            // decode: one query row over all 200 keys, several splits
            case_data d(1, 4097, 2, 1, 16, 78);
            (in_key ? d.k : d.v)[static_cast<std::size_t>(bad * 16 + 3)] = nan;
            run_decode(be, d, {});
            CHECK(std::isnan(d.o[3]));
            CHECK(std::isnan(d.o[16 + 3]));
        }
    }
}

namespace {

/// Sets key j of every KV head to a −∞ score for every query: channel 0 of the key is −∞ and channel 0 of every
/// query is made positive (so q·k = −∞, never −∞ + ∞).
void make_minus_inf_keys(case_data& c, std::int64_t j0, std::int64_t j1) {
    for (std::int64_t t = 0; t < c.Tq; ++t)
        for (std::int64_t h = 0; h < c.H; ++h) {
            float& q0 = c.q[static_cast<std::size_t>((t * c.H + h) * c.dh)];
            q0 = 0.25f + std::abs(q0);
        }
    for (std::int64_t j = j0; j < j1; ++j)
        for (std::int64_t h = 0; h < c.Hkv; ++h) c.k[static_cast<std::size_t>((j * c.Hkv + h) * c.dh)] = -std::numeric_limits<float>::infinity();
}

}  // namespace

TEST_CASE("attention: issue case — decode over 512 keys of score -inf then one key of score 10 gives o = v_512, LSE 10") {
    const cpu_backend be(1);
    case_data c(1, 513, 1, 1, 4, 11);
    c.q = {1.f, 1.f, 1.f, 1.f};
    for (std::int64_t j = 0; j < 512; ++j)
        for (std::int64_t ch = 0; ch < 4; ++ch) c.k[static_cast<std::size_t>(j * 4 + ch)] = -std::numeric_limits<float>::infinity();
    for (std::int64_t ch = 0; ch < 4; ++ch) c.k[static_cast<std::size_t>(512 * 4 + ch)] = 5.f;
    for (int path = 0; path < 2; ++path) {
        CAPTURE(path);
        case_data d = c;
        if (path == 0) run_decode(be, d, {});
        else run_prefill(be, d, {});
        for (std::int64_t ch = 0; ch < 4; ++ch) CHECK(d.o[static_cast<std::size_t>(ch)] == c.v[static_cast<std::size_t>(512 * 4 + ch)]);
        CHECK(d.lse[0] == 10.f);
    }
    c.run_ref({});
    for (std::int64_t ch = 0; ch < 4; ++ch) CHECK(c.od[static_cast<std::size_t>(ch)] == doctest::Approx(c.v[static_cast<std::size_t>(512 * 4 + ch)]));
    CHECK(c.lsed[0] == doctest::Approx(10.0));
}

TEST_CASE("attention: blocks, splits and whole rows with no finite score (prefill tiles, decode blocks and splits, merge)") {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        CAPTURE(threads);
        // Decode: -inf ranges placed on 512-key blocks, on whole splits (with 2 threads 5000 keys form 4 splits of
        // 1250), at the start, in the middle and at the end; then every key -inf.
        struct range {
            std::int64_t j0, j1;
        };
        const range ranges[] = {{0, 512}, {0, 1250}, {0, 3750}, {1250, 2500}, {600, 4999}, {1, 5000}, {3750, 5000}, {0, 5000}};
        for (const auto& r : ranges) {
            for (std::int64_t window : {0, 2600}) {
                CAPTURE(r.j0);
                CAPTURE(r.j1);
                CAPTURE(window);
                case_data c(1, 5000, 4, 2, 16, 900 + static_cast<std::uint64_t>(r.j0 + r.j1));
                make_minus_inf_keys(c, r.j0, r.j1);
                run_decode(be, c, {0.0, window});
                c.run_ref({0.0, window});
                for (float x : c.o) REQUIRE(std::isfinite(x));
                CHECK(test::rel_error(c.o, c.od) < 2e-6);
                CHECK(c.lse_error() < 1e-6);
                const bool none_finite = r.j0 == 0 && r.j1 == 5000;
                const bool none_in_window = window > 0 && r.j0 <= 5000 - window && r.j1 == 5000;
                if (none_finite || none_in_window) {  // whole row: o = 0, LSE −∞ (spec.md §2)
                    for (float x : c.o) CHECK(x == 0.f);
                    for (float x : c.lse) CHECK(x == ninf);
                } else {
                    for (float x : c.lse) CHECK(std::isfinite(x));
                }
                case_data t = c;  // the tiled path on the same single row
                run_prefill(be, t, {0.0, window});
                CHECK(test::rel_error(t.o, c.od) < 2e-6);
                CHECK(t.lse_error() < 1e-6);
            }
        }
        // Prefill: -inf key ranges covering whole key tiles (64) or parts of them; rows whose visible keys all score
        // -inf (here rows 0..j1-1 when j0 = 0) return o = 0, LSE −∞.
        const range pranges[] = {{0, 64}, {0, 100}, {64, 128}, {10, 190}, {130, 200}, {0, 200}};
        for (const auto& r : pranges) {
            for (std::int64_t window : {0, 70}) {
                CAPTURE(r.j0);
                CAPTURE(r.j1);
                CAPTURE(window);
                case_data c(200, 200, 2, 1, 12, 950 + static_cast<std::uint64_t>(r.j0 * 3 + r.j1));
                make_minus_inf_keys(c, r.j0, r.j1);
                run_prefill(be, c, {0.0, window});
                c.run_ref({0.0, window});
                for (float x : c.o) REQUIRE(std::isfinite(x));
                CHECK(test::rel_error(c.o, c.od) < 2e-6);
                CHECK(c.lse_error() < 1e-6);
                for (std::int64_t t = 0; t < 200; ++t) {
                    const std::int64_t lo = window > 0 ? std::max<std::int64_t>(0, t - window + 1) : 0;
                    const bool none = lo >= r.j0 && t < r.j1;
                    CAPTURE(t);
                    for (std::int64_t h = 0; h < 2; ++h) CHECK((c.lse[static_cast<std::size_t>(t * 2 + h)] == ninf) == none);
                }
            }
        }
    }
}

TEST_CASE("attention: a NaN score inside a block of -inf scores still propagates (decode and prefill)") {
    const cpu_backend be(2);
    case_data c(1, 3000, 2, 1, 8, 31);
    make_minus_inf_keys(c, 0, 1500);
    c.k[static_cast<std::size_t>(700 * 8 + 1)] = std::numeric_limits<float>::quiet_NaN();
    case_data d = c;
    run_decode(be, c, {});
    run_prefill(be, d, {});
    for (const auto* r : {&c, &d}) {
        for (float x : r->o) CHECK(std::isnan(x));
        for (float x : r->lse) CHECK(std::isnan(x));
    }
}

TEST_CASE("attention: stride rules of every view argument and the parameters are checked, naming the argument") {
    const cpu_backend be(1);
    case_data c(4, 4, 2, 1, 8, 3);
    auto prefill = [&](const attention_problem<float>& p, attention_params prm = {}) {
        kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), prm);
    };
    auto decode = [&](const attention_problem<float>& p, attention_params prm = {}) {
        kernels::attention_decode(be, std::span<const attention_problem<float>>(&p, 1), prm);
    };
    std::vector<float> buf(1000);
    SUBCASE("d_h stride of q, k, v, o") {
        auto p = c.problem();
        p.q = tensor_view<const float, 3>(buf.data(), {4, 2, 8}, {32, 16, 2});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: q [4, 2, 8] needs unit stride along axis 2"), shape_error);
        p = c.problem();
        p.k = tensor_view<const float, 3>(buf.data(), {4, 1, 8}, {1, 8, 4});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: k [4, 1, 8] needs unit stride"), shape_error);
        p = c.problem();
        p.v = tensor_view<const float, 3>(buf.data(), {4, 1, 8}, {1, 8, 4});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: v"), shape_error);
        p = c.problem();
        p.o = tensor_view<float, 3>(buf.data(), {4, 2, 8}, {1, 4, 8});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: o"), shape_error);
    }
    SUBCASE("outputs overlapping themselves or the inputs") {
        auto p = c.problem();
        p.o = tensor_view<float, 3>(buf.data(), {4, 2, 8}, {8, 0, 1});  // both heads written to one place
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: o [4, 2, 8] is written, but its strides [8, 0, 1] make elements overlap"),
                             shape_error);
        p = c.problem();
        p.o = tensor_view<float, 3>(c.q.data(), {4, 2, 8});  // in place over q: other work items still read q
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: o overlaps q"), shape_error);
        p = c.problem();
        p.lse = tensor_view<float, 2>(c.o.data() + 3, {4, 2});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: lse overlaps o"), shape_error);
        p = c.problem();
        p.lse = tensor_view<float, 2>(buf.data(), {4, 2}, {1, 1});
        CHECK_THROWS_WITH_AS(prefill(p), doctest::Contains("attention_prefill: lse"), shape_error);
        case_data d(1, 5, 2, 1, 8, 4);
        auto pd = d.problem();
        pd.o = tensor_view<float, 3>(d.v.data(), {1, 2, 8});
        CHECK_THROWS_WITH_AS(decode(pd), doctest::Contains("attention_decode: o overlaps v"), shape_error);
    }
    SUBCASE("parameters and head_dim") {
        const auto p = c.problem();
        CHECK_THROWS_WITH_AS(prefill(p, {std::nan(""), 0}), doctest::Contains("attention_prefill: params.scale must be finite"), value_error);
        CHECK_THROWS_WITH_AS(prefill(p, {0.0, -1}), doctest::Contains("attention_prefill: params.window must be >= 0"), value_error);
        case_data d(1, 5, 2, 1, 8, 4);
        CHECK_THROWS_WITH_AS(decode(d.problem(), {INFINITY, 0}), doctest::Contains("attention_decode: params.scale"), value_error);
        case_data e(2, 2, 1, 1, 0, 4);
        CHECK_THROWS_WITH_AS(run_prefill(be, e, {}), doctest::Contains("head_dim must be >= 1"), shape_error);
        std::vector<double> qd(16), od(16);
        attention_problem<double> pr{tensor_view<const double, 3>(qd.data(), {2, 1, 8}), tensor_view<const double, 3>(qd.data(), {2, 1, 8}),
                                     tensor_view<const double, 3>(qd.data(), {2, 1, 8}), tensor_view<double, 3>(od.data(), {2, 1, 8}), {}};
        CHECK_THROWS_WITH_AS(kernels::attention_ref(pr, {0.0, -3}), doctest::Contains("attention_ref: params.window"), value_error);
    }
}

TEST_CASE("attention: general token and head strides of q, k, v, o and lse give the contiguous result") {
    const cpu_backend be(2);
    for (std::int64_t Tq : {1, 50}) {
        CAPTURE(Tq);
        case_data c(Tq, 50, 4, 2, 8, 17);
        const attention_params prm{};
        if (Tq == 1) run_decode(be, c, prm);
        else run_prefill(be, c, prm);
        // the same problem in strided storage: token-major with padding, heads in reverse order (negative stride)
        const std::int64_t H = 4, Hkv = 2, dh = 8, pad = 3;
        std::vector<float> q(static_cast<std::size_t>(Tq * (H * dh + pad))), k(static_cast<std::size_t>(50 * (Hkv * dh + pad))),
            v(k.size()), o(q.size(), 7.f), lse(static_cast<std::size_t>(H * Tq * 2), 7.f);
        for (std::int64_t t = 0; t < Tq; ++t)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t ch = 0; ch < dh; ++ch)
                    q[static_cast<std::size_t>(t * (H * dh + pad) + (H - 1 - h) * dh + ch)] = c.q[static_cast<std::size_t>((t * H + h) * dh + ch)];
        for (std::int64_t t = 0; t < 50; ++t)
            for (std::int64_t h = 0; h < Hkv; ++h)
                for (std::int64_t ch = 0; ch < dh; ++ch) {
                    const auto src = static_cast<std::size_t>((t * Hkv + h) * dh + ch);
                    const auto dst = static_cast<std::size_t>(t * (Hkv * dh + pad) + (Hkv - 1 - h) * dh + ch);
                    k[dst] = c.k[src];
                    v[dst] = c.v[src];
                }
        const std::int64_t qs = H * dh + pad, ks = Hkv * dh + pad;
        attention_problem<float> p{tensor_view<const float, 3>(q.data() + (H - 1) * dh, {Tq, H, dh}, {qs, -dh, 1}),
                                   tensor_view<const float, 3>(k.data() + (Hkv - 1) * dh, {50, Hkv, dh}, {ks, -dh, 1}),
                                   tensor_view<const float, 3>(v.data() + (Hkv - 1) * dh, {50, Hkv, dh}, {ks, -dh, 1}),
                                   tensor_view<float, 3>(o.data() + (H - 1) * dh, {Tq, H, dh}, {qs, -dh, 1}),
                                   tensor_view<float, 2>(lse.data(), {Tq, H}, {1, 2 * Tq})};  // head-major, every other slot
        if (Tq == 1) kernels::attention_decode(be, std::span<const attention_problem<float>>(&p, 1), prm);
        else kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), prm);
        for (std::int64_t t = 0; t < Tq; ++t)
            for (std::int64_t h = 0; h < H; ++h) {
                CHECK(p.lse(t, h) == c.lse[static_cast<std::size_t>(t * H + h)]);
                for (std::int64_t ch = 0; ch < dh; ++ch) CHECK(p.o(t, h, ch) == c.o[static_cast<std::size_t>((t * H + h) * dh + ch)]);
            }
    }
}

namespace {

/// Runs one problem with keys and values stored as KV (bf16 or f16) on `be`: c.k and c.v are first rounded to KV
/// (so c holds the widened values the kernel reads). Returns the 16-bit run's o and lse in c.
template <class KV, class Backend>
void run_16bit(const Backend& be, case_data& c, const attention_params& prm) {
    std::vector<KV> k16(c.k.size()), v16(c.v.size());
    convert(c.k.data(), k16.data(), k16.size());
    convert(c.v.data(), v16.data(), v16.size());
    convert(k16.data(), c.k.data(), k16.size());
    convert(v16.data(), c.v.data(), v16.size());
    const auto f = c.problem();
    const attention_problem<float, KV> p{f.q, tensor_view<const KV, 3>(k16.data(), {c.Tk, c.Hkv, c.dh}),
                                         tensor_view<const KV, 3>(v16.data(), {c.Tk, c.Hkv, c.dh}), f.o, f.lse};
    if (c.Tq == 1)
        kernels::attention_decode(be, std::span<const attention_problem<float, KV>>(&p, 1), prm);
    else
        kernels::attention_prefill(be, std::span<const attention_problem<float, KV>>(&p, 1), prm);
}

/// A 16-bit KV problem against the fp64 reference on the widened values, and against the f32 kernel on them (within
/// fp32 rounding: the 16-bit kernels widen exactly as they load and keep the f32 kernels' order of operations; the
/// compiler may still contract or vectorise a tail loop differently, a few ulp).
template <class KV, class Backend>
void check_16bit(const Backend& be, std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t Hkv, std::int64_t dh,
                 std::int64_t window, std::uint64_t seed) {
    CAPTURE(Tq);
    CAPTURE(Tk);
    CAPTURE(dh);
    CAPTURE(window);
    case_data c(Tq, Tk, H, Hkv, dh, seed);
    const attention_params prm{0.0, window};
    run_16bit<KV>(be, c, prm);
    c.run_ref(prm);
    CHECK(test::rel_error(c.o, c.od) < 2e-6);
    CHECK(c.lse_error() < 1e-6);
    case_data f = c;  // k, v: the widened 16-bit values
    std::fill(f.o.begin(), f.o.end(), 5.f);
    const auto p = f.problem();
    if (Tq == 1)
        kernels::attention_decode(be, std::span<const attention_problem<float>>(&p, 1), prm);
    else
        kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), prm);
    CHECK(test::rel_error(f.o, c.o) < 5e-7);
    CHECK((Tk == 0 ? f.lse == c.lse : test::rel_error(f.lse, c.lse) < 5e-7));  // Tk 0: LSE −∞ in both
}

template <class KV, class Backend>
void check_16bit_shapes(const Backend& be) {
    // Prefill: query tiles, GQA, n_past, windows, d_h off the SIMD width; decode: the register tiles (d_h 128 with 4
    // heads per KV head, 6 heads), splits over 1024-key blocks, a window, and the plain path (d_h 17).
    check_16bit<KV>(be, 77, 77, 4, 2, 24, 0, 1);
    check_16bit<KV>(be, 37, 300, 2, 1, 20, 0, 2);
    check_16bit<KV>(be, 150, 150, 2, 2, 12, 50, 3);
    check_16bit<KV>(be, 65, 65, 1, 1, 5, 1, 4);
    check_16bit<KV>(be, 1, 4100, 8, 2, 128, 0, 5);
    check_16bit<KV>(be, 1, 2051, 12, 2, 80, 0, 6);
    check_16bit<KV>(be, 1, 3000, 3, 1, 17, 700, 7);
    check_16bit<KV>(be, 1, 37, 4, 1, 32, 0, 8);
    check_16bit<KV>(be, 1, 0, 2, 1, 8, 0, 9);
}

}  // namespace

TEST_CASE("attention: keys and values stored in bf16 / f16 give the reference on their widened values, and the f32 "
          "kernels' result on them (prefill and decode, every SIMD width)") {
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        const cpu_backend be(threads);
        check_16bit_shapes<bf16>(be);
        check_16bit_shapes<f16>(be);
    }
    if constexpr (xsimd::avx2::supported()) {
        const basic_cpu_backend<xsimd::avx2> be(2);
        check_16bit_shapes<bf16>(be);
        check_16bit_shapes<f16>(be);
    }
    if constexpr (xsimd::sse2::supported()) {
        const basic_cpu_backend<xsimd::sse2> sse(2);
        check_16bit_shapes<bf16>(sse);
        check_16bit_shapes<f16>(sse);
    }
}
