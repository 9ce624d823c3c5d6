// The recall tasks' generator (train/recall.hpp): layout, answers, determinism, independence from the batch size,
// the haystack's bytes, parsing and errors, and the scorer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hymix/train/recall.hpp"

using namespace hymix;
using namespace hymix::train;

namespace {
std::vector<std::uint8_t> ascii_text(std::size_t n) {
    std::vector<std::uint8_t> t(n);
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint8_t>('a' + (i * 7 + i / 13) % 26);
    return t;
}
bool is_key(int b) { return b >= recall_key_base && b < recall_key_base + recall_alphabet; }
bool is_value(int b) { return b >= recall_value_base && b < recall_value_base + recall_alphabet; }

/// Checks one sequence against the layout of recall.hpp: N pairs with distinct keys in the context (at the start or
/// scattered), nothing else from the alphabets there, Q distinct asked keys each followed by the value of its pair.
void check_sequence(const recall_task& task, const std::vector<std::uint8_t>& s, const std::vector<std::uint8_t>* hay_window_source) {
    const std::int64_t T = task.seq_len, C = task.context_len();
    REQUIRE(static_cast<std::int64_t>(s.size()) == T + 1);
    std::vector<int> value_of(256, -1);
    std::int64_t pairs = 0;
    for (std::int64_t t = 0; t < C; ++t) {
        const int b = s[static_cast<std::size_t>(t)];
        if (is_key(b)) {
            REQUIRE(t % 2 == 0);
            REQUIRE(t + 1 < C);
            REQUIRE(is_value(s[static_cast<std::size_t>(t + 1)]));
            REQUIRE(value_of[static_cast<std::size_t>(b)] == -1);  // distinct keys
            value_of[static_cast<std::size_t>(b)] = s[static_cast<std::size_t>(t + 1)];
            if (!task.scatter) REQUIRE(t == 2 * pairs);  // back to back from the start
            ++pairs;
            ++t;  // skip the value
        } else {
            REQUIRE(b < 0x80);  // filler is ASCII
            if (!hay_window_source) REQUIRE((b >= 0x20 && b < 0x7f));
        }
    }
    CHECK(pairs == task.n_pairs);
    std::set<int> asked;
    for (std::int64_t j = 0; j < task.n_queries; ++j) {
        const int k = s[static_cast<std::size_t>(C + 2 * j)];
        REQUIRE(is_key(k));
        REQUIRE(value_of[static_cast<std::size_t>(k)] >= 0);
        CHECK(s[static_cast<std::size_t>(C + 2 * j + 1)] == value_of[static_cast<std::size_t>(k)]);
        asked.insert(k);
    }
    CHECK(static_cast<std::int64_t>(asked.size()) == task.n_queries);
}
}  // namespace

TEST_CASE("recall sequences follow the documented layout (MQAR and needles, with and without a haystack)") {
    const auto text = ascii_text(5000);
    const recall_haystack hay(text), none;
    for (const auto& task : {mqar_task(129, 16), mqar_task(256, 64), recall_task{301, 20, 7, false}, needle_task(1023), needle_task(777, 5),
                             recall_task{65, 32, 1, true}}) {
        CAPTURE(task.describe());
        for (std::uint64_t i = 0; i < 20; ++i) {
            check_sequence(task, recall_sequence(task, hay, 42, i), &text);
            check_sequence(task, recall_sequence(task, none, 42, i), nullptr);
        }
    }
}

TEST_CASE("a haystack's context is a window of the text; scattered needles fall at many depths") {
    const auto text = ascii_text(3000);
    const recall_haystack hay(text);
    const auto task = needle_task(512);
    std::set<std::int64_t> depths;
    for (std::uint64_t i = 0; i < 200; ++i) {
        const auto s = recall_sequence(task, hay, 7, i);
        // Find the window: the filler around the needle equals text[start + t] for one start.
        const std::int64_t C = task.context_len();
        std::int64_t needle = -1;
        for (std::int64_t t = 0; t < C; ++t)
            if (is_key(s[static_cast<std::size_t>(t)])) needle = t;
        REQUIRE(needle >= 0);
        depths.insert(needle / 64);
        bool found = false;
        for (std::size_t st = 0; st + static_cast<std::size_t>(C) <= text.size() && !found; ++st) {
            bool ok = true;
            for (std::int64_t t = 0; t < C && ok; ++t)
                if (t != needle && t != needle + 1) ok = text[st + static_cast<std::size_t>(t)] == s[static_cast<std::size_t>(t)];
            found = ok;
        }
        CHECK(found);
    }
    CHECK(depths.size() == 8);  // every eighth of the context holds some needle
}

TEST_CASE("recall batches: targets only at query keys, deterministic, independent of batch size, mixtures alternate") {
    const auto text = ascii_text(4000);
    const recall_haystack hay(text);
    const std::vector<recall_task> mix{mqar_task(200, 12), needle_task(200, 3)};
    const auto a = make_recall_batch(std::span<const recall_task>(mix), hay, 6, 99, 10);
    const auto b = make_recall_batch(std::span<const recall_task>(mix), hay, 6, 99, 10);
    CHECK(a.inputs == b.inputs);
    CHECK(a.targets == b.targets);
    CHECK(a.n_seq == 6);
    CHECK(a.seq_len == 200);
    // Sequence 3 of a batch starting at 10 is stream sequence 13: the same as the first of a batch starting at 13.
    const auto c = make_recall_batch(std::span<const recall_task>(mix), hay, 1, 99, 13);
    CHECK(std::equal(c.inputs.begin(), c.inputs.end(), a.inputs.begin() + 3 * 200));
    CHECK(std::equal(c.targets.begin(), c.targets.end(), a.targets.begin() + 3 * 200));
    for (std::int64_t r = 0; r < 6; ++r) {
        const auto& task = mix[static_cast<std::size_t>((10 + r) % 2)];
        const auto s = recall_sequence(task, hay, 99, static_cast<std::uint64_t>(10 + r));
        std::int64_t n_targets = 0;
        for (std::int64_t t = 0; t < 200; ++t) {
            const auto i = static_cast<std::size_t>(r * 200 + t);
            CHECK(a.inputs[i] == s[static_cast<std::size_t>(t)]);
            if (a.targets[i] >= 0) {
                ++n_targets;
                CHECK(t >= task.context_len());
                CHECK(is_key(a.inputs[i]));
                CHECK(a.targets[i] == s[static_cast<std::size_t>(t + 1)]);
            }
        }
        CHECK(n_targets == task.n_queries);
    }
    // Another seed gives other sequences.
    const auto d = make_recall_batch(std::span<const recall_task>(mix), hay, 6, 100, 10);
    CHECK(d.inputs != a.inputs);
}

TEST_CASE("score_recall counts right answers and perfect sequences") {
    const auto b = make_recall_batch(mqar_task(64, 8), recall_haystack{}, 4, 3);
    std::vector<std::int32_t> pred(b.targets.begin(), b.targets.end());  // the oracle
    auto s = score_recall(b, pred);
    CHECK(s.answers == 32);
    CHECK(s.correct == 32);
    CHECK(s.perfect == 4);
    CHECK(s.accuracy() == 1.0);
    // Break one answer of sequence 1 and two of sequence 3.
    int broken = 0;
    for (std::int64_t r : {1, 3, 3})
        for (std::int64_t t = 0; t < 64; ++t) {
            auto& p = pred[static_cast<std::size_t>(r * 64 + t)];
            if (p >= recall_value_base && p != 0) {
                p = 0;
                ++broken;
                break;
            }
        }
    REQUIRE(broken == 3);
    s = score_recall(b, pred);
    CHECK(s.correct == 29);
    CHECK(s.perfect == 2);
    CHECK(s.accuracy() == doctest::Approx(29.0 / 32.0));
    CHECK_THROWS_AS(score_recall(b, std::span<const std::int32_t>(pred).first(10)), shape_error);
}

TEST_CASE("recall task specs parse, and impossible tasks or haystacks are refused with the reason") {
    auto t = parse_recall_task("mqar:256:16");
    CHECK(t.seq_len == 256);
    CHECK(t.n_pairs == 16);
    CHECK(t.n_queries == 16);
    CHECK_FALSE(t.scatter);
    t = parse_recall_task("needle:4096");
    CHECK(t.scatter);
    CHECK(t.n_pairs == 1);
    CHECK(t.n_queries == 1);
    t = parse_recall_task("needle:512:4:2");
    CHECK(t.n_pairs == 4);
    CHECK(t.n_queries == 2);
    CHECK(parse_recall_task("mqar:300:20:5").describe() == "mqar:300:20:5");
    for (const char* bad : {"mqar:256", "mqar", "needle", "recall:12:3", "mqar:256:x", "mqar:256:16q", "mqar:256:65", "mqar:40:16",
                            "needle:512:4:5", "needle:512:0"})
        CHECK_THROWS_AS(parse_recall_task(bad), config_error);
    try {
        (void)parse_recall_task("mqar:40:16");
        FAIL("accepted");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("the pairs need 32") != std::string::npos);
    }
    std::vector<std::uint8_t> bad_text = ascii_text(100);
    bad_text[57] = 0xC3;  // a UTF-8 lead byte
    try {
        const recall_haystack h(bad_text);
        FAIL("accepted");
    } catch (const value_error& e) {
        CHECK(std::string(e.what()).find("offset 57") != std::string::npos);
    }
    const auto small = ascii_text(50);
    CHECK_THROWS_AS(recall_sequence(needle_task(128), recall_haystack(small), 1, 0), value_error);
    const std::vector<recall_task> mixed{mqar_task(64, 4), mqar_task(65, 4)};
    CHECK_THROWS_AS(make_recall_batch(std::span<const recall_task>(mixed), recall_haystack{}, 2, 1), config_error);
}
