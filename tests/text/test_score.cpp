// The bits-per-byte scoring protocol (hymix/text/score.hpp): every predictable byte scored with a shortened last
// window, the whole-window protocol of shared/models/README.md, the standard error, and non-finite logits as errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "hymix/text/score.hpp"

using namespace hymix;

namespace {
// A model whose logits put `margin` on the byte after the current one (cyclic), to test the scoring protocol.
// It records the sequence lengths it was called with; `poison_row` (≥ 0) puts `poison` in logit 7 of that row.
struct fake_lm {
    struct cache {};
    struct info_t {
        std::int64_t vocab_size = 256;
    } inf;
    float margin = 0.0f;
    std::int64_t poison_row = -1;
    float poison = 0.0f;
    mutable std::int64_t calls = 0;
    mutable std::vector<std::int64_t> lengths;
    const info_t& info() const { return inf; }
    cache make_cache(std::int64_t) const { return {}; }
    void forward(cache&, const seq_batch& b, std::span<const std::int32_t> t, tensor_view<float, 2> logits) const {
        ++calls;
        for (auto len : b.lengths) lengths.push_back(len);
        for (std::int64_t r = 0; r < b.n_rows; ++r)
            for (std::int64_t v = 0; v < 256; ++v) logits(r, v) = (v == (t[static_cast<std::size_t>(r)] + 1) % 256) ? margin : 0.0f;
        if (calls == 1 && poison_row >= 0) logits(poison_row, 7) = poison;
    }
};

std::vector<std::uint8_t> counting_text(std::size_t n) {  // next byte = current + 1 (mod 256)
    std::vector<std::uint8_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint8_t>(i % 256);
    return t;
}
}  // namespace

TEST_CASE("score: every predictable byte is scored; the last window is shortened") {
    std::vector<std::uint8_t> text(5000);
    for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint8_t>(i * 7 % 251);
    fake_lm m;
    // 1024 bytes, window 512: windows [0, 512) and [512, 1023), predicting bytes 1..1023.
    const auto r = score_bits_per_byte(m, text, 0, 1024, {.window = 512});
    CHECK(r.scored_bytes == 1023);
    CHECK(r.windows == 2);
    CHECK(m.lengths == std::vector<std::int64_t>{512, 511});
    CHECK(r.bits_per_byte == doctest::Approx(8.0).epsilon(1e-12));  // uniform model
    CHECK(r.std_error == 0.0);  // every byte costs the same
    // A text shorter than the window is one window of n - 1 bytes.
    fake_lm s;
    const auto r2 = score_bits_per_byte(s, text, 10, 100, {.window = 512});
    CHECK(r2.scored_bytes == 99);
    CHECK(s.lengths == std::vector<std::int64_t>{99});
    // Two bytes: one prediction.
    CHECK(score_bits_per_byte(s, text, 0, 2, {.window = 512}).scored_bytes == 1);
    // 1000 bytes, window 128, batch 3: 7 whole windows (3 + 3 + 1 calls) and one of 999 - 896 = 103.
    fake_lm b;
    const auto r3 = score_bits_per_byte(b, text, 100, 1000, {.window = 128, .batch = 3});
    CHECK(r3.scored_bytes == 999);
    CHECK(r3.windows == 8);
    CHECK(b.calls == 4);
    CHECK(b.lengths.back() == 103);
    // A window length that divides n - 1 leaves no short window.
    fake_lm e;
    CHECK(score_bits_per_byte(e, text, 0, 1025, {.window = 512}).windows == 2);
    CHECK(e.lengths == std::vector<std::int64_t>{512, 512});
}

TEST_CASE("score: whole windows only reproduce the protocol of shared/models/README.md") {
    std::vector<std::uint8_t> text(5000);
    for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<std::uint8_t>(i * 7 % 251);
    fake_lm m;
    // s = 0, 128, ..., while s < 1000 - 128 = 872: 0..768 -> 7 windows.
    const auto r = score_bits_per_byte(m, text, 100, 1000, {.window = 128, .batch = 3, .full_windows_only = true});
    CHECK(r.windows == 7);
    CHECK(r.scored_bytes == 7 * 128);
    CHECK(m.calls == 3);  // batches of 3, 3, 1
    // The older overload is the same protocol.
    fake_lm o;
    const auto r2 = score_bits_per_byte(o, text, 100, 1000, 128, 3);
    CHECK(r2.windows == 7);
    CHECK(r2.scored_bytes == 7 * 128);
    fake_lm w;
    CHECK(score_bits_per_byte(w, text, 0, 1024, {.window = 512, .full_windows_only = true}).scored_bytes == 512);
}

TEST_CASE("score: targets are the next bytes; the standard error follows the per-byte losses") {
    const auto text = counting_text(3000);
    fake_lm m;
    m.margin = 30.0f;
    const auto r = score_bits_per_byte(m, text, 0, 2048, {.window = 512});
    // Every prediction is right with p = e^30 / (e^30 + 255): CE = log(1 + 255 e^-30).
    const double ce = std::log1p(255.0 * std::exp(-30.0));
    CHECK(r.bits_per_byte == doctest::Approx(ce / std::log(2.0)).epsilon(1e-6));
    CHECK(r.scored_bytes == 2047);

    // Half the bytes predicted (margin), half not: odd positions continue the count, even ones skip.
    std::vector<std::uint8_t> mixed(1001, 0);
    for (std::size_t i = 1; i < mixed.size(); ++i) mixed[i] = static_cast<std::uint8_t>(mixed[i - 1] + (i % 2 ? 1 : 3));
    fake_lm h;
    h.margin = 5.0f;
    std::vector<score_progress> seen;
    const auto r2 = score_bits_per_byte(h, mixed, 0, 1001, {.window = 100, .batch = 4},
                                        [&](const score_progress& p) { seen.push_back(p); });
    // Reference: the per-byte cross-entropies computed directly.
    std::vector<double> ce_bits;
    const double z = std::exp(5.0) + 255.0;
    for (std::size_t i = 1; i < mixed.size(); ++i) {
        const bool hit = mixed[i] == static_cast<std::uint8_t>(mixed[i - 1] + 1);
        ce_bits.push_back((std::log(z) - (hit ? 5.0 : 0.0)) / std::log(2.0));
    }
    double mean = 0;
    for (double c : ce_bits) mean += c;
    mean /= static_cast<double>(ce_bits.size());
    double var = 0;
    for (double c : ce_bits) var += (c - mean) * (c - mean);
    var /= static_cast<double>(ce_bits.size() - 1);
    CHECK(r2.scored_bytes == 1000);
    CHECK(r2.bits_per_byte == doctest::Approx(mean).epsilon(1e-12));
    CHECK(r2.std_error == doctest::Approx(std::sqrt(var / 1000.0)).epsilon(1e-9));
    CHECK(r2.std_error > 0.01);
    // The running estimate: after each call, ending with the final numbers.
    REQUIRE(seen.size() == 3);  // 10 windows of 100 in batches of 4: 4 + 4 + 2
    CHECK(seen[0].windows_done == 4);
    CHECK(seen[0].scored_bytes == 400);
    CHECK(seen.back().windows_total == 10);
    CHECK(seen.back().bits_per_byte == doctest::Approx(r2.bits_per_byte));
    CHECK(seen.back().std_error == doctest::Approx(r2.std_error));
}

TEST_CASE("score: bad ranges are config errors") {
    std::vector<std::uint8_t> text(100);
    fake_lm m;
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 50, 60, {.window = 10}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 1, {.window = 10}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 50, {.window = 0}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 50, {.window = 50, .full_windows_only = true}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 0, 50, {.window = 10, .batch = 0}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 9223372036854775800LL, 100, {.window = 5}), config_error);
    CHECK_THROWS_AS(score_bits_per_byte(m, text, 10, 9223372036854775800LL, {.window = 5}), config_error);
    CHECK(m.calls == 0);
}

TEST_CASE("score: batch larger than the window count is clipped") {
    std::vector<std::uint8_t> text(3000, 7);
    fake_lm m;
    const auto r = score_bits_per_byte(m, text, 0, 2048, 512, 1000);  // 3 whole windows, batch clipped to 3
    CHECK(r.windows == 3);
    CHECK(m.calls == 1);
}

TEST_CASE("cross_entropy: non-finite logits are errors, never a NaN result") {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> l{1.0f, 2.0f, 0.5f};
    const double want = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5)) - 2.0;
    CHECK(cross_entropy(l, 1) == doctest::Approx(want).epsilon(1e-12));
    for (std::size_t at = 0; at < 3; ++at)
        for (const float bad : {nan, inf}) {
            auto m = l;
            m[at] = bad;  // at 0 too: a running std::max skips a leading NaN
            CHECK_THROWS_WITH_AS(cross_entropy(m, 1), doctest::Contains(("logits[" + std::to_string(at) + "] = " + nonfinite_name(bad)).c_str()),
                                 nonfinite_error);
        }
    auto masked = l;
    masked[0] = -inf;  // another token impossible: fine
    CHECK(std::isfinite(cross_entropy(masked, 1)));
    CHECK_THROWS_WITH_AS(cross_entropy(masked, 0), doctest::Contains("probability 0"), nonfinite_error);
    CHECK_THROWS_AS(cross_entropy(std::vector<float>(3, -inf), 0), nonfinite_error);
    CHECK_THROWS_AS(cross_entropy(l, 3), shape_error);
    CHECK_THROWS_AS(cross_entropy(l, -1), shape_error);
}

TEST_CASE("score: a non-finite logit is an error naming the byte, not a NaN bits/byte") {
    const auto text = counting_text(3000);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        fake_lm m;
        m.poison_row = 600;  // window 1 (from byte 100 + 512), position 88: predicts byte 100 + 512 + 89
        m.poison = bad;
        CHECK_THROWS_WITH_AS(score_bits_per_byte(m, text, 100, 2000, {.window = 512, .batch = 2}),
                             doctest::Contains("predicting the byte at offset 701 (window from 612)"), nonfinite_error);
    }
}
