// random_stack: one call gives a whole model with the schedule's layers, each mixer's own random initialisation,
// N(0, 0.02) embedding / MLPs and neutral norm weights; reproducible from the seed; missing sizes are config errors.
// model::store_weights_as: bf16 / f16 projection weights give, bit for bit, the logits of the f32 model whose weights
// were rounded the same way (prefill and decode, both backends); training and saving refuse them. model::set_kv_dtype:
// bf16 / f16 KV caches of the attention layers give logits within their rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/stack/model.hpp"
#include "hymix/stack/random_stack.hpp"
#include "hymix/train/model_grad.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

constexpr std::int64_t D = 64, V = 50;

using hybrid = model<interval_rule<3>, zero_centered_rms_norm, swiglu_mlp, bind<layer_kind::gated_deltanet, gated_deltanet>,
                     bind<layer_kind::attention, attention>>;
using mamba_pair = model<pattern<"MM">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>>;
using run_time = model<any_of<layer_kind::mamba2, layer_kind::attention>, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>,
                       bind<layer_kind::attention, attention>>;

gated_deltanet_config gdn_cfg(std::int64_t d = D) {
    gated_deltanet_config c;
    c.d_model = d;
    c.n_k_heads = 2;
    c.n_v_heads = 4;
    c.d_k = 16;
    c.d_v = 16;
    c.chunk_size = 8;
    return c;
}
attention_config attn_cfg() {
    attention_config c;
    c.d_model = D;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    return c;
}
mamba2_config mamba_cfg() {
    mamba2_config c;
    c.d_model = D;
    c.n_heads = 8;
    c.head_dim = 16;
    c.d_state = 16;
    c.n_groups = 1;
    c.chunk_size = 8;
    return c;
}

stack_config sizes(bool tied) { return stack_config{.d_model = D, .vocab_size = V, .norm_eps = 1e-6f, .tie_embeddings = tied}; }

template <class Stack>
std::vector<float> logits_of(const Stack& m, std::span<const std::int32_t> ids) {
    const cpu_backend be(1);
    auto c = m.make_cache(1);
    const auto T = static_cast<std::int64_t>(ids.size());
    tensor<float> lg({T, V});
    m.forward(be, c, seq_batch::dense(1, T), ids, lg);  // a tensor where a view is expected
    return {lg.data(), lg.data() + lg.numel()};
}

bool all_equal(const tensor<float>& t, float v) {
    const auto s = t.span();
    return std::all_of(s.begin(), s.end(), [v](float x) { return x == v; });
}

template <class T>  // tensor<float> or linear_weight
double stddev(const T& t) {
    double s = 0, s2 = 0;
    for (float x : t.span()) {
        s += x;
        s2 += double(x) * x;
    }
    const double n = static_cast<double>(t.numel());
    return std::sqrt(s2 / n - (s / n) * (s / n));
}

const std::vector<std::int32_t> ids{3, 17, 42, 0, 49, 8, 8, 21, 30, 11, 5};

/// Logits of a prefill of two sequences (7 and 4 tokens, packed) and of three decode steps after it, concatenated.
template <class Stack, class B>
std::vector<float> prefill_and_decode(const Stack& m, const B& be) {
    auto c = m.make_cache(2);
    const std::vector<std::int64_t> cu{0, 7, 11};
    tensor<float> lg({11, V});
    m.forward(be, c, seq_batch::packed(cu), ids, lg);
    std::vector<float> out(lg.data(), lg.data() + lg.numel());
    const std::vector<std::int64_t> slots{0, 1};
    for (std::int32_t step = 0; step < 3; ++step) {
        const std::vector<std::int32_t> next{static_cast<std::int32_t>(step * 7 % V), static_cast<std::int32_t>(step * 13 % V + 1)};
        tensor<float> ls({2, V});
        m.forward(be, c, seq_batch::decode(slots), next, ls);
        out.insert(out.end(), ls.data(), ls.data() + ls.numel());
    }
    return out;
}

/// The f32 model whose projection weights hold the values `d` stores (rounded to nearest even, widened back).
template <class Stack>
Stack rounded_to(Stack m, dtype d) {
    m.store_weights_as(d);
    m.store_weights_as(dtype::f32);
    return m;
}

/// bf16 and f16 storage: the rounded f32 model's logits bit for bit on `be`; f32 again restores the rounded model.
template <class Stack, class B>
void check_16bit_storage(const Stack& m, const B& be) {
    for (dtype d : {dtype::bf16, dtype::f16}) {
        CAPTURE(weight_dtype_name(d));
        const Stack ref = rounded_to(m, d);
        Stack half = m;
        half.store_weights_as(d);
        CHECK(half.weight_dtype() == d);
        CHECK(half.weights().embedding.storage() == d);
        CHECK(half.weights().embedding.stored_bytes() == static_cast<std::size_t>(V * D) * 2);
        const auto a = prefill_and_decode(ref, be), b = prefill_and_decode(half, be);
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        // The rounding is real: the f32 model's logits differ (bf16 keeps 8 bits of mantissa, f16 11).
        CHECK(prefill_and_decode(m, be) != a);
        half.store_weights_as(dtype::f32);
        CHECK(half.weight_dtype() == dtype::f32);
        CHECK(prefill_and_decode(half, be) == a);
    }
}

}  // namespace

TEST_CASE("random_stack: the schedule's layers, neutral norms, N(0, 0.02) embedding and MLPs, usable logits") {
    const auto m = random_stack<hybrid>(sizes(false), {.n_layers = 6, .d_ff = 96}, {gdn_cfg(), attn_cfg()}, 7);
    REQUIRE(m.n_layers() == 6);
    std::string kinds;
    for (auto k : m.layer_kinds()) kinds += k.code;
    CHECK(kinds == "GGAGGA");
    // Zero-centred RMSNorm: zeros are neutral; the final norm too.
    CHECK(all_equal(m.weights().final_norm, 0.0f));
    for (std::int64_t l = 0; l < m.n_layers(); ++l)
        std::visit([&](const auto& blk) {
            CHECK(all_equal(blk.norm(), 0.0f));
            CHECK(all_equal(blk.mlp_norm(), 0.0f));
            CHECK(blk.mlp().d_ff() == 96);
            CHECK(stddev(blk.mlp().down_proj) == doctest::Approx(0.02).epsilon(0.05));
        }, m.layer_at(l));
    CHECK(stddev(m.weights().embedding) == doctest::Approx(0.02).epsilon(0.05));
    CHECK(stddev(m.weights().lm_head) == doctest::Approx(0.02).epsilon(0.05));
    // The mixers got their own random initialisation (the attention layer's is not the GDN layer's).
    const auto& att = std::get<1>(m.layer_at(2)).mixer();
    CHECK(att.weights().q_proj.numel() == 4 * 16 * D);
    CHECK(att.weights().q_proj.span()[0] != 0.0f);
    // A mixer's forward takes tensors where it takes views, too.
    {
        const cpu_backend be(1);
        auto st = att.make_state(1);
        tensor<float> x({3, D}), y({3, D});
        x.fill(0.5f);
        att.forward(be, st, seq_batch::dense(1, 3), x, y);
        CHECK(std::any_of(y.span().begin(), y.span().end(), [](float v) { return v != 0.0f; }));
    }

    // Logits: finite, not constant, of the size the initialisation implies (|h| ~ sqrt(d), head rows N(0, 0.02)),
    // and different for different tokens.
    const auto lg = logits_of(m, ids);
    REQUIRE(std::all_of(lg.begin(), lg.end(), [](float x) { return std::isfinite(x); }));
    double s2 = 0;
    for (float x : lg) s2 += double(x) * x;
    const double rms = std::sqrt(s2 / static_cast<double>(lg.size()));
    CHECK(rms > 0.02);
    CHECK(rms < 2.0);
    CHECK(!std::equal(lg.begin(), lg.begin() + V, lg.begin() + V));
}

TEST_CASE("random_stack: reproducible from the seed, different across seeds; plain norms are ones; tied head") {
    const auto a = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 11);  // pattern<"MM"> fixes the count
    const auto b = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 11);
    const auto c = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 12);
    CHECK(a.n_layers() == 2);
    CHECK(all_equal(a.weights().final_norm, 1.0f));
    CHECK(all_equal(std::get<0>(a.layer_at(1)).norm(), 1.0f));
    CHECK(a.weights().lm_head.rank() == 0);  // tied: no separate head
    // Layers draw from different streams.
    CHECK(std::get<0>(a.layer_at(0)).mixer().weights().in_proj.span()[0] !=
          std::get<0>(a.layer_at(1)).mixer().weights().in_proj.span()[0]);
    const auto la = logits_of(a, ids), lb = logits_of(b, ids), lc = logits_of(c, ids);
    CHECK(la == lb);
    CHECK(la != lc);
}

TEST_CASE("random_stack: per-layer kinds for run-time schedules; missing sizes and wrong configs are config errors") {
    const auto r = random_stack<run_time>(sizes(false), {.kinds = {layer_kind::attention, layer_kind::mamba2, layer_kind::mamba2}},
                                          {mamba_cfg(), attn_cfg()}, 3);
    CHECK(r.layer_kinds() == std::vector<layer_kind>{layer_kind::attention, layer_kind::mamba2, layer_kind::mamba2});
    CHECK(std::isfinite(logits_of(r, ids).back()));

    CHECK_THROWS_WITH_AS(random_stack<run_time>(sizes(false), {.n_layers = 3}, {mamba_cfg(), attn_cfg()}, 3),
                         doctest::Contains("is decided at run time; give every layer's kind in layer_plan.kinds"), config_error);
    CHECK_THROWS_WITH_AS(random_stack<hybrid>(sizes(false), {.d_ff = 96}, {gdn_cfg(), attn_cfg()}, 3),
                         doctest::Contains("interval_rule<3, gated_deltanet> does not fix the number of layers; set layer_plan.n_layers"),
                         config_error);
    CHECK_THROWS_WITH_AS(random_stack<hybrid>(sizes(false), {.n_layers = 3}, {gdn_cfg(), attn_cfg()}, 3),
                         doctest::Contains("layer_plan.d_ff must be positive, found 0"), config_error);
    CHECK_THROWS_WITH_AS(random_stack<mamba_pair>(sizes(false), {.n_layers = 3}, {mamba_cfg()}, 3),
                         doctest::Contains("expected 2 layers, asked for 3"), config_error);
    CHECK_THROWS_WITH_AS(random_stack<run_time>(sizes(false), {.n_layers = 2, .kinds = {layer_kind::mamba2}}, {mamba_cfg(), attn_cfg()}, 3),
                         doctest::Contains("layer_plan.n_layers is 2 but layer_plan.kinds has 1 entries"), config_error);
    // Kinds given for a static schedule are checked against it, without mentioning a checkpoint.
    CHECK_THROWS_WITH_AS(random_stack<hybrid>(sizes(false), {.d_ff = 96, .kinds = {layer_kind::gated_deltanet, layer_kind::attention}},
                                              {gdn_cfg(), attn_cfg()}, 3),
                         "layer schedule interval_rule<3, gated_deltanet>: layer 1 is 'attention', expected 'gated_deltanet'", config_error);
    CHECK_THROWS_WITH_AS(random_stack<run_time>(sizes(false), {.kinds = {layer_kind::gated_deltanet}}, {mamba_cfg(), attn_cfg()}, 3),
                         doctest::Contains("layer 0 is 'gated_deltanet', a kind the stack binds to no block or mixer"), config_error);
    // A mixer config of another width: the model names the first layer that uses it.
    CHECK_THROWS_WITH_AS(random_stack<hybrid>(sizes(false), {.n_layers = 3, .d_ff = 96}, {gdn_cfg(96), attn_cfg()}, 3),
                         "layers.0: the mixer's d_model is 96, the stack's is 64", config_error);
}

TEST_CASE("store_weights_as: bf16 and f16 projections give the rounded f32 model's logits bit for bit, prefill and decode") {
    // GDN + attention with SwiGLU MLPs and an untied head; Mamba-2 + attention without MLPs; a tied Mamba-2 pair.
    const auto h = random_stack<hybrid>(sizes(false), {.n_layers = 3, .d_ff = 96}, {gdn_cfg(), attn_cfg()}, 21);
    const auto r = random_stack<run_time>(sizes(false), {.kinds = {layer_kind::mamba2, layer_kind::attention}}, {mamba_cfg(), attn_cfg()}, 22);
    const auto t = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 23);
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        const cpu_backend be(threads);
        check_16bit_storage(h, be);
        check_16bit_storage(r, be);
        check_16bit_storage(t, be);
    }
    check_16bit_storage(t, reference_backend{});

    // Every projection is 16-bit; norms and the convolution stay fp32.
    auto half = h;
    half.store_weights_as(dtype::bf16);
    std::size_t n16 = 0, n32 = 0;
    half.for_each_param([&](const std::string& name, auto& w) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(w)>, linear_weight>) {
            CAPTURE(name);
            CHECK(w.storage() == dtype::bf16);
            ++n16;
        } else {
            ++n32;
        }
    });
    // Layers G, G, A: 2 × 5 GDN projections, 4 attention projections, 3 × 3 MLP projections, embedding and head.
    CHECK(n16 == 2 * 5 + 4 + 3 * 3 + 2);
    CHECK(n32 > 0);

    // fp32 access to a 16-bit weight, training and saving are refused with the reason.
    CHECK_THROWS_WITH_AS((void)half.weights().embedding.data(), doctest::Contains("stored as bf16 for inference"), value_error);
    CHECK_THROWS_WITH_AS((void)train::zeros_like(half), doctest::Contains("zeros_like: the model stores its projection weights as bf16"),
                         config_error);
    CHECK_THROWS_AS(half.store_weights_as(dtype::f64), config_error);

    // A value beyond f16's range is named, and nothing is lost: the model still runs as it was.
    auto big = t;
    big.weights_mut().embedding.span()[5] = 1.0e5f;
    const auto before = prefill_and_decode(big, cpu_backend(1));
    CHECK_THROWS_WITH_AS(big.store_weights_as(dtype::f16), doctest::Contains("embedding: value 100000.000000 at [0, 5] overflows f16"),
                         value_error);
    CHECK(big.weights().embedding.storage() == dtype::f32);
    CHECK(prefill_and_decode(big, cpu_backend(1)) == before);
}

TEST_CASE("store_weights_as(i8): per-row 8-bit projections give the dequantized f32 model's logits to fp32 rounding, prefill and decode") {
    const auto h = random_stack<hybrid>(sizes(false), {.n_layers = 3, .d_ff = 96}, {gdn_cfg(), attn_cfg()}, 31);
    const auto r = random_stack<run_time>(sizes(false), {.kinds = {layer_kind::mamba2, layer_kind::attention}}, {mamba_cfg(), attn_cfg()}, 32);
    const auto t = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 33);
    auto check = [](const auto& m, const auto& be) {
        using Stack = std::remove_cvref_t<decltype(m)>;
        const Stack deq = rounded_to(m, dtype::i8);  // f32 weights holding scale · q
        Stack q8 = m;
        q8.store_weights_as(dtype::i8);
        CHECK(q8.weight_dtype() == dtype::i8);
        CHECK(q8.weights().embedding.stored_bytes() == static_cast<std::size_t>(V * D + V * 4));
        CHECK(q8.weight_bytes() < m.weight_bytes() / 2);
        const auto a = prefill_and_decode(deq, be), b = prefill_and_decode(q8, be), f = prefill_and_decode(m, be);
        REQUIRE(a.size() == b.size());
        double amax = 0, diff = 0, qerr = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
            amax = std::max(amax, std::abs(double(a[i])));
            diff = std::max(diff, std::abs(double(a[i]) - b[i]));
            qerr = std::max(qerr, std::abs(double(a[i]) - f[i]));
        }
        CHECK(diff <= 1e-5 * amax);  // the same model, summed in another order (scale once per output)
        CHECK(qerr > 10 * diff);     // the quantization is real and larger than that rounding
        // Batch invariance and thread independence hold as for f32 weights.
        CHECK(prefill_and_decode(q8, cpu_backend(1)) == prefill_and_decode(q8, cpu_backend(2)));
        // f32 again gives the dequantized model exactly.
        q8.store_weights_as(dtype::f32);
        CHECK(prefill_and_decode(q8, be) == a);
    };
    check(h, cpu_backend(2));
    check(r, cpu_backend(2));
    check(t, cpu_backend(1));
    check(t, reference_backend{});

    // A NaN in a weight cannot be quantized: named, and the model is left as it was (every weight checked first).
    auto bad = h;
    bad.weights_mut().lm_head.span()[7] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(bad.store_weights_as(dtype::i8), doctest::Contains("lm_head: value nan at [0, 7] cannot be quantized to i8"),
                         value_error);
    CHECK(bad.weight_dtype() == dtype::f32);
}

TEST_CASE("set_kv_dtype: the attention layers' caches in bf16 / f16 give logits within their rounding; other stacks and dtypes") {
    const auto h = random_stack<hybrid>(sizes(false), {.n_layers = 3, .d_ff = 96}, {gdn_cfg(), attn_cfg()}, 31);
    const cpu_backend be(2);
    const auto f32_logits = prefill_and_decode(h, be);
    for (dtype t : {dtype::bf16, dtype::f16}) {
        CAPTURE(static_cast<int>(t));
        auto m = h;
        CHECK(m.set_kv_dtype(t) == 1);  // layers G, G, A: one attention layer
        const auto c = m.make_cache(1);
        CHECK(std::get<attention_state>(c.layer_state(2)).kv_dtype() == t);
        const auto a = prefill_and_decode(m, be);
        CHECK(test::rel_error(a, f32_logits) < (t == dtype::bf16 ? 1e-2 : 2e-3));
        CHECK(a != f32_logits);                              // the rounding is real
        CHECK(prefill_and_decode(m, reference_backend{}).size() == a.size());
        CHECK(test::rel_error(prefill_and_decode(m, reference_backend{}), a) < 1e-5);  // both backends round the same values
        m.set_kv_dtype(dtype::f32);
        CHECK(prefill_and_decode(m, be) == f32_logits);
    }
    auto m = h;
    CHECK_THROWS_AS(m.set_kv_dtype(dtype::i8), config_error);
    auto t = random_stack<mamba_pair>(sizes(true), {}, {mamba_cfg()}, 32);
    CHECK(t.set_kv_dtype(dtype::bf16) == 0);  // no attention layer
}
