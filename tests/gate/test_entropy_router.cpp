// AMOR's fitted entropy router (spec.md §5.6): prediction against a double-precision reference on odd sizes and both
// backends, the fit's gradient against central differences, a fit that recovers a router-shaped target, determinism,
// the gate firing on Ĥ > τ with a router set (and recording (ĥ, H) samples without one), and the router file.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/gate/entropy_ema.hpp"
#include "hymix/gate/entropy_router.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/stack/context.hpp"
#include "hymix/train/router_fit.hpp"
#include "gate_fixture.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {
/// A router with random weights of the given sizes (values uniform in ±scale).
entropy_router_weights random_weights(std::int64_t d, std::int64_t hid, std::uint64_t seed, float scale = 0.5f) {
    auto w = train::detail::router_zeros(d, hid);
    std::uint64_t s = seed;
    for (auto* t : {&w.fc1_weight, &w.fc1_bias, &w.fc2_weight, &w.fc2_bias, &w.skip_weight}) {
        const auto v = test::uniform(static_cast<std::size_t>(t->numel()), -scale, scale, s++);
        std::copy(v.begin(), v.end(), t->data());
    }
    return w;
}
/// The router's MSE in double precision on rows x against H.
double mse_reference(const entropy_router& r, const std::vector<float>& x, const std::vector<float>& H) {
    const auto n = static_cast<std::int64_t>(H.size());
    const auto p = r.predict_reference(tensor_view<const float, 2>(x.data(), {n, r.d_model()}));
    double s = 0;
    for (std::size_t i = 0; i < H.size(); ++i) s += (p[i] - H[i]) * (p[i] - H[i]);
    return s / static_cast<double>(n);
}
}  // namespace

TEST_CASE("predict equals the double-precision reference on odd sizes, both backends") {
    for (auto [n, d, hid] : {std::array<std::int64_t, 3>{1, 7, 5}, {13, 37, 29}, {67, 24, 512}}) {
        const entropy_router r(random_weights(d, hid, static_cast<std::uint64_t>(n + d + hid)));
        const auto x = test::uniform(static_cast<std::size_t>(n * d), -2.f, 2.f, 3);
        const tensor_view<const float, 2> xv(x.data(), {n, d});
        const auto ref = r.predict_reference(xv);
        std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
        r.predict(cpu_backend(2), xv, a);
        r.predict(reference_backend{}, xv, b);
        CHECK(test::rel_error(a, ref) < 1e-5);
        CHECK(test::rel_error(b, ref) < 1e-6);
        CHECK(r.macs_per_row() == d * (hid + 1) + hid);
    }
    // A row stride wider than d (a view of a wider buffer) gives the same values; no rows is fine.
    {
        const entropy_router r(random_weights(6, 5, 9));
        const auto wide = test::uniform(4 * 10, -1.f, 1.f, 10);
        std::vector<float> packed(4 * 6);
        for (int i = 0; i < 4; ++i) std::copy_n(wide.begin() + i * 10, 6, packed.begin() + i * 6);
        std::vector<float> a(4), b(4), none;
        r.predict(cpu_backend(1), tensor_view<const float, 2>(wide.data(), {4, 6}, {10, 1}), a);
        r.predict(cpu_backend(1), tensor_view<const float, 2>(packed.data(), {4, 6}), b);
        CHECK(a == b);
        CHECK_NOTHROW(r.predict(cpu_backend(1), tensor_view<const float, 2>(packed.data(), {0, 6}), none));
        CHECK_THROWS_AS(r.predict(cpu_backend(1), tensor_view<const float, 2>(wide.data(), {4, 6}, {1, 4}), a), shape_error);
    }
    const entropy_router r(random_weights(8, 4, 1));
    std::vector<float> x(3 * 9), out(3);
    CHECK_THROWS_AS(r.predict(cpu_backend(1), tensor_view<const float, 2>(x.data(), {3, 9}), out), shape_error);
    CHECK_THROWS_AS(r.predict(cpu_backend(1), tensor_view<const float, 2>(x.data(), {2, 8}), out), shape_error);
}

TEST_CASE("router weights of mismatched shapes or holding NaN are refused, naming the tensor") {
    auto w = random_weights(6, 4, 2);
    w.fc2_weight = tensor<float>({4});
    try {
        entropy_router r(std::move(w));
        FAIL("accepted");
    } catch (const shape_error& e) {
        CHECK(std::string(e.what()).find("fc2.weight") != std::string::npos);
    }
    auto w2 = random_weights(6, 4, 2);
    w2.skip_weight[3] = std::nanf("");
    CHECK_THROWS_AS(entropy_router(std::move(w2)), nonfinite_error);
}

TEST_CASE("the fit's gradient equals central differences of the double-precision loss") {
    const std::int64_t n = 9, d = 5, hid = 7;
    const auto w = random_weights(d, hid, 11);
    const auto x = test::uniform(static_cast<std::size_t>(n * d), -1.5f, 1.5f, 12);
    const auto H = test::uniform(static_cast<std::size_t>(n), 0.f, 1.f, 13);
    for (int be_kind = 0; be_kind < 2; ++be_kind) {
        auto g = train::detail::router_zeros(d, hid);
        const double loss = be_kind == 0 ? train::detail::router_loss_grad(cpu_backend(2), w, tensor_view<const float, 2>(x.data(), {n, d}), H, g)
                                         : train::detail::router_loss_grad(reference_backend{}, w, tensor_view<const float, 2>(x.data(), {n, d}), H, g);
        CHECK(loss == doctest::Approx(mse_reference(entropy_router(w), x, H)).epsilon(1e-5));
        const tensor<float>* ws[] = {&w.fc1_weight, &w.fc1_bias, &w.fc2_weight, &w.fc2_bias, &w.skip_weight};
        const tensor<float>* gs[] = {&g.fc1_weight, &g.fc1_bias, &g.fc2_weight, &g.fc2_bias, &g.skip_weight};
        for (int t = 0; t < 5; ++t) {
            for (std::int64_t i = 0; i < ws[t]->numel(); ++i) {
                const float eps = 1e-2f;
                auto plus = w, minus = w;
                tensor<float>* tp[] = {&plus.fc1_weight, &plus.fc1_bias, &plus.fc2_weight, &plus.fc2_bias, &plus.skip_weight};
                tensor<float>* tm[] = {&minus.fc1_weight, &minus.fc1_bias, &minus.fc2_weight, &minus.fc2_bias, &minus.skip_weight};
                (*tp[t])[i] += eps;
                (*tm[t])[i] -= eps;
                const double dp = mse_reference(entropy_router(std::move(plus)), x, H), dm = mse_reference(entropy_router(std::move(minus)), x, H);
                const double fd = (dp - dm) / (2.0 * eps);
                CHECK((*gs[t])[i] == doctest::Approx(fd).epsilon(2e-3).scale(1e-3));
            }
        }
    }
}

TEST_CASE("fitting recovers a router-shaped target (held-out R² > 0.97) and is deterministic for a seed") {
    const std::int64_t d = 12, N = 3000;
    const entropy_router teacher(random_weights(d, 16, 21, 0.4f));
    router_samples s;
    s.d_model = d;
    s.h = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 22);
    std::vector<float> Ht(static_cast<std::size_t>(N));
    teacher.predict(cpu_backend(1), tensor_view<const float, 2>(s.h.data(), {N, d}), Ht);
    s.H = Ht;
    train::router_fit_options o;
    o.hidden = 32;
    o.epochs = 30;
    o.batch = 64;
    o.lr = 3e-3;
    o.seed = 5;
    std::int64_t epochs_seen = 0;
    o.progress = [&](std::int64_t e, double tr, double ho) {
        CHECK(e == ++epochs_seen);
        CHECK(std::isfinite(tr));
        CHECK(std::isfinite(ho));
    };
    const auto r = train::fit_entropy_router(cpu_backend(2), s, o);
    CHECK(epochs_seen == 30);
    CHECK(r.n_heldout == 300);
    CHECK(r.n_train == 2700);
    REQUIRE(r.heldout_var > 0);
    MESSAGE("held-out R² " << 1 - r.heldout_mse / r.heldout_var);
    CHECK(1 - r.heldout_mse / r.heldout_var > 0.97);
    o.progress = nullptr;
    const auto r2 = train::fit_entropy_router(cpu_backend(2), s, o);
    CHECK(std::equal(r.router.weights().fc1_weight.span().begin(), r.router.weights().fc1_weight.span().end(),
                     r2.router.weights().fc1_weight.span().begin()));
    CHECK(r.heldout_mse == r2.heldout_mse);
    router_samples one;
    one.d_model = d;
    one.h.assign(static_cast<std::size_t>(d), 0.f);
    one.H = {0.5f};
    CHECK_THROWS_AS(train::fit_entropy_router(cpu_backend(1), one, o), value_error);
    // A learning rate that blows the fit up is reported as such, not as non-finite weights.
    auto wild = o;
    wild.lr = 1e36;
    wild.epochs = 2;
    try {
        train::fit_entropy_router(cpu_backend(1), s, wild);
        FAIL("a diverging fit was accepted");
    } catch (const nonfinite_error&) {  // (a value_error too: caught first)
        FAIL("divergence reported as nonfinite_error");
    } catch (const value_error& e) {
        CHECK(std::string(e.what()).find("lower the learning rate") != std::string::npos);
    }
    auto short_h = s;
    short_h.h.resize(short_h.h.size() - 1);
    CHECK_THROWS_AS(train::fit_entropy_router(cpu_backend(1), short_h, o), shape_error);
    s.H[7] = std::nanf("");
    CHECK_THROWS_AS(train::fit_entropy_router(cpu_backend(1), s, o), nonfinite_error);
}

TEST_CASE("a gate with a router fires on Ĥ > τ and reports Ĥ; without one it records (ĥ, exact H) of live rows") {
    test::padded_gate_fixture f(31, 32);
    const auto n = f.n, d = f.d;
    auto& be = f.be;
    auto& ws = f.ws;
    auto& ctx = f.ctx;
    auto& fire = f.fire;
    const auto& vb = f.vb;
    const auto h = f.h();

    entropy_ema g;
    auto tap = std::make_shared<router_samples>();
    g.set_sample_tap(tap);
    g.decide(ctx, h, fire);
    const auto exact = ws.score;
    REQUIRE(tap->rows() == 5);  // the live rows
    CHECK(tap->d_model == d);
    std::int64_t k = 0;
    for (std::int64_t r = 0; r < n; ++r) {
        if (!vb.live()[static_cast<std::size_t>(r)]) continue;
        CHECK(tap->H[static_cast<std::size_t>(k)] == exact[static_cast<std::size_t>(r)]);
        CHECK(tap->h[static_cast<std::size_t>(k * d)] == h(r, 0));
        ++k;
    }

    auto w = random_weights(d, 8, 33);
    auto rt = std::make_shared<const entropy_router>(w);
    g.set_router(rt);
    g.decide(ctx, h, fire);
    CHECK(tap->rows() == 5);  // nothing recorded while a router is set
    std::vector<float> pred(static_cast<std::size_t>(n));
    rt->predict(be, h, pred);
    for (std::int64_t r = 0; r < n; ++r) {
        CHECK(ws.score[static_cast<std::size_t>(r)] == pred[static_cast<std::size_t>(r)]);
        CHECK(fire[static_cast<std::size_t>(r)] == (pred[static_cast<std::size_t>(r)] > g.threshold() ? 1 : 0));
    }
    // A constant router: above τ everything fires, below nothing; training ignores the router.
    auto hi = train::detail::router_zeros(d, 8), lo = train::detail::router_zeros(d, 8);
    hi.fc2_bias[0] = 0.9f, lo.fc2_bias[0] = 0.1f;
    g.set_router(std::make_shared<const entropy_router>(std::move(hi)));
    g.decide(ctx, h, fire);
    CHECK(std::count(fire.begin(), fire.end(), 1) == n);
    g.set_router(std::make_shared<const entropy_router>(std::move(lo)));
    g.decide(ctx, h, fire);
    CHECK(std::count(fire.begin(), fire.end(), 1) == 0);
    g.decide_train(ctx, h, fire);
    CHECK(ws.score == exact);
    g.set_router(nullptr);
    g.decide(ctx, h, fire);
    CHECK(ws.score == exact);
    // Inconsistent sizes and a keep fraction outside (0, 1] are refused.
    router_samples bad;
    CHECK_THROWS_AS(bad.add(h, std::span<const float>(exact).first(3), vb.live()), shape_error);
    CHECK_THROWS_AS(bad.add(h, exact, std::span<const unsigned char>(vb.live()).first(2)), shape_error);
    bad.keep = 1.5;
    CHECK_THROWS_AS(bad.add(h, exact, vb.live()), value_error);
}

TEST_CASE("router file: round trip, and clear errors for missing or misshapen tensors and foreign files") {
    const auto dir = std::filesystem::temp_directory_path() / "hymix_test_entropy_router";
    std::filesystem::create_directories(dir);
    std::vector<std::shared_ptr<const entropy_router>> rs;
    for (int i = 0; i < 3; ++i) rs.push_back(std::make_shared<const entropy_router>(random_weights(10, 6, 40 + static_cast<std::uint64_t>(i))));
    models::save_entropy_routers(rs, dir / "r.safetensors", {{"fitted_for", "x.safetensors"}});
    const auto back = models::load_entropy_routers(dir / "r.safetensors");
    REQUIRE(back.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        const auto& a = rs[i]->weights();
        const auto& b = back[i]->weights();
        CHECK(std::equal(a.fc1_weight.span().begin(), a.fc1_weight.span().end(), b.fc1_weight.span().begin()));
        CHECK(std::equal(a.skip_weight.span().begin(), a.skip_weight.span().end(), b.skip_weight.span().begin()));
        CHECK(a.fc2_bias[0] == b.fc2_bias[0]);
    }
    // Another file: a router of another width for block 1.
    std::vector<std::shared_ptr<const entropy_router>> mixed{rs[0], std::make_shared<const entropy_router>(random_weights(10, 7, 9))};
    CHECK_THROWS_AS(models::save_entropy_routers(mixed, dir / "m.safetensors"), value_error);
    CHECK_THROWS_AS(models::save_entropy_routers({}, dir / "m.safetensors"), value_error);
    {
        safetensors::writer w;
        w.add("amor_blocks.0.router.fc1.weight", rs[0]->weights().fc1_weight);
        w.set_metadata("format", "hymix-amor-router");
        w.set_metadata("config", R"({"n_amor_blocks": 1, "d_model": 10, "hidden": 6})");
        w.write(dir / "missing.safetensors");
    }
    try {
        models::load_entropy_routers(dir / "missing.safetensors");
        FAIL("accepted");
    } catch (const format_error& e) {
        CHECK(std::string(e.what()).find("amor_blocks.0.router.fc1.bias") != std::string::npos);
    }
    {
        safetensors::writer w;
        w.add("amor_blocks.0.router.fc1.weight", rs[0]->weights().fc1_weight);
        w.set_metadata("format", "hymix-amor-router");
        w.set_metadata("config", R"({"n_amor_blocks": 1, "d_model": 10, "hidden": 5})");
        w.write(dir / "shape.safetensors");
    }
    try {
        models::load_entropy_routers(dir / "shape.safetensors");
        FAIL("accepted");
    } catch (const shape_error& e) {
        CHECK(std::string(e.what()).find("[5, 10]") != std::string::npos);
    }
    {
        safetensors::writer w;
        w.add("x", rs[0]->weights().fc1_bias);
        w.write(dir / "foreign.safetensors");
    }
    CHECK_THROWS_AS(models::load_entropy_routers(dir / "foreign.safetensors"), format_error);
    {
        auto w = random_weights(10, 6, 50);
        tensor<float> nan_bias({6});
        nan_bias.fill(std::nanf(""));
        safetensors::writer f;
        f.add("amor_blocks.0.router.fc1.weight", w.fc1_weight).add("amor_blocks.0.router.fc1.bias", nan_bias);
        f.add("amor_blocks.0.router.fc2.weight", w.fc2_weight).add("amor_blocks.0.router.fc2.bias", w.fc2_bias);
        f.add("amor_blocks.0.router.skip.weight", w.skip_weight);
        f.set_metadata("format", "hymix-amor-router");
        f.set_metadata("config", R"({"n_amor_blocks": 1, "d_model": 10, "hidden": 6, "vocab_size": 300})");
        f.write(dir / "nan.safetensors");
        try {
            models::load_entropy_routers(dir / "nan.safetensors");
            FAIL("accepted");
        } catch (const nonfinite_error& e) {
            CHECK(std::string(e.what()).find("nan.safetensors: block 0: entropy_router: fc1.bias") != std::string::npos);
        }
        safetensors::writer j;
        j.add("amor_blocks.0.router.fc1.weight", w.fc1_weight);
        j.set_metadata("format", "hymix-amor-router");
        j.set_metadata("config", "{not json");
        j.write(dir / "json.safetensors");
        CHECK_THROWS_AS(models::load_entropy_routers(dir / "json.safetensors"), format_error);
    }
    std::vector<std::shared_ptr<const entropy_router>> with_null{rs[0], nullptr};
    CHECK_THROWS_AS(models::save_entropy_routers(with_null, dir / "n.safetensors"), value_error);
    models::save_entropy_routers(rs, dir / "v.safetensors", {{"vocab_size", 300}});
    CHECK(models::read_entropy_routers(dir / "v.safetensors").vocab_size() == 300);
    std::filesystem::remove_all(dir);
}
