// Causal depthwise conv1d backward (kernels/conv1d_backward.hpp, ops/conv1d_backward.hpp): the fp64 reference vs
// central finite differences of the fp64 forward (with SiLU, L2 groups, initial state and the final-state
// gradient), split invariance of every gradient when calls are chained through the conv state (spec.md §8
// invariant 2, including T < K−1), CPU fp32 (1 and 2 threads) vs the reference on varlen problems, layout
// independence of dout (invariant 20) and argument errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hymix/kernels/conv1d.hpp"
#include "hymix/kernels/conv1d_backward.hpp"
#include "hymix/ops/conv1d_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::check_gradient;
using hymix::test::cotangent;
using hymix::test::dot;
using hymix::test::rel_error;
using hymix::test::uniform;
using act_t = kernels::conv_activation;

namespace {

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> to_f32(const std::vector<double>& v) {
    std::vector<float> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
    return r;
}

/// One conv problem in fp64 with everything the forward and backward need (contiguous).
struct problem64 {
    std::int64_t T = 0, C = 0, K = 0;
    std::vector<double> x, w, b, s0;  // [T, C], [C, K], [C], [C, K−1]
    act_t act = act_t::silu;
    kernels::conv_l2_groups l2{};
    std::int64_t S() const { return K - 1; }
};

problem64 make_problem(std::int64_t T, std::int64_t C, std::int64_t K, act_t act, kernels::conv_l2_groups l2, std::uint64_t seed) {
    problem64 p;
    p.T = T, p.C = C, p.K = K, p.act = act, p.l2 = l2;
    p.x = to_f64(uniform(std::size_t(T * C), -1.5f, 1.5f, seed));
    p.w = to_f64(uniform(std::size_t(C * K), -1.f, 1.f, seed + 1));
    p.b = to_f64(uniform(std::size_t(C), -0.5f, 0.5f, seed + 2));
    p.s0 = to_f64(uniform(std::size_t(C * (K - 1)), -1.f, 1.f, seed + 3));
    return p;
}

/// fp64 forward (kernels::causal_conv1d<double> + the L2 groups as the reference backend applies them):
/// out [T, C] and the final state [C, K−1].
void forward64(const problem64& p, std::vector<double>& out, std::vector<double>& state) {
    out.assign(std::size_t(p.T * p.C), 0.0);
    state = p.s0;
    kernels::causal_conv1d<double>(tensor_view<const double, 2>(p.x.data(), {p.T, p.C}), tensor_view<const double, 2>(p.w.data(), {p.C, p.K}),
                                   p.b.data(), state.data(), p.act, tensor_view<double, 2>(out.data(), {p.T, p.C}));
    if (p.l2.group > 0)
        for (std::int64_t t = 0; t < p.T; ++t)
            for (std::int64_t g0 = 0; g0 + p.l2.group <= p.l2.limit(p.C); g0 += p.l2.group) {
                double ss = 0;
                for (std::int64_t a = 0; a < p.l2.group; ++a) ss += out[std::size_t(t * p.C + g0 + a)] * out[std::size_t(t * p.C + g0 + a)];
                const double n = std::sqrt(ss + p.l2.eps);
                for (std::int64_t a = 0; a < p.l2.group; ++a) out[std::size_t(t * p.C + g0 + a)] /= n;
            }
}

struct grads64 {
    std::vector<double> dx, dw, db, ds0;
};

/// fp64 reference backward with upstream gradients dout [T, C] and dsf [C, K−1] (empty: none).
grads64 backward64(const problem64& p, const std::vector<double>& dout, const std::vector<double>& dsf) {
    grads64 g;
    g.dx.assign(std::size_t(p.T * p.C), -7.0);  // overwritten
    g.dw.assign(std::size_t(p.C * p.K), 0.0);
    g.db.assign(std::size_t(p.C), 0.0);
    g.ds0.assign(std::size_t(p.C * p.S()), -7.0);  // overwritten
    kernels::causal_conv1d_backward_ref<double>(
        tensor_view<const double, 2>(p.x.data(), {p.T, p.C}), tensor_view<const double, 2>(p.w.data(), {p.C, p.K}), p.b.data(),
        p.s0.data(), tensor_view<const double, 2>(dout.data(), {p.T, p.C}), dsf.empty() ? nullptr : dsf.data(), p.act, p.l2,
        tensor_view<double, 2>(g.dx.data(), {p.T, p.C}), tensor_view<double, 2>(g.dw.data(), {p.C, p.K}), g.db.data(), g.ds0.data());
    return g;
}

double max_abs(const std::vector<double>& a, const std::vector<double>& b) { return hymix::test::max_abs_diff(a, b); }

/// The same problem through a backend op in fp32 (dout contiguous), returning the gradients as doubles.
template <class B>
grads64 backward_op(const B& be, const problem64& p, const std::vector<double>& dout, const std::vector<double>& dsf) {
    const auto x = to_f32(p.x), w = to_f32(p.w), b = to_f32(p.b), s0 = to_f32(p.s0), dy = to_f32(dout), ds = to_f32(dsf);
    std::vector<float> dx(x.size(), -7.f), dw(w.size(), 0.f), db(b.size(), 0.f), ds0(s0.size(), -7.f);
    ops::conv_backward_problem<> q;
    q.x = tensor_view<const float, 2>(x.data(), {p.T, p.C});
    q.w = tensor_view<const float, 2>(w.data(), {p.C, p.K});
    q.bias = b.data();
    q.state0 = s0.data();
    q.dout = tensor_view<const float, 2>(dy.data(), {p.T, p.C});
    q.dstate_final = ds.empty() ? nullptr : ds.data();
    q.dx = tensor_view<float, 2>(dx.data(), {p.T, p.C});
    q.dw = tensor_view<float, 2>(dw.data(), {p.C, p.K});
    q.dbias = db.data();
    q.dstate0 = ds0.data();
    q.l2_group = p.l2.group;
    q.l2_channels = p.l2.channels;
    q.l2_eps = static_cast<float>(p.l2.eps);
    ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(&q, 1), p.act);
    return {to_f64(dx), to_f64(dw), to_f64(db), to_f64(ds0)};
}

}  // namespace

TEST_CASE("conv1d backward: fp64 reference equals central finite differences (dx, dw, dbias, dstate0)") {
    std::uint64_t seed = 100;
    for (std::int64_t K : {2, 4})
        for (std::int64_t T : {1, 2, 3, 5, 17})
            for (act_t act : {act_t::none, act_t::silu})
                for (bool l2 : {false, true}) {
                    CAPTURE(K);
                    CAPTURE(T);
                    CAPTURE(static_cast<int>(act));
                    CAPTURE(l2);
                    const std::int64_t C = 7;  // L2: groups of 3 over the first 6 channels, channel 6 left alone
                    auto p = make_problem(T, C, K, act, l2 ? kernels::conv_l2_groups{3, 6, 1e-3} : kernels::conv_l2_groups{}, seed += 10);
                    const auto cy = cotangent(std::size_t(T * C), seed + 5), cs = cotangent(std::size_t(C * (K - 1)), seed + 6);
                    auto loss = [&] {
                        std::vector<double> y, s;
                        forward64(p, y, s);
                        return dot(cy, y) + dot(cs, s);
                    };
                    const auto g = backward64(p, cy, cs);
                    check_gradient("dx", p.x, g.dx, loss);
                    check_gradient("dw", p.w, g.dw, loss);
                    check_gradient("dbias", p.b, g.db, loss);
                    check_gradient("dstate0", p.s0, g.ds0, loss);
                    // without a final-state gradient, dstate0 is the gradient of the outputs alone
                    auto loss_y = [&] {
                        std::vector<double> y, s;
                        forward64(p, y, s);
                        return dot(cy, y);
                    };
                    check_gradient("dstate0 (outputs only)", p.s0, backward64(p, cy, {}).ds0, loss_y);
                }
}

TEST_CASE("conv1d backward: gradients chained through the conv state equal one call (invariant 2, T < K−1)") {
    const std::int64_t C = 5, K = 4, T = 5, S = K - 1;
    for (bool l2 : {false, true}) {
        CAPTURE(l2);
        const auto whole = make_problem(T, C, K, act_t::silu, l2 ? kernels::conv_l2_groups{2, -1, 1e-4} : kernels::conv_l2_groups{}, 7);
        const auto cy = cotangent(std::size_t(T * C), 8), cs = cotangent(std::size_t(C * S), 9);
        const auto ref = backward64(whole, cy, cs);
        for (const auto& splits : std::vector<std::vector<std::int64_t>>{{1, 1, 3}, {2, 3}, {4, 1}, {1, 4}, {0, 5}}) {
            CAPTURE(splits.size());
            CAPTURE(splits[0]);
            // forward: the initial state of every piece
            std::vector<problem64> pieces;
            std::vector<double> state = whole.s0;
            std::int64_t t0 = 0;
            for (const auto len : splits) {
                problem64 q = whole;
                q.T = len;
                q.x.assign(whole.x.begin() + t0 * C, whole.x.begin() + (t0 + len) * C);
                q.s0 = state;
                std::vector<double> y;
                forward64(q, y, state);
                pieces.push_back(q);
                t0 += len;
            }
            // backward, last piece first, each piece's dstate0 the previous piece's final-state gradient
            std::vector<double> dx(std::size_t(T * C)), dw(std::size_t(C * K), 0.0), db(std::size_t(C), 0.0), ds = cs;
            for (std::size_t i = pieces.size(); i-- > 0;) {
                t0 -= pieces[i].T;
                const std::vector<double> dy(cy.begin() + t0 * C, cy.begin() + (t0 + pieces[i].T) * C);
                const auto g = backward64(pieces[i], dy, ds);
                std::copy(g.dx.begin(), g.dx.end(), dx.begin() + t0 * C);
                for (std::size_t k = 0; k < dw.size(); ++k) dw[k] += g.dw[k];
                for (std::size_t k = 0; k < db.size(); ++k) db[k] += g.db[k];
                ds = g.ds0;
            }
            CHECK(max_abs(dx, ref.dx) < 1e-12);
            CHECK(max_abs(dw, ref.dw) < 1e-12);
            CHECK(max_abs(db, ref.db) < 1e-12);
            CHECK(max_abs(ds, ref.ds0) < 1e-12);
            // and the fp32 CPU op chained the same way
            const cpu_backend be(1);
            std::vector<double> dx32(std::size_t(T * C)), dw32(std::size_t(C * K), 0.0), ds32 = cs;
            t0 = T;
            for (std::size_t i = pieces.size(); i-- > 0;) {
                t0 -= pieces[i].T;
                const std::vector<double> dy(cy.begin() + t0 * C, cy.begin() + (t0 + pieces[i].T) * C);
                const auto g = backward_op(be, pieces[i], dy, ds32);
                std::copy(g.dx.begin(), g.dx.end(), dx32.begin() + t0 * C);
                for (std::size_t k = 0; k < dw32.size(); ++k) dw32[k] += g.dw[k];
                ds32 = g.ds0;
            }
            CHECK(rel_error(dx32, ref.dx) < 1e-5);
            CHECK(rel_error(dw32, ref.dw) < 1e-5);
            CHECK(rel_error(ds32, ref.ds0) < 1e-5);
        }
    }
}

TEST_CASE("conv1d backward: T = 0 passes the final-state gradient through to dstate0") {
    auto p = make_problem(0, 3, 4, act_t::silu, {}, 3);
    const auto cs = cotangent(std::size_t(3 * 3), 4);
    const auto g = backward64(p, {}, cs);
    CHECK(g.ds0 == cs);
    for (double v : g.dw) CHECK(v == 0.0);
    const auto g32 = backward_op(cpu_backend(1), p, {}, cs);
    CHECK(max_abs(g32.ds0, cs) < 1e-7);
}

namespace {

/// A packed varlen batch: sequences of `lens` tokens of one layer (shared w, bias, dw, dbias), each with its own
/// state slot; x and dout are column slices of wider row-major matrices.
struct varlen_case {
    std::int64_t C, K, ld;
    std::vector<std::int64_t> lens;
    std::vector<float> xw, w, b, s0, dyw, dsf;  // x rows [n, ld] (channels at column 3), dout rows [n, ld]
    kernels::conv_l2_groups l2;

    std::int64_t rows() const {
        std::int64_t n = 0;
        for (auto l : lens) n += l;
        return n;
    }
    varlen_case(std::int64_t C_, std::int64_t K_, std::vector<std::int64_t> lens_, kernels::conv_l2_groups l2_, std::uint64_t seed)
        : C(C_), K(K_), ld(C_ + 5), lens(std::move(lens_)), l2(l2_) {
        const auto n = std::size_t(rows()), ns = lens.size();
        xw = uniform(n * std::size_t(ld), -2.f, 2.f, seed);
        w = uniform(std::size_t(C * K), -1.f, 1.f, seed + 1);
        b = uniform(std::size_t(C), -1.f, 1.f, seed + 2);
        s0 = uniform(ns * std::size_t(C * (K - 1)), -1.f, 1.f, seed + 3);
        dyw = uniform(n * std::size_t(ld), -1.f, 1.f, seed + 4);
        dsf = uniform(ns * std::size_t(C * (K - 1)), -1.f, 1.f, seed + 5);
    }

    struct result {
        std::vector<float> dx, dw, db, ds0;
    };
    /// Runs the op on backend `be`; dw / db start from `dw0` / `db0` (accumulation).
    template <class B>
    result run(const B& be, act_t act, float dw0 = 0.f) const {
        const std::int64_t n = rows(), S = K - 1;
        result r;
        r.dx.assign(std::size_t(n * C), -9.f);
        r.dw.assign(std::size_t(C * K), dw0);
        r.db.assign(std::size_t(C), dw0);
        r.ds0.assign(s0.size(), -9.f);
        std::vector<ops::conv_backward_problem<>> ps;
        std::int64_t t0 = 0;
        for (std::size_t i = 0; i < lens.size(); ++i) {
            ops::conv_backward_problem<> q;
            q.x = tensor_view<const float, 2>(xw.data() + t0 * ld + 3, {lens[i], C}, {ld, 1});
            q.w = tensor_view<const float, 2>(w.data(), {C, K});
            q.bias = b.data();
            q.state0 = s0.data() + i * std::size_t(C * S);
            q.dout = tensor_view<const float, 2>(dyw.data() + t0 * ld + 1, {lens[i], C}, {ld, 1});
            q.dstate_final = dsf.data() + i * std::size_t(C * S);
            q.dx = tensor_view<float, 2>(r.dx.data() + t0 * C, {lens[i], C});
            q.dw = tensor_view<float, 2>(r.dw.data(), {C, K});
            q.dbias = r.db.data();
            q.dstate0 = r.ds0.data() + i * std::size_t(C * S);
            q.l2_group = l2.group;
            q.l2_channels = l2.channels;
            q.l2_eps = static_cast<float>(l2.eps);
            ps.push_back(q);
            t0 += lens[i];
        }
        ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(ps), act);
        return r;
    }
};

}  // namespace

TEST_CASE("conv1d backward: CPU fp32 (1 and 2 threads) equals the fp64 reference on varlen problems") {
    struct cfg {
        std::int64_t C, K;
        kernels::conv_l2_groups l2;
    };
    for (const cfg& c : {cfg{203, 4, {}}, cfg{203, 4, {32, 160, 1e-6}}, cfg{150, 2, {48, -1, 1e-6}}, cfg{37, 3, {5, 23, 1e-6}},
                         cfg{150, 2, {}}, cfg{37, 3, {}}, cfg{21, 6, {}}, cfg{1, 1, {}}})
        for (act_t act : {act_t::none, act_t::silu}) {
            CAPTURE(c.C);
            CAPTURE(c.K);
            CAPTURE(c.l2.group);
            CAPTURE(static_cast<int>(act));
            const varlen_case v(c.C, c.K, {5, 3, 1, 0, 9, 130}, c.l2, std::uint64_t(c.C + c.K));
            const auto ref = v.run(reference_backend(), act, 0.25f);
            const auto r1 = v.run(cpu_backend(1), act, 0.25f);
            const auto r2 = v.run(cpu_backend(2), act, 0.25f);
            CHECK(rel_error(r1.dx, ref.dx) < 1e-4);
            CHECK(rel_error(r1.dw, ref.dw) < 1e-4);
            CHECK(rel_error(r1.db, ref.db) < 1e-4);
            CHECK(rel_error(r1.ds0, ref.ds0) < 1e-4);
            // deterministic: the same fixed partition and reduction order for any thread count
            CHECK(r1.dx == r2.dx);
            CHECK(r1.dw == r2.dw);
            CHECK(r1.db == r2.db);
            CHECK(r1.ds0 == r2.ds0);
            CHECK(r1.dw == v.run(cpu_backend(1), act, 0.25f).dw);
        }
}

TEST_CASE("conv1d backward: the reference backend op equals causal_conv1d_backward_ref, sequence by sequence") {
    const std::int64_t C = 19, K = 4, S = K - 1;
    const varlen_case v(C, K, {4, 2, 11}, {4, 16, 1e-5}, 77);
    const auto op = v.run(reference_backend(), act_t::silu, 0.f);
    std::vector<double> dw(std::size_t(C * K), 0.0), db(std::size_t(C), 0.0);
    std::int64_t t0 = 0;
    for (std::size_t i = 0; i < v.lens.size(); ++i) {
        const std::int64_t T = v.lens[i];
        problem64 p;
        p.T = T, p.C = C, p.K = K, p.act = act_t::silu, p.l2 = {4, 16, double(1e-5f)};
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c) p.x.push_back(v.xw[std::size_t((t0 + t) * v.ld + 3 + c)]);
        p.w = to_f64(v.w);
        p.b = to_f64(v.b);
        p.s0.assign(v.s0.begin() + std::int64_t(i) * C * S, v.s0.begin() + std::int64_t(i + 1) * C * S);
        std::vector<double> dy, dsf(v.dsf.begin() + std::int64_t(i) * C * S, v.dsf.begin() + std::int64_t(i + 1) * C * S);
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c) dy.push_back(v.dyw[std::size_t((t0 + t) * v.ld + 1 + c)]);
        const auto g = backward64(p, dy, dsf);
        for (std::int64_t k = 0; k < T * C; ++k) CHECK(op.dx[std::size_t(t0 * C + k)] == static_cast<float>(g.dx[std::size_t(k)]));
        for (std::int64_t k = 0; k < C * S; ++k) CHECK(op.ds0[std::size_t(std::int64_t(i) * C * S + k)] == static_cast<float>(g.ds0[std::size_t(k)]));
        for (std::size_t k = 0; k < dw.size(); ++k) dw[k] += g.dw[k];
        for (std::size_t k = 0; k < db.size(); ++k) db[k] += g.db[k];
        t0 += T;
    }
    CHECK(rel_error(op.dw, dw) < 1e-6);  // per-sequence fp32 rounding of the accumulation
    CHECK(rel_error(op.db, db) < 1e-6);
}

TEST_CASE("conv1d backward: dout contiguous, a slice of [T, 3C], transposed or a stride-0 broadcast give identical gradients (invariant 20)") {
    const std::int64_t T = 13, C = 70, K = 4, S = K - 1;
    const auto x = uniform(std::size_t(T * C), -1.f, 1.f, 1), w = uniform(std::size_t(C * K), -1.f, 1.f, 2);
    const auto b = uniform(std::size_t(C), -1.f, 1.f, 3), s0 = uniform(std::size_t(C * S), -1.f, 1.f, 4);
    const auto row = uniform(std::size_t(C), -1.f, 1.f, 5);
    const auto rnd = uniform(std::size_t(T * C), -1.f, 1.f, 6);
    auto grads = [&](const auto& be, tensor_view<const float, 2> dout, std::int64_t l2g) {
        std::vector<float> dx(std::size_t(T * C)), dw(std::size_t(C * K), 0.f), db(std::size_t(C), 0.f), ds0(std::size_t(C * S));
        ops::conv_backward_problem<> q;
        q.x = tensor_view<const float, 2>(x.data(), {T, C});
        q.w = tensor_view<const float, 2>(w.data(), {C, K});
        q.bias = b.data();
        q.state0 = s0.data();
        q.dout = dout;
        q.dx = tensor_view<float, 2>(dx.data(), {T, C});
        q.dw = tensor_view<float, 2>(dw.data(), {C, K});
        q.dbias = db.data();
        q.dstate0 = ds0.data();
        q.l2_group = l2g;
        q.l2_eps = 1e-6f;
        ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(&q, 1), act_t::silu);
        std::vector<float> all = dx;
        all.insert(all.end(), dw.begin(), dw.end());
        all.insert(all.end(), db.begin(), db.end());
        all.insert(all.end(), ds0.begin(), ds0.end());
        return all;
    };
    auto layouts = [&](const std::vector<float>& dense) {  // the same [T, C] values in three more layouts
        std::vector<float> wide(std::size_t(T * 3 * C), 5.f), trans(std::size_t(T * C));
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c) {
                wide[std::size_t(t * 3 * C + C + c)] = dense[std::size_t(t * C + c)];
                trans[std::size_t(c * T + t)] = dense[std::size_t(t * C + c)];
            }
        return std::pair{wide, trans};
    };
    for (std::int64_t l2g : {0, 10}) {
        CAPTURE(l2g);
        for (int bk = 0; bk < 2; ++bk) {
            auto run = [&](tensor_view<const float, 2> d) {
                return bk == 0 ? grads(cpu_backend(2), d, l2g) : grads(reference_backend(), d, l2g);
            };
            // random dout: contiguous, slice of [T, 3C], transposed (channel stride T)
            const auto [wide, trans] = layouts(rnd);
            const auto g0 = run(tensor_view<const float, 2>(rnd.data(), {T, C}));
            CHECK(run(tensor_view<const float, 2>(wide.data() + C, {T, C}, {3 * C, 1})) == g0);
            CHECK(run(tensor_view<const float, 2>(trans.data(), {T, C}, {1, T})) == g0);
            // one row repeated: contiguous, slice, stride-0 broadcast
            std::vector<float> rep(std::size_t(T * C));
            for (std::int64_t t = 0; t < T; ++t) std::copy(row.begin(), row.end(), rep.begin() + t * C);
            const auto [wide2, trans2] = layouts(rep);
            const auto g1 = run(tensor_view<const float, 2>(rep.data(), {T, C}));
            CHECK(run(tensor_view<const float, 2>(wide2.data() + C, {T, C}, {3 * C, 1})) == g1);
            CHECK(run(tensor_view<const float, 2>(row.data(), {T, C}, {0, 1})) == g1);
        }
    }
}

TEST_CASE("conv1d backward: bad shapes and strides throw errors naming the argument") {
    const std::int64_t T = 4, C = 3, K = 4;
    std::vector<float> x(64, 1.f), w(64, 1.f), dy(64, 1.f), dx(64), dw(64);
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto base = [&] {
        ops::conv_backward_problem<> q;
        q.x = tensor_view<const float, 2>(x.data(), {T, C});
        q.w = tensor_view<const float, 2>(w.data(), {C, K});
        q.dout = tensor_view<const float, 2>(dy.data(), {T, C});
        q.dx = tensor_view<float, 2>(dx.data(), {T, C});
        q.dw = tensor_view<float, 2>(dw.data(), {C, K});
        return q;
    };
    auto expect = [&](const ops::conv_backward_problem<>& q, const char* what, bool shape) {
        CAPTURE(what);
        const std::span<const ops::conv_backward_problem<>> s(&q, 1);
        if (shape) {
            CHECK_THROWS_WITH_AS(ops::causal_conv1d_backward(cpu, s, act_t::silu), doctest::Contains(what), shape_error);
            CHECK_THROWS_WITH_AS(ops::causal_conv1d_backward(ref, s, act_t::silu), doctest::Contains(what), shape_error);
        } else {
            CHECK_THROWS_WITH_AS(ops::causal_conv1d_backward(cpu, s, act_t::silu), doctest::Contains(what), value_error);
            CHECK_THROWS_WITH_AS(ops::causal_conv1d_backward(ref, s, act_t::silu), doctest::Contains(what), value_error);
        }
    };
    {
        const auto q = base();
        CHECK_NOTHROW(ops::causal_conv1d_backward(cpu, std::span<const ops::conv_backward_problem<>>(&q, 1), act_t::silu));
    }
    auto q = base();
    q.w = tensor_view<const float, 2>(w.data(), {C + 1, K});
    expect(q, "w: expected shape [3, -1], found [4, 4]", true);
    q = base();
    q.w = tensor_view<const float, 2>(w.data(), {C, 0});
    expect(q, "w: kernel width", true);
    q = base();
    q.dout = tensor_view<const float, 2>(dy.data(), {T + 1, C});
    expect(q, "dout: expected shape [4, 3], found [5, 3]", true);
    q = base();
    q.dx = tensor_view<float, 2>(dx.data(), {T, C + 1});
    expect(q, "dx: expected shape [4, 3], found [4, 4]", true);
    q = base();
    q.dx = tensor_view<float, 2>(dx.data(), {T, C}, {1, T});
    expect(q, "dx [4, 3] needs unit stride along axis 1", true);
    q = base();
    q.dx = tensor_view<float, 2>(dx.data(), {T, C}, {0, 1});
    expect(q, "dx [4, 3] is written, but its strides", true);
    q = base();
    q.x = tensor_view<const float, 2>(x.data(), {T, C}, {1, T});
    expect(q, "x [4, 3] needs unit stride along axis 1", true);
    q = base();
    q.dw = tensor_view<float, 2>(dw.data(), {K, C});
    expect(q, "dw: expected shape [3, 4], found [4, 3]", true);
    q = base();
    q.dw = tensor_view<float, 2>(dx.data() + 2, {C, K});
    expect(q, "dw overlaps dx", true);
    q = base();
    q.dx = tensor_view<float, 2>(const_cast<float*>(dy.data()), {T, C});
    expect(q, "dx overlaps dout", true);
    q = base();
    q.l2_group = 2;
    q.l2_channels = 5;
    expect(q, "l2_channels 5 exceeds the 3 channels", false);
    q = base();
    q.l2_group = -1;
    expect(q, "l2_group must be >= 0", false);
    q = base();
    const std::span<const ops::conv_backward_problem<>> s(&q, 1);
    CHECK_THROWS_WITH_AS(ops::causal_conv1d_backward(cpu, s, static_cast<act_t>(7)), doctest::Contains("unknown activation"), value_error);
}
