// Training of the Gated DeltaNet layer (issue 8; spec.md §4.2): forward_train equals forward from zero states; the
// whole-layer backward (out_proj → gated norm → gated delta rule → gates → conv + SiLU + L2 → projections) against
// central finite differences of the fp64 layer reference; CPU against the reference backend; packed varlen batches
// (each sequence's gradients are its solo run's); gradient accumulation; the weights' names and zeros_like.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

gated_deltanet_config config(std::int64_t d, std::int64_t Hk, std::int64_t Hv, std::int64_t dk, std::int64_t dv, std::int64_t K,
                             std::int64_t chunk) {
    gated_deltanet_config c;
    c.d_model = d;
    c.n_k_heads = Hk;
    c.n_v_heads = Hv;
    c.d_k = dk;
    c.d_v = dv;
    c.d_conv = K;
    c.chunk_size = chunk;
    return c;
}

/// Random weights scaled so that activations, gates and the norm are O(1); non-trivial dt_bias and norm weight.
gated_deltanet_weights test_weights(const gated_deltanet_config& c, std::uint64_t seed) {
    auto w = gated_deltanet_weights::random(c, seed);
    for (auto* t : {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_a, &w.in_proj_b, &w.out_proj})
        for (auto& x : t->span()) x *= 8.f;
    const auto nb = test::uniform(static_cast<std::size_t>(c.d_v), 0.5f, 1.5f, seed + 1);
    std::copy(nb.begin(), nb.end(), w.norm_weight.data());
    const auto db = test::uniform(static_cast<std::size_t>(c.n_v_heads), -2.f, 2.f, seed + 2);
    std::copy(db.begin(), db.end(), w.dt_bias.data());
    const auto al = test::uniform(static_cast<std::size_t>(c.n_v_heads), -1.f, 1.f, seed + 3);
    std::copy(al.begin(), al.end(), w.A_log.data());
    return w;
}

/// A packed batch with a padding row at the end.
seq_batch packed(const std::vector<std::int64_t>& lengths, std::int64_t padding) {
    std::vector<std::int64_t> cu{0};
    for (auto l : lengths) cu.push_back(cu.back() + l);
    seq_batch b = seq_batch::packed(cu);
    b.n_rows += padding;
    return b;
}

struct layer_grads {
    std::vector<float> y, dx;
    gated_deltanet_weights g;
};

/// forward_train then backward with upstream gradient dy, on backend B (threads for the CPU).
template <class B>
layer_grads run_train(const gated_deltanet& m, const seq_batch& b, const std::vector<float>& x, const std::vector<float>& dy,
                      int threads = 2) {
    B be(threads);
    const std::int64_t n = b.n_rows, d = m.config().d_model;
    layer_grads r{std::vector<float>(x.size(), 7.f), std::vector<float>(x.size(), 7.f), m.weights().zeros_like()};
    gated_deltanet::train_cache tc;
    m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<float, 2>(r.y.data(), {n, d}), tc);
    m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {n, d}), tensor_view<const float, 2>(dy.data(), {n, d}),
               tensor_view<float, 2>(r.dx.data(), {n, d}), r.g);
    return r;
}

/// Σ dy · y of the fp64 layer reference from zero states, every sequence in its own slot.
double ref_loss(const gated_deltanet_config& c, const gated_deltanet_weights& w, const seq_batch& b, const std::vector<double>& x,
                const std::vector<double>& dy) {
    seq_batch sb = b;
    for (std::size_t i = 0; i < sb.slots.size(); ++i) sb.slots[i] = static_cast<std::int64_t>(i);
    gated_deltanet_ref_slots st(c, std::max<std::int64_t>(sb.n_seq(), 1));
    std::vector<double> y(x.size());
    gated_deltanet_layer_ref(c, w, sb, tensor_view<const double, 2>(x.data(), {b.n_rows, c.d_model}), st,
                             tensor_view<double, 2>(y.data(), {b.n_rows, c.d_model}));
    return test::dot(dy, y);
}

/// Every parameter gradient of `a` within rel of `b` (||a − b|| / ||b|| per tensor).
void check_param_grads(const gated_deltanet_weights& a, const gated_deltanet_weights& b, double rel) {
    std::vector<std::vector<float>> ga, gb;
    a.for_each([&](std::string_view, const tensor<float>& t) { ga.emplace_back(t.span().begin(), t.span().end()); });
    std::vector<std::string> names;
    b.for_each([&](std::string_view name, const tensor<float>& t) {
        gb.emplace_back(t.span().begin(), t.span().end());
        names.emplace_back(name);
    });
    REQUIRE(ga.size() == gb.size());
    for (std::size_t i = 0; i < ga.size(); ++i) {
        CAPTURE(names[i]);
        CHECK(rel_error(ga[i], gb[i]) < rel);
    }
}

/// Every parameter gradient of `a` equal to `b`, bit for bit.
void check_same_param_grads(const gated_deltanet_weights& a, const gated_deltanet_weights& b) {
    std::vector<std::vector<float>> ga, gb;
    a.for_each([&](std::string_view, const tensor<float>& t) { ga.emplace_back(t.span().begin(), t.span().end()); });
    b.for_each([&](std::string_view, const tensor<float>& t) { gb.emplace_back(t.span().begin(), t.span().end()); });
    CHECK(ga == gb);
}

}  // namespace

TEST_CASE("gated deltanet weights: for_each names every tensor in order; zeros_like has the shapes and zeros") {
    const auto c = config(16, 2, 4, 8, 6, 4, 16);
    auto w = test_weights(c, 3);
    std::vector<std::string> names;
    w.for_each([&](std::string_view name, tensor<float>& t) {
        names.emplace_back(name);
        CHECK(t.numel() > 0);
    });
    CHECK(names == std::vector<std::string>{"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                                            "conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"});
    const auto z = w.zeros_like();
    z.validate(c);
    z.for_each([&](std::string_view, const tensor<float>& t) {
        CHECK(std::all_of(t.span().begin(), t.span().end(), [](float x) { return x == 0.f; }));
    });
    // weights_mut reaches the layer's own weights.
    gated_deltanet m(c, w);
    m.weights_mut().A_log[0] = 0.25f;
    CHECK(m.weights().A_log[0] == 0.25f);
}

TEST_CASE("gated deltanet forward_train equals forward from zero states (packed, padding rows zero)") {
    const auto c = config(40, 2, 4, 12, 10, 4, 16);
    const gated_deltanet m(c, test_weights(c, 11));
    const auto b = packed({20, 1, 33, 7}, 2);
    const std::int64_t n = b.n_rows;
    auto x = test::uniform(static_cast<std::size_t>(n * c.d_model), -1.f, 1.f, 12);
    for (std::int64_t i = 0; i < c.d_model; ++i) x[static_cast<std::size_t>((n - 1) * c.d_model + i)] = std::nanf("");  // padding
    for (const bool cpu : {true, false}) {
        CAPTURE(cpu);
        std::vector<float> y(x.size(), 7.f), y_ref(x.size(), 7.f);
        gated_deltanet::train_cache tc;
        auto st = m.make_state(b.n_seq());
        const tensor_view<const float, 2> xv(x.data(), {n, c.d_model});
        if (cpu) {
            cpu_backend be(2);
            m.forward_train(be, b, xv, tensor_view<float, 2>(y.data(), {n, c.d_model}), tc);
            m.forward(be, st, b, xv, tensor_view<float, 2>(y_ref.data(), {n, c.d_model}));
        } else {
            reference_backend be;
            m.forward_train(be, b, xv, tensor_view<float, 2>(y.data(), {n, c.d_model}), tc);
            m.forward(be, st, b, xv, tensor_view<float, 2>(y_ref.data(), {n, c.d_model}));
        }
        for (std::int64_t r = (n - 2) * c.d_model; r < n * c.d_model; ++r) CHECK(y[static_cast<std::size_t>(r)] == 0.f);
        for (std::int64_t r = (n - 2) * c.d_model; r < n * c.d_model; ++r) y_ref[static_cast<std::size_t>(r)] = 0.f;
        CHECK(rel_error(y, y_ref) < 1e-6);
        // The cache is reusable: a smaller batch after a larger one gives its own result.
        const auto b2 = packed({9}, 0);
        std::vector<float> y2(static_cast<std::size_t>(9 * c.d_model)), y2_ref(y2.size());
        auto st2 = m.make_state(1);
        const tensor_view<const float, 2> x2(x.data(), {9, c.d_model});
        cpu_backend be(1);
        m.forward_train(be, b2, x2, tensor_view<float, 2>(y2.data(), {9, c.d_model}), tc);
        m.forward(be, st2, b2, x2, tensor_view<float, 2>(y2_ref.data(), {9, c.d_model}));
        CHECK(rel_error(y2, y2_ref) < 1e-6);
    }
}

TEST_CASE("gated deltanet backward equals central finite differences of the fp64 layer reference") {
    // Odd sizes: d 7, H_k 1, H_v 2 (grouped), d_k 4, d_v 3, K 3, chunk 4; sequences of 7 and 4 tokens and a padding row.
    // The analytic gradients come from fp32 backward ops (fp64 inside on the reference backend, but fp32 activations in
    // the cache and fp32 gradients between ops), so they carry fp32 rounding: tolerance (relative above 1, absolute
    // below) 1e-6 on the reference backend as for the ops, 5e-6 for the CPU's fp32 arithmetic (seen: 6e-8 and 4e-7). x is perturbed in fp64 (eps 1e-6); the weights are fp32 tensors read by the fp64 reference, so
    // they are perturbed by fp32 steps of 2^-16 (times a power of two for |w| > 1, so w ± h is exact) and the difference
    // quotient divides by the step actually taken; the loss is fp64, so the quotient keeps ~1e-10 of rounding.
    const auto c = config(7, 1, 2, 4, 3, 3, 4);
    gated_deltanet_weights w = test_weights(c, 21);
    const auto b = packed({7, 4}, 1);
    const std::int64_t n = b.n_rows;
    const auto xf = test::uniform(static_cast<std::size_t>(n * c.d_model), -1.f, 1.f, 22);
    auto dyd = test::cotangent(xf.size(), 23);
    for (std::int64_t i = 0; i < c.d_model; ++i) dyd[static_cast<std::size_t>((n - 1) * c.d_model + i)] = 5.0;  // ignored
    const std::vector<float> dyf(dyd.begin(), dyd.end());
    for (auto& e : dyd) e = static_cast<double>(static_cast<float>(e));
    std::vector<double> xd(xf.begin(), xf.end());
    for (const bool cpu : {false, true}) {
        CAPTURE(cpu);
        const gated_deltanet m(c, w);
        const auto an = cpu ? run_train<cpu_backend>(m, b, xf, dyf) : run_train<reference_backend>(m, b, xf, dyf);
        const auto loss = [&] { return ref_loss(c, w, b, xd, dyd); };
        const double tol = cpu ? 5e-6 : 1e-6;
        const std::vector<double> dx(an.dx.begin(), an.dx.end());
        test::check_gradient("dx", xd, dx, loss, tol);
        for (std::int64_t i = 0; i < c.d_model; ++i) CHECK(an.dx[static_cast<std::size_t>((n - 1) * c.d_model + i)] == 0.f);
        // Every weight entry.
        std::vector<const tensor<float>*> grads;
        an.g.for_each([&](std::string_view, const tensor<float>& t) { grads.push_back(&t); });
        std::size_t ti = 0;
        w.for_each([&](std::string_view name, tensor<float>& t) {
            const tensor<float>& gt = *grads[ti++];
            double worst = 0;
            for (std::int64_t i = 0; i < t.numel(); ++i) {
                const float w0 = t[i], h = std::ldexp(1.f, -16 + std::max(0, std::ilogb(w0) + 1));
                t[i] = w0 + h;
                const float wp = t[i];
                const double lp = loss();
                t[i] = w0 - h;
                const float wm = t[i];
                const double lm = loss();
                t[i] = w0;
                const double fd = (lp - lm) / (static_cast<double>(wp) - static_cast<double>(wm));
                const double a = gt[i], err = std::abs(fd - a) / std::max(1.0, std::abs(a));
                worst = std::max(worst, err);
                if (!(err <= tol)) FAIL_CHECK(name << "[" << i << "]: finite difference " << fd << ", analytic " << a << " (error " << err << ")");
            }
            MESSAGE(name << ": worst finite-difference error " << worst << " over " << t.numel() << " entries");
        });
    }
}

TEST_CASE("gated deltanet backward: CPU equals the reference backend; deterministic; gradients accumulate") {
    const auto c = config(40, 2, 4, 12, 10, 4, 16);
    const gated_deltanet m(c, test_weights(c, 31));
    const auto b = packed({20, 33, 1, 7}, 3);
    const std::int64_t n = b.n_rows;
    const auto x = test::uniform(static_cast<std::size_t>(n * c.d_model), -1.f, 1.f, 32);
    const auto dyd = test::cotangent(x.size(), 33);
    const std::vector<float> dy(dyd.begin(), dyd.end());
    const auto ref = run_train<reference_backend>(m, b, x, dy);
    for (const int threads : {1, 2}) {
        CAPTURE(threads);
        const auto cpu = run_train<cpu_backend>(m, b, x, dy, threads);
        CHECK(rel_error(cpu.y, ref.y) < 1e-5);
        CHECK(rel_error(cpu.dx, ref.dx) < 1e-4);
        MESSAGE("threads " << threads << ": dx relative error " << rel_error(cpu.dx, ref.dx));
        check_param_grads(cpu.g, ref.g, 1e-4);
        const auto again = run_train<cpu_backend>(m, b, x, dy, threads);
        CHECK(again.dx == cpu.dx);
        check_same_param_grads(again.g, cpu.g);
    }
    // Two backwards into one gradient accumulate: twice the single one; dx is overwritten.
    cpu_backend be(2);
    gated_deltanet::train_cache tc;
    std::vector<float> y(x.size()), dx(x.size());
    auto g = m.weights().zeros_like();
    const tensor_view<const float, 2> xv(x.data(), {n, c.d_model}), dyv(dy.data(), {n, c.d_model});
    m.forward_train(be, b, xv, tensor_view<float, 2>(y.data(), {n, c.d_model}), tc);
    for (int rep = 0; rep < 2; ++rep) m.backward(be, b, tc, xv, dyv, tensor_view<float, 2>(dx.data(), {n, c.d_model}), g);
    const auto once = run_train<cpu_backend>(m, b, x, dy, 2);
    CHECK(dx == once.dx);
    auto twice = once.g.zeros_like();
    std::vector<tensor<float>*> tw;
    twice.for_each([&](std::string_view, tensor<float>& t) { tw.push_back(&t); });
    std::size_t i = 0;
    once.g.for_each([&](std::string_view, const tensor<float>& t) {
        for (std::int64_t e = 0; e < t.numel(); ++e) (*tw[i])[e] = 2.f * t[e];
        ++i;
    });
    check_param_grads(g, twice, 1e-6);
}

TEST_CASE("gated deltanet backward: packed varlen gradients equal the solo runs; padding and dy there are ignored") {
    const auto c = config(24, 1, 3, 8, 6, 4, 8);
    const gated_deltanet m(c, test_weights(c, 41));
    const std::vector<std::int64_t> lengths{5, 3, 9};
    const auto b = packed(lengths, 2);
    const std::int64_t n = b.n_rows, d = c.d_model;
    auto x = test::uniform(static_cast<std::size_t>(n * d), -1.f, 1.f, 42);
    auto dy = test::uniform(x.size(), -1.f, 1.f, 43);
    for (std::int64_t i = (n - 2) * d; i < n * d; ++i) dy[static_cast<std::size_t>(i)] = 1e3f;  // padding: ignored
    const auto all = run_train<cpu_backend>(m, b, x, dy);
    auto sum = m.weights().zeros_like();
    std::vector<tensor<float>*> acc;
    sum.for_each([&](std::string_view, tensor<float>& t) { acc.push_back(&t); });
    std::int64_t r0 = 0;
    for (const auto len : lengths) {
        CAPTURE(len);
        const std::vector<float> xs(x.begin() + r0 * d, x.begin() + (r0 + len) * d), dys(dy.begin() + r0 * d, dy.begin() + (r0 + len) * d);
        const auto solo = run_train<cpu_backend>(m, packed({len}, 0), xs, dys);
        const std::vector<float> got(all.dx.begin() + r0 * d, all.dx.begin() + (r0 + len) * d);
        CHECK(rel_error(got, solo.dx) < 1e-6);
        std::size_t i = 0;
        solo.g.for_each([&](std::string_view, const tensor<float>& t) {
            for (std::int64_t e = 0; e < t.numel(); ++e) (*acc[i])[e] += t[e];
            ++i;
        });
        r0 += len;
    }
    check_param_grads(all.g, sum, 1e-5);
    for (std::int64_t i = (n - 2) * d; i < n * d; ++i) CHECK(all.dx[static_cast<std::size_t>(i)] == 0.f);
}

TEST_CASE("gated deltanet backward: argument errors") {
    const auto c = config(16, 1, 2, 8, 6, 4, 8);
    const gated_deltanet m(c, test_weights(c, 51));
    cpu_backend be(1);
    const auto b = packed({6}, 0);
    std::vector<float> x(6 * 16, 0.1f), y(x.size()), dx(x.size());
    gated_deltanet::train_cache tc;
    const tensor_view<const float, 2> xv(x.data(), {6, 16});
    m.forward_train(be, b, xv, tensor_view<float, 2>(y.data(), {6, 16}), tc);
    auto g = m.weights().zeros_like();
    // A cache from another batch size.
    const auto b5 = packed({5}, 0);
    CHECK_THROWS_AS(m.backward(be, b5, tc, tensor_view<const float, 2>(x.data(), {5, 16}), tensor_view<const float, 2>(y.data(), {5, 16}),
                               tensor_view<float, 2>(dx.data(), {5, 16}), g),
                    shape_error);
    // dx of the wrong width; gradient weights of another shape.
    CHECK_THROWS_AS(m.backward(be, b, tc, xv, tensor_view<const float, 2>(y.data(), {6, 16}), tensor_view<float, 2>(dx.data(), {6, 15}), g),
                    shape_error);
    auto bad = g;
    bad.A_log = tensor<float>({3});
    CHECK_THROWS_AS(m.backward(be, b, tc, xv, tensor_view<const float, 2>(y.data(), {6, 16}), tensor_view<float, 2>(dx.data(), {6, 16}), bad),
                    shape_error);
    // Overlapping sequences.
    seq_batch overlap = packed({6}, 0);
    overlap.add(2, 3, 1);
    CHECK_THROWS_AS(m.forward_train(be, overlap, xv, tensor_view<float, 2>(y.data(), {6, 16}), tc), shape_error);
}
