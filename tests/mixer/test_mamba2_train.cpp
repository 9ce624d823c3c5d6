// Mamba-2 layer training (mixer/mamba2.hpp: forward_train, backward, weights_mut, for_each, zeros_like): the training
// forward equals forward() from zero states; every weight and input gradient against central finite differences of
// the fp64 layer reference (mamba2_layer_ref); CPU against the reference backend; packed varlen batches (each
// sequence's contribution equals its solo run); accumulation and argument checks (issue 8, spec.md §3.2, §8.17).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

/// Two small layers with odd sizes: (a) G = 1, chunk 4, conv bias, per-head D; (b) G = 3, chunk 3, K = 3,
/// projection biases, per-channel D, a finite Δ clamp that some tokens hit.
mamba2_config layer_config(bool b) {
    mamba2_config c;
    if (!b) {
        c.d_model = 12;
        c.n_heads = 3;
        c.head_dim = 4;
        c.d_state = 5;
        c.n_groups = 1;
        c.d_conv = 4;
        c.chunk_size = 4;
    } else {
        c.d_model = 10;
        c.n_heads = 3;
        c.head_dim = 4;
        c.d_state = 3;
        c.n_groups = 3;
        c.d_conv = 3;
        c.chunk_size = 3;
        c.proj_bias = true;
        c.D_has_hdim = true;
        c.dt_limit = {0.45f, 1.0f};  // with layer_weights' dt_bias: head 0 always at lo, heads 1 and 2 partly at hi
    }
    return c;
}

/// The state-spaces initialisation with every vector parameter moved off its default (D = 1, norm weight 1, zero
/// biases), so that each gradient is exercised; with a Δ clamp, dt_bias puts Δ around the clamp's range.
mamba2_weights layer_weights(const mamba2_config& cfg, std::uint64_t seed) {
    auto w = mamba2_weights::random(cfg, seed);
    std::mt19937_64 gen(seed + 1);
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    for (auto* t : {&w.D, &w.norm_weight, &w.in_proj_bias, &w.out_proj_bias, &w.conv1d_bias})
        if (t->data())
            for (auto& v : t->span()) v += u(gen);
    if (cfg.dt_limit.hi < std::numeric_limits<float>::infinity())
        for (std::int64_t h = 0; h < cfg.n_heads; ++h) w.dt_bias[h] = -1.0f + 0.9f * float(h);
    return w;
}

/// Sequences [0, 7) and [8, 13) of 14 rows (rows 7 and 13 belong to none), slots as given (ignored by training).
seq_batch gapped_batch(std::int64_t slot0 = 0, std::int64_t slot1 = 1) {
    seq_batch b;
    b.starts = {0, 8};
    b.lengths = {7, 5};
    b.slots = {slot0, slot1};
    b.n_rows = 14;
    return b;
}

/// The gradients of one backward call.
struct result {
    std::vector<float> y, dx;
    mamba2_weights g;
};

template <class Backend>
result train_step(const Backend& be, const mamba2& m, const seq_batch& b, const std::vector<float>& x, const std::vector<float>& dy) {
    const std::int64_t d = m.config().d_model;
    result r;
    r.y.assign(x.size(), std::numeric_limits<float>::quiet_NaN());
    r.dx.assign(x.size(), std::numeric_limits<float>::quiet_NaN());
    r.g = m.weights().zeros_like();
    mamba2::train_cache tc;
    m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(r.y.data(), {b.n_rows, d}), tc);
    m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<const float, 2>(dy.data(), {b.n_rows, d}),
               tensor_view<float, 2>(r.dx.data(), {b.n_rows, d}), r.g);
    return r;
}

std::vector<float> values(const tensor<float>& t) { return {t.data(), t.data() + t.numel()}; }

/// Every gradient tensor of a and b within rel (relative Frobenius error), by name.
void check_grads_close(const mamba2_weights& a, const mamba2_weights& b, double rel) {
    std::map<std::string, std::vector<float>> bv;
    b.for_each([&](std::string_view name, const tensor<float>& t) { bv[std::string(name)] = values(t); });
    a.for_each([&](std::string_view name, const tensor<float>& t) {
        CAPTURE(name);
        REQUIRE(bv.count(std::string(name)));
        CHECK(rel_error(values(t), bv[std::string(name)]) < rel);
    });
}

/// L = Σ c·y of the fp64 layer reference from zero states over the batch's sequences.
double reference_loss(const mamba2_config& cfg, const mamba2_weights& w, const seq_batch& b, const std::vector<double>& x,
                      const std::vector<double>& c) {
    const std::int64_t d = cfg.d_model;
    mamba2_ref_slots st(cfg, b.n_seq());
    seq_batch bb = b;
    for (std::int64_t i = 0; i < b.n_seq(); ++i) bb.slots[static_cast<std::size_t>(i)] = i;
    std::vector<double> y(x.size());
    mamba2_layer_ref(cfg, w, bb, tensor_view<const double, 2>(x.data(), {b.n_rows, d}), st, tensor_view<double, 2>(y.data(), {b.n_rows, d}));
    return test::dot(c, y);
}

/// Central differences over an fp32 weight: the step actually taken is float(w + h) − float(w − h) (the weight is
/// stored in fp32, so the nominal 2h is not what the loss sees), which keeps the difference exact to fp64 rounding.
/// Probes at most 24 entries (always the first and the last). Same pass rule as test::check_gradient.
void check_weight_gradient(const std::string& what, tensor<float>& t, const tensor<float>& analytic, const std::function<double()>& loss,
                           double tol) {
    const auto n = static_cast<std::size_t>(t.numel());
    std::vector<std::size_t> idx;
    std::mt19937_64 gen(3);
    std::uniform_int_distribution<std::size_t> u(0, n - 1);
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 24); ++i) idx.push_back(n <= 24 ? i : i == 0 ? 0 : i == 1 ? n - 1 : u(gen));
    double worst = 0;
    for (const std::size_t i : idx) {
        const float w0 = t.data()[i];
        const double h = 1e-4 * std::max(1.0, std::abs(double(w0)));
        const float wp = static_cast<float>(w0 + h), wm = static_cast<float>(w0 - h);
        t.data()[i] = wp;
        const double lp = loss();
        t.data()[i] = wm;
        const double lm = loss();
        t.data()[i] = w0;
        const double fd = (lp - lm) / (double(wp) - double(wm));
        const double an = analytic.data()[i];
        const double err = std::abs(fd - an) / std::max(1.0, std::abs(an));
        worst = std::max(worst, err);
        if (!(err <= tol)) FAIL_CHECK(what << "[" << i << "]: finite difference " << fd << ", analytic " << an << " (error " << err << ")");
    }
    MESSAGE(what << ": worst finite-difference error " << worst << " over " << idx.size() << " entries");
}

}  // namespace

TEST_CASE("mamba2 forward_train equals forward from zero states (dense and gapped batches)") {
    for (bool b : {false, true}) {
        const auto cfg = layer_config(b);
        const mamba2 m(cfg, layer_weights(cfg, 5));
        const cpu_backend be(2);
        for (const auto& batch : {gapped_batch(), seq_batch::dense(2, 7)}) {
            const auto x = uniform(std::size_t(batch.n_rows * cfg.d_model), -1.f, 1.f, 9);
            std::vector<float> y(x.size(), -5.f), yt(x.size(), -5.f);
            auto st = m.make_state(batch.n_seq());
            m.forward(be, st, batch, tensor_view<const float, 2>(x.data(), {batch.n_rows, cfg.d_model}),
                      tensor_view<float, 2>(y.data(), {batch.n_rows, cfg.d_model}));
            mamba2::train_cache tc;
            m.forward_train(be, batch, tensor_view<const float, 2>(x.data(), {batch.n_rows, cfg.d_model}),
                            tensor_view<float, 2>(yt.data(), {batch.n_rows, cfg.d_model}), tc);
            CHECK(yt == y);
        }
    }
}

TEST_CASE("mamba2 backward: every weight and input gradient equals central differences of the fp64 layer reference") {
    // The analytic side runs on the reference backend: each op in fp64, but its outputs are stored in fp32 views
    // between ops (the fp32 activations training uses), which bounds the agreement to about 1e-6 relative; 1e-5 is
    // the tolerance. The finite differences are of mamba2_layer_ref (fp64 throughout, fp32 weights).
    for (bool b : {false, true}) {
        CAPTURE(b);
        const auto cfg = layer_config(b);
        mamba2 m(cfg, layer_weights(cfg, 11));
        const auto batch = gapped_batch();
        const std::int64_t d = cfg.d_model;
        const auto xf = uniform(std::size_t(batch.n_rows * d), -1.f, 1.f, 12);
        const auto dyf = uniform(xf.size(), -1.f, 1.f, 13);
        const auto r = train_step(reference_backend(), m, batch, xf, dyf);
        if (b) {  // the clamp is active on some tokens and not on others: both sides of it are checked
            mamba2::train_cache tc;
            std::vector<float> y(xf.size());
            m.forward_train(reference_backend(), batch, tensor_view<const float, 2>(xf.data(), {batch.n_rows, d}),
                            tensor_view<float, 2>(y.data(), {batch.n_rows, d}), tc);
            const auto clamped = std::count_if(tc.delta.begin(), tc.delta.end(), [&](float v) { return v == cfg.dt_limit.lo || v == cfg.dt_limit.hi; });
            CHECK(clamped > 0);
            CHECK(clamped < std::ssize(tc.delta));
        }
        std::vector<double> x(xf.begin(), xf.end()), c(dyf.begin(), dyf.end());
        auto& w = m.weights_mut();
        const auto loss = [&] { return reference_loss(cfg, w, batch, x, c); };
        std::vector<double> dx(r.dx.begin(), r.dx.end());
        test::check_gradient("x", x, dx, loss, 1e-5);
        std::map<std::string, const tensor<float>*> grads;
        r.g.for_each([&](std::string_view name, const tensor<float>& t) { grads[std::string(name)] = &t; });
        w.for_each([&](std::string_view name, tensor<float>& t) { check_weight_gradient(std::string(name), t, *grads.at(std::string(name)), loss, 1e-5); });
    }
}

TEST_CASE("mamba2 backward: the CPU backend equals the reference backend (1 and 2 threads)") {
    for (bool b : {false, true})
        for (int threads : {1, 2}) {
            CAPTURE(b);
            CAPTURE(threads);
            const auto cfg = layer_config(b);
            const mamba2 m(cfg, layer_weights(cfg, 21));
            const auto batch = gapped_batch(4, -1);
            const auto x = uniform(std::size_t(batch.n_rows * cfg.d_model), -1.f, 1.f, 22);
            const auto dy = uniform(x.size(), -1.f, 1.f, 23);
            const auto cpu = train_step(cpu_backend(threads), m, batch, x, dy);
            const auto ref = train_step(reference_backend(), m, batch, x, dy);
            CHECK(rel_error(cpu.y, ref.y) < 1e-5);
            CHECK(rel_error(cpu.dx, ref.dx) < 1e-4);
            check_grads_close(cpu.g, ref.g, 1e-4);
            for (std::int64_t i = 7 * cfg.d_model; i < 8 * cfg.d_model; ++i) {  // a row outside every sequence
                CHECK(cpu.y[std::size_t(i)] == 0.f);
                CHECK(cpu.dx[std::size_t(i)] == 0.f);
            }
        }
}

TEST_CASE("mamba2 backward: a packed batch's gradients are the sum of its sequences' solo gradients") {
    const auto cfg = layer_config(false);
    const mamba2 m(cfg, layer_weights(cfg, 31));
    const std::int64_t d = cfg.d_model;
    const auto batch = gapped_batch();
    const auto x = uniform(std::size_t(batch.n_rows * d), -1.f, 1.f, 32);
    const auto dy = uniform(x.size(), -1.f, 1.f, 33);
    for (int which : {0, 1}) {
        CAPTURE(which);
        const auto packed = which == 0 ? train_step(cpu_backend(2), m, batch, x, dy) : train_step(reference_backend(), m, batch, x, dy);
        auto sum = m.weights().zeros_like();
        std::vector<tensor<float>*> sum_t;
        sum.for_each([&](std::string_view, tensor<float>& t) { sum_t.push_back(&t); });
        for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
            const std::int64_t r0 = batch.starts[std::size_t(s)], len = batch.lengths[std::size_t(s)];
            const std::vector<float> xs(x.begin() + r0 * d, x.begin() + (r0 + len) * d), dys(dy.begin() + r0 * d, dy.begin() + (r0 + len) * d);
            const auto solo = which == 0 ? train_step(cpu_backend(2), m, seq_batch::dense(1, len), xs, dys)
                                         : train_step(reference_backend(), m, seq_batch::dense(1, len), xs, dys);
            CHECK(rel_error(std::vector<float>(packed.dx.begin() + r0 * d, packed.dx.begin() + (r0 + len) * d), solo.dx) < 1e-6);
            CHECK(rel_error(std::vector<float>(packed.y.begin() + r0 * d, packed.y.begin() + (r0 + len) * d), solo.y) < 1e-6);
            std::size_t k = 0;
            solo.g.for_each([&](std::string_view, const tensor<float>& t) {
                for (std::int64_t i = 0; i < t.numel(); ++i) sum_t[k]->data()[i] += t.data()[i];
                ++k;
            });
        }
        check_grads_close(packed.g, sum, 1e-5);
    }
}

TEST_CASE("mamba2 backward: parameter gradients accumulate; dx is overwritten") {
    const auto cfg = layer_config(true);
    const mamba2 m(cfg, layer_weights(cfg, 41));
    const auto batch = gapped_batch();
    const std::int64_t d = cfg.d_model;
    const auto x = uniform(std::size_t(batch.n_rows * d), -1.f, 1.f, 42);
    const auto dy = uniform(x.size(), -1.f, 1.f, 43);
    const cpu_backend be(2);
    const auto once = train_step(be, m, batch, x, dy);
    auto g = m.weights().zeros_like();
    std::vector<float> y(x.size()), dx(x.size(), std::numeric_limits<float>::quiet_NaN());
    mamba2::train_cache tc;
    for (int rep = 0; rep < 2; ++rep) {
        m.forward_train(be, batch, tensor_view<const float, 2>(x.data(), {batch.n_rows, d}), tensor_view<float, 2>(y.data(), {batch.n_rows, d}), tc);
        m.backward(be, batch, tc, tensor_view<const float, 2>(x.data(), {batch.n_rows, d}), tensor_view<const float, 2>(dy.data(), {batch.n_rows, d}),
                   tensor_view<float, 2>(dx.data(), {batch.n_rows, d}), g);
    }
    CHECK(dx == once.dx);
    auto twice = once.g.zeros_like();
    std::vector<tensor<float>*> tw;
    twice.for_each([&](std::string_view, tensor<float>& t) { tw.push_back(&t); });
    std::size_t k = 0;
    once.g.for_each([&](std::string_view, const tensor<float>& t) {
        for (std::int64_t i = 0; i < t.numel(); ++i) tw[k]->data()[i] = 2 * t.data()[i];
        ++k;
    });
    check_grads_close(g, twice, 1e-6);
}

TEST_CASE("mamba2 weights: for_each visits every present tensor by its HF name; zeros_like; A follows weights_mut") {
    auto cfg = layer_config(false);
    const auto w = layer_weights(cfg, 51);
    std::vector<std::string> names;
    w.for_each([&](std::string_view name, const tensor<float>&) { names.emplace_back(name); });
    CHECK(names == std::vector<std::string>{"in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight",
                                            "out_proj.weight"});
    cfg.proj_bias = true;
    std::vector<std::string> with_bias;
    mamba2_weights::random(cfg, 1).for_each([&](std::string_view name, const tensor<float>&) { with_bias.emplace_back(name); });
    CHECK(with_bias.size() == 10);
    const auto z = w.zeros_like();
    std::size_t n = 0;
    z.for_each([&](std::string_view, const tensor<float>& t) {
        ++n;
        for (float v : t.span()) CHECK(v == 0.f);
    });
    CHECK(n == names.size());
    CHECK(z.in_proj.shape() == w.in_proj.shape());
    CHECK(!z.in_proj_bias.data());

    // A = −exp(A_log) is derived per call: a changed A_log acts at once, as in a freshly built mixer.
    cfg = layer_config(false);
    mamba2 m(cfg, w);
    m.weights_mut().A_log[1] += 0.7f;
    const mamba2 fresh(cfg, m.weights());
    const auto b = seq_batch::dense(1, 9);
    const auto x = uniform(std::size_t(9 * cfg.d_model), -1.f, 1.f, 52);
    std::vector<float> y1(x.size()), y2(x.size());
    const cpu_backend be(1);
    auto s1 = m.make_state(1), s2 = fresh.make_state(1);
    m.forward(be, s1, b, tensor_view<const float, 2>(x.data(), {9, cfg.d_model}), tensor_view<float, 2>(y1.data(), {9, cfg.d_model}));
    fresh.forward(be, s2, b, tensor_view<const float, 2>(x.data(), {9, cfg.d_model}), tensor_view<float, 2>(y2.data(), {9, cfg.d_model}));
    CHECK(y1 == y2);
}

TEST_CASE("mamba2 backward: bad arguments throw shape_error") {
    const auto cfg = layer_config(false);
    const mamba2 m(cfg, layer_weights(cfg, 61));
    const std::int64_t d = cfg.d_model;
    const auto batch = gapped_batch();
    const auto x = uniform(std::size_t(batch.n_rows * d), -1.f, 1.f, 62);
    std::vector<float> y(x.size()), dx(x.size());
    const cpu_backend be(1);
    mamba2::train_cache tc;
    const tensor_view<const float, 2> xv(x.data(), {batch.n_rows, d});
    m.forward_train(be, batch, xv, tensor_view<float, 2>(y.data(), {batch.n_rows, d}), tc);
    auto g = m.weights().zeros_like();
    auto other = batch;
    other.lengths[1] = 4;
    CHECK_THROWS_WITH_AS(m.backward(be, other, tc, xv, xv, tensor_view<float, 2>(dx.data(), {batch.n_rows, d}), g),
                         doctest::Contains("train_cache"), shape_error);
    auto bad = g;
    bad.D = tensor<float>({cfg.n_heads + 1});
    CHECK_THROWS_WITH_AS(m.backward(be, batch, tc, xv, xv, tensor_view<float, 2>(dx.data(), {batch.n_rows, d}), bad), doctest::Contains("D"),
                         shape_error);
    CHECK_THROWS_WITH_AS(m.backward(be, batch, tc, xv, xv, tensor_view<float, 2>(dx.data(), {batch.n_rows, d - 1}), g),
                         doctest::Contains("dx"), shape_error);
    auto overlap = batch;
    overlap.starts[1] = 5;
    CHECK_THROWS_AS(m.forward_train(be, overlap, xv, tensor_view<float, 2>(y.data(), {batch.n_rows, d}), tc), shape_error);
}
