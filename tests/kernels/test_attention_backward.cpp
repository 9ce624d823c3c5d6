// Attention backward (spec.md §2, invariant 21; issue 8): the fp64 reference backward vs central finite differences of
// the fp64 forward reference (GQA/MQA/MHA, Tq < Tk, sliding window), the tiled CPU fp32 backward vs the reference
// (1 and 2 threads, other SIMD widths, tiles not a multiple of the size), packed problems vs solo runs, rows and tiles
// with every key masked, skipped outputs, the reference backend's op, bad arguments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/kernels/attention.hpp"
#include "hymix/kernels/attention_backward.hpp"
#include "hymix/ops/attention_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using kernels::attention_backward_problem;
using kernels::attention_params;
using kernels::attention_problem;

namespace {

/// One problem's tensors: fp32 inputs (q, k, v, do), the fp32 forward outputs (o, lse) of the CPU prefill, fp32
/// gradients, and fp64 gradients of the reference on the same inputs.
struct bwd_case {
    std::int64_t Tq, Tk, H, Hkv, dh;
    std::vector<float> q, k, v, dout, o, lse, dq, dk, dv;
    std::vector<double> dqr, dkr, dvr;

    bwd_case(std::int64_t Tq_, std::int64_t Tk_, std::int64_t H_, std::int64_t Hkv_, std::int64_t dh_, std::uint64_t seed,
             float amp = 2.f)
        : Tq(Tq_), Tk(Tk_), H(H_), Hkv(Hkv_), dh(dh_) {
        q = test::uniform(nq(), -amp, amp, seed);
        k = test::uniform(nk(), -amp, amp, seed + 1);
        v = test::uniform(nk(), -1.f, 1.f, seed + 2);
        dout = test::uniform(nq(), -1.f, 1.f, seed + 3);
        o.assign(nq(), 0.f);
        lse.assign(static_cast<std::size_t>(Tq * H), 0.f);
        dq.assign(nq(), 77.f);  // garbage: the kernel must overwrite every entry
        dk.assign(nk(), 77.f);
        dv.assign(nk(), 77.f);
    }
    std::size_t nq() const { return static_cast<std::size_t>(Tq * H * dh); }
    std::size_t nk() const { return static_cast<std::size_t>(Tk * Hkv * dh); }
    attention_problem<float> fwd() {
        return {tensor_view<const float, 3>(q.data(), {Tq, H, dh}), tensor_view<const float, 3>(k.data(), {Tk, Hkv, dh}),
                tensor_view<const float, 3>(v.data(), {Tk, Hkv, dh}), tensor_view<float, 3>(o.data(), {Tq, H, dh}),
                tensor_view<float, 2>(lse.data(), {Tq, H})};
    }
    attention_backward_problem<float> bwd() {
        attention_backward_problem<float> p;
        p.q = tensor_view<const float, 3>(q.data(), {Tq, H, dh});
        p.k = tensor_view<const float, 3>(k.data(), {Tk, Hkv, dh});
        p.v = tensor_view<const float, 3>(v.data(), {Tk, Hkv, dh});
        p.o = tensor_view<const float, 3>(o.data(), {Tq, H, dh});
        p.lse = tensor_view<const float, 2>(lse.data(), {Tq, H});
        p.dout = tensor_view<const float, 3>(dout.data(), {Tq, H, dh});
        p.dq = tensor_view<float, 3>(dq.data(), {Tq, H, dh});
        p.dk = tensor_view<float, 3>(dk.data(), {Tk, Hkv, dh});
        p.dv = tensor_view<float, 3>(dv.data(), {Tk, Hkv, dh});
        return p;
    }
    /// o, lse from the CPU forward.
    void forward(const cpu_backend& be, const attention_params& prm) {
        const auto p = fwd();
        kernels::attention_prefill(be, std::span<const attention_problem<float>>(&p, 1), prm);
    }
    void backward(const cpu_backend& be, const attention_params& prm) {
        const auto p = bwd();
        kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    }
    /// The fp64 reference backward on fp64 copies of the fp32 inputs.
    void reference(const attention_params& prm) {
        std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()), dod(dout.begin(), dout.end());
        std::vector<double> od(o.begin(), o.end()), ld(lse.begin(), lse.end());
        dqr.assign(nq(), 0.0);
        dkr.assign(nk(), 0.0);
        dvr.assign(nk(), 0.0);
        attention_backward_problem<double> p;
        p.q = tensor_view<const double, 3>(qd.data(), {Tq, H, dh});
        p.k = tensor_view<const double, 3>(kd.data(), {Tk, Hkv, dh});
        p.v = tensor_view<const double, 3>(vd.data(), {Tk, Hkv, dh});
        p.o = tensor_view<const double, 3>(od.data(), {Tq, H, dh});
        p.lse = tensor_view<const double, 2>(ld.data(), {Tq, H});
        p.dout = tensor_view<const double, 3>(dod.data(), {Tq, H, dh});
        p.dq = tensor_view<double, 3>(dqr.data(), {Tq, H, dh});
        p.dk = tensor_view<double, 3>(dkr.data(), {Tk, Hkv, dh});
        p.dv = tensor_view<double, 3>(dvr.data(), {Tk, Hkv, dh});
        kernels::attention_backward_ref(p, prm);
    }
    void check_vs_reference(double tol) const {
        CHECK(test::rel_error(dq, dqr) < tol);
        CHECK(test::rel_error(dk, dkr) < tol);
        CHECK(test::rel_error(dv, dvr) < tol);
    }
};

bool all_finite(const std::vector<float>& x) {
    for (float v : x)
        if (!std::isfinite(v)) return false;
    return true;
}

/// o = attention_ref(q, k, v) in fp64.
std::vector<double> forward_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                                std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t Hkv, std::int64_t dh,
                                const attention_params& prm) {
    std::vector<double> o(static_cast<std::size_t>(Tq * H * dh));
    attention_problem<double> p{tensor_view<const double, 3>(q.data(), {Tq, H, dh}), tensor_view<const double, 3>(k.data(), {Tk, Hkv, dh}),
                                tensor_view<const double, 3>(v.data(), {Tk, Hkv, dh}), tensor_view<double, 3>(o.data(), {Tq, H, dh}),
                                tensor_view<double, 2>()};
    kernels::attention_ref(p, prm);
    return o;
}

}  // namespace

TEST_CASE("attention backward reference vs central finite differences of the fp64 forward (q, k, v)") {
    struct shape {
        std::int64_t Tq, Tk, Hkv, window;
    };
    const shape shapes[] = {{7, 7, 1, 0}, {7, 7, 2, 0}, {7, 7, 4, 0}, {3, 9, 1, 0}, {3, 9, 2, 0},
                            {3, 9, 4, 0}, {7, 7, 2, 3}, {3, 9, 4, 2}, {5, 3, 2, 0}};
    const std::int64_t H = 4, dh = 5;
    for (const auto& s : shapes) {
        CAPTURE(s.Tq);
        CAPTURE(s.Tk);
        CAPTURE(s.Hkv);
        CAPTURE(s.window);
        const attention_params prm{0.0, s.window};
        const auto seed = static_cast<std::uint64_t>(1000 + 100 * s.Tq + 10 * s.Tk + s.Hkv + 7 * s.window);
        const auto nq = static_cast<std::size_t>(s.Tq * H * dh), nk = static_cast<std::size_t>(s.Tk * s.Hkv * dh);
        auto tod = [](const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); };
        std::vector<double> q = tod(test::uniform(nq, -1.5f, 1.5f, seed)), k = tod(test::uniform(nk, -1.5f, 1.5f, seed + 1)),
                            v = tod(test::uniform(nk, -1.f, 1.f, seed + 2));
        const std::vector<double> c = test::cotangent(nq, seed + 3);  // upstream gradient do
        const auto o = forward_ref(q, k, v, s.Tq, s.Tk, H, s.Hkv, dh, prm);
        std::vector<double> lse(static_cast<std::size_t>(s.Tq * H), 0.0), dq(nq), dk(nk), dv(nk);
        attention_backward_problem<double> p;
        p.q = tensor_view<const double, 3>(q.data(), {s.Tq, H, dh});
        p.k = tensor_view<const double, 3>(k.data(), {s.Tk, s.Hkv, dh});
        p.v = tensor_view<const double, 3>(v.data(), {s.Tk, s.Hkv, dh});
        p.o = tensor_view<const double, 3>(o.data(), {s.Tq, H, dh});
        p.lse = tensor_view<const double, 2>(lse.data(), {s.Tq, H});
        p.dout = tensor_view<const double, 3>(c.data(), {s.Tq, H, dh});
        p.dq = tensor_view<double, 3>(dq.data(), {s.Tq, H, dh});
        p.dk = tensor_view<double, 3>(dk.data(), {s.Tk, s.Hkv, dh});
        p.dv = tensor_view<double, 3>(dv.data(), {s.Tk, s.Hkv, dh});
        kernels::attention_backward_ref(p, prm);
        auto loss = [&] { return test::dot(c, forward_ref(q, k, v, s.Tq, s.Tk, H, s.Hkv, dh, prm)); };
        test::check_gradient("dq", q, dq, loss, 1e-6, 1e-6, 200);
        test::check_gradient("dk", k, dk, loss, 1e-6, 1e-6, 200);
        test::check_gradient("dv", v, dv, loss, 1e-6, 1e-6, 200);
        if (s.Tk < s.Tq)  // the first Tq − Tk rows see no key: their dq is exactly 0
            for (std::size_t i = 0; i < static_cast<std::size_t>((s.Tq - s.Tk) * H * dh); ++i) CHECK(dq[i] == 0.0);
    }
}

TEST_CASE("attention backward CPU fp32 vs fp64 reference: 130 tokens (not a tile multiple), d_h 64 and 128, 1 and 2 threads") {
    struct shape {
        std::int64_t Tq, Tk, H, Hkv, dh, window;
    };
    const shape shapes[] = {
        {130, 130, 4, 2, 64, 0}, {130, 130, 4, 2, 128, 0}, {130, 130, 4, 4, 64, 0}, {130, 130, 4, 1, 128, 0},
        {130, 130, 4, 2, 64, 40},  // window: early key blocks masked for late rows
        {37, 130, 4, 2, 64, 0},    // n_past = 93, bottom-right mask
        {130, 130, 2, 1, 20, 0},   // d_h not a multiple of the SIMD width
        {1, 70, 2, 2, 8, 0},       // one query
    };
    const cpu_backend be1(1), be2(2);
    for (const auto& s : shapes) {
        CAPTURE(s.Tq);
        CAPTURE(s.Tk);
        CAPTURE(s.Hkv);
        CAPTURE(s.dh);
        CAPTURE(s.window);
        const attention_params prm{0.0, s.window};
        bwd_case c(s.Tq, s.Tk, s.H, s.Hkv, s.dh, static_cast<std::uint64_t>(17 * s.Tq + s.Tk + s.dh + s.Hkv + s.window));
        c.forward(be2, prm);
        c.reference(prm);
        c.backward(be1, prm);
        c.check_vs_reference(1e-4);
        const auto dq1 = c.dq, dk1 = c.dk, dv1 = c.dv;
        std::fill(c.dq.begin(), c.dq.end(), 77.f);
        c.backward(be2, prm);
        c.check_vs_reference(1e-4);
        // The work split depends only on the problem: the same bits for any thread count.
        CHECK(c.dq == dq1);
        CHECK(c.dk == dk1);
        CHECK(c.dv == dv1);
    }
}

TEST_CASE("attention backward: long sequence (several key splits per KV head, MQA) vs reference, explicit scale") {
    const cpu_backend be(2);
    for (const std::int64_t window : {std::int64_t{0}, std::int64_t{100}}) {
        CAPTURE(window);
        const attention_params prm{0.3, window};
        bwd_case c(700, 700, 3, 1, 16, 5 + static_cast<std::uint64_t>(window));
        c.forward(be, prm);
        c.reference(prm);
        c.backward(be, prm);
        c.check_vs_reference(1e-4);
    }
}

TEST_CASE("attention backward: packed problems (varlen) equal solo runs, bit for bit") {
    const cpu_backend be(2);
    const attention_params prm{0.0, 0};
    std::vector<bwd_case> cs;
    cs.emplace_back(130, 130, 4, 2, 32, 1);
    cs.emplace_back(1, 1, 4, 2, 32, 2);
    cs.emplace_back(65, 200, 4, 2, 32, 3);
    cs.emplace_back(300, 300, 4, 2, 32, 4);
    cs.emplace_back(0, 10, 4, 2, 32, 5);  // no queries: dk = dv = 0
    std::vector<attention_backward_problem<float>> ps;
    for (auto& c : cs) {
        c.forward(be, prm);
        ps.push_back(c.bwd());
    }
    kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(ps), prm);
    for (auto& c : cs) {
        CAPTURE(c.Tq);
        const auto dq = c.dq, dk = c.dk, dv = c.dv;
        c.backward(be, prm);
        CHECK(c.dq == dq);
        CHECK(c.dk == dk);
        CHECK(c.dv == dv);
        c.reference(prm);
        c.check_vs_reference(1e-4);
    }
    for (float x : cs.back().dk) CHECK(x == 0.f);
}

TEST_CASE("attention backward: rows that see no key (Tk < Tq) and fully masked tiles give zero, finite gradients") {
    const cpu_backend be(2);
    struct shape {
        std::int64_t Tq, Tk, window;
    };
    // Tk < Tq: the first Tq − Tk rows see nothing (o = 0, LSE −∞); windows make whole key tiles invisible to a row.
    for (const shape s : {shape{100, 40, 0}, shape{100, 40, 5}, shape{200, 3, 0}, shape{300, 300, 1}, shape{300, 300, 20}}) {
        CAPTURE(s.Tq);
        CAPTURE(s.Tk);
        CAPTURE(s.window);
        const attention_params prm{0.0, s.window};
        bwd_case c(s.Tq, s.Tk, 2, 1, 16, 40 + static_cast<std::uint64_t>(s.Tq + s.Tk + s.window));
        c.forward(be, prm);
        c.backward(be, prm);
        CHECK(all_finite(c.dq));
        CHECK(all_finite(c.dk));
        CHECK(all_finite(c.dv));
        const std::int64_t dead = std::max<std::int64_t>(0, s.Tq - s.Tk);
        for (std::int64_t i = 0; i < dead; ++i) {
            CHECK(c.lse[static_cast<std::size_t>(i * 2)] == -std::numeric_limits<float>::infinity());
            for (std::int64_t e = 0; e < 2 * 16; ++e) CHECK(c.dq[static_cast<std::size_t>(i * 2 * 16 + e)] == 0.f);
        }
        c.reference(prm);
        c.check_vs_reference(1e-4);
    }
    // Huge values in keys and values no row can see (the last key tile with Tq = 1, window 1) change nothing.
    bwd_case a(1, 200, 2, 1, 16, 91);
    for (std::int64_t j = 0; j < 128; ++j)
        for (std::int64_t e = 0; e < 16; ++e) {
            a.k[static_cast<std::size_t>(j * 16 + e)] = 1e30f;
            a.v[static_cast<std::size_t>(j * 16 + e)] = -1e30f;
        }
    a.forward(be, {0.0, 1});
    a.backward(be, {0.0, 1});
    CHECK(all_finite(a.dq));
    CHECK(all_finite(a.dk));
    CHECK(all_finite(a.dv));
    a.reference({0.0, 1});
    a.check_vs_reference(1e-5);
}

TEST_CASE("attention backward: null outputs are skipped and leave the others unchanged") {
    const cpu_backend be(2);
    const attention_params prm{0.0, 0};
    bwd_case c(90, 90, 4, 2, 24, 123);
    c.forward(be, prm);
    c.backward(be, prm);
    const auto dq = c.dq, dk = c.dk, dv = c.dv;
    auto p = c.bwd();
    p.dq = {};
    std::fill(c.dk.begin(), c.dk.end(), 5.f);
    kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    CHECK(c.dk == dk);
    CHECK(c.dv == dv);
    p = c.bwd();
    p.dk = {};
    p.dv = {};
    std::fill(c.dq.begin(), c.dq.end(), 5.f);
    std::fill(c.dk.begin(), c.dk.end(), 5.f);
    kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    CHECK(c.dq == dq);
    for (float x : c.dk) CHECK(x == 5.f);
    p = c.bwd();  // dv only: dP and dS are not formed
    p.dq = {};
    p.dk = {};
    std::fill(c.dv.begin(), c.dv.end(), 5.f);
    kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    CHECK(c.dv == dv);
}

TEST_CASE("attention backward: the reference backend's op equals the fp64 reference; the CPU op equals the kernel") {
    const attention_params prm{0.0, 9};
    const cpu_backend be(2);
    bwd_case c(41, 50, 4, 2, 12, 300);
    c.forward(be, prm);
    c.reference(prm);
    const auto p = c.bwd();
    ops::attention_prefill_backward(reference_backend{}, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    CHECK(test::rel_error(c.dq, c.dqr) < 1e-7);
    CHECK(test::rel_error(c.dk, c.dkr) < 1e-7);
    CHECK(test::rel_error(c.dv, c.dvr) < 1e-7);
    ops::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
    const auto dq = c.dq;
    c.backward(be, prm);
    CHECK(c.dq == dq);
    c.check_vs_reference(1e-4);
}

TEST_CASE("attention backward: AVX2 and SSE2 backends (8 and 4 lanes) agree with the reference") {
    const attention_params prm{0.0, 50};
    auto run = [&](const auto& be) {
        bwd_case c(77, 150, 4, 2, 20, 555);
        const auto pf = c.fwd();
        kernels::attention_prefill(be, std::span<const attention_problem<float>>(&pf, 1), prm);
        const auto p = c.bwd();
        kernels::attention_prefill_backward(be, std::span<const attention_backward_problem<float>>(&p, 1), prm);
        c.reference(prm);
        c.check_vs_reference(1e-4);
    };
    if constexpr (xsimd::avx2::supported())
        run(basic_cpu_backend<xsimd::avx2>(2));
    else
        MESSAGE("SKIPPED: this build has no AVX2");
    if constexpr (xsimd::sse2::supported())
        run(basic_cpu_backend<xsimd::sse2>(2));
    else
        MESSAGE("SKIPPED: this build has no SSE2");
}

TEST_CASE("attention backward: bad arguments throw shape_error / value_error naming the argument") {
    const cpu_backend be(1);
    const reference_backend ref;
    bwd_case c(8, 8, 4, 2, 8, 9);
    c.forward(be, {});
    auto expect_shape_error = [&](const attention_backward_problem<float>& p, const char* what) {
        CAPTURE(what);
        const std::span<const attention_backward_problem<float>> ps(&p, 1);
        CHECK_THROWS_AS(kernels::attention_prefill_backward(be, ps, {}), shape_error);
        CHECK_THROWS_AS(ops::attention_prefill_backward(ref, ps, {}), shape_error);
        try {
            kernels::attention_prefill_backward(be, ps, {});
        } catch (const shape_error& e) {
            CHECK(std::string(e.what()).find(what) != std::string::npos);
        }
    };
    auto p = c.bwd();
    p.dk = tensor_view<float, 3>(c.dk.data(), {8, 2, 7});
    expect_shape_error(p, "dk");
    p = c.bwd();
    p.dv = tensor_view<float, 3>(c.dv.data(), {7, 2, 8});
    expect_shape_error(p, "dv");
    p = c.bwd();
    p.dout = tensor_view<const float, 3>(c.dout.data(), {8, 3, 8});
    expect_shape_error(p, "do");
    p = c.bwd();
    p.lse = {};
    expect_shape_error(p, "lse");
    p = c.bwd();
    p.k = tensor_view<const float, 3>(c.k.data(), {8, 3, 8});  // H = 4 is not a multiple of H_kv = 3
    p.v = tensor_view<const float, 3>(c.v.data(), {8, 3, 8});
    p.dk = p.dv = {};
    expect_shape_error(p, "multiple");
    p = c.bwd();
    p.dq = tensor_view<float, 3>(c.dq.data(), {8, 4, 8}, {64, 16, 2});  // stride 2 along d_h (rejected before any access)
    expect_shape_error(p, "dq");
    p = c.bwd();
    p.dq = tensor_view<float, 3>(const_cast<float*>(c.q.data()), {8, 4, 8});  // dq overwrites q
    expect_shape_error(p, "dq");
    p = c.bwd();
    p.dv = tensor_view<float, 3>(c.dk.data(), {8, 2, 8});  // dv on top of dk
    expect_shape_error(p, "dv");
    p = c.bwd();
    const std::span<const attention_backward_problem<float>> ps(&p, 1);
    CHECK_THROWS_AS(kernels::attention_prefill_backward(be, ps, {0.0, -1}), value_error);
    CHECK_THROWS_AS(kernels::attention_prefill_backward(be, ps, {std::numeric_limits<double>::infinity(), 0}), value_error);
}
