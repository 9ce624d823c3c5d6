// AdamW, clipping, learning-rate schedules and the byte-window sampler of the training engine.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hymix/train/data.hpp"
#include "hymix/train/optimizer.hpp"
#include "hymix/train/plot.hpp"

using namespace hymix;
using namespace hymix::train;

namespace {
/// PyTorch's AdamW step for one scalar, written out in double.
struct adamw_scalar {
    double p, m = 0, v = 0;
    void step(double g, double lr, double b1, double b2, double eps, double wd, int t) {
        p -= lr * wd * p;
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        const double mh = m / (1 - std::pow(b1, t)), vh = v / (1 - std::pow(b2, t));
        p -= lr * mh / (std::sqrt(vh) + eps);
    }
};
}  // namespace

TEST_CASE("AdamW follows the decoupled-decay, bias-corrected update; vectors are not decayed") {
    tensor<float> w({2, 2}), gw({2, 2}), b({3}), gb({3});
    const float w0[] = {0.5f, -1.0f, 2.0f, 0.25f}, b0[] = {1.0f, -2.0f, 0.0f};
    std::copy(w0, w0 + 4, w.data());
    std::copy(b0, b0 + 3, b.data());
    std::vector<param> ps{{"w", &w, &gw, decays_by_default(w), false}, {"b", &b, &gb, decays_by_default(b), false}};
    CHECK(ps[0].decay);
    CHECK_FALSE(ps[1].decay);
    adamw_config cfg{1e-2, 0.9, 0.95, 1e-8, 0.1};
    adamw opt(ps, cfg);
    std::vector<adamw_scalar> rw, rb;
    for (float x : w0) rw.push_back({x});
    for (float x : b0) rb.push_back({x});
    for (int t = 1; t <= 5; ++t) {
        for (int i = 0; i < 4; ++i) gw[i] = static_cast<float>(std::sin(t + i));
        for (int i = 0; i < 3; ++i) gb[i] = static_cast<float>(std::cos(2 * t + i));
        opt.update(ps, 1e-2);
        for (int i = 0; i < 4; ++i) rw[i].step(gw[i], 1e-2, 0.9, 0.95, 1e-8, 0.1, t);
        for (int i = 0; i < 3; ++i) rb[i].step(gb[i], 1e-2, 0.9, 0.95, 1e-8, 0.0, t);
    }
    CHECK(opt.step() == 5);
    for (int i = 0; i < 4; ++i) CHECK(w[i] == doctest::Approx(rw[i].p).epsilon(1e-6));
    for (int i = 0; i < 3; ++i) CHECK(b[i] == doctest::Approx(rb[i].p).epsilon(1e-6));

    ps[1].frozen = true;
    const float before = b[0];
    opt.update(ps, 1e-2);
    CHECK(b[0] == before);
    // Parameters frozen from the start get no moments.
    adamw fresh(ps, cfg);
    CHECK(fresh.exp_avg(0).numel() == 4);
    CHECK(fresh.exp_avg(1).numel() == 0);
    CHECK(fresh.exp_avg_sq(1).numel() == 0);
    fresh.update(ps, 1e-2);
    CHECK(b[0] == before);
}

TEST_CASE("global-norm clipping scales every gradient; a NaN gradient refuses the step") {
    tensor<float> a({2}), ga({2}), c({1}), gc({1});
    ga[0] = 3, ga[1] = 0, gc[0] = 4;
    std::vector<param> ps{{"a", &a, &ga}, {"c", &c, &gc}};
    CHECK(global_grad_norm(ps) == doctest::Approx(5.0));
    CHECK(clip_grad_norm(ps, 1.0) == doctest::Approx(5.0));
    CHECK(global_grad_norm(ps) == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(clip_grad_norm(ps, 10.0) == doctest::Approx(1.0).epsilon(1e-5));  // below the limit: untouched
    CHECK(ga[0] == doctest::Approx(0.6).epsilon(1e-5));
    gc[0] = NAN;
    CHECK_THROWS_AS(clip_grad_norm(ps, 1.0), nonfinite_error);
}

TEST_CASE("learning-rate schedules: warmup then constant, linear or cosine to min_lr") {
    lr_schedule s{1.0, 10, 110, lr_decay::constant, 0.1};
    CHECK(s(0) == doctest::Approx(0.1));
    CHECK(s(9) == doctest::Approx(1.0));
    CHECK(s(50) == doctest::Approx(1.0));
    s.decay = lr_decay::linear;
    CHECK(s(10) == doctest::Approx(1.0));
    CHECK(s(109) == doctest::Approx(0.1));
    CHECK(s(60) == doctest::Approx(0.1 + 0.9 * (1 - 50.0 / 99)));
    s.decay = lr_decay::cosine;
    CHECK(s(10) == doctest::Approx(1.0));
    CHECK(s(109) == doctest::Approx(0.1));
    CHECK(s(10 + 99 / 2.0) == doctest::Approx(0.55).epsilon(0.02));
    CHECK_THROWS_AS(parse_lr_decay("exp"), config_error);
}

TEST_CASE("byte windows: the shared split, seeded order, and a restored generator state continues the stream") {
    const auto path = std::filesystem::path(HYMIX_TEST_TMP) / "train_text.txt";
    {
        std::ofstream f(path, std::ios::binary);
        for (int i = 0; i < 2000; ++i) f.put(static_cast<char>('a' + i % 26));
    }
    const auto c = byte_corpus::load(path);
    CHECK(c.size() == 2000);
    CHECK(c.train_end == 1900);
    CHECK(byte_corpus::default_split(4298239) == 4083327);  // the KJV boundary of shared/models/README.md
    window_sampler a(c, 16, 42), b(c, 16, 42);
    const auto b1 = a.next(3);
    CHECK(b1.inputs == b.next(3).inputs);
    for (std::size_t r = 0; r + 1 < b1.inputs.size(); ++r)
        if ((r + 1) % 16 != 0) CHECK(b1.targets[r] == b1.inputs[r + 1]);
    const std::string st = a.state();
    const auto next_a = a.next(4);
    window_sampler d(c, 16, 7);
    d.set_state(st);
    CHECK(d.next(4).inputs == next_a.inputs);
    CHECK_THROWS_AS(d.set_state("not a state"), format_error);
    CHECK_THROWS_AS(window_sampler(c, 1900, 1), value_error);
    CHECK_THROWS_AS(byte_corpus::load(std::filesystem::path(HYMIX_TEST_TMP) / "missing.txt"), io_error);
}

TEST_CASE("SVG line plot: every series is drawn and labels are escaped") {
    plot_spec p{"loss <curve>", "step", "bits/byte", {{"a & b", {{0, 1}, {1, 0.5}, {2, NAN}}, "", false}, {"c", {{0, 2}}, "", true}}};
    const auto svg = svg_line_plot(p);
    CHECK(svg.find("<svg") == 0);
    CHECK(svg.find("loss &lt;curve&gt;") != std::string::npos);
    CHECK(svg.find("a &amp; b") != std::string::npos);
    CHECK(svg.find("<circle") != std::string::npos);
    CHECK(svg.find("nan") == std::string::npos);
}
