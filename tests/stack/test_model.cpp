// Stacks built in code from random weights (no files): fast stack vs an fp64 token-by-token reference, causality,
// split invariance, batching, slot copy, forward_last, allocation-free decode workspace, bad inputs, SwiGLU.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/stack/model.hpp"
#include "support/random.hpp"

using namespace hymix;
using test::rel_error;

namespace {

using mamba_stack = model<every_layer<layer_kind::mamba2>, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>>;
using mamba_mlp_stack = model<every_layer<layer_kind::mamba2>, zero_centered_rms_norm, swiglu_mlp, bind<layer_kind::mamba2, mamba2>>;

tensor<float> random_tensor(std::vector<std::int64_t> shape, float lo, float hi, std::uint64_t seed) {
    tensor<float> t(std::move(shape));
    auto v = test::uniform(static_cast<std::size_t>(t.numel()), lo, hi, seed);
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

mamba2_config small_mamba_cfg(std::int64_t d) {
    mamba2_config c;
    c.d_model = d;
    c.n_heads = 4;
    c.head_dim = 16;
    c.d_state = 8;
    c.n_groups = 2;
    c.d_conv = 4;
    c.chunk_size = 16;
    c.expand = 2;
    return c;
}

constexpr std::int64_t D = 32, V = 37;

template <class Stack>
Stack make_stack(std::int64_t n_layers, bool tied, std::uint64_t seed) {
    stack_config sc{D, V, 1e-5f, tied};
    stack_weights w;
    w.embedding = random_tensor({V, D}, -1.f, 1.f, seed);
    w.final_norm = random_tensor({D}, 0.5f, 1.5f, seed + 1);
    if (!tied) w.lm_head = random_tensor({V, D}, -0.3f, 0.3f, seed + 2);
    std::vector<typename Stack::layer> layers;
    for (std::int64_t l = 0; l < n_layers; ++l) {
        const auto mc = small_mamba_cfg(D);
        typename Stack::layer L{random_tensor({D}, 0.5f, 1.5f, seed + 10 + l),
                                typename Stack::mixer_variant(std::in_place_type<mamba2>, mc, mamba2_weights::random(mc, seed + 20 + l))};
        if constexpr (Stack::mlp_type::present) {
            L.mlp_norm = random_tensor({D}, -0.5f, 0.5f, seed + 30 + l);
            L.mlp.gate_proj = random_tensor({48, D}, -0.2f, 0.2f, seed + 40 + l);
            L.mlp.up_proj = random_tensor({48, D}, -0.2f, 0.2f, seed + 50 + l);
            L.mlp.down_proj = random_tensor({D, 48}, -0.2f, 0.2f, seed + 60 + l);
        }
        layers.push_back(std::move(L));
    }
    return Stack(sc, std::move(w), std::move(layers));
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int> d(0, V - 1);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = d(g);
    return t;
}

/// fp64 reference of a Mamba-2 stack for one sequence, token by token: rms norms, mamba2_reference per layer,
/// optional SwiGLU, final norm, LM head. Returns logits [T, V].
template <class Stack>
std::vector<double> stack_reference(const Stack& m, std::span<const std::int32_t> toks) {
    const std::int64_t T = static_cast<std::int64_t>(toks.size());
    const auto& cfg = m.config();
    const bool zc = Stack::norm_type::flavor == kernels::rms_flavor::zero_centered;
    auto norm = [&](const std::vector<double>& x, const tensor<float>& w) {
        std::vector<double> y(x.size());
        for (std::int64_t t = 0; t < T; ++t) {
            double ss = 0;
            for (std::int64_t i = 0; i < D; ++i) ss += x[t * D + i] * x[t * D + i];
            const double r = 1.0 / std::sqrt(ss / D + cfg.norm_eps);
            for (std::int64_t i = 0; i < D; ++i) y[t * D + i] = ((zc ? 1.0 : 0.0) + w[i]) * x[t * D + i] * r;
        }
        return y;
    };
    std::vector<double> x(static_cast<std::size_t>(T * D));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < D; ++i) x[t * D + i] = m.weights().embedding[toks[t] * D + i];
    for (std::int64_t l = 0; l < m.n_layers(); ++l) {
        const auto& L = std::get<0>(m.layer_at(l));
        const auto& mx = L.mixer();
        mamba2_ref_state st(mx.config());
        auto h = norm(x, L.norm());
        auto y = mamba2_reference(mx.config(), mx.weights(), h, T, st);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
        if constexpr (Stack::mlp_type::present) {
            auto h2 = norm(x, L.mlp_norm());
            std::vector<double> y2(x.size());
            kernels::swiglu_ref(L.mlp(), tensor_view<const double, 2>(h2.data(), {T, D}), tensor_view<double, 2>(y2.data(), {T, D}));
            for (std::size_t i = 0; i < x.size(); ++i) x[i] += y2[i];
        }
    }
    auto h = norm(x, m.weights().final_norm);
    const auto& head = cfg.tie_embeddings ? m.weights().embedding : m.weights().lm_head;
    std::vector<double> logits(static_cast<std::size_t>(T * V));
    for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t v = 0; v < V; ++v) {
            double s = 0;
            for (std::int64_t i = 0; i < D; ++i) s += double(head[v * D + i]) * h[t * D + i];
            logits[t * V + v] = s;
        }
    return logits;
}

template <class Stack>
std::vector<float> run_dense(const Stack& m, const cpu_backend& be, std::span<const std::int32_t> toks) {
    auto c = m.make_cache(1);
    const auto T = static_cast<std::int64_t>(toks.size());
    std::vector<float> lg(static_cast<std::size_t>(T * V));
    m.forward(be, c, seq_batch::dense(1, T), toks, tensor_view<float, 2>(lg.data(), {T, V}));
    return lg;
}

}  // namespace

TEST_CASE_TEMPLATE("stack equals the fp64 reference, one call and split and token by token", Stack, mamba_stack, mamba_mlp_stack) {
    cpu_backend be(2);
    const auto m = make_stack<Stack>(3, std::is_same_v<Stack, mamba_stack>, 11);
    const std::int64_t T = 45;
    const auto toks = random_tokens(T, 3);
    const auto ref = stack_reference(m, toks);
    const auto one = run_dense(m, be, toks);
    CHECK(rel_error(one, ref) < 1e-5);

    // 17 + 1 + 27 with one cache.
    auto c = m.make_cache(2);
    std::vector<float> split(one.size());
    std::int64_t pos = 0;
    for (std::int64_t len : {17, 1, 27}) {
        seq_batch b;
        b.add(0, len, 1);
        b.n_rows = len;
        m.forward(be, c, b, std::span(toks).subspan(pos, len), tensor_view<float, 2>(split.data() + pos * V, {len, V}));
        pos += len;
    }
    CHECK(rel_error(split, one) < 1e-5);

    // Token by token through the decode path; the workspace stops growing after the first step.
    c.reset_slot(1);
    std::vector<float> steps(one.size());
    std::int64_t cap = -1;
    const std::vector<std::int64_t> slot{1};
    for (std::int64_t t = 0; t < T; ++t) {
        m.forward(be, c, seq_batch::decode(slot), std::span(toks).subspan(t, 1), tensor_view<float, 2>(steps.data() + t * V, {1, V}));
        if (t == 1) cap = c.workspace().capacity();
        if (t > 1) CHECK(c.workspace().capacity() == cap);
    }
    CHECK(rel_error(steps, one) < 1e-5);
}

TEST_CASE("stack causality: changing token t0 never changes logits before t0") {
    cpu_backend be(2);
    const auto m = make_stack<mamba_mlp_stack>(2, false, 5);
    const std::int64_t T = 40, t0 = 23;
    auto toks = random_tokens(T, 9);
    const auto a = run_dense(m, be, toks);
    toks[t0] = (toks[t0] + 5) % V;
    const auto b = run_dense(m, be, toks);
    for (std::int64_t i = 0; i < t0 * V; ++i) REQUIRE(a[i] == b[i]);
    double diff = 0;
    for (std::int64_t i = t0 * V; i < (t0 + 1) * V; ++i) diff += std::abs(a[i] - b[i]);
    CHECK(diff > 0);
}

TEST_CASE("stack batches: packed sequences equal separate runs; padding and invalid slots give zeros") {
    cpu_backend be(2);
    const auto m = make_stack<mamba_mlp_stack>(2, false, 7);
    const auto s0 = random_tokens(13, 1), s1 = random_tokens(21, 2);
    const auto r0 = run_dense(m, be, s0), r1 = run_dense(m, be, s1);
    // rows: [s1 (21) | pad (2) | s0 (13) | invalid (3)]
    std::vector<std::int32_t> toks(39, 0);
    std::copy(s1.begin(), s1.end(), toks.begin());
    std::copy(s0.begin(), s0.end(), toks.begin() + 23);
    toks[21] = 999;  // padding rows are never read
    seq_batch b;
    b.add(0, 21, 3);
    b.add(23, 13, 0);
    b.add(36, 3, -1);
    b.n_rows = 39;
    auto c = m.make_cache(4);
    std::vector<float> lg(39 * V, 7.f);
    m.forward(be, c, b, toks, tensor_view<float, 2>(lg.data(), {39, V}));
    CHECK(rel_error(lg.data(), r1.data(), r1.size()) < 1e-5);
    CHECK(rel_error(lg.data() + 23 * V, r0.data(), r0.size()) < 1e-5);
    for (std::int64_t i = 21 * V; i < 23 * V; ++i) REQUIRE(lg[i] == 0.f);
    for (std::int64_t i = 36 * V; i < 39 * V; ++i) REQUIRE(lg[i] == 0.f);

    // forward_last on the same batch in a fresh cache: the last row of each sequence, zeros for the invalid one.
    auto c2 = m.make_cache(4);
    std::vector<float> last(3 * V, 7.f);
    m.forward_last(be, c2, b, toks, tensor_view<float, 2>(last.data(), {3, V}));
    CHECK(rel_error(last.data(), r1.data() + 20 * V, V) < 1e-5);
    CHECK(rel_error(last.data() + V, r0.data() + 12 * V, V) < 1e-5);
    for (std::int64_t i = 2 * V; i < 3 * V; ++i) REQUIRE(last[i] == 0.f);

    // Then a batched decode step of both sequences (slots 3 and 0) equals continuing each alone.
    const std::vector<std::int64_t> slots{0, 3};
    const std::vector<std::int32_t> next{4, 9};
    std::vector<float> step(2 * V);
    m.forward(be, c, seq_batch::decode(slots), next, tensor_view<float, 2>(step.data(), {2, V}));
    auto e0 = s0;
    e0.push_back(4);
    auto e1 = s1;
    e1.push_back(9);
    const auto f0 = run_dense(m, be, e0), f1 = run_dense(m, be, e1);
    CHECK(rel_error(step.data(), f0.data() + 13 * V, V) < 1e-5);
    CHECK(rel_error(step.data() + V, f1.data() + 21 * V, V) < 1e-5);
}

TEST_CASE("copy_slot then continue equals continuing the original; reset_slot starts afresh") {
    cpu_backend be(1);
    const auto m = make_stack<mamba_stack>(2, true, 13);
    const auto prompt = random_tokens(30, 4), cont = random_tokens(9, 5);
    auto c = m.make_cache(3);
    std::vector<float> scratch(30 * V);
    seq_batch b;
    b.add(0, 30, 0);
    b.n_rows = 30;
    m.forward(be, c, b, prompt, tensor_view<float, 2>(scratch.data(), {30, V}));
    c.copy_slot(0, 2);
    auto cont_in = [&](std::int64_t slot) {
        seq_batch s;
        s.add(0, 9, slot);
        s.n_rows = 9;
        std::vector<float> out(9 * V);
        m.forward(be, c, s, cont, tensor_view<float, 2>(out.data(), {9, V}));
        return out;
    };
    const auto from_copy = cont_in(2);
    const auto from_orig = cont_in(0);
    for (std::size_t i = 0; i < from_copy.size(); ++i) REQUIRE(from_copy[i] == from_orig[i]);
    c.reset_slot(2);
    const auto fresh = cont_in(2);
    CHECK(rel_error(fresh, run_dense(m, be, cont)) < 1e-6);
    CHECK_THROWS_AS(c.copy_slot(0, 3), shape_error);
}

TEST_CASE("stack bad inputs") {
    cpu_backend be(1);
    const auto m = make_stack<mamba_stack>(1, false, 17);
    auto c = m.make_cache(1);
    std::vector<float> lg(4 * V);
    std::vector<std::int32_t> toks{1, 2, V, 3};
    try {
        m.forward(be, c, seq_batch::dense(1, 4), toks, tensor_view<float, 2>(lg.data(), {4, V}));
        FAIL("expected value_error");
    } catch (const value_error& e) {
        CHECK(std::string(e.what()).find("token id 37 at row 2") != std::string::npos);
    }
    toks[2] = -1;
    CHECK_THROWS_AS(m.forward(be, c, seq_batch::dense(1, 4), toks, tensor_view<float, 2>(lg.data(), {4, V})), value_error);
    toks[2] = 0;
    CHECK_THROWS_AS(m.forward(be, c, seq_batch::dense(1, 3), toks, tensor_view<float, 2>(lg.data(), {3, V})), shape_error);
    CHECK_THROWS_AS(m.forward(be, c, seq_batch::dense(2, 2), toks, tensor_view<float, 2>(lg.data(), {4, V})), shape_error);

    // Wrong weight shapes name the tensor. (Built afresh each time: default-constructed tensors are not copied.)
    const auto mc = small_mamba_cfg(D);
    auto build = [&](std::int64_t head_cols, std::int64_t norm_len) {
        stack_weights w;
        w.embedding = tensor<float>({V, D});
        w.final_norm = neutral_norm_weight<plain_rms_norm>(D);
        w.lm_head = tensor<float>({V, head_cols});
        std::vector<mamba_stack::layer> layers;
        layers.emplace_back(neutral_norm_weight<plain_rms_norm>(norm_len), mamba_stack::mixer_variant(mamba2(mc, mamba2_weights::random(mc, 1))));
        return mamba_stack(stack_config{D, V, 1e-5f, false}, std::move(w), std::move(layers));
    };
    CHECK_THROWS_WITH_AS(build(D + 1, D), doctest::Contains("lm_head: expected shape [37, 32], found [37, 33]"), shape_error);
    CHECK_THROWS_WITH_AS(build(D, D - 1), doctest::Contains("layers.0.norm: expected shape [32], found [31]"), shape_error);
    CHECK_NOTHROW(build(D, D));
}

TEST_CASE("schedule mismatch at construction names the layer") {
    using two = model<pattern<"MM">, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>>;
    stack_config sc{D, V, 1e-5f, true};
    auto build = [&](int n) {
        stack_weights w;
        w.embedding = tensor<float>({V, D});
        w.final_norm = neutral_norm_weight<plain_rms_norm>(D);
        std::vector<two::layer> layers;
        const auto mc = small_mamba_cfg(D);
        for (int i = 0; i < n; ++i)
            layers.emplace_back(neutral_norm_weight<plain_rms_norm>(D), two::mixer_variant(mamba2(mc, mamba2_weights::random(mc, 1))));
        return two(sc, std::move(w), std::move(layers));
    };
    CHECK_THROWS_WITH_AS(build(3), "layer schedule pattern<\"MM\">: expected 2 layers, found 3", config_error);
    CHECK_NOTHROW(build(2));
}

TEST_CASE("construction names the layer whose mixer width or norm weight cannot work") {
    // Layer `bad` gets a mixer of width d_mixer, or a zero norm / MLP norm; everything else is neutral and valid.
    enum class fault { none, width, norm, sparse_norm, mlp_norm, final_norm };
    auto build = [&]<class Stack>(std::type_identity<Stack>, std::size_t bad, fault f) {
        using Norm = typename Stack::norm_type;
        const auto zero = [] { return tensor<float>({D}); };
        const auto sparse = [] {
            tensor<float> t({D});
            t[5] = 0.5f;
            return t;
        };
        stack_weights w;
        w.embedding = random_tensor({V, D}, -1.f, 1.f, 3);
        w.final_norm = f == fault::final_norm ? zero() : neutral_norm_weight<Norm>(D);
        w.lm_head = random_tensor({V, D}, -1.f, 1.f, 4);
        std::vector<typename Stack::layer> layers;
        for (std::size_t l = 0; l < 4; ++l) {
            auto mc = small_mamba_cfg(D);
            if (l == bad && f == fault::width) {  // a valid Mamba-2 layer of width 48
                mc.d_model = D + 16;
                mc.n_heads = 6;
            }
            tensor<float> norm = neutral_norm_weight<Norm>(D);
            if (l == bad && f == fault::norm) norm = zero();
            if (l == bad && f == fault::sparse_norm) norm = sparse();
            typename Stack::layer L{std::move(norm),
                                    typename Stack::mixer_variant(std::in_place_type<mamba2>, mc, mamba2_weights::random(mc, l))};
            if constexpr (Stack::mlp_type::present) {
                L.mlp_norm = l == bad && f == fault::mlp_norm ? zero() : neutral_norm_weight<Norm>(D);
                L.mlp = swiglu_weights::random(D, 40, 10 + l);
            }
            layers.push_back(std::move(L));
        }
        return Stack(stack_config{D, V, 1e-5f, false}, std::move(w), std::move(layers));
    };
    using plain_mlp_stack = model<every_layer<layer_kind::mamba2>, plain_rms_norm, swiglu_mlp, bind<layer_kind::mamba2, mamba2>>;
    const std::type_identity<mamba_stack> plain;
    const std::type_identity<plain_mlp_stack> plain_mlp;
    const std::type_identity<mamba_mlp_stack> centred;

    // A mixer whose d_model is not the stack's: config_error naming the layer and both widths.
    CHECK_THROWS_WITH_AS(build(plain, 2, fault::width), "layers.2: the mixer's d_model is 48, the stack's is 32", config_error);
    CHECK_THROWS_WITH_AS(build(centred, 0, fault::width), "layers.0: the mixer's d_model is 48, the stack's is 32", config_error);
    // An all-zero weight with plain RMSNorm zeroes everything after it: value_error naming the tensor.
    CHECK_THROWS_WITH_AS(build(plain, 3, fault::norm), doctest::Contains("layers.3.norm: all-zero weight with plain RMSNorm gives all-zero output"),
                         value_error);
    CHECK_THROWS_WITH_AS(build(plain_mlp, 1, fault::mlp_norm), doctest::Contains("layers.1.mlp_norm: all-zero weight with plain RMSNorm"),
                         value_error);
    CHECK_THROWS_WITH_AS(build(plain, 0, fault::final_norm), doctest::Contains("final_norm: all-zero weight with plain RMSNorm"), value_error);
    // Zeros are the neutral weight of zero-centred RMSNorm ((1 + w) ⊙ x / rms(x)): accepted everywhere.
    CHECK_NOTHROW(build(centred, 3, fault::norm));
    CHECK_NOTHROW(build(centred, 1, fault::mlp_norm));
    CHECK_NOTHROW(build(centred, 0, fault::final_norm));
    CHECK_NOTHROW(build(plain, 0, fault::none));
    CHECK_NOTHROW(build(plain_mlp, 0, fault::none));
    // One nonzero element is enough (a trained weight can have zeros).
    CHECK_NOTHROW(build(plain, 2, fault::sparse_norm));
    static_assert(neutral_norm_value<plain_rms_norm> == 1.0f && neutral_norm_value<zero_centered_rms_norm> == 0.0f);
}

TEST_CASE("SwiGLU fast path equals its fp64 reference on odd sizes") {
    cpu_backend be(2);
    for (auto [M, d, F] : {std::array<std::int64_t, 3>{1, 33, 67}, {5, 64, 130}, {37, 31, 45}}) {
        swiglu_weights w;
        w.gate_proj = random_tensor({F, d}, -0.5f, 0.5f, 100 + M);
        w.up_proj = random_tensor({F, d}, -0.5f, 0.5f, 200 + M);
        w.down_proj = random_tensor({d, F}, -0.5f, 0.5f, 300 + M);
        w.validate(d, "mlp");
        w.prepare();
        auto x = random_tensor({M, d}, -2.f, 2.f, 400 + M);
        tensor<float> gu({M, 2 * F}), y({M, d});
        tensor<double> yr({M, d});
        kernels::swiglu(be, w, x.view<2>(), gu.view<2>(), y.view<2>());
        kernels::swiglu_ref(w, x.view<2>(), yr.view<2>());
        CHECK(rel_error(y.data(), yr.data(), static_cast<std::size_t>(y.numel())) < 1e-5);
    }
}
