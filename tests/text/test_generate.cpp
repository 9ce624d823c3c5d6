// Generation (hymix/text/generate.hpp): chunked prefill (bounded calls, state carried between chunks), stop
// strings across token boundaries, end-of-sequence tokens, the context limit, -1 = no token limit, non-finite logits.
#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "hymix/text/generate.hpp"

using namespace hymix;

namespace {
// A model that predicts "the byte after the last one" (cyclic) with logit `margin`, from a cache that keeps
// every token it was fed, so tests can check that chunks continue one sequence. Records each call's row count.
struct fake_lm {
    struct cache {
        std::vector<std::int32_t> seen;
    };
    struct info_t {
        std::int64_t vocab_size = 256;
    } inf;
    float margin = 20.0f;
    std::int64_t nan_after = -1;  // after this many tokens seen, logits are NaN
    mutable std::vector<std::int64_t> rows;
    const info_t& info() const { return inf; }
    cache make_cache(std::int64_t) const { return {}; }
    void forward_last(cache& c, const seq_batch& b, std::span<const std::int32_t> t, tensor_view<float, 2> logits) const {
        REQUIRE(b.n_seq() == 1);
        rows.push_back(b.n_rows);
        c.seen.insert(c.seen.end(), t.begin(), t.end());
        const std::int32_t next = (c.seen.back() + 1) % 256;
        for (std::int64_t v = 0; v < 256; ++v) logits(0, v) = v == next ? margin : 0.0f;
        if (nan_after >= 0 && static_cast<std::int64_t>(c.seen.size()) > nan_after) logits(0, 5) = std::numeric_limits<float>::quiet_NaN();
    }
};

struct run_out {
    std::string text;
    generation_result r;
};

run_out run(const fake_lm& m, const std::string& prompt, generation_options o) {
    const byte_tokenizer tok;
    run_out out;
    const auto ids = tok.encode(prompt);
    out.r = generate(m, tok, ids, o, [&](std::string_view b) { out.text += b; });
    return out;
}

generation_options greedy(std::int64_t n) {
    generation_options o;
    o.max_new = n;
    o.sampling.temperature = 0.0f;
    return o;
}
}  // namespace

TEST_CASE("prefill runs in chunks of at most ubatch tokens and continues one sequence") {
    fake_lm m;
    auto c = m.make_cache(1);
    std::vector<std::int32_t> ids(1000);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 13 % 256);
    tensor<float> logits({1, 256});
    std::vector<std::pair<std::int64_t, std::int64_t>> progress;
    prefill(m, c, ids, 300, logits.view<2>(), [&](std::int64_t d, std::int64_t t) { progress.emplace_back(d, t); });
    CHECK(m.rows == std::vector<std::int64_t>{300, 300, 300, 100});
    CHECK(c.seen == ids);
    CHECK(progress.back() == std::pair<std::int64_t, std::int64_t>{1000, 1000});
    CHECK(progress.size() == 4);
    CHECK(logits.view<2>()(0, (ids.back() + 1) % 256) == 20.0f);  // the last chunk's last token
    fake_lm one;
    auto c1 = one.make_cache(1);
    prefill(one, c1, ids, 5000, logits.view<2>());
    CHECK(one.rows == std::vector<std::int64_t>{1000});
    CHECK_THROWS_AS(prefill(one, c1, ids, 0, logits.view<2>()), config_error);
    CHECK_THROWS_AS(prefill(one, c1, std::span<const std::int32_t>(), 4, logits.view<2>()), config_error);
}

TEST_CASE("generate: greedy continuation, token limit, prefill chunks, then one token per call") {
    fake_lm m;
    auto o = greedy(5);
    o.ubatch = 2;
    const auto out = run(m, "abc", o);
    CHECK(out.text == "defgh");
    CHECK(out.r.generated == 5);
    CHECK(out.r.prompt_tokens == 3);
    CHECK(out.r.reason == stop_reason::token_limit);
    // Prefill 2 + 1, then 4 decode calls (no call after the last token).
    CHECK(m.rows == std::vector<std::int64_t>{2, 1, 1, 1, 1, 1});
    fake_lm z;
    const auto none = run(z, "abc", greedy(0));
    CHECK(none.text.empty());
    CHECK(none.r.reason == stop_reason::token_limit);
    CHECK(z.rows.size() == 1);  // prefill only
}

TEST_CASE("generate: stop strings end generation after the string, also across tokens; generated text only") {
    fake_lm m;
    auto o = greedy(100);
    o.stop = {"xyz", "ghi"};
    const auto out = run(m, "abc", o);
    CHECK(out.text == "defghi");  // "ghi" completes first, spread over three tokens
    CHECK(out.r.reason == stop_reason::stop_string);
    // A stop string already in the prompt does not stop generation.
    fake_lm p;
    o.stop = {"b"};
    const auto out2 = run(p, "abc", o);
    CHECK(out2.text.size() == 100);  // "b" comes back only after 255 bytes: the token limit stops first
    CHECK(out2.r.reason == stop_reason::token_limit);
    stop_matcher sm({"abcd"});
    CHECK(sm.feed("xxab") == nullptr);
    CHECK(sm.feed("c") == nullptr);
    REQUIRE(sm.feed("dz") != nullptr);
    CHECK_THROWS_AS(stop_matcher({"ok", ""}), config_error);
}

TEST_CASE("generate: -1 runs until the context limit or an end-of-sequence token") {
    fake_lm m;
    auto o = greedy(-1);
    o.context_limit = 10;
    const auto out = run(m, "abc", o);
    CHECK(out.text == "defghij");
    CHECK(out.r.reason == stop_reason::context_limit);
    fake_lm e;
    o.context_limit = 0;
    o.eos = {'h'};
    const auto out2 = run(e, "abc", o);
    CHECK(out2.text == "defg");  // EOS is not emitted
    CHECK(out2.r.reason == stop_reason::end_of_sequence);
    // The context limit applies to an explicit token count too.
    fake_lm c;
    auto o3 = greedy(50);
    o3.context_limit = 5;
    CHECK(run(c, "abc", o3).text == "de");
    fake_lm bad;
    CHECK_THROWS_AS(run(bad, "", greedy(3)), config_error);
    CHECK_THROWS_AS(run(bad, "a", greedy(-2)), config_error);
}

TEST_CASE("generate: NaN logits are an error, also mid-generation") {
    fake_lm m;
    m.nan_after = 5;  // the prompt (3) and two generated tokens are fine
    std::string text;
    const byte_tokenizer tok;
    const auto ids = tok.encode("abc");
    CHECK_THROWS_AS(generate(m, tok, ids, greedy(10), [&](std::string_view b) { text += b; }), nonfinite_error);
    CHECK(text == "def");
}
