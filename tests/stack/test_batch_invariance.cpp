// Batch invariance of a whole model (issue 11, item 4): one sequence's logits are bit-identical when it runs
// alone, or inside a batch of 2, 7 or 64 other random sequences laid out dense, packed (cu_seqlens) or right-padded,
// for the prefill and for the decode step that follows, on 1 or 2 threads. The stack mixes all three mixer kinds
// (Mamba-2, Gated DeltaNet, attention) with SwiGLU MLPs, so every op of a forward pass takes part.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/stack/model.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

constexpr std::int64_t D = 48, V = 41, F = 56;

using any_stack = model<any_of<layer_kind::mamba2, layer_kind::gated_deltanet, layer_kind::attention>, zero_centered_rms_norm,
                        swiglu_mlp, bind<layer_kind::mamba2, mamba2>, bind<layer_kind::gated_deltanet, gated_deltanet>,
                        bind<layer_kind::attention, attention>>;

tensor<float> rnd(std::vector<std::int64_t> shape, float lo, float hi, std::uint64_t seed) {
    tensor<float> t(std::move(shape));
    auto v = test::uniform(static_cast<std::size_t>(t.numel()), lo, hi, seed);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

mamba2_config mamba_cfg() {
    mamba2_config c;
    c.d_model = D;
    c.n_heads = 6;
    c.head_dim = 16;
    c.d_state = 8;
    c.n_groups = 2;
    c.d_conv = 4;
    c.chunk_size = 16;
    c.expand = 2;
    return c;
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
    c.rope.partial_rotary_factor = 0.5;
    return c;
}

/// M G A G M A with random weights; mixer outputs scaled up so every layer visibly changes the logits.
any_stack make_model(std::uint64_t seed) {
    const std::vector<layer_kind> kinds{layer_kind::mamba2, layer_kind::gated_deltanet, layer_kind::attention,
                                        layer_kind::gated_deltanet, layer_kind::mamba2, layer_kind::attention};
    stack_weights w;
    w.embedding = rnd({V, D}, -1.f, 1.f, seed);
    w.final_norm = rnd({D}, -0.3f, 0.3f, seed + 1);
    w.lm_head = rnd({V, D}, -0.3f, 0.3f, seed + 2);
    std::vector<any_stack::layer> layers;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        const std::uint64_t s = seed + 100 * (i + 1);
        swiglu_weights mlp;
        mlp.gate_proj = rnd({F, D}, -0.2f, 0.2f, s + 1);
        mlp.up_proj = rnd({F, D}, -0.2f, 0.2f, s + 2);
        mlp.down_proj = rnd({D, F}, -0.2f, 0.2f, s + 3);
        auto mx = [&]() -> any_stack::mixer_variant {
            if (kinds[i] == layer_kind::mamba2) {
                auto mw = mamba2_weights::random(mamba_cfg(), s + 4);
                for (auto& x : mw.out_proj.span()) x *= 10.f;
                return any_stack::mixer_variant(std::in_place_type<mamba2>, mamba_cfg(), std::move(mw));
            }
            if (kinds[i] == layer_kind::gated_deltanet) {
                auto gw = gated_deltanet_weights::random(gdn_cfg(), s + 5);
                for (auto& x : gw.out_proj.span()) x *= 20.f;
                return any_stack::mixer_variant(std::in_place_type<gated_deltanet>, gdn_cfg(), std::move(gw));
            }
            return any_stack::mixer_variant(std::in_place_type<attention>, attn_cfg(), attention_weights::random(attn_cfg(), s + 6));
        }();
        layers.emplace_back(rnd({D}, -0.3f, 0.3f, s + 7), std::move(mx), rnd({D}, -0.3f, 0.3f, s + 8), std::move(mlp));
    }
    return any_stack(stack_config{D, V, 1e-6f, false}, std::move(w), std::move(layers));
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int> d(0, V - 1);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = d(g);
    return t;
}

enum class layout { dense, packed, padded };
const char* name(layout l) { return l == layout::dense ? "dense" : l == layout::packed ? "packed" : "padded"; }

/// One prefill of B sequences and one decode step after it, in one layout; returns the target sequence's prefill
/// logits [T, V] and decode logits [V], concatenated. The target is sequence `target` (slot `target`); the others
/// are random, of length T (dense) or of lengths 1 … other_max (packed, padded: so the target starts at other rows).
std::vector<float> run_batch(const any_stack& m, const cpu_backend& be, layout lay, std::int64_t B, std::int64_t target,
                             const std::vector<std::int32_t>& seq, std::int32_t next, std::uint64_t seed, std::int64_t other_max) {
    const auto T = static_cast<std::int64_t>(seq.size());
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(B), T);
    if (lay != layout::dense)
        for (std::int64_t b = 0; b < B; ++b)
            if (b != target) lengths[static_cast<std::size_t>(b)] = 1 + (b * 7 + static_cast<std::int64_t>(seed)) % other_max;
    const std::int64_t T_pad = *std::max_element(lengths.begin(), lengths.end()) + 2;  // padded rows hold ≥ 2 pad rows

    std::vector<std::int64_t> starts(static_cast<std::size_t>(B));
    std::int64_t n_rows = 0;
    for (std::int64_t b = 0; b < B; ++b) {
        starts[static_cast<std::size_t>(b)] = lay == layout::padded ? b * T_pad : n_rows;
        n_rows += lay == layout::padded ? T_pad : lengths[static_cast<std::size_t>(b)];
    }
    std::vector<std::int32_t> toks(static_cast<std::size_t>(n_rows), 0);
    for (std::int64_t b = 0; b < B; ++b) {
        const auto s = b == target ? seq : tokens(static_cast<std::size_t>(lengths[static_cast<std::size_t>(b)]), seed + 10 + static_cast<std::uint64_t>(b));
        std::copy(s.begin(), s.end(), toks.begin() + starts[static_cast<std::size_t>(b)]);
    }
    std::vector<std::int64_t> cu{0};
    for (auto l : lengths) cu.push_back(cu.back() + l);
    const seq_batch prefill = lay == layout::dense    ? seq_batch::dense(B, T)
                              : lay == layout::packed ? seq_batch::packed(cu)
                                                      : seq_batch::padded(T_pad, lengths);

    auto cache = m.make_cache(B);
    std::vector<float> logits(static_cast<std::size_t>(n_rows * V));
    m.forward(be, cache, prefill, toks, tensor_view<float, 2>(logits.data(), {n_rows, V}));
    const auto t0 = logits.begin() + starts[static_cast<std::size_t>(target)] * V;
    std::vector<float> out(t0, t0 + T * V);

    // Decode step: one token per sequence; padded puts each in a row of 3 (two pad rows after it).
    const std::int64_t rows_per = lay == layout::padded ? 3 : 1;
    std::vector<std::int32_t> step_toks(static_cast<std::size_t>(B * rows_per), 0);
    const auto nt = tokens(static_cast<std::size_t>(B), seed + 5);
    for (std::int64_t b = 0; b < B; ++b)
        step_toks[static_cast<std::size_t>(b * rows_per)] = b == target ? next : nt[static_cast<std::size_t>(b)];
    std::vector<std::int64_t> slots(static_cast<std::size_t>(B)), ones(static_cast<std::size_t>(B), 1), cu1{0};
    for (std::int64_t b = 0; b < B; ++b) slots[static_cast<std::size_t>(b)] = b, cu1.push_back(b + 1);
    const seq_batch step = lay == layout::dense    ? seq_batch::decode(slots)
                           : lay == layout::packed ? seq_batch::packed(cu1)
                                                   : seq_batch::padded(rows_per, ones);
    std::vector<float> step_logits(static_cast<std::size_t>(B * rows_per * V));
    m.forward(be, cache, step, step_toks, tensor_view<float, 2>(step_logits.data(), {B * rows_per, V}));
    const auto s0 = step_logits.begin() + target * rows_per * V;
    out.insert(out.end(), s0, s0 + V);
    return out;
}

std::int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) n += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
    return n;
}

}  // namespace

TEST_CASE("a sequence's logits are bit-identical alone and in batches of 2, 7 and 64, dense, packed and padded") {
    const auto m = make_model(11);
    const std::int64_t T = 37;  // several Mamba-2 and GDN chunks, the last one partial
    const auto seq = tokens(T, 3);
    const std::int32_t next = 17;
    const cpu_backend one(1), two(2);
    const auto alone = run_batch(m, one, layout::dense, 1, 0, seq, next, 1, T);
    REQUIRE(alone.size() == static_cast<std::size_t>((T + 1) * V));
    // The decode step's logits depend on the prefill (not a constant), so the comparison below can fail.
    CHECK(std::any_of(alone.end() - V, alone.end(), [&](float v) { return v != alone[static_cast<std::size_t>(T - 1) * V]; }));

    for (layout lay : {layout::dense, layout::packed, layout::padded})
        for (std::int64_t B : {1, 2, 7, 64})
            for (const cpu_backend* be : {&one, &two}) {
                const std::int64_t target = B == 1 ? 0 : (B == 7 ? 3 : B - 1);
                const auto got = run_batch(m, *be, lay, B, target, seq, next, static_cast<std::uint64_t>(B * 31 + 7), T + 3);
                CAPTURE(name(lay));
                CAPTURE(B);
                CAPTURE(be->num_threads());
                REQUIRE(got.size() == alone.size());
                const std::vector<float> pre_a(alone.begin(), alone.end() - V), pre_g(got.begin(), got.end() - V);
                const std::vector<float> dec_a(alone.end() - V, alone.end()), dec_g(got.end() - V, got.end());
                CHECK(bit_mismatches(pre_g, pre_a) == 0);
                CHECK(bit_mismatches(dec_g, dec_a) == 0);
            }
}

// Decode over more than 2048 cached keys splits each sequence's key range into blocks (kernels/attention.hpp); the
// blocks must depend on the sequence alone, not on the thread count or on how many other sequences share the step.
TEST_CASE("a long sequence's logits are bit-identical alone and beside short sequences (attention decode splits)") {
    const auto m = make_model(12);
    const std::int64_t T = 2100;
    const auto seq = tokens(T, 4);
    const std::int32_t next = 5;
    const cpu_backend one(1), two(2);
    const auto alone = run_batch(m, one, layout::dense, 1, 0, seq, next, 1, T);
    for (const cpu_backend* be : {&one, &two}) {
        for (layout lay : {layout::packed, layout::padded}) {
            const auto got = run_batch(m, *be, lay, 7, 2, seq, next, 3, 40);
            CAPTURE(name(lay));
            CAPTURE(be->num_threads());
            CHECK(bit_mismatches(got, alone) == 0);
        }
        CAPTURE(be->num_threads());
        CHECK(bit_mismatches(run_batch(m, *be, layout::dense, 2, 1, seq, next, 9, T), alone) == 0);
    }
}

// A one-token continuation (or a fresh one-token sequence) sharing a call with prefilling sequences must get the
// bits it gets in a decode step: the chunked / tiled kernels give one-token sequences the decode step's arithmetic.
// Checked on the logits of that call and, through the state it leaves, on the decode step after it.
TEST_CASE("a one-token sequence beside prefilling sequences gets its decode-step logits, and the same state") {
    const auto m = make_model(13);
    const std::int64_t T = 37;
    const auto seq = tokens(T, 6);
    const std::int32_t next = 9, after = 30;
    const cpu_backend one(1), two(2);

    // Slot 0: the target, prefilled alone, then two decode steps alone (the reference bits).
    auto run_alone = [&](std::vector<float>& step1, std::vector<float>& step2) {
        auto cache = m.make_cache(4);
        std::vector<float> lg(static_cast<std::size_t>(T * V));
        m.forward(one, cache, seq_batch::dense(1, T), seq, tensor_view<float, 2>(lg.data(), {T, V}));
        step1.assign(static_cast<std::size_t>(V), 0.f);
        step2.assign(static_cast<std::size_t>(V), 0.f);
        const std::vector<std::int64_t> s0{0};
        m.forward(one, cache, seq_batch::decode(s0), std::vector<std::int32_t>{next}, tensor_view<float, 2>(step1.data(), {1, V}));
        m.forward(one, cache, seq_batch::decode(s0), std::vector<std::int32_t>{after}, tensor_view<float, 2>(step2.data(), {1, V}));
    };
    std::vector<float> ref1, ref2;
    run_alone(ref1, ref2);
    // A fresh one-token sequence: alone it is a decode batch.
    std::vector<float> fresh_ref(static_cast<std::size_t>(V));
    {
        auto cache = m.make_cache(1);
        m.forward(one, cache, seq_batch::dense(1, 1), std::vector<std::int32_t>{next}, tensor_view<float, 2>(fresh_ref.data(), {1, V}));
    }

    for (const cpu_backend* be : {&one, &two})
        for (bool padded : {false, true}) {
            CAPTURE(be->num_threads());
            CAPTURE(padded);
            auto cache = m.make_cache(4);
            std::vector<float> lg(static_cast<std::size_t>(T * V));
            m.forward(*be, cache, seq_batch::dense(1, T), seq, tensor_view<float, 2>(lg.data(), {T, V}));
            // Mixed call: slot 1 prefills 21 tokens, slot 0 continues by one, slot 2 prefills 5, slot 3 starts with one.
            const std::vector<std::int64_t> lens{21, 1, 5, 1}, slots{1, 0, 2, 3};
            seq_batch b;
            std::int64_t row = 0;
            for (std::size_t i = 0; i < lens.size(); ++i) {
                b.add(row, lens[i], slots[i]);
                row += lens[i] + (padded ? 2 : 0);
            }
            b.n_rows = row;
            std::vector<std::int32_t> toks(static_cast<std::size_t>(row), 0);
            const auto o1 = tokens(21, 40), o2 = tokens(5, 41);
            std::copy(o1.begin(), o1.end(), toks.begin() + b.starts[0]);
            toks[static_cast<std::size_t>(b.starts[1])] = next;
            std::copy(o2.begin(), o2.end(), toks.begin() + b.starts[2]);
            toks[static_cast<std::size_t>(b.starts[3])] = next;
            std::vector<float> mixed(static_cast<std::size_t>(row * V));
            m.forward(*be, cache, b, toks, tensor_view<float, 2>(mixed.data(), {row, V}));
            const auto at = [&](std::int64_t r) { return std::vector<float>(mixed.begin() + r * V, mixed.begin() + (r + 1) * V); };
            CHECK(bit_mismatches(at(b.starts[1]), ref1) == 0);
            CHECK(bit_mismatches(at(b.starts[3]), fresh_ref) == 0);
            // The state the mixed call left in slot 0 gives the reference's next step.
            std::vector<float> s2(static_cast<std::size_t>(V));
            const std::vector<std::int64_t> s0{0};
            m.forward(*be, cache, seq_batch::decode(s0), std::vector<std::int32_t>{after}, tensor_view<float, 2>(s2.data(), {1, V}));
            CHECK(bit_mismatches(s2, ref2) == 0);
        }
}
