// Blocks with per-token gates (stack/prenorm_block.hpp, gate/token_gate.hpp): an `always` gate equals the plain
// block bit for bit; a `never` gate makes the block the identity on the stream while its KV cache still receives
// every token; a per-token side-input gate runs attention only for the chosen rows (true-sparse) and equals
// dense-with-mask; the classic residual mode replaces the stream by its normalised input; gate statistics come back
// in the cache. Plus the KV cache's rollback (truncate) for speculative decoding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/stack/model.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

constexpr std::int64_t D = 32, V = 29;

mamba2_config mcfg() {
    mamba2_config c;
    c.d_model = D;
    c.n_heads = 4;
    c.head_dim = 16;
    c.d_state = 8;
    c.chunk_size = 8;
    return c;
}
attention_config acfg() {
    attention_config c;
    c.d_model = D;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.rope = {rope_mode::rotate_half, 1e4, 1.0};
    return c;
}
tensor<float> rnd(std::vector<std::int64_t> shape, float lo, float hi, std::uint64_t seed) {
    tensor<float> t(std::move(shape));
    const auto v = test::uniform(static_cast<std::size_t>(t.numel()), lo, hi, seed);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}
stack_weights sweights() {
    stack_weights w;
    w.embedding = rnd({V, D}, -1.f, 1.f, 1);
    w.final_norm = rnd({D}, 0.5f, 1.5f, 2);
    return w;
}

template <class Gate, class Residual = residual_add>
using ablock = prenorm_block<attention, plain_rms_norm, no_mlp, Gate, Residual>;

using plain_stack = model<pattern<"MA">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>, bind<layer_kind::attention, attention>>;
template <class Gate, class Residual = residual_add>
using gated_stack = model<pattern<"MA">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>,
                          bind<layer_kind::attention, ablock<Gate, Residual>>>;
using mamba_only = model<pattern<"M">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>>;

template <class Stack>
Stack build() {
    std::vector<typename Stack::layer> L;
    L.emplace_back(rnd({D}, 0.5f, 1.5f, 3), typename Stack::mixer_variant(std::in_place_index<0>, mcfg(), mamba2_weights::random(mcfg(), 4)));
    if constexpr (Stack::schedule_type::layer_count == 2)
        L.emplace_back(rnd({D}, 0.5f, 1.5f, 5), typename Stack::mixer_variant(std::in_place_index<1>, acfg(), attention_weights::random(acfg(), 6)));
    return Stack(stack_config{D, V, 1e-5f, true}, sweights(), std::move(L));
}

std::vector<std::int32_t> tokens(std::int64_t n, std::uint64_t seed) {
    const auto u = test::uniform(static_cast<std::size_t>(n), 0.f, static_cast<float>(V) - 0.01f, seed);
    std::vector<std::int32_t> t;
    for (auto v : u) t.push_back(static_cast<std::int32_t>(v));
    return t;
}

template <class Stack, class B>
std::vector<float> logits(const Stack& m, const B& be, typename Stack::cache_type& c, const seq_batch& b, const std::vector<std::int32_t>& tok,
                          std::map<std::string, std::vector<float>>* probes = nullptr, std::span<const unsigned char> side = {}) {
    std::vector<float> out(static_cast<std::size_t>(b.n_rows * V));
    m.forward(be, c, b, tok, tensor_view<float, 2>(out.data(), {b.n_rows, V}),
              [&](std::string_view n, tensor_view<const float, 2> v) {
                  if (probes) (*probes)[std::string(n)].assign(v.data, v.data + v.numel());
              },
              side);
    return out;
}

}  // namespace

TEST_CASE("blocks: an `always` gate equals the plain block bit for bit (prefill and decode, both backends)") {
    const auto plain = build<plain_stack>();
    const auto gated = build<gated_stack<always>>();
    const auto tok = tokens(2 * 13, 7);
    const auto one = tokens(2, 8);
    auto check = [&](const auto& be) {
        auto c1 = plain.make_cache(2);
        auto c2 = gated.make_cache(2);
        CHECK(logits(plain, be, c1, seq_batch::dense(2, 13), tok) == logits(gated, be, c2, seq_batch::dense(2, 13), tok));
        CHECK(logits(plain, be, c1, seq_batch::dense(2, 1), one) == logits(gated, be, c2, seq_batch::dense(2, 1), one));
        CHECK(c2.stats().empty());  // an ungated block reports nothing
    };
    check(cpu_backend(2));
    check(reference_backend());
}

TEST_CASE("blocks: a `never` gate is the identity on the stream; its KV cache still receives every token") {
    const auto gated = build<gated_stack<never>>();
    const auto base = build<mamba_only>();
    const cpu_backend be(2);
    const auto tok = tokens(11, 9);
    auto cg = gated.make_cache(1);
    auto cb = base.make_cache(1);
    CHECK(logits(gated, be, cg, seq_batch::dense(1, 11), tok) == logits(base, be, cb, seq_batch::dense(1, 11), tok));
    const auto& kv = std::get<1>(cg.layer_state(1));
    CHECK(kv.length(0) == 11);
    REQUIRE(cg.stats().size() == 1);
    CHECK(cg.stats()[0].layer == 1);
    CHECK(cg.stats()[0].rows == 11);
    CHECK(cg.stats()[0].fired == 0);
    const auto t1 = tokens(1, 10);
    CHECK(logits(gated, be, cg, seq_batch::dense(1, 1), t1) == logits(base, be, cb, seq_batch::dense(1, 1), t1));
    CHECK(std::get<1>(cg.layer_state(1)).length(0) == 12);
    // the keys in the cache are the layer's: a plain attention layer fed the same rows caches the same keys
    const auto plain = build<plain_stack>();
    auto cp = plain.make_cache(1);
    auto all = tok;
    all.push_back(t1[0]);
    (void)logits(plain, be, cp, seq_batch::dense(1, 12), all);
    const auto& kp = std::get<1>(cp.layer_state(1));
    for (std::int64_t h = 0; h < acfg().n_kv_heads; ++h)
        for (std::int64_t t = 0; t < 12; ++t)
            for (std::int64_t i = 0; i < acfg().head_dim; ++i) CHECK(kv.keys(0)(h, t, i) == doctest::Approx(kp.keys(0)(h, t, i)).epsilon(1e-5));
}

TEST_CASE("blocks: a per-token gate runs attention only for firing rows and equals dense-with-mask") {
    const auto plain = build<plain_stack>();
    const auto gated = build<gated_stack<side_input_gate>>();
    const std::int64_t T = 17;
    const auto tok = tokens(2 * T, 11);
    std::vector<unsigned char> side(static_cast<std::size_t>(2 * T));
    for (std::size_t i = 0; i < side.size(); ++i) side[i] = (i % 3 == 1 || i == 5 || i == 6 || i == 7) ? 1 : 0;
    auto run_both = [&](const auto& be, double tol) {
        std::map<std::string, std::vector<float>> pp, pg;
        auto cp = plain.make_cache(2);
        auto cg = gated.make_cache(2);
        (void)logits(plain, be, cp, seq_batch::dense(2, T), tok, &pp);
        (void)logits(gated, be, cg, seq_batch::dense(2, T), tok, &pg, side);
        const auto& yd = pp["layers.1.mixer_output"];
        const auto& ys = pg["layers.1.mixer_output"];
        const auto& x0 = pg["layers.0.output"];
        const auto& x1 = pg["layers.1.output"];
        for (std::int64_t r = 0; r < 2 * T; ++r) {
            const bool f = side[static_cast<std::size_t>(r)] != 0;
            std::vector<float> a(ys.begin() + r * D, ys.begin() + (r + 1) * D), b(yd.begin() + r * D, yd.begin() + (r + 1) * D);
            if (f) {
                CHECK(test::rel_error(a, b) <= tol);
            } else {
                for (auto v : a) REQUIRE(v == 0.f);
            }
            for (std::int64_t i = 0; i < D; ++i) {
                const auto k = static_cast<std::size_t>(r * D + i);
                REQUIRE(x1[k] == (f ? x0[k] + ys[k] : x0[k]));
            }
        }
        REQUIRE(cg.stats().size() == 1);
        CHECK(cg.stats()[0].fired == std::count(side.begin(), side.end(), 1));
        CHECK(std::get<1>(cg.layer_state(1)).length(0) == T);
        CHECK(std::get<1>(cg.layer_state(1)).length(1) == T);
    };
    run_both(cpu_backend(2), 1e-5);
    run_both(reference_backend(), 1e-12);
}

TEST_CASE("blocks: the normed residual mode replaces the stream with the block's normalised input") {
    const auto gated = build<gated_stack<never, residual_normed>>();
    const cpu_backend be(1);
    std::map<std::string, std::vector<float>> p;
    auto c = gated.make_cache(1);
    (void)logits(gated, be, c, seq_batch::dense(1, 6), tokens(6, 12), &p);
    const auto& x0 = p["layers.0.output"];
    const auto& x1 = p["layers.1.output"];
    const auto& blk = std::get<1>(gated.layer_at(1));
    for (std::int64_t r = 0; r < 6; ++r) {
        double ss = 0;
        for (std::int64_t i = 0; i < D; ++i) ss += double(x0[static_cast<std::size_t>(r * D + i)]) * x0[static_cast<std::size_t>(r * D + i)];
        const double inv = 1.0 / std::sqrt(ss / D + 1e-5);
        for (std::int64_t i = 0; i < D; ++i)
            CHECK(x1[static_cast<std::size_t>(r * D + i)] ==
                  doctest::Approx(blk.norm()[i] * x0[static_cast<std::size_t>(r * D + i)] * inv).epsilon(1e-5));
    }
}

TEST_CASE("kv_cache: truncate rolls a slot back (speculative decoding) and rejects what it cannot") {
    const attention m(acfg(), attention_weights::random(acfg(), 30));
    const cpu_backend be(1);
    const auto x = test::uniform(static_cast<std::size_t>(10 * D), -1.f, 1.f, 31);
    auto st = m.make_state(1);
    std::vector<float> y(x.size()), y2(4 * D);
    m.forward(be, st, seq_batch::dense(1, 10), tensor_view<const float, 2>(x.data(), {10, D}), tensor_view<float, 2>(y.data(), {10, D}));
    st.truncate(0, 6);
    CHECK(st.length(0) == 6);
    m.forward(be, st, seq_batch::dense(1, 4), tensor_view<const float, 2>(x.data() + 6 * D, {4, D}), tensor_view<float, 2>(y2.data(), {4, D}));
    for (std::int64_t i = 0; i < 4 * D; ++i) CHECK(y2[static_cast<std::size_t>(i)] == doctest::Approx(y[static_cast<std::size_t>(6 * D + i)]).epsilon(1e-5));
    CHECK_THROWS_AS(st.truncate(0, 11), shape_error);
    CHECK_THROWS_AS(st.truncate(0, -1), shape_error);
    CHECK_THROWS_AS(st.truncate(1, 0), shape_error);
}
