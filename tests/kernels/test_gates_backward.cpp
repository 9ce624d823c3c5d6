// Backward of the gate preparations (kernels/gates_backward.hpp, ops/gates_backward.hpp): Mamba-2's
// Δ = clamp(softplus(dt + dt_bias), lo, hi) and GDN's g = min(−exp(A_log)·softplus(a + dt_bias), −floor), β = σ(b).
// fp64 references vs central finite differences, the dt path and softplus invariants (spec.md §8 9–10), the decay
// clamp (invariant 11: gradient 0 exactly where the clamp is active), CPU fp32 (1, 2 threads) vs the reference.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "hymix/kernels/gates_backward.hpp"
#include "hymix/ops/gated_delta.hpp"
#include "hymix/ops/gates_backward.hpp"
#include "hymix/ops/ssd.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::check_gradient;
using hymix::test::cotangent;
using hymix::test::dot;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }
using v2d = tensor_view<double, 2>;
using cv2d = tensor_view<const double, 2>;
using v2f = tensor_view<float, 2>;
using cv2f = tensor_view<const float, 2>;

/// Δ in fp64 with the formula of spec.md §3.2 step 4.
std::vector<double> delta64(const std::vector<double>& raw, const std::vector<double>& bias, std::int64_t n, std::int64_t H, double lo,
                            double hi) {
    std::vector<double> d(raw.size());
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t h = 0; h < H; ++h)
            d[std::size_t(r * H + h)] = std::clamp(softplus(raw[std::size_t(r * H + h)] + bias[std::size_t(h)]), lo, hi);
    return d;
}

}  // namespace

TEST_CASE("ssd_delta backward: fp64 reference equals central finite differences, with and without the clamp") {
    const std::int64_t n = 13, H = 5;
    const double inf = std::numeric_limits<double>::infinity();
    for (const auto& lim : {std::pair{0.0, inf}, std::pair{0.05, 2.0}}) {
        CAPTURE(lim.first);
        auto raw = to_f64(uniform(std::size_t(n * H), -6.f, 6.f, 1));
        auto bias = to_f64(uniform(std::size_t(H), -1.f, 1.f, 2));
        const auto cd = cotangent(std::size_t(n * H), 3);
        std::vector<double> draw(raw.size(), -9.0), dbias(std::size_t(H), 0.5);
        kernels::ssd_delta_backward_ref<double>(cv2d(raw.data(), {n, H}), bias.data(), lim.first, lim.second, cv2d(cd.data(), {n, H}),
                                                v2d(draw.data(), {n, H}), dbias.data());
        for (auto& v : dbias) v -= 0.5;  // accumulated onto 0.5
        auto loss = [&] { return dot(cd, delta64(raw, bias, n, H, lim.first, lim.second)); };
        check_gradient("draw", raw, draw, loss, 1e-6, 1e-6, 100);
        check_gradient("dbias", bias, dbias, loss);
        if (lim.second < inf) {  // some entries clamp at each end, and exactly there the gradient is 0
            int low = 0, high = 0;
            for (std::int64_t r = 0; r < n; ++r)
                for (std::int64_t h = 0; h < H; ++h) {
                    const double sp = softplus(raw[std::size_t(r * H + h)] + bias[std::size_t(h)]);
                    const bool clamped = sp < lim.first || sp > lim.second;
                    low += sp < lim.first;
                    high += sp > lim.second;
                    CHECK((draw[std::size_t(r * H + h)] == 0.0) == clamped);
                }
            CHECK(low > 3);
            CHECK(high > 3);
        }
    }
}

TEST_CASE("ssd_delta backward: the dt path of invariant 9 (tokens [−30, −5, 0, 5, 30], dt_bias [0.5, −2])") {
    const std::int64_t T = 5, H = 2;
    const std::vector<float> tok{-30, -5, 0, 5, 30}, bias{0.5f, -2.f};
    std::vector<float> raw(std::size_t(T * H)), dd(std::size_t(T * H), 1.f);
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t h = 0; h < H; ++h) raw[std::size_t(t * H + h)] = tok[std::size_t(t)];
    const cpu_backend cpu(1);
    const reference_backend ref;
    for (const auto& lim : {std::pair{0.f, std::numeric_limits<float>::infinity()}, std::pair{0.01f, 0.1f}}) {
        CAPTURE(lim.first);
        for (int bk = 0; bk < 2; ++bk) {
            std::vector<float> draw(raw.size(), -9.f), dbias(std::size_t(H), 0.f), delta(raw.size());
            if (bk == 0) {
                ops::ssd_delta_backward(cpu, cv2f(raw.data(), {T, H}), bias.data(), lim.first, lim.second, cv2f(dd.data(), {T, H}),
                                        v2f(draw.data(), {T, H}), dbias.data());
                ops::ssd_delta(cpu, cv2f(raw.data(), {T, H}), bias.data(), lim.first, lim.second, v2f(delta.data(), {T, H}));
            } else {
                ops::ssd_delta_backward(ref, cv2f(raw.data(), {T, H}), bias.data(), lim.first, lim.second, cv2f(dd.data(), {T, H}),
                                        v2f(draw.data(), {T, H}), dbias.data());
                ops::ssd_delta(ref, cv2f(raw.data(), {T, H}), bias.data(), lim.first, lim.second, v2f(delta.data(), {T, H}));
            }
            double sum[2] = {0, 0};
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t h = 0; h < H; ++h) {
                    const std::size_t i = std::size_t(t * H + h);
                    const bool pinned = delta[i] == lim.first || delta[i] == lim.second;
                    CHECK(std::isfinite(draw[i]));
                    if (pinned) CHECK(draw[i] == 0.f);
                    else CHECK(draw[i] == doctest::Approx(kernels::sigmoid_stable(double(tok[std::size_t(t)]) + bias[std::size_t(h)])).epsilon(1e-6));
                    sum[h] += draw[i];
                }
            for (std::int64_t h = 0; h < H; ++h) CHECK(dbias[std::size_t(h)] == doctest::Approx(sum[h]).epsilon(1e-6));
            if (lim.first == 0.f) {
                CHECK(draw[0] > 0.f);  // softplus(−29.5) ≈ 1.5e−13 survives, and so does its gradient σ(−29.5)
                CHECK(draw[0] == doctest::Approx(1.5229979744712629e-13).epsilon(1e-5));
            } else {
                for (std::int64_t h = 0; h < H; ++h) {  // the extreme tokens pin to 0.01 / 0.1: gradient exactly 0
                    CHECK(delta[std::size_t(h)] == 0.01f);
                    CHECK(delta[std::size_t(4 * H + h)] == 0.1f);
                    CHECK(draw[std::size_t(h)] == 0.f);
                    CHECK(draw[std::size_t(4 * H + h)] == 0.f);
                }
            }
        }
    }
}

TEST_CASE("softplus gradient: σ(x), finite at {19.9, 20.1, 50, 100, −50, 0} and extremes (invariant 10)") {
    const std::vector<float> xs{19.9f, 20.1f, 50.f, 100.f, -50.f, 0.f, 1e4f, -1e4f, 3e38f, -3e38f};
    const std::int64_t n = std::int64_t(xs.size());
    const std::vector<float> zero{0.f}, ones(xs.size(), 1.f);
    for (int bk = 0; bk < 2; ++bk) {
        std::vector<float> draw(xs.size(), -9.f), dbias{0.f};
        const auto raw = cv2f(xs.data(), {n, 1});
        if (bk == 0)
            ops::ssd_delta_backward(cpu_backend(1), raw, zero.data(), 0.f, std::numeric_limits<float>::infinity(), cv2f(ones.data(), {n, 1}),
                                    v2f(draw.data(), {n, 1}), dbias.data());
        else
            ops::ssd_delta_backward(reference_backend(), raw, zero.data(), 0.f, std::numeric_limits<float>::infinity(),
                                    cv2f(ones.data(), {n, 1}), v2f(draw.data(), {n, 1}), dbias.data());
        for (std::size_t i = 0; i < xs.size(); ++i) {
            CAPTURE(xs[i]);
            const double x = xs[i], want = x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
            CHECK(std::isfinite(draw[i]));
            CHECK(std::abs(double(draw[i]) - want) <= 1e-7 * std::max(want, 1e-30));
        }
        CHECK(std::isfinite(dbias[0]));
    }
    // the fp64 helper: σ at the threshold is continuous (no jump where softplus switches to x)
    CHECK(kernels::softplus_grad(20.0 - 1e-9) == doctest::Approx(kernels::softplus_grad(20.0 + 1e-9)).epsilon(1e-12));
    CHECK(kernels::softplus_grad(-800.0) == 0.0);
    CHECK(kernels::softplus_grad(800.0) == 1.0);
}

namespace {

void gates64(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& dtb, const std::vector<double>& alog,
             double floor, bool neg, std::int64_t n, std::int64_t H, std::vector<double>& g, std::vector<double>& beta) {
    g.resize(a.size());
    beta.resize(a.size());
    for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t h = 0; h < H; ++h) {
            const std::size_t i = std::size_t(r * H + h);
            g[i] = kernels::gdn_log_decay<double>(a[i], dtb[std::size_t(h)], alog[std::size_t(h)], floor);
            beta[i] = kernels::gdn_beta<double>(b[i], neg);
        }
}

}  // namespace

TEST_CASE("gdn_gates backward: fp64 reference equals central finite differences (da, db, d_dt_bias, dA_log)") {
    const std::int64_t n = 11, H = 4;
    for (double floor : {0.0, 0.5})
        for (bool neg : {false, true}) {
            CAPTURE(floor);
            CAPTURE(neg);
            auto a = to_f64(uniform(std::size_t(n * H), -4.f, 3.f, 1)), b = to_f64(uniform(std::size_t(n * H), -6.f, 6.f, 2));
            auto dtb = to_f64(uniform(std::size_t(H), -1.f, 1.f, 3)), alog = to_f64(uniform(std::size_t(H), -1.f, 1.5f, 4));
            const auto cg = cotangent(std::size_t(n * H), 5), cb = cotangent(std::size_t(n * H), 6);
            std::vector<double> da(a.size(), -9.0), db(a.size(), -9.0), ddt(std::size_t(H), 0.0), dal(std::size_t(H), 0.0);
            kernels::gdn_gates_backward_ref<double>(cv2d(a.data(), {n, H}), cv2d(b.data(), {n, H}), dtb.data(), alog.data(), floor, neg,
                                                    cv2d(cg.data(), {n, H}), cv2d(cb.data(), {n, H}), v2d(da.data(), {n, H}),
                                                    v2d(db.data(), {n, H}), ddt.data(), dal.data());
            auto loss = [&] {
                std::vector<double> g, beta;
                gates64(a, b, dtb, alog, floor, neg, n, H, g, beta);
                return dot(cg, g) + dot(cb, beta);
            };
            check_gradient("da", a, da, loss, 1e-6, 1e-6, 100);
            check_gradient("db", b, db, loss, 1e-6, 1e-6, 100);
            check_gradient("d_dt_bias", dtb, ddt, loss);
            check_gradient("dA_log", alog, dal, loss);
            if (floor > 0) {  // the clamp is active on some entries, and exactly there da is 0
                int clamped = 0;
                for (std::int64_t r = 0; r < n; ++r)
                    for (std::int64_t h = 0; h < H; ++h) {
                        const std::size_t i = std::size_t(r * H + h);
                        const bool active = -std::exp(alog[std::size_t(h)]) * softplus(a[i] + dtb[std::size_t(h)]) > -floor;
                        clamped += active;
                        CHECK((da[i] == 0.0) == active);
                    }
                CHECK(clamped > 3);
                CHECK(clamped < n * H - 3);
            }
        }
}

TEST_CASE("gdn_gates backward: decay clamp of invariant 11 (raw {−5, 0, 5}, floor 0.1): gradient 0 only where it clamps") {
    const std::vector<float> a{-5.f, 0.f, 5.f}, b{0.f, 0.f, 0.f}, zero{0.f}, ones(3, 1.f);
    for (int bk = 0; bk < 2; ++bk) {
        std::vector<float> g(3), beta(3), da(3, -9.f), db(3, -9.f), ddt{0.f}, dal{0.f};
        auto run = [&](const auto& be) {
            ops::gdn_gates(be, cv2f(a.data(), {3, 1}), cv2f(b.data(), {3, 1}), zero.data(), zero.data(), 0.1f, false, v2f(g.data(), {3, 1}),
                           v2f(beta.data(), {3, 1}));
            ops::gdn_gates_backward(be, cv2f(a.data(), {3, 1}), cv2f(b.data(), {3, 1}), zero.data(), zero.data(), 0.1f, false,
                                    cv2f(ones.data(), {3, 1}), cv2f(ones.data(), {3, 1}), v2f(da.data(), {3, 1}), v2f(db.data(), {3, 1}),
                                    ddt.data(), dal.data());
        };
        if (bk == 0) run(cpu_backend(1));
        else run(reference_backend());
        CHECK(g[0] == doctest::Approx(-0.1).epsilon(1e-6));
        CHECK(g[1] == doctest::Approx(-0.693147).epsilon(1e-5));
        CHECK(g[2] == doctest::Approx(-5.006715).epsilon(1e-6));
        CHECK(da[0] == 0.f);  // clamped
        CHECK(da[1] == doctest::Approx(-0.5).epsilon(1e-6));
        CHECK(da[2] == doctest::Approx(-kernels::sigmoid_stable(5.0)).epsilon(1e-6));
        CHECK(ddt[0] == doctest::Approx(da[1] + da[2]).epsilon(1e-6));
        CHECK(dal[0] == doctest::Approx(g[1] + g[2]).epsilon(1e-6));  // dg/dA_log = g where unclamped
        for (float v : db) CHECK(v == doctest::Approx(0.25).epsilon(1e-7));
    }
}

TEST_CASE("gate backwards: CPU fp32 (1 and 2 threads) equals the reference backend; reference op equals the _ref") {
    const std::int64_t n = 1000, H = 7, ld = 12;  // 4 row blocks; inputs are column slices of [n, 12] matrices
    const auto wide_a = uniform(std::size_t(n * ld), -5.f, 5.f, 1), wide_b = uniform(std::size_t(n * ld), -5.f, 5.f, 2);
    const auto dg = uniform(std::size_t(n * H), -1.f, 1.f, 3), dbeta = uniform(std::size_t(n * H), -1.f, 1.f, 4);
    const auto dtb = uniform(std::size_t(H), -1.f, 1.f, 5), alog = uniform(std::size_t(H), -1.f, 1.f, 6);
    const cv2f a(wide_a.data() + 2, {n, H}, {ld, 1}), b(wide_b.data() + 1, {n, H}, {ld, 1});
    struct out {
        std::vector<float> d1, d2, p1, p2;
    };
    auto delta_run = [&](const auto& be) {
        out o{std::vector<float>(std::size_t(n * H), -9.f), {}, std::vector<float>(std::size_t(H), 0.25f), {}};
        ops::ssd_delta_backward(be, a, dtb.data(), 0.02f, 3.f, cv2f(dg.data(), {n, H}), v2f(o.d1.data(), {n, H}), o.p1.data());
        return o;
    };
    auto gates_run = [&](const auto& be) {
        out o{std::vector<float>(std::size_t(n * H), -9.f), std::vector<float>(std::size_t(n * H), -9.f),
              std::vector<float>(std::size_t(H), 0.25f), std::vector<float>(std::size_t(H), -0.5f)};
        ops::gdn_gates_backward(be, a, b, dtb.data(), alog.data(), 0.05f, true, cv2f(dg.data(), {n, H}), cv2f(dbeta.data(), {n, H}),
                                v2f(o.d1.data(), {n, H}), v2f(o.d2.data(), {n, H}), o.p1.data(), o.p2.data());
        return o;
    };
    for (int which = 0; which < 2; ++which) {
        CAPTURE(which);
        auto run = [&](const auto& be) { return which == 0 ? delta_run(be) : gates_run(be); };
        const auto ref = run(reference_backend()), c1 = run(cpu_backend(1)), c2 = run(cpu_backend(2));
        CHECK(rel_error(c1.d1, ref.d1) < 1e-5);
        CHECK(rel_error(c1.p1, ref.p1) < 1e-5);
        CHECK(c1.d1 == c2.d1);  // deterministic for any thread count
        CHECK(c1.p1 == c2.p1);
        if (which == 1) {
            CHECK(rel_error(c1.d2, ref.d2) < 1e-5);
            CHECK(rel_error(c1.p2, ref.p2) < 1e-5);
            CHECK(c1.d2 == c2.d2);
            CHECK(c1.p2 == c2.p2);
        }
        // the reference backend's op equals the fp64 _ref rounded once
        std::vector<double> ad, bd;
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t h = 0; h < H; ++h) {
                ad.push_back(a(r, h));
                bd.push_back(b(r, h));
            }
        const auto dgd = to_f64(dg), dbd = to_f64(dbeta), dtbd = to_f64(dtb), alogd = to_f64(alog);
        std::vector<double> d1(ad.size()), d2(ad.size()), p1(std::size_t(H), 0.25), p2(std::size_t(H), -0.5);
        if (which == 0)
            kernels::ssd_delta_backward_ref<double>(cv2d(ad.data(), {n, H}), dtbd.data(), 0.02, 3.0, cv2d(dgd.data(), {n, H}),
                                                    v2d(d1.data(), {n, H}), p1.data());
        else
            kernels::gdn_gates_backward_ref<double>(cv2d(ad.data(), {n, H}), cv2d(bd.data(), {n, H}), dtbd.data(), alogd.data(),
                                                    double(0.05f), true, cv2d(dgd.data(), {n, H}), cv2d(dbd.data(), {n, H}),
                                                    v2d(d1.data(), {n, H}), v2d(d2.data(), {n, H}), p1.data(), p2.data());
        for (std::size_t i = 0; i < d1.size(); ++i) CHECK(ref.d1[i] == static_cast<float>(d1[i]));
        for (std::size_t h = 0; h < p1.size(); ++h) CHECK(ref.p1[h] == static_cast<float>(p1[h]));
        if (which == 1) {
            for (std::size_t i = 0; i < d2.size(); ++i) CHECK(ref.d2[i] == static_cast<float>(d2[i]));
            for (std::size_t h = 0; h < p2.size(); ++h) CHECK(ref.p2[h] == static_cast<float>(p2[h]));
        }
    }
    // not-wanted outputs are skipped
    std::vector<float> p(std::size_t(H), 0.25f);
    ops::ssd_delta_backward(cpu_backend(2), a, dtb.data(), 0.02f, 3.f, cv2f(dg.data(), {n, H}), v2f{}, p.data());
    const auto full = delta_run(cpu_backend(2)).p1;  // with draw computed too (the compiler may fuse differently: 1e-6)
    for (std::size_t h = 0; h < p.size(); ++h) CHECK(p[h] == doctest::Approx(full[h]).epsilon(1e-6));
    std::vector<float> da(std::size_t(n * H), -9.f);
    ops::gdn_gates_backward(cpu_backend(2), a, b, dtb.data(), alog.data(), 0.05f, true, cv2f(dg.data(), {n, H}), cv2f(dbeta.data(), {n, H}),
                            v2f(da.data(), {n, H}), v2f{}, nullptr, nullptr);
    const auto full_da = gates_run(cpu_backend(2)).d1;
    for (std::size_t i = 0; i < da.size(); ++i) CHECK(da[i] == doctest::Approx(full_da[i]).epsilon(1e-6));
}

TEST_CASE("gate backwards: bad shapes and arguments throw errors naming them") {
    std::vector<float> buf(64, 0.5f), out(64), out2(64), h(4, 0.f);
    const cv2f a(buf.data(), {4, 3});
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto both = [&](auto&& f, const char* what, bool shape) {
        CAPTURE(what);
        if (shape) {
            CHECK_THROWS_WITH_AS(f(cpu), doctest::Contains(what), shape_error);
            CHECK_THROWS_WITH_AS(f(ref), doctest::Contains(what), shape_error);
        } else {
            CHECK_THROWS_WITH_AS(f(cpu), doctest::Contains(what), value_error);
            CHECK_THROWS_WITH_AS(f(ref), doctest::Contains(what), value_error);
        }
    };
    both([&](const auto& be) { ops::ssd_delta_backward(be, a, h.data(), 0.f, 1.f, cv2f(buf.data(), {4, 2}), v2f(out.data(), {4, 3}), nullptr); },
         "ssd_delta_backward: ddelta: expected shape [4, 3], found [4, 2]", true);
    both([&](const auto& be) { ops::ssd_delta_backward(be, a, h.data(), 0.f, 1.f, a, v2f(out.data(), {3, 3}), nullptr); },
         "ssd_delta_backward: draw: expected shape [4, 3], found [3, 3]", true);
    both([&](const auto& be) { ops::ssd_delta_backward(be, a, h.data(), 0.f, 1.f, a, v2f(out.data(), {4, 3}, {0, 1}), nullptr); },
         "ssd_delta_backward: draw [4, 3] is written, but its strides", true);
    both([&](const auto& be) { ops::ssd_delta_backward(be, a, nullptr, 0.f, 1.f, a, v2f(out.data(), {4, 3}), nullptr); },
         "ssd_delta_backward: bias is null", false);
    both([&](const auto& be) { ops::ssd_delta_backward(be, a, h.data(), 2.f, 1.f, a, v2f(out.data(), {4, 3}), nullptr); },
         "ssd_delta_backward: lo 2.000000 must be <= hi 1.000000", false);
    auto gates = [&](const auto& be, cv2f b, const float* dtb, const float* al, cv2f dg, cv2f dbeta, v2f da, v2f db) {
        ops::gdn_gates_backward(be, a, b, dtb, al, 0.f, false, dg, dbeta, da, db, nullptr, nullptr);
    };
    const v2f da(out.data(), {4, 3}), db(out2.data(), {4, 3});
    both([&](const auto& be) { gates(be, cv2f(buf.data(), {3, 3}), h.data(), h.data(), a, a, da, db); }, "gdn_gates_backward: b: expected shape",
         true);
    both([&](const auto& be) { gates(be, a, h.data(), h.data(), cv2f(buf.data(), {4, 4}), a, da, db); }, "gdn_gates_backward: dg: expected shape",
         true);
    both([&](const auto& be) { gates(be, a, h.data(), h.data(), a, cv2f(buf.data(), {2, 3}), da, db); },
         "gdn_gates_backward: dbeta: expected shape", true);
    both([&](const auto& be) { gates(be, a, h.data(), h.data(), a, a, v2f(out.data(), {4, 1}), db); }, "gdn_gates_backward: da: expected shape",
         true);
    both([&](const auto& be) { gates(be, a, h.data(), h.data(), a, a, da, v2f(out2.data(), {5, 3})); }, "gdn_gates_backward: db: expected shape",
         true);
    both([&](const auto& be) { gates(be, a, h.data(), h.data(), a, a, da, v2f(out.data() + 1, {4, 3})); }, "gdn_gates_backward: da overlaps db",
         true);
    both([&](const auto& be) { gates(be, a, nullptr, h.data(), a, a, da, db); }, "gdn_gates_backward: dt_bias is null", false);
    both([&](const auto& be) { gates(be, a, h.data(), nullptr, a, a, da, db); }, "gdn_gates_backward: A_log is null", false);
}
