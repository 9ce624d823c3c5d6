// Byte tokenizer and sampler (greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds, non-finite
// logits). The scoring protocol is in test_score.cpp, generation in test_generate.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hymix/text/sampler.hpp"
#include "hymix/text/tokenizer.hpp"

using namespace hymix;

TEST_CASE("byte tokenizer round-trips every byte") {
    byte_tokenizer tok;
    std::string s;
    for (int b = 0; b < 256; ++b) s.push_back(static_cast<char>(b));
    const auto ids = tok.encode(s);
    REQUIRE(ids.size() == 256);
    std::string back;
    for (std::size_t i = 0; i < ids.size(); ++i) {
        CHECK(ids[i] == static_cast<int>(i));
        back += tok.decode(ids[i]);
    }
    CHECK(back == s);
    CHECK(tok.decode(300).empty());
}

TEST_CASE("greedy sampling is argmax; NaN and +Inf logits are rejected, -Inf is allowed") {
    sampler g({.temperature = 0.0f});
    std::vector<float> l{0.1f, 3.0f, -1.0f, 3.0f};
    CHECK(g.sample(l) == 1);
    const float inf = std::numeric_limits<float>::infinity();
    for (const float bad : {std::nanf(""), inf}) {
        for (const float temperature : {0.0f, 1.0f}) {
            sampler s({.temperature = temperature});
            auto m = l;
            m[2] = bad;
            CHECK_THROWS_WITH_AS(s.sample(m), doctest::Contains(("logits[2] = " + nonfinite_name(bad)).c_str()), nonfinite_error);
            m[2] = -1.0f;
            m[0] = bad;  // first element: a max that skips NaN would miss it
            CHECK_THROWS_AS(s.sample(m), nonfinite_error);
        }
    }
    // -Inf means "never this token": sampling works and never draws it.
    sampler t({.temperature = 1.0f, .seed = 5});
    std::vector<float> masked{-inf, 0.5f, -inf, 0.0f};
    for (int i = 0; i < 200; ++i) {
        const auto k = t.sample(masked);
        CHECK((k == 1 || k == 3));
    }
    CHECK(g.sample(masked) == 1);
    std::vector<float> none(4, -inf);
    CHECK_THROWS_WITH_AS(t.sample(none), doctest::Contains("every logit is -Inf"), nonfinite_error);
    CHECK_THROWS_AS(argmax(std::vector<float>{1.0f, std::nanf("")}), nonfinite_error);
    CHECK_THROWS_AS(sampler({.temperature = -1.0f}), config_error);
    CHECK_THROWS_AS(sampler({.top_p = 0.0f}), config_error);
    CHECK_THROWS_AS(sampler({.min_p = 1.5f}), config_error);
    CHECK_THROWS_AS(sampler({.repeat_penalty = 0.0f}), config_error);
    CHECK_THROWS_AS(sampler({.repeat_penalty = inf}), config_error);
    CHECK_THROWS_AS(sampler({.repeat_last_n = -2}), config_error);
}

TEST_CASE("min-p keeps the tokens at least min_p times as likely as the best one") {
    // Probabilities at temperature 1 ∝ e^{2, 1, 0.5, 0, -1}: relative to the best, 1, 0.37, 0.22, 0.14, 0.05.
    std::vector<float> l{2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
    for (const auto& [min_p, kept] : std::vector<std::pair<float, int>>{{0.3f, 2}, {0.2f, 3}, {0.1f, 4}, {0.01f, 5}, {1.0f, 1}}) {
        sampler s({.temperature = 1.0f, .min_p = min_p, .seed = 17});
        std::map<int, int> seen;
        for (int i = 0; i < 4000; ++i) seen[s.sample(l)]++;
        CHECK(static_cast<int>(seen.size()) == kept);
        CHECK(seen.rbegin()->first == kept - 1);  // the kept tokens are the most likely ones
    }
}

TEST_CASE("repetition penalty: positive logits divided, negative multiplied, only for recent tokens") {
    // Greedy picks token 0 (3.0); penalising it (3.0 / 2 = 1.5 < 2.0) makes token 1 the argmax.
    std::vector<float> l{3.0f, 2.0f, -1.0f, -1.5f};
    sampler off({.temperature = 0.0f});
    sampler pen({.temperature = 0.0f, .repeat_penalty = 2.0f, .repeat_last_n = 2});
    const std::vector<std::int32_t> recent{0};
    CHECK(off.sample(l, recent) == 0);
    CHECK(pen.sample(l, recent) == 1);
    // Token 0 outside the last 2 tokens: no penalty.
    const std::vector<std::int32_t> older{0, 2, 3};
    CHECK(pen.sample(l, older) == 0);
    // repeat_last_n = -1 looks at all of them; a token repeated counts once (3.0 / 2, not / 4).
    sampler all({.temperature = 0.0f, .repeat_penalty = 2.0f, .repeat_last_n = -1});
    CHECK(all.sample(l, older) == 1);
    sampler twice({.temperature = 0.0f, .repeat_penalty = 1.4f, .repeat_last_n = -1});
    const std::vector<std::int32_t> rep{0, 0, 0};
    CHECK(twice.sample(l, rep) == 0);  // 3.0 / 1.4 = 2.14 > 2.0
    // Negative logits move away from zero: penalising token 2 (-1 × 3 = -3) makes token 3 (-1.5) the argmax.
    std::vector<float> neg{-5.0f, -5.0f, -1.0f, -1.5f};
    sampler p3({.temperature = 0.0f, .repeat_penalty = 3.0f, .repeat_last_n = -1});
    const std::vector<std::int32_t> r2{2};
    CHECK(p3.sample(neg, r2) == 3);
    // Ids outside the vocabulary in the history are ignored.
    const std::vector<std::int32_t> junk{-3, 99};
    CHECK(pen.sample(l, junk) == 0);
}

TEST_CASE("random_seed differs between calls") {
    const auto a = random_seed(), b = random_seed(), c = random_seed();
    CHECK((a != b || b != c));
}

TEST_CASE("require_finite names the first non-finite element and counts the rest") {
    std::vector<float> v{1.0f, 2.0f, std::numeric_limits<float>::infinity(), std::nanf(""), 0.0f};
    CHECK(first_nonfinite(std::span<const float>(v)) == 2);
    CHECK_THROWS_WITH_AS(require_finite(std::span<const float>(v), "x"), "x[2] = +Inf (and 1 more non-finite values)", nonfinite_error);
    v[2] = v[3] = 0.0f;
    CHECK(first_nonfinite(std::span<const float>(v)) == -1);
    CHECK_NOTHROW(require_finite(std::span<const float>(v), "x"));
    CHECK(nonfinite_name(-std::numeric_limits<double>::infinity()) == "-Inf");
}

TEST_CASE("top-k and top-p restrict the support; same seed gives the same draws") {
    std::vector<float> l{2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
    sampler k2({.temperature = 1.0f, .top_k = 2, .seed = 3});
    std::map<int, int> seen;
    for (int i = 0; i < 2000; ++i) seen[k2.sample(l)]++;
    CHECK(seen.size() == 2);
    CHECK(seen.count(0) == 1);
    CHECK(seen.count(1) == 1);
    // p(0) = e^2 / Σ ≈ 0.61 at temperature 1: top_p = 0.5 keeps only token 0.
    sampler p({.temperature = 1.0f, .top_p = 0.5f, .seed = 4});
    for (int i = 0; i < 200; ++i) CHECK(p.sample(l) == 0);
    sampler a({.seed = 9}), b({.seed = 9});
    for (int i = 0; i < 100; ++i) CHECK(a.sample(l) == b.sample(l));
    // Frequencies follow the softmax at temperature 1 (5-sigma band).
    sampler f({.seed = 11});
    int zeros = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) zeros += f.sample(l) == 0;
    double Z = 0;
    for (float v : l) Z += std::exp(v);
    const double p0 = std::exp(2.0) / Z;
    CHECK(std::abs(zeros / double(n) - p0) < 5 * std::sqrt(p0 * (1 - p0) / n));
}

