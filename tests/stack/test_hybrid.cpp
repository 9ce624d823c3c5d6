// Random GDN and hybrid GDN/attention stacks built in code (no files): causality, split invariance, decode path,
// batching, compile-time schedules vs the layers given, and the stack-level cost of mismatches.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/stack/model.hpp"
#include "support/random.hpp"

using namespace hymix;
using test::rel_error;

namespace {

constexpr std::int64_t D = 48, V = 29, F = 40;

using hybrid = model<interval_rule<3>, zero_centered_rms_norm, swiglu_mlp, bind<layer_kind::gated_deltanet, gated_deltanet>,
                     bind<layer_kind::attention, attention>>;
using gdn_only = model<every_layer<layer_kind::gated_deltanet>, zero_centered_rms_norm, swiglu_mlp,
                       bind<layer_kind::gated_deltanet, gated_deltanet>>;

tensor<float> rnd(std::vector<std::int64_t> shape, float lo, float hi, std::uint64_t seed) {
    tensor<float> t(std::move(shape));
    auto v = test::uniform(static_cast<std::size_t>(t.numel()), lo, hi, seed);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

gated_deltanet_config gdn_cfg() {
    gated_deltanet_config c;
    c.d_model = D;
    c.n_k_heads = 2;
    c.n_v_heads = 4;
    c.d_k = 16;
    c.d_v = 8;
    c.chunk_size = 8;
    return c;
}

attention_config attn_cfg() {
    attention_config c;
    c.d_model = D;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.output_gate = true;
    c.qk_norm.mode = qk_norm_mode::zero_centered;
    c.rope.partial_rotary_factor = 0.25;
    return c;
}

/// Layers of the given kinds with random weights.
template <class Stack>
Stack make(std::span<const layer_kind> kinds, std::uint64_t seed) {
    stack_weights w;
    w.embedding = rnd({V, D}, -1.f, 1.f, seed);
    w.final_norm = rnd({D}, -0.3f, 0.3f, seed + 1);
    w.lm_head = rnd({V, D}, -0.3f, 0.3f, seed + 2);
    std::vector<typename Stack::layer> layers;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        const std::uint64_t s = seed + 100 * (i + 1);
        swiglu_weights mlp;
        mlp.gate_proj = rnd({F, D}, -0.2f, 0.2f, s + 1);
        mlp.up_proj = rnd({F, D}, -0.2f, 0.2f, s + 2);
        mlp.down_proj = rnd({D, F}, -0.2f, 0.2f, s + 3);
        typename Stack::mixer_variant mx = [&]() -> typename Stack::mixer_variant {
            if (kinds[i] == layer_kind::gated_deltanet) {
                auto gw = gated_deltanet_weights::random(gdn_cfg(), s + 4);
                for (auto& x : gw.out_proj.span()) x *= 20.f;  // make the mixer's contribution visible
                return typename Stack::mixer_variant(std::in_place_type<gated_deltanet>, gdn_cfg(), std::move(gw));
            }
            if constexpr (std::variant_size_v<typename Stack::mixer_variant> > 1)
                return typename Stack::mixer_variant(std::in_place_type<attention>, attn_cfg(), attention_weights::random(attn_cfg(), s + 5));
            throw config_error("no attention in this stack");
        }();
        layers.emplace_back(rnd({D}, -0.3f, 0.3f, s + 6), std::move(mx), rnd({D}, -0.3f, 0.3f, s + 7), std::move(mlp));
    }
    return Stack(stack_config{D, V, 1e-6f, false}, std::move(w), std::move(layers));
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int> d(0, V - 1);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = d(g);
    return t;
}

template <class Stack>
std::vector<float> run(const Stack& m, const cpu_backend& be, typename Stack::cache_type& c, std::int64_t slot,
                       std::span<const std::int32_t> toks) {
    const auto T = static_cast<std::int64_t>(toks.size());
    std::vector<float> out(static_cast<std::size_t>(T * V));
    seq_batch b;
    b.add(0, T, slot);
    b.n_rows = T;
    m.forward(be, c, b, toks, tensor_view<float, 2>(out.data(), {T, V}));
    return out;
}

const std::vector<layer_kind> gga_gga{layer_kind::gated_deltanet, layer_kind::gated_deltanet, layer_kind::attention,
                                      layer_kind::gated_deltanet, layer_kind::gated_deltanet, layer_kind::attention};

}  // namespace

TEST_CASE_TEMPLATE("GDN and hybrid stacks: one call = split = token by token; causality", Stack, hybrid, gdn_only) {
    cpu_backend be(2);
    const std::vector<layer_kind> kinds = std::is_same_v<Stack, hybrid> ? gga_gga : std::vector<layer_kind>(4, layer_kind::gated_deltanet);
    const auto m = make<Stack>(kinds, 3);
    CHECK(m.layer_kinds() == kinds);
    const std::int64_t T = 37;
    auto toks = tokens(T, 8);
    auto c = m.make_cache(3);
    const auto one = run(m, be, c, 0, toks);

    std::vector<float> split;
    std::int64_t pos = 0;
    for (std::int64_t len : {13, 1, 23}) {
        const auto part = run(m, be, c, 1, std::span(toks).subspan(pos, len));
        split.insert(split.end(), part.begin(), part.end());
        pos += len;
    }
    CHECK(rel_error(split, one) < 1e-5);

    std::vector<float> steps(one.size());
    const std::vector<std::int64_t> slot{2};
    std::int64_t cap = -1;
    for (std::int64_t t = 0; t < T; ++t) {
        m.forward(be, c, seq_batch::decode(slot), std::span(toks).subspan(t, 1), tensor_view<float, 2>(steps.data() + t * V, {1, V}));
        if (t == 1) cap = c.workspace().capacity();
        if (t > 1) CHECK(c.workspace().capacity() == cap);
    }
    CHECK(rel_error(steps, one) < 1e-5);

    // Causality: changing token t0 leaves every earlier row bit-identical and changes row t0.
    const std::int64_t t0 = 21;
    toks[t0] = (toks[t0] + 3) % V;
    auto c2 = m.make_cache(1);
    const auto changed = run(m, be, c2, 0, toks);
    for (std::int64_t i = 0; i < t0 * V; ++i) REQUIRE(changed[i] == one[i]);
    CHECK(rel_error(changed.data() + t0 * V, one.data() + t0 * V, V) > 1e-3);
}

TEST_CASE("hybrid stack: a batch of two sequences equals separate runs; copy_slot continues identically") {
    cpu_backend be(2);
    const auto m = make<hybrid>(gga_gga, 5);
    const auto a = tokens(19, 1), b = tokens(30, 2);
    auto c = m.make_cache(4);
    const auto ra = run(m, be, c, 0, a), rb = run(m, be, c, 1, b);
    std::vector<std::int32_t> packed(b.begin(), b.end());
    packed.insert(packed.end(), a.begin(), a.end());
    const std::vector<std::int64_t> cu{0, 30, 49}, slots{3, 2};
    const auto batch = seq_batch::packed(cu, slots);
    std::vector<float> both(49 * V);
    m.forward(be, c, batch, packed, tensor_view<float, 2>(both.data(), {49, V}));
    CHECK(rel_error(both.data(), rb.data(), rb.size()) < 1e-5);
    CHECK(rel_error(both.data() + 30 * V, ra.data(), ra.size()) < 1e-5);

    c.copy_slot(2, 1);
    const auto more = tokens(7, 9);
    const auto x1 = run(m, be, c, 1, more), x2 = run(m, be, c, 2, more);
    CHECK(x1 == x2);
}

TEST_CASE("hybrid stack: layers that disagree with the compile-time schedule are rejected") {
    std::vector<layer_kind> wrong = gga_gga;
    std::swap(wrong[1], wrong[2]);  // G A G G G A
    // Worded for a stack built in code as much as for a checkpoint (the loaders prefix config.json's path).
    CHECK_THROWS_WITH_AS(make<hybrid>(wrong, 1),
                         "layer schedule interval_rule<3, gated_deltanet>: layer 1 is 'attention', expected 'gated_deltanet'",
                         config_error);
    const std::vector<layer_kind> runtime_ok = wrong;
    using any = model<any_of<layer_kind::gated_deltanet, layer_kind::attention>, zero_centered_rms_norm, swiglu_mlp,
                      bind<layer_kind::gated_deltanet, gated_deltanet>, bind<layer_kind::attention, attention>>;
    CHECK_NOTHROW(make<any>(runtime_ok, 1));
}
