// Training of the Oryx multi-mixer layer (issue 10; spec.md §6.5): forward_train equals forward on fresh states for
// any per-token mode list; the whole-layer backward (W_O → gated norm → attention rows' flash backward and linear
// rows' chunked backward → short convs → projections) against central finite differences of the fp64 layer reference
// for both instances (GDN, Mamba-2) under mixed modes; CPU against the reference backend; packed varlen batches equal
// the solo runs; each W_Q gets gradient only through its own mode's rows.

// GCC 12's false `__Y is used uninitialized` inside its AVX-512 intrinsics (bug 105593): see test_oryx.cpp.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/oryx.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

oryx_config config(oryx_linear_kind kind, std::int64_t d, std::int64_t H, std::int64_t dh, std::int64_t K, std::int64_t chunk) {
    oryx_config c;
    c.d_model = d;
    c.n_heads = H;
    c.head_dim = dh;
    c.d_conv = K;
    c.linear = kind;
    c.gdn_chunk = chunk;
    c.ssd_chunk = chunk;
    return c;
}

/// Random weights scaled so activations, gates and norms are O(1) in a tiny layer; non-trivial o_norm, dt_bias, D.
oryx_weights test_weights(const oryx_config& c, std::uint64_t seed) {
    auto w = oryx_weights::random(c, seed);
    const float s = c.is_gdn() ? 10.f : 1.5f;
    w.for_each([&](std::string_view name, tensor<float>& t) {
        if (name.ends_with("proj.weight")) for (auto& v : t.span()) v *= s;
    });
    const auto nw = hymix::test::uniform(static_cast<std::size_t>(c.head_dim), 0.5f, 1.5f, seed + 1);
    std::copy(nw.begin(), nw.end(), w.o_norm.data());
    const auto db = hymix::test::uniform(static_cast<std::size_t>(c.n_heads), -1.5f, 1.f, seed + 2);
    std::copy(db.begin(), db.end(), w.dt_bias.data());
    if (!c.is_gdn()) {
        const auto dd = hymix::test::uniform(static_cast<std::size_t>(c.n_heads), 0.5f, 1.5f, seed + 3);
        std::copy(dd.begin(), dd.end(), w.D.data());
    }
    return w;
}

/// A packed batch with `padding` rows after the sequences.
seq_batch packed(const std::vector<std::int64_t>& lengths, std::int64_t padding) {
    std::vector<std::int64_t> cu{0};
    for (auto l : lengths) cu.push_back(cu.back() + l);
    seq_batch b = seq_batch::packed(cu);
    b.n_rows += padding;
    return b;
}

struct layer_grads {
    std::vector<float> y, dx;
    oryx_weights g;
};

template <class B>
layer_grads run_train(const oryx& m, const seq_batch& b, const std::vector<float>& x, const std::vector<float>& dy,
                      const std::vector<unsigned char>& modes, int threads = 2) {
    B be(threads);
    const std::int64_t n = b.n_rows, d = m.config().d_model;
    layer_grads r{std::vector<float>(x.size(), 7.f), std::vector<float>(x.size(), 7.f), m.weights().zeros_like()};
    oryx::train_cache tc;
    m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(r.y.data(), {n, d}), tc,
                    std::span<const unsigned char>(modes));
    m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<const float, 2>(dy.data(), {n, d}),
               tensor_view<float, 2>(r.dx.data(), {n, d}), r.g);
    return r;
}

/// Σ dy · y of the fp64 layer reference from empty states, every sequence in its own slot, weights of type W.
template <class W>
double ref_loss(const oryx_config& c, const basic_oryx_weights<W>& w, const seq_batch& b, const std::vector<double>& x,
                const std::vector<double>& dy, const std::vector<unsigned char>& modes) {
    seq_batch sb = b;
    for (std::size_t i = 0; i < sb.slots.size(); ++i) sb.slots[i] = static_cast<std::int64_t>(i);
    oryx_ref_slots st(c, std::max<std::int64_t>(sb.n_seq(), 1));
    std::vector<double> y(x.size());
    oryx_layer_ref(c, w, sb, tensor_view<const double, 2>(x.data(), {b.n_rows, c.d_model}), st, tensor_view<double, 2>(y.data(), {b.n_rows, c.d_model}),
                   std::span<const unsigned char>(modes));
    return test::dot(dy, y);
}

std::vector<std::vector<float>> grads_of(const oryx_weights& g, std::vector<std::string>* names = nullptr) {
    std::vector<std::vector<float>> out;
    g.for_each([&](std::string_view name, const tensor<float>& t) {
        out.emplace_back(t.span().begin(), t.span().end());
        if (names) names->emplace_back(name);
    });
    return out;
}

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (const float e : v) m = std::max(m, static_cast<double>(std::abs(e)));
    return m;
}

const std::vector<oryx_linear_kind> kinds{oryx_linear_kind::gdn, oryx_linear_kind::mamba2};

}  // namespace

TEST_CASE("oryx forward_train equals forward on fresh states for mixed per-token modes (packed, padding rows zero)") {
    for (const auto kind : kinds) {
        CAPTURE(kind == oryx_linear_kind::gdn);
        const auto c = config(kind, 20, 3, 8, 4, 8);
        const oryx m(c, test_weights(c, 11));
        const auto b = packed({13, 1, 21}, 2);
        const std::int64_t n = b.n_rows, d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, 12);
        const auto modes = modes_for(block_random{4, 0.4, 5}, b, call_phase::prefill);
        for (const auto& md : {modes, std::vector<unsigned char>(), std::vector<unsigned char>(static_cast<std::size_t>(n), 0)}) {
            cpu_backend be(2);
            std::vector<float> y1(x.size(), 3.f), y2(x.size(), 3.f);
            oryx::train_cache tc;
            m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(y1.data(), {n, d}), tc,
                            std::span<const unsigned char>(md));
            auto st = m.make_state(b.n_seq());
            m.forward(be, st, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(y2.data(), {n, d}),
                      std::span<const unsigned char>(md));
            CHECK(rel_error(y1, y2) < 1e-6);
            for (std::int64_t i = (n - 2) * d; i < n * d; ++i) CHECK(y1[static_cast<std::size_t>(i)] == 0.f);
        }
    }
}

TEST_CASE("oryx backward equals central finite differences of the fp64 layer reference (both instances, mixed modes)") {
    // Odd sizes: d 7, H 2, d_h 4, K 3, chunk 4 (T not a multiple); sequences of 7 and 5 tokens plus a padding row; modes
    // with runs of attention rows starting at the first token, inside and at the end of a sequence. The reference
    // reads fp64 weights, so every weight is perturbed in fp64. Tolerances as the other layers' checks: 1e-6 on the
    // reference backend (fp32 activations between fp64 ops), 5e-6 on the CPU.
    const std::vector<unsigned char> modes{0, 1, 1, 0, 1, 0, 0, /**/ 1, 1, 0, 1, 0, /**/ 1};
    for (const auto kind : kinds) {
        CAPTURE(kind == oryx_linear_kind::gdn);
      for (const bool own_init : {false, true}) {
        CAPTURE(own_init);
        const auto c = config(kind, 7, 2, 4, 3, 4);
        // Scaled test weights, and the instance's own initialisation doubled (strong decays: A up to −256).
        oryx_weights w = test_weights(c, 21);
        if (own_init) {
            w = oryx_weights::random(c, 24);
            w.for_each([](std::string_view, tensor<float>& t) {
                for (auto& e : t.span()) e *= 2.f;
            });
        }
        auto wd = w.cast<double>();
        const auto b = packed({7, 5}, 1);
        const std::int64_t n = b.n_rows;
        const auto xf = test::uniform(static_cast<std::size_t>(n * c.d_model), -1.f, 1.f, 22);
        auto dyd = test::cotangent(xf.size(), 23);
        for (std::int64_t i = 0; i < c.d_model; ++i) dyd[static_cast<std::size_t>((n - 1) * c.d_model + i)] = 5.0;  // ignored
        const std::vector<float> dyf(dyd.begin(), dyd.end());
        for (auto& e : dyd) e = static_cast<double>(static_cast<float>(e));
        std::vector<double> xd(xf.begin(), xf.end());
        for (const bool cpu : {false, true}) {
            CAPTURE(cpu);
            const oryx m(c, w);
            const auto an = cpu ? run_train<cpu_backend>(m, b, xf, dyf, modes) : run_train<reference_backend>(m, b, xf, dyf, modes);
            const auto loss = [&] { return ref_loss(c, wd, b, xd, dyd, modes); };
            const double tol = cpu ? 5e-6 : 1e-6;
            test::check_gradient("dx", xd, std::vector<double>(an.dx.begin(), an.dx.end()), loss, tol);
            for (std::int64_t i = 0; i < c.d_model; ++i) CHECK(an.dx[static_cast<std::size_t>((n - 1) * c.d_model + i)] == 0.f);
            std::vector<std::string> names;
            const auto ga = grads_of(an.g, &names);
            std::size_t ti = 0;
            wd.for_each([&](std::string_view, tensor<double>& t) {
                std::vector<double> theta(t.span().begin(), t.span().end());
                const auto& gt = ga[ti];
                const auto wl = [&] {
                    std::copy(theta.begin(), theta.end(), t.data());
                    return loss();
                };
                test::check_gradient(names[ti], theta, std::vector<double>(gt.begin(), gt.end()), wl, tol, 1e-6, 64);
                std::copy(theta.begin(), theta.end(), t.data());
                ++ti;
            });
        }
      }
    }
}

TEST_CASE("oryx backward: CPU equals the reference backend; deterministic for a thread count; gradients accumulate") {
    for (const auto kind : kinds) {
        CAPTURE(kind == oryx_linear_kind::gdn);
        const auto c = config(kind, 40, 4, 8, 4, 16);
        const oryx m(c, test_weights(c, 31));
        const auto b = packed({20, 33, 1, 7}, 3);
        const std::int64_t n = b.n_rows, d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, 32);
        const auto dyd = test::cotangent(x.size(), 33);
        const std::vector<float> dy(dyd.begin(), dyd.end());
        const auto modes = modes_for(block_random{5, 0.5, 9}, b, call_phase::prefill);
        const auto ref = run_train<reference_backend>(m, b, x, dy, modes);
        std::vector<std::string> names;
        const auto gref = grads_of(ref.g, &names);
        for (const int threads : {1, 2}) {
            CAPTURE(threads);
            const auto cpu = run_train<cpu_backend>(m, b, x, dy, modes, threads);
            CHECK(rel_error(cpu.y, ref.y) < 1e-5);
            CHECK(rel_error(cpu.dx, ref.dx) < 1e-4);
            const auto gc = grads_of(cpu.g);
            for (std::size_t i = 0; i < gc.size(); ++i) {
                CAPTURE(names[i]);
                CHECK(rel_error(gc[i], gref[i]) < 1e-4);
            }
            const auto again = run_train<cpu_backend>(m, b, x, dy, modes, threads);
            CHECK(again.dx == cpu.dx);
            CHECK(grads_of(again.g) == gc);
        }
        // Two backwards into one gradient: twice the single one; dx is overwritten.
        cpu_backend be(2);
        oryx::train_cache tc;
        std::vector<float> y(x.size()), dx(x.size());
        auto g = m.weights().zeros_like();
        const tensor_view<const float, 2> xv(x.data(), {n, d}), dyv(dy.data(), {n, d});
        m.forward_train(be, b, xv, tensor_view<float, 2>(y.data(), {n, d}), tc, std::span<const unsigned char>(modes));
        for (int rep = 0; rep < 2; ++rep) m.backward(be, b, tc, xv, dyv, tensor_view<float, 2>(dx.data(), {n, d}), g);
        const auto once = run_train<cpu_backend>(m, b, x, dy, modes, 2);
        CHECK(dx == once.dx);
        const auto g2 = grads_of(g), g1 = grads_of(once.g);
        for (std::size_t i = 0; i < g1.size(); ++i) {
            std::vector<float> twice(g1[i]);
            for (auto& e : twice) e *= 2.f;
            CHECK(rel_error(g2[i], twice) < 1e-6);
        }
    }
}

TEST_CASE("oryx backward: packed varlen gradients equal the solo runs; padding rows and their dy are ignored") {
    for (const auto kind : kinds) {
        CAPTURE(kind == oryx_linear_kind::gdn);
        const auto c = config(kind, 24, 3, 8, 4, 8);
        const oryx m(c, test_weights(c, 41));
        const std::vector<std::int64_t> lengths{5, 3, 19};
        const auto b = packed(lengths, 2);
        const std::int64_t n = b.n_rows, d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, 42);
        auto dy = test::uniform(x.size(), -1.f, 1.f, 43);
        for (std::int64_t i = (n - 2) * d; i < n * d; ++i) dy[static_cast<std::size_t>(i)] = 1e3f;
        const auto modes = modes_for(block_random{3, 0.5, 4}, b, call_phase::prefill);
        const auto all = run_train<cpu_backend>(m, b, x, dy, modes);
        auto sum = grads_of(m.weights().zeros_like());
        std::int64_t r0 = 0;
        for (const auto len : lengths) {
            CAPTURE(len);
            const std::vector<float> xs(x.begin() + r0 * d, x.begin() + (r0 + len) * d), dys(dy.begin() + r0 * d, dy.begin() + (r0 + len) * d);
            const std::vector<unsigned char> ms(modes.begin() + r0, modes.begin() + r0 + len);
            const auto solo = run_train<cpu_backend>(m, packed({len}, 0), xs, dys, ms);
            const std::vector<float> got(all.dx.begin() + r0 * d, all.dx.begin() + (r0 + len) * d);
            CHECK(rel_error(got, solo.dx) < 1e-6);
            const auto gs = grads_of(solo.g);
            for (std::size_t i = 0; i < gs.size(); ++i)
                for (std::size_t e = 0; e < gs[i].size(); ++e) sum[i][e] += gs[i][e];
            r0 += len;
        }
        const auto ga = grads_of(all.g);
        for (std::size_t i = 0; i < ga.size(); ++i) CHECK(rel_error(ga[i], sum[i]) < 1e-5);
        for (std::int64_t i = (n - 2) * d; i < n * d; ++i) CHECK(all.dx[static_cast<std::size_t>(i)] == 0.f);
    }
}

TEST_CASE("oryx backward: each W_Q learns only from its own mode's rows (spec.md §6.5)") {
    for (const auto kind : kinds) {
        CAPTURE(kind == oryx_linear_kind::gdn);
        const auto c = config(kind, 16, 2, 8, 4, 8);
        const oryx m(c, test_weights(c, 51));
        const auto b = packed({17, 9}, 0);
        const std::int64_t n = b.n_rows;
        const auto x = test::uniform(static_cast<std::size_t>(n * c.d_model), -1.f, 1.f, 52);
        const auto dy = test::uniform(x.size(), -1.f, 1.f, 53);
        const auto lin = run_train<cpu_backend>(m, b, x, dy, std::vector<unsigned char>(static_cast<std::size_t>(n), 0));
        const auto att = run_train<cpu_backend>(m, b, x, dy, std::vector<unsigned char>(static_cast<std::size_t>(n), 1));
        const auto mix = run_train<cpu_backend>(m, b, x, dy, modes_for(block_random{4, 0.5, 1}, b, call_phase::prefill));
        const auto v = [](const auto& t) { return std::vector<float>(t.span().begin(), t.span().end()); };
        CHECK(max_abs(v(lin.g.q_attn_proj)) == 0.0);   // no attention row: W_Q^attn untouched
        CHECK(max_abs(v(lin.g.q_lin_proj)) > 0.0);
        CHECK(max_abs(v(att.g.q_lin_proj)) == 0.0);    // no linear read-out: W_Q^lin (and its conv) untouched
        CHECK(max_abs(v(att.g.conv_q)) == 0.0);
        CHECK(max_abs(v(att.g.q_attn_proj)) > 0.0);
        CHECK(max_abs(v(mix.g.q_attn_proj)) > 0.0);
        CHECK(max_abs(v(mix.g.q_lin_proj)) > 0.0);
        for (const auto* r : {&lin, &att, &mix}) CHECK(max_abs(v(r->g.k_proj)) > 0.0);  // tied: both modes
    }
}

TEST_CASE("oryx backward: argument errors") {
    const auto c = config(oryx_linear_kind::gdn, 16, 2, 8, 4, 8);
    const oryx m(c, test_weights(c, 61));
    cpu_backend be(1);
    const auto b = packed({5, 4}, 0);
    const std::int64_t n = b.n_rows, d = c.d_model;
    std::vector<float> x(static_cast<std::size_t>(n * d), 0.1f), y(x.size()), dx(x.size());
    oryx::train_cache tc;
    const std::vector<unsigned char> short_modes(3, 1);
    CHECK_THROWS_AS(m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(y.data(), {n, d}), tc,
                                    std::span<const unsigned char>(short_modes)),
                    shape_error);
    auto g = m.weights().zeros_like();
    // backward before forward_train on this batch
    CHECK_THROWS_AS(m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<const float, 2>(y.data(), {n, d}),
                               tensor_view<float, 2>(dx.data(), {n, d}), g),
                    shape_error);
    m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(y.data(), {n, d}), tc);
    CHECK_THROWS_AS(m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {n, d - 1}), tensor_view<const float, 2>(y.data(), {n, d}),
                               tensor_view<float, 2>(dx.data(), {n, d}), g),
                    shape_error);
    auto wrong = oryx_weights::random(config(oryx_linear_kind::mamba2, 16, 2, 8, 4, 8), 1).zeros_like();
    CHECK_THROWS_AS(m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<const float, 2>(y.data(), {n, d}),
                               tensor_view<float, 2>(dx.data(), {n, d}), wrong),
                    shape_error);
}
