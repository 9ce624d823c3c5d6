// Whole-stack gradients (train/model_grad.hpp) on a small stack of toy mixers: the block and stack backward
// (pre-norms, SwiGLU MLPs, residuals, final norm, fused head + cross-entropy, embedding) against central finite
// differences, CPU against the fp64 reference backend, packed batches against solo runs, and frozen layers.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/stack/model.hpp"
#include "hymix/train/model_grad.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"
#include "support/toy_mixer.hpp"

using namespace hymix;

namespace {
constexpr layer_kind toy_kind('T', "toy");
template <class Norm, class Mlp>
using toy_stack = model<every_layer<toy_kind>, Norm, Mlp, bind<toy_kind, test::toy_mixer>>;

template <class Norm, class Mlp>
toy_stack<Norm, Mlp> make_toy(std::int64_t d, std::int64_t V, std::int64_t L, std::int64_t F, bool tied, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.f, 0.5f);
    auto rnd = [&](std::vector<std::int64_t> shape, float scale = 1.0f) {
        tensor<float> t(std::move(shape));
        for (auto& v : t.span()) v = scale * nd(g);
        return t;
    };
    stack_config c{d, V, 1e-5f, tied};
    stack_weights w;
    w.embedding = rnd({V, d});
    w.final_norm = rnd({d}, 0.3f);
    for (auto& v : w.final_norm.span()) v += Norm::flavor == kernels::rms_flavor::plain ? 1.0f : 0.0f;
    if (!tied) w.lm_head = rnd({V, d});
    std::vector<typename toy_stack<Norm, Mlp>::layer> layers;
    for (std::int64_t l = 0; l < L; ++l) {
        auto n1 = rnd({d}, 0.3f), n2 = rnd({d}, 0.3f);
        if (Norm::flavor == kernels::rms_flavor::plain)
            for (auto* t : {&n1, &n2})
                for (auto& v : t->span()) v += 1.0f;
        typename Mlp::weights_type mlp;
        if constexpr (Mlp::present) {
            mlp.gate_proj = rnd({F, d}, 0.4f);
            mlp.up_proj = rnd({F, d}, 0.4f);
            mlp.down_proj = rnd({d, F}, 0.4f);
        }
        layers.emplace_back(std::move(n1), test::toy_mixer(test::toy_config{d}, test::toy_weights::random(test::toy_config{d}, seed + 7 + l)),
                            Mlp::present ? std::move(n2) : tensor<float>{}, std::move(mlp));
    }
    return toy_stack<Norm, Mlp>(c, std::move(w), std::move(layers));
}

/// All parameters of a model as one flat vector (visiting order) and back.
template <class M>
std::vector<double> flat(M& m) {
    std::vector<double> v;
    m.for_each_param([&](const std::string&, tensor<float>& t) {
        for (float x : t.span()) v.push_back(x);
    });
    return v;
}
template <class M>
void unflat(M& m, const std::vector<double>& v) {
    std::size_t i = 0;
    m.for_each_param([&](const std::string&, tensor<float>& t) {
        for (auto& x : t.span()) x = static_cast<float>(v[i++]);
    });
    m.weights_changed();
}
}  // namespace

TEST_CASE_TEMPLATE("stack gradients match finite differences (reference backend) and the CPU backend", Cfg,
                   toy_stack<plain_rms_norm, swiglu_mlp>, toy_stack<zero_centered_rms_norm, swiglu_mlp>,
                   toy_stack<plain_rms_norm, no_mlp>) {
    using Norm = typename Cfg::norm_type;
    using Mlp = typename Cfg::mlp_type;
    const std::int64_t d = 6, V = 11, L = 2, F = 5;
    for (bool tied : {false, true}) {
        CAPTURE(tied);
        auto m = make_toy<Norm, Mlp>(d, V, L, F, tied, 3);
        // Packed varlen: lengths 4 and 3 plus a padding row.
        seq_batch b;
        b.add(0, 4, 0);
        b.add(4, 3, 1);
        b.n_rows = 8;
        const std::vector<std::int32_t> tok{1, 5, 2, 9, 3, 3, 10, 0}, tgt{5, 2, 9, -1, 3, 10, 4, 7};
        reference_backend ref;
        auto g = train::zeros_like(m);
        train::activations<Cfg> acts;
        const auto loss = train::loss_and_grad(ref, m, g, acts, b, tok, tgt, 1.0f);
        CHECK(loss.n_targets == 6);
        auto theta = flat(m);
        const auto analytic = flat(g);
        auto probe = [&]() {
            auto mm = m;
            unflat(mm, theta);
            auto gg = train::zeros_like(mm);
            train::activations<Cfg> aa;
            return train::loss_and_grad(ref, mm, gg, aa, b, tok, tgt, 1.0f).sum_nats;
        };
        // fp32 storage between ops limits finite differences to ~1e-3 relative (the ops themselves are checked in
        // double against finite differences in tests/kernels).
        test::check_gradient("stack parameters", theta, analytic, probe, 2e-3, 1e-3, 64);

        cpu_backend be(2);
        auto gc = train::zeros_like(m);
        train::activations<Cfg> ac;
        const auto lc = train::loss_and_grad(be, m, gc, ac, b, tok, tgt, 1.0f);
        CHECK(lc.sum_nats == doctest::Approx(loss.sum_nats).epsilon(1e-5));
        const auto gcpu = flat(gc);
        CHECK(test::rel_error(gcpu, analytic) < 1e-4);

        // Each sequence alone gives its share of the gradient.
        seq_batch b0, b1;
        b0.add(0, 4, 0);
        b0.n_rows = 4;
        b1.add(0, 3, 0);
        b1.n_rows = 3;
        auto g0 = train::zeros_like(m);
        train::activations<Cfg> a0;
        train::loss_and_grad(ref, m, g0, a0, b0, std::span(tok).subspan(0, 4), std::span(tgt).subspan(0, 4), 1.0f);
        train::loss_and_grad(ref, m, g0, a0, b1, std::span(tok).subspan(4, 3), std::span(tgt).subspan(4, 3), 1.0f);
        CHECK(test::rel_error(flat(g0), analytic) < 1e-6);
    }
}

TEST_CASE("a frozen prefix keeps no activations and gets no gradient; the trained layers' gradients are unchanged") {
    using M = toy_stack<plain_rms_norm, swiglu_mlp>;
    auto m = make_toy<plain_rms_norm, swiglu_mlp>(6, 11, 3, 5, false, 5);
    const auto b = seq_batch::dense(2, 5);
    std::vector<std::int32_t> tok(10), tgt(10);
    for (int i = 0; i < 10; ++i) tok[i] = (3 * i) % 11, tgt[i] = (5 * i + 1) % 11;
    reference_backend ref;
    auto gfull = train::zeros_like(m), gfro = train::zeros_like(m);
    train::activations<M> af, ar;
    train::loss_and_grad(ref, m, gfull, af, b, tok, tgt, 0.1f);
    ar.frozen_prefix = 2;
    train::loss_and_grad(ref, m, gfro, ar, b, tok, tgt, 0.1f);
    CHECK(ar.layers.size() == 1);
    std::vector<std::string> names;
    std::vector<double> full, fro;
    gfull.for_each_param([&](const std::string& n, tensor<float>& t) {
        names.push_back(n);
        full.push_back(std::sqrt(std::inner_product(t.span().begin(), t.span().end(), t.span().begin(), 0.0)));
    });
    gfro.for_each_param([&](const std::string&, tensor<float>& t) {
        fro.push_back(std::sqrt(std::inner_product(t.span().begin(), t.span().end(), t.span().begin(), 0.0)));
    });
    for (std::size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        const bool trained = names[i].rfind("layers.2.", 0) == 0 || names[i] == "final_norm" || names[i] == "lm_head";
        if (trained) CHECK(fro[i] == doctest::Approx(full[i]).epsilon(1e-6));
        else CHECK(fro[i] == 0.0);
    }
}

TEST_CASE("gradient_model: the frozen prefix gets no gradient tensors, the rest equals zeros_like's, the model is unchanged") {
    using M = toy_stack<plain_rms_norm, swiglu_mlp>;
    auto m = make_toy<plain_rms_norm, swiglu_mlp>(6, 11, 3, 5, false, 9);
    const auto before = flat(m);
    const auto b = seq_batch::dense(2, 5);
    std::vector<std::int32_t> tok(10), tgt(10);
    for (int i = 0; i < 10; ++i) tok[i] = (7 * i + 2) % 11, tgt[i] = (3 * i + 1) % 11;
    cpu_backend be(2);
    double loss_before = 0;
    {
        auto gz = train::zeros_like(m);
        train::activations<M> a;
        loss_before = train::loss_and_grad(be, m, gz, a, b, tok, tgt, 0.5f).sum_nats;
    }
    auto g = train::gradient_model(m, 2);
    CHECK(flat(m) == before);  // the frozen layers' weights were set aside and put back
    for (std::int64_t l = 0; l < 3; ++l) {
        CAPTURE(l);
        CHECK(std::get<0>(m.layer_at(l)).mlp_mut().gate_up.rank() == 2);  // the model keeps its fused copy
        CHECK(std::get<0>(g.layer_at(l)).mlp_mut().gate_up.rank() == 0);  // the gradient model has none
    }
    std::vector<std::string> names;
    std::vector<std::int64_t> msize, gsize;
    m.for_each_param([&](const std::string& n, tensor<float>& t) {
        names.push_back(n);
        msize.push_back(t.numel());
    });
    double gsum = 0;
    g.for_each_param([&](const std::string&, tensor<float>& t) {
        gsize.push_back(t.numel());
        for (float v : t.span()) gsum += std::abs(v);
    });
    REQUIRE(gsize.size() == names.size());
    std::int64_t mtotal = 0, gtotal = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        // The prefix's layers, and the (untied) embedding, which no gradient reaches above a frozen prefix.
        const bool prefix = names[i].rfind("layers.0.", 0) == 0 || names[i].rfind("layers.1.", 0) == 0 || names[i] == "embedding";
        CHECK(gsize[i] == (prefix ? 0 : msize[i]));
        mtotal += msize[i];
        gtotal += gsize[i];
    }
    CHECK(gsum == 0.0);
    CHECK(gtotal < mtotal);

    // The same loss as before, and the same gradients as a full zeros_like model, bit for bit, above the prefix.
    auto gz = train::zeros_like(m);
    train::activations<M> a1, a2;
    a1.frozen_prefix = a2.frozen_prefix = 2;
    const auto l1 = train::loss_and_grad(be, m, gz, a1, b, tok, tgt, 0.5f);
    const auto l2 = train::loss_and_grad(be, m, g, a2, b, tok, tgt, 0.5f);
    CHECK(l1.sum_nats == l2.sum_nats);
    CHECK(l1.sum_nats == loss_before);
    std::vector<std::vector<float>> vz, vg;
    gz.for_each_param([&](const std::string&, tensor<float>& t) { vz.emplace_back(t.span().begin(), t.span().end()); });
    g.for_each_param([&](const std::string&, tensor<float>& t) { vg.emplace_back(t.span().begin(), t.span().end()); });
    for (std::size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        if (gsize[i] == 0) continue;
        CHECK(vz[i] == vg[i]);
    }

    // parameters(): the prefix's tensors get no gradient and must be frozen.
    auto in_prefix = [](const std::string& n) {
        return n.rfind("layers.0.", 0) == 0 || n.rfind("layers.1.", 0) == 0 || n == "embedding";
    };
    const auto ps = train::parameters(m, g, in_prefix);
    for (const auto& p : ps) {
        CAPTURE(p.name);
        CHECK((p.grad == nullptr) == in_prefix(p.name));
    }
    CHECK_THROWS_AS(train::parameters(m, g), config_error);
    CHECK_THROWS_AS(train::parameters(m, g, [](const std::string& n) { return n.rfind("layers.", 0) == 0 && n[7] < '2'; }),
                    config_error);  // the embedding, left without a gradient, is not frozen

    // Tied embeddings: the LM head's gradient is the embedding's, so it keeps its tensor.
    {
        auto mt = make_toy<plain_rms_norm, swiglu_mlp>(6, 11, 3, 5, true, 9);
        auto gt = train::gradient_model(mt, 2);
        std::int64_t emb = -1;
        gt.for_each_param([&](const std::string& n, tensor<float>& t) {
            if (n == "embedding") emb = t.numel();
        });
        CHECK(emb == 11 * 6);
        train::activations<M> at;
        at.frozen_prefix = 2;
        CHECK_NOTHROW(train::loss_and_grad(be, mt, gt, at, b, tok, tgt, 0.5f));
    }

    // Activations with a smaller frozen prefix would write gradients the model does not hold.
    train::activations<M> a0;
    a0.frozen_prefix = 1;
    CHECK_THROWS_AS(train::loss_and_grad(be, m, g, a0, b, tok, tgt, 0.5f), config_error);
    CHECK_THROWS_AS(train::gradient_model(m, 4), value_error);
    CHECK_THROWS_AS(train::gradient_model(m, -1), value_error);
    auto g0 = train::gradient_model(m, 0);
    std::int64_t g0total = 0;
    g0.for_each_param([&](const std::string&, tensor<float>& t) { g0total += t.numel(); });
    CHECK(g0total == mtotal);
    CHECK(flat(m) == before);
}

TEST_CASE("loss_and_grad rejects bad tokens, targets and sizes") {
    using M = toy_stack<plain_rms_norm, no_mlp>;
    auto m = make_toy<plain_rms_norm, no_mlp>(4, 5, 1, 3, false, 1);
    auto g = train::zeros_like(m);
    train::activations<M> a;
    cpu_backend be(1);
    const auto b = seq_batch::dense(1, 3);
    std::vector<std::int32_t> ok{0, 1, 2}, bad{0, 5, 2}, badt{0, 1, -2};
    CHECK_THROWS_AS(train::loss_and_grad(be, m, g, a, b, bad, ok, 1.0f), value_error);
    CHECK_THROWS_AS(train::loss_and_grad(be, m, g, a, b, ok, badt, 1.0f), value_error);
    CHECK_THROWS_AS(train::loss_and_grad(be, m, g, a, b, std::span(ok).subspan(0, 2), ok, 1.0f), shape_error);
}
