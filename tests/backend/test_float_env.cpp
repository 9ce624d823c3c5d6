// Subnormal flushing (backend/float_env.hpp): the scope sets and restores the thread's setting; the CPU backend runs
// every parallel_for / parallel_for_static body and every dispatched op under its setting (on by default) on
// whichever thread runs it, leaves the caller's own setting as it was, and keeps IEEE subnormals when told to; the
// chunked gated delta rule with fast-decaying heads gives the same result within fp32 rounding either way, and both
// match the fp64 recurrence.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/float_env.hpp"
#include "hymix/backend/op.hpp"
#include "hymix/core/convert.hpp"
#include "hymix/core/dtype.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "support/random.hpp"

namespace hymix_test_ops {
struct probe_op {};
}  // namespace hymix_test_ops

namespace hymix {
// A test op that records whether the thread that runs it flushes subnormals, outside and inside a parallel loop.
template <class Arch>
struct op_impl<hymix_test_ops::probe_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, bool* serial, std::atomic<int>* flushing, std::atomic<int>* bodies) {
        *serial = subnormal_flush_scope::active();
        be.parallel_for(64, 1, [&](std::int64_t, std::int64_t) {
            ++*bodies;
            if (subnormal_flush_scope::active()) ++*flushing;
        });
    }
};
}  // namespace hymix

namespace {

/// The smallest normal float times 1/8: a subnormal result, or 0 when results are flushed. `volatile` keeps the
/// product at run time.
float subnormal_product() {
    volatile float a = std::numeric_limits<float>::min();
    volatile float b = 0.125f;
    return a * b;
}

/// True (with a message) where hymix cannot change the flush setting, so a test has nothing to check.
bool no_flush_control() {
    if (hymix::can_flush_subnormals) return false;
    MESSAGE("skipped: this architecture has no subnormal flush control that hymix sets");
    return true;
}

/// Runs a parallel_for of 1000 items (grain 7) on `be` and counts its bodies: all of them, those that flush both ways
/// (the flag set and a subnormal product flushed to 0), and those that flush either way.
struct body_counts {
    int bodies, flushed, any_flush;
};
body_counts count_bodies(const hymix::cpu_backend& be) {
    std::atomic<int> bodies{0}, flushed{0}, any_flush{0};
    be.parallel_for(1000, 7, [&](std::int64_t, std::int64_t) {
        ++bodies;
        const bool flag = hymix::subnormal_flush_scope::active(), zero = subnormal_product() == 0.f;
        if (flag && zero) ++flushed;
        if (flag || zero) ++any_flush;
    });
    return {bodies.load(), flushed.load(), any_flush.load()};
}

}  // namespace

TEST_CASE("subnormal_flush_scope: flushes inside, restores the thread's setting outside") {
    if (no_flush_control()) return;
    const bool before = hymix::subnormal_flush_scope::active();
    REQUIRE_FALSE(before);  // a fresh test process computes with IEEE subnormals
    CHECK(subnormal_product() > 0.f);
    {
        const hymix::subnormal_flush_scope fp;
        CHECK(hymix::subnormal_flush_scope::active());
        CHECK(subnormal_product() == 0.f);
        {
            const hymix::subnormal_flush_scope nested;  // already set: changes nothing, restores nothing
            CHECK(hymix::subnormal_flush_scope::active());
        }
        CHECK(hymix::subnormal_flush_scope::active());
        {
            const hymix::subnormal_flush_scope off(false);  // `false` gives IEEE subnormals inside
            CHECK_FALSE(hymix::subnormal_flush_scope::active());
            CHECK(subnormal_product() > 0.f);
        }
        CHECK(hymix::subnormal_flush_scope::active());
    }
    CHECK_FALSE(hymix::subnormal_flush_scope::active());
    CHECK(subnormal_product() > 0.f);
}

TEST_CASE("cpu backend: parallel bodies and ops run flushed by default, the caller's setting is kept") {
    if (no_flush_control()) return;
    for (int threads : {1, 4}) {
        CAPTURE(threads);
        hymix::cpu_backend be(threads);
        CHECK(be.flush_subnormals());
        for (bool on : {true, false}) {
            CAPTURE(on);
            be.set_flush_subnormals(on);
            const body_counts c = count_bodies(be);
            CHECK(c.bodies > 0);
            CHECK(c.flushed == (on ? c.bodies : 0));
            std::atomic<int> flushing{0}, bodies{0};
            be.parallel_for_static(
                100, [&](std::int64_t, std::int64_t) {
                    ++bodies;
                    if (hymix::subnormal_flush_scope::active()) ++flushing;
                },
                3);
            CHECK(bodies.load() > 0);
            CHECK(flushing.load() == (on ? bodies.load() : 0));
            bool serial = false;
            flushing = 0;
            bodies = 0;
            hymix::dispatch<hymix_test_ops::probe_op>(be, &serial, &flushing, &bodies);
            CHECK(serial == on);
            CHECK(flushing.load() == (on ? bodies.load() : 0));
            // The calling thread computes with IEEE subnormals again once the backend returns.
            CHECK_FALSE(hymix::subnormal_flush_scope::active());
            CHECK(subnormal_product() > 0.f);
        }
    }
}

TEST_CASE("cpu backend: flushing off gives IEEE bodies even where the caller or the arena's first caller flushed") {
    if (no_flush_control()) return;
    for (int threads : {1, 4}) {
        CAPTURE(threads);
        hymix::cpu_backend be(threads);
        // The arena's first use is a dispatched op with flushing on (oneTBB hands the first caller's floating-point
        // settings to the arena's tasks).
        bool serial = false;
        std::atomic<int> flushing{0}, bodies{0};
        hymix::dispatch<hymix_test_ops::probe_op>(be, &serial, &flushing, &bodies);
        CHECK(serial);
        CHECK(flushing.load() == bodies.load());
        be.set_flush_subnormals(false);
        for (bool caller_flushes : {false, true}) {
            CAPTURE(caller_flushes);
            const hymix::subnormal_flush_scope mine(caller_flushes);
            const body_counts c = count_bodies(be);
            CHECK(c.bodies > 0);
            CHECK(c.any_flush == 0);
            flushing = 0;
            bodies = 0;
            hymix::dispatch<hymix_test_ops::probe_op>(be, &serial, &flushing, &bodies);
            CHECK_FALSE(serial);
            CHECK(flushing.load() == 0);
            CHECK(hymix::subnormal_flush_scope::active() == caller_flushes);  // the caller's own setting is back
        }
    }
}

TEST_CASE("subnormal_flush_scope keeps the sticky exception flags raised inside it") {
#if defined(HYMIX_FLOAT_ENV_X86)
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
    {
        const hymix::subnormal_flush_scope fp;
        volatile float one = 1.f, zero = 0.f;
        volatile float inf = one / zero;
        (void)inf;
    }
    CHECK((_mm_getcsr() & 0x04u) != 0);  // ZE, raised inside the scope, survives it
    _mm_setcsr(_mm_getcsr() & ~0x3fu);
#else
    MESSAGE("skipped: x86 only");
#endif
}

TEST_CASE("bulk f16 -> f32 conversion is exact with subnormals flushed (the ops convert inside the backend's scope)") {
    // Every f16 pattern, subnormals included (widened by integer conversion, not through an f32 subnormal that
    // denormals-are-zero would read as 0); equal bit for bit to the scalar f16::to_float with and without the scope.
    std::vector<hymix::f16> h(65536);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = hymix::f16::from_bits(static_cast<std::uint16_t>(i));
    for (bool flush : {false, true}) {
        CAPTURE(flush);
        const hymix::subnormal_flush_scope fp(flush);
        std::vector<float> wide(h.size());
        hymix::convert(h.data(), wide.data(), h.size());
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < h.size(); ++i) {
            const float ref = h[i].to_float();
            if (std::memcmp(&ref, &wide[i], sizeof(float)) != 0) ++mismatches;
        }
        CHECK(mismatches == 0);
        CHECK(wide[1] == std::ldexp(1.f, -24));        // smallest f16 subnormal
        CHECK(wide[0x3ff] == 1023.f * std::ldexp(1.f, -24));
        CHECK(wide[0x8001] == -std::ldexp(1.f, -24));
    }
}

TEST_CASE("gated delta rule with fast-decaying heads: flushed and IEEE runs agree, both match the fp64 recurrence") {
    // Decays of a randomly initialised layer (g = −A·softplus(a + 1), A up to 16 per head): e^-5 to e^-20 per token,
    // so products along a 64-token chunk fall below 2^-126.
    const std::int64_t T = 150, H = 3, d = 32, chunk = 64;
    auto q = hymix::test::uniform(static_cast<std::size_t>(T * H * d), -1.f, 1.f, 1);
    auto k = hymix::test::uniform(q.size(), -1.f, 1.f, 2);
    const auto v = hymix::test::uniform(q.size(), -1.f, 1.f, 3);
    for (auto* x : {&q, &k})
        for (std::int64_t r = 0; r < T * H; ++r) {
            double ss = 0;
            for (std::int64_t a = 0; a < d; ++a) ss += double((*x)[r * d + a]) * (*x)[r * d + a];
            for (std::int64_t a = 0; a < d; ++a) (*x)[r * d + a] = static_cast<float>((*x)[r * d + a] / std::sqrt(ss));
        }
    const auto a = hymix::test::uniform(static_cast<std::size_t>(T * H), -1.f, 1.f, 4);
    const float A[H] = {16.f, 6.f, 0.5f};
    std::vector<float> g(a.size()), beta = hymix::test::uniform(a.size(), 0.2f, 1.f, 5);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = -A[i % H] * std::log1p(std::exp(1.f + a[i]));
    const auto batch = hymix::seq_batch::dense(1, T);
    const float scale = 1.f / std::sqrt(static_cast<float>(d));
    std::vector<float> out[2];
    std::vector<float> state_out[2];
    const auto run = [&](int threads, bool flush, std::vector<float>& o, std::vector<float>& s) {
        hymix::cpu_backend be(threads);
        be.set_flush_subnormals(flush);
        s.assign(static_cast<std::size_t>(H * d * d), 0.f);
        o.assign(q.size(), 0.f);
        hymix::kernels::gated_delta_rule_chunked(
            be, batch, hymix::tensor_view<const float, 3>(q.data(), {T, H, d}), hymix::tensor_view<const float, 3>(k.data(), {T, H, d}),
            hymix::tensor_view<const float, 3>(v.data(), {T, H, d}), hymix::tensor_view<const float, 2>(g.data(), {T, H}),
            hymix::tensor_view<const float, 2>(beta.data(), {T, H}), scale, hymix::tensor_view<float, 4>(s.data(), {1, H, d, d}),
            hymix::tensor_view<float, 3>(o.data(), {T, H, d}), chunk);
    };
    for (int flush = 0; flush < 2; ++flush) run(2, flush == 1, out[flush], state_out[flush]);
#if defined(HYMIX_FLOAT_ENV_X86)
    {
        // The case does make subnormals: on one thread (run inline on this one) with IEEE subnormals kept, the sticky
        // underflow and denormal-operand flags of MXCSR get set (the scope keeps flags raised inside it); flushed,
        // the kernel reads no denormal operand. With mild decays (e^-0.08 per token) neither flag is raised.
        std::vector<float> o, s;
        _mm_setcsr(_mm_getcsr() & ~0x3fu);
        run(1, false, o, s);
        const unsigned ieee_flags = _mm_getcsr();
        CHECK((ieee_flags & 0x10u) != 0);  // UE
        CHECK((ieee_flags & 0x02u) != 0);  // DE
        _mm_setcsr(_mm_getcsr() & ~0x3fu);
        run(1, true, o, s);
        CHECK((_mm_getcsr() & 0x02u) == 0);
        CHECK(hymix::test::rel_error(o, out[1]) < 1e-6);
        const std::vector<float> g_strong = g;
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = -0.05f * (1.5f + 0.3f * a[i]);
        _mm_setcsr(_mm_getcsr() & ~0x3fu);
        run(1, false, o, s);
        const unsigned mild_flags = _mm_getcsr();
        CHECK((mild_flags & 0x10u) == 0);
        CHECK((mild_flags & 0x02u) == 0);
        _mm_setcsr(_mm_getcsr() & ~0x3fu);
        g = g_strong;
    }
#endif
    // fp64 token-by-token recurrence.
    std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()), gd(g.begin(), g.end()),
        bd(beta.begin(), beta.end()), sd(static_cast<std::size_t>(H * d * d), 0.0), od(q.size());
    hymix::kernels::gated_delta_rule_ref<double>(
        batch, hymix::tensor_view<const double, 3>(qd.data(), {T, H, d}), hymix::tensor_view<const double, 3>(kd.data(), {T, H, d}),
        hymix::tensor_view<const double, 3>(vd.data(), {T, H, d}), hymix::tensor_view<const double, 2>(gd.data(), {T, H}),
        hymix::tensor_view<const double, 2>(bd.data(), {T, H}), static_cast<double>(scale),
        hymix::tensor_view<double, 4>(sd.data(), {1, H, d, d}), hymix::tensor_view<double, 3>(od.data(), {T, H, d}));
    CHECK(hymix::test::rel_error(out[1], out[0]) < 1e-6);
    CHECK(hymix::test::rel_error(state_out[1], state_out[0]) < 1e-6);
    for (int flush = 0; flush < 2; ++flush) {
        CAPTURE(flush);
        CHECK(hymix::test::rel_error(out[flush], od) < 1e-5);
        CHECK(hymix::test::rel_error(state_out[flush], sd) < 1e-5);
    }
}
