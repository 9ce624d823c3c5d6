// Byte tokenizer, sampler (greedy, temperature, top-k, top-p, seeds) and the bits-per-byte scoring protocol.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>

#include "hymix/text/sampler.hpp"
#include "hymix/text/score.hpp"
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

TEST_CASE("greedy sampling is argmax; NaN logits are rejected") {
    sampler g({.temperature = 0.0f});
    std::vector<float> l{0.1f, 3.0f, -1.0f, 3.0f};
    CHECK(g.sample(l) == 1);
    l[2] = std::nanf("");
    CHECK_THROWS_AS(g.sample(l), value_error);
    CHECK_THROWS_AS(sampler({.temperature = -1.0f}), config_error);
    CHECK_THROWS_AS(sampler({.top_p = 0.0f}), config_error);
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

namespace {
// A model whose logits put `margin` on the byte after the current one (cyclic), to test the scoring protocol.
struct fake_lm {
    struct cache {};
    struct info_t {
        std::int64_t vocab_size = 256;
    } inf;
    float margin = 0.0f;
    mutable std::int64_t calls = 0;
    const info_t& info() const { return inf; }
    cache make_cache(std::int64_t) const { return {}; }
    void forward(cache&, const seq_batch& b, std::span<const std::int32_t> t, tensor_view<float, 2> logits) const {
        ++calls;
        for (std::int64_t r = 0; r < b.n_rows; ++r)
            for (std::int64_t v = 0; v < 256; ++v) logits(r, v) = (v == (t[static_cast<std::size_t>(r)] + 1) % 256) ? margin : 0.0f;
    }
};
}  // namespace

TEST_CASE("score protocol: uniform model gives 8 bits/byte; windows and scored bytes as documented") {
    std::vector<std::uint8_t> text(5000);
    for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint8_t>(i * 7 % 251);
    fake_lm m;
    const auto r = score_bits_per_byte(m, text, 100, 1000, 128, 3);
    // s = 0, 128, ..., while s < 1000 - 128 = 872: 0..768 -> 7 windows.
    CHECK(r.windows == 7);
    CHECK(r.scored_bytes == 7 * 128);
    CHECK(r.bits_per_byte == doctest::Approx(8.0).epsilon(1e-12));
    CHECK(m.calls == 3);  // batches of 3, 3, 1
}

TEST_CASE("score protocol: targets are the next bytes") {
    std::vector<std::uint8_t> text(3000);
    for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint8_t>(i % 256);  // next = current + 1
    fake_lm m;
    m.margin = 30.0f;
    const auto r = score_bits_per_byte(m, text, 0, 2048, 512);
    // Every prediction is right with p = e^30 / (e^30 + 255): CE = log(1 + 255 e^-30).
    const double ce = std::log1p(255.0 * std::exp(-30.0));
    CHECK(r.bits_per_byte == doctest::Approx(ce / std::log(2.0)).epsilon(1e-6));
}

TEST_CASE("score protocol: bad ranges are config errors") {
    std::vector<std::uint8_t> text(100);
    fake_lm m;
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 50, 60, 10), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 50, 50), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 50, 10, 0), config_error);
}

TEST_CASE("score protocol: huge offsets / lengths are range errors (no overflow), batch larger than the window count") {
    std::vector<std::uint8_t> text(3000, 7);
    fake_lm m;
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 9223372036854775800LL, 100, 5), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 100, 9223372036854775800LL, 5), config_error);
    const auto r = score_bits_per_byte(m, text, 0, 2048, 512, 1000);  // 3 windows, batch clipped to 3
    CHECK(r.windows == 3);
    CHECK(m.calls == 1);
}
