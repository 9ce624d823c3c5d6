// Training of the attention mixer (spec.md §2; issue 8): forward_train equals forward from an empty cache; whole-layer
// gradients (dx and every weight) vs central finite differences of the fp64 layer reference attention_layer_ref for
// GQA + zero-centred qk-norm + partial RoPE + output gate, plain MHA, and MQA with plain qk-norm and a window; CPU vs
// reference backend; packed batches vs solo runs; accumulation into the gradient weights; the sliding-window kind;
// weights' for_each / zeros_like; bad arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/sliding_window_attention.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;

namespace {

/// Qwen3.5-style: GQA 2:1, zero-centred qk-norm, rotate-half RoPE on half of each head, output gate.
attention_config cfg_qwen(std::int64_t d = 12, std::int64_t dh = 8) {
    attention_config c;
    c.d_model = d;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = dh;
    c.rope = {rope_mode::rotate_half, 1e4, 0.5};
    c.qk_norm = {qk_norm_mode::zero_centered, 1e-6};
    c.output_gate = true;
    return c;
}
/// Plain MHA: full rotate-half RoPE, no qk-norm, no gate.
attention_config cfg_mha() {
    attention_config c;
    c.d_model = 10;
    c.n_heads = 2;
    c.n_kv_heads = 2;
    c.head_dim = 6;
    c.rope = {rope_mode::rotate_half, 1e4, 1.0};
    return c;
}
/// MQA, plain qk-norm, interleaved RoPE, explicit scale, sliding window 3.
attention_config cfg_window() {
    attention_config c;
    c.d_model = 9;
    c.n_heads = 3;
    c.n_kv_heads = 1;
    c.head_dim = 4;
    c.rope = {rope_mode::interleaved, 1e4, 1.0};
    c.qk_norm = {qk_norm_mode::plain, 1e-5};
    c.scale = 0.45;
    c.sliding_window = 3;
    return c;
}

/// Random weights on a grid of 2^-20 with |w| < 1 (plain qk-norm weights in [0.75, 1)): w ± 2^-20 is exact in fp32,
/// so finite differences can perturb the fp32 weights the fp64 layer reference reads.
attention_weights grid_weights(const attention_config& c, std::uint64_t seed) {
    auto w = attention_weights::random(c, seed);
    const bool plain = c.qk_norm.mode == qk_norm_mode::plain;
    w.for_each([&](std::string_view name, tensor<float>& t) {
        const bool norm = name == "q_norm.weight" || name == "k_norm.weight";
        for (auto& v : t.span()) {
            double x = norm && plain ? 0.75 + 0.24 * (v - 0.8) / 0.4 : v;  // plain norm weights: [0.8, 1.2) → [0.75, 0.99)
            v = static_cast<float>(std::round(x * 1048576.0) / 1048576.0);
        }
    });
    return w;
}

/// Sequences of 5 and 7 tokens with padding rows between and after them (rows 5 and 13).
seq_batch packed_with_padding() {
    seq_batch b;
    b.add(0, 5, 0);
    b.add(6, 7, 1);
    b.n_rows = 14;
    return b;
}
std::vector<unsigned char> live_rows(const seq_batch& b) {
    std::vector<unsigned char> live(static_cast<std::size_t>(b.n_rows), 0);
    for (std::int64_t s = 0; s < b.n_seq(); ++s)
        for (std::int64_t t = 0; t < b.lengths[static_cast<std::size_t>(s)]; ++t) live[static_cast<std::size_t>(b.starts[static_cast<std::size_t>(s)] + t)] = 1;
    return live;
}

/// y = forward_train(x); dx and g += backward(dy) on backend be.
template <class B>
struct train_run {
    std::vector<float> y, dx;
    attention_weights g;
    train_run(const B& be, const attention& m, const seq_batch& b, const std::vector<float>& x, const std::vector<float>& dy)
        : g(m.weights().zeros_like()) {
        const std::int64_t d = m.config().d_model, N = b.n_rows;
        y.assign(static_cast<std::size_t>(N * d), -3.f);
        dx.assign(static_cast<std::size_t>(N * d), -3.f);
        attention::train_cache tc;
        m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<float, 2>(y.data(), {N, d}), tc);
        m.backward(be, b, tc, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<const float, 2>(dy.data(), {N, d}),
                   tensor_view<float, 2>(dx.data(), {N, d}), g);
    }
};

std::vector<double> to_double(const float* p, std::int64_t n) { return std::vector<double>(p, p + n); }

}  // namespace

TEST_CASE("attention forward_train equals forward from an empty cache (packed, padding rows zero)") {
    const cpu_backend cpu(2);
    const reference_backend ref;
    for (const auto& c : {cfg_qwen(48, 16), cfg_mha(), cfg_window()}) {
        CAPTURE(c.d_model);
        const attention m(c, attention_weights::random(c, 3));
        seq_batch b;
        b.add(0, 37, 0);
        b.add(38, 1, 1);
        b.add(40, 20, 2);
        b.n_rows = 61;
        const std::int64_t d = c.d_model;
        const auto x = test::uniform(static_cast<std::size_t>(b.n_rows * d), -1.f, 1.f, 5);
        auto check = [&](const auto& be, bool bitwise) {
            std::vector<float> y0(x.size(), -1.f), y1(x.size(), -1.f);
            auto st = m.make_state(3);
            m.forward(be, st, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(y0.data(), {b.n_rows, d}));
            attention::train_cache tc;
            m.forward_train(be, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(y1.data(), {b.n_rows, d}), tc);
            if (bitwise)
                CHECK(y0 == y1);
            else
                CHECK(test::rel_error(y1, y0) < 1e-7);
            for (std::int64_t r : {37, 39, 60})
                for (std::int64_t i = 0; i < d; ++i) CHECK(y1[static_cast<std::size_t>(r * d + i)] == 0.f);
        };
        check(cpu, true);
        check(ref, false);
    }
}

TEST_CASE("attention backward: whole-layer gradients vs finite differences of the fp64 layer reference") {
    // The analytic gradients come from the reference backend: every op in fp64, but fp32 tensors between ops, so they
    // agree with the fp64 finite differences only to fp32 rounding (worst errors seen: about 1e-7).
    const reference_backend ref;
    const std::vector<attention_config> cfgs{cfg_qwen(), cfg_mha(), cfg_window()};
    for (std::size_t ci = 0; ci < cfgs.size(); ++ci) {
        const auto& c = cfgs[ci];
        CAPTURE(ci);
        const attention m(c, grid_weights(c, 11 + ci));
        const seq_batch b = packed_with_padding();
        const std::int64_t d = c.d_model, N = b.n_rows;
        const auto x = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 21 + ci);
        const auto dy = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 31 + ci);  // the cotangent of y
        train_run<reference_backend> run(ref, m, b, x, dy);
        const auto live = live_rows(b);
        for (std::int64_t r = 0; r < N; ++r)
            if (!live[static_cast<std::size_t>(r)])
                for (std::int64_t i = 0; i < d; ++i) CHECK(run.dx[static_cast<std::size_t>(r * d + i)] == 0.f);

        attention_weights w = m.weights();
        std::vector<double> xd(x.begin(), x.end());
        const std::vector<double> c_y(dy.begin(), dy.end());
        auto loss = [&] {
            attention_ref_cache st(c, b.n_seq());
            std::vector<double> y(static_cast<std::size_t>(N * d));
            attention_layer_ref(c, w, b, tensor_view<const double, 2>(xd.data(), {N, d}), st, tensor_view<double, 2>(y.data(), {N, d}));
            return test::dot(c_y, y);
        };
        constexpr double tol = 1e-6;
        test::check_gradient("dx", xd, to_double(run.dx.data(), N * d), loss, tol, 1e-6, 64);
        // Each weight tensor: θ in fp64 mirrors the fp32 tensor; the loss writes θ back (exact on the 2^-20 grid).
        run.g.for_each([&](std::string_view name, tensor<float>& gt) {
            tensor<float>* wt = nullptr;
            w.for_each([&](std::string_view n2, tensor<float>& t) {
                if (n2 == name) wt = &t;
            });
            REQUIRE(wt != nullptr);
            std::vector<double> theta(wt->data(), wt->data() + wt->numel());
            auto loss_w = [&] {
                for (std::size_t i = 0; i < theta.size(); ++i) (*wt)[static_cast<std::int64_t>(i)] = static_cast<float>(theta[i]);
                return loss();
            };
            test::check_gradient(std::string(name), theta, to_double(gt.data(), gt.numel()), loss_w, tol, 1.0 / 1048576.0, 40);
            for (std::size_t i = 0; i < theta.size(); ++i) (*wt)[static_cast<std::int64_t>(i)] = static_cast<float>(theta[i]);
        });
    }
}

TEST_CASE("attention backward: CPU fp32 vs reference backend (1e-4 relative), 1 and 2 threads") {
    const reference_backend ref;
    for (const auto& c : {cfg_qwen(64, 16), cfg_mha(), cfg_window()}) {
        CAPTURE(c.d_model);
        const attention m(c, attention_weights::random(c, 7));
        seq_batch b;
        b.add(0, 70, 0);
        b.add(71, 33, 1);
        b.add(104, 1, 2);
        b.n_rows = 106;
        const std::int64_t d = c.d_model, N = b.n_rows;
        const auto x = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 8);
        const auto dy = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 9);
        train_run<reference_backend> r(ref, m, b, x, dy);
        for (int threads : {1, 2}) {
            CAPTURE(threads);
            const cpu_backend cpu(threads);
            train_run<cpu_backend> f(cpu, m, b, x, dy);
            CHECK(test::rel_error(f.y, r.y) < 1e-5);
            CHECK(test::rel_error(f.dx, r.dx) < 1e-4);
            std::vector<const tensor<float>*> rt;
            r.g.for_each([&](std::string_view, tensor<float>& t) { rt.push_back(&t); });
            std::size_t i = 0;
            f.g.for_each([&](std::string_view name, tensor<float>& t) {
                CAPTURE(std::string(name));
                REQUIRE(i < rt.size());
                CHECK(test::rel_error(t.data(), rt[i]->data(), static_cast<std::size_t>(t.numel())) < 1e-4);
                ++i;
            });
        }
    }
}

TEST_CASE("attention backward: a packed batch equals solo runs of its sequences (dx rows; weight gradients summed)") {
    const cpu_backend cpu(2);
    const auto c = cfg_qwen(32, 8);
    const attention m(c, attention_weights::random(c, 17));
    const std::int64_t d = c.d_model;
    const std::vector<std::int64_t> lens{29, 1, 66};
    seq_batch b;
    std::int64_t row = 0;
    for (std::size_t s = 0; s < lens.size(); ++s) {
        b.add(row, lens[s], static_cast<std::int64_t>(s));
        row += lens[s];
    }
    b.n_rows = row;
    const auto x = test::uniform(static_cast<std::size_t>(row * d), -1.f, 1.f, 18);
    const auto dy = test::uniform(static_cast<std::size_t>(row * d), -1.f, 1.f, 19);
    train_run<cpu_backend> all(cpu, m, b, x, dy);
    attention_weights sum = m.weights().zeros_like();
    std::int64_t r0 = 0;
    for (const std::int64_t T : lens) {
        CAPTURE(T);
        const seq_batch one = seq_batch::dense(1, T);
        const std::vector<float> xs(x.begin() + r0 * d, x.begin() + (r0 + T) * d), dys(dy.begin() + r0 * d, dy.begin() + (r0 + T) * d);
        train_run<cpu_backend> solo(cpu, m, one, xs, dys);
        CHECK(test::rel_error(solo.dx.data(), all.dx.data() + r0 * d, static_cast<std::size_t>(T * d)) < 1e-6);
        CHECK(test::rel_error(solo.y.data(), all.y.data() + r0 * d, static_cast<std::size_t>(T * d)) == 0.0);
        std::vector<tensor<float>*> st;
        solo.g.for_each([&](std::string_view, tensor<float>& t) { st.push_back(&t); });
        std::size_t i = 0;
        sum.for_each([&](std::string_view, tensor<float>& t) {
            for (std::int64_t e = 0; e < t.numel(); ++e) t[e] += (*st[i])[e];
            ++i;
        });
        r0 += T;
    }
    std::vector<tensor<float>*> at;
    all.g.for_each([&](std::string_view, tensor<float>& t) { at.push_back(&t); });
    std::size_t i = 0;
    sum.for_each([&](std::string_view name, tensor<float>& t) {
        CAPTURE(std::string(name));
        CHECK(test::rel_error(at[i]->data(), t.data(), static_cast<std::size_t>(t.numel())) < 1e-5);
        ++i;
    });
}

TEST_CASE("attention backward: parameter gradients accumulate (+=), dx is overwritten; weights for_each / zeros_like") {
    const cpu_backend cpu(2);
    const auto c = cfg_qwen(24, 8);
    attention m(c, attention_weights::random(c, 23));
    const seq_batch b = seq_batch::dense(2, 19);
    const std::int64_t d = c.d_model, N = b.n_rows;
    const auto x = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 24);
    const auto dy = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 25);
    attention::train_cache tc;
    std::vector<float> y(x.size()), dx1(x.size()), dx2(x.size(), 9.f);
    const tensor_view<const float, 2> xv(x.data(), {N, d}), dyv(dy.data(), {N, d});
    m.forward_train(cpu, b, xv, tensor_view<float, 2>(y.data(), {N, d}), tc);
    auto g = m.weights().zeros_like();
    m.backward(cpu, b, tc, xv, dyv, tensor_view<float, 2>(dx1.data(), {N, d}), g);
    auto g1 = g;
    m.backward(cpu, b, tc, xv, dyv, tensor_view<float, 2>(dx2.data(), {N, d}), g);
    CHECK(dx1 == dx2);
    std::vector<const tensor<float>*> once;
    g1.for_each([&](std::string_view, tensor<float>& t) { once.push_back(&t); });
    std::size_t i = 0;
    std::vector<std::string> names;
    g.for_each([&](std::string_view name, tensor<float>& t) {
        names.emplace_back(name);
        CHECK(t.shape() == once[i]->shape());
        for (std::int64_t e = 0; e < t.numel(); ++e) CHECK(t[e] == 2.f * (*once[i])[e]);
        ++i;
    });
    CHECK(names == std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_norm.weight",
                                            "k_norm.weight"});
    // zeros_like: same shapes, all zero; a config without qk-norm visits four tensors.
    auto z = m.weights().zeros_like();
    z.for_each([&](std::string_view, tensor<float>& t) {
        for (float v : t.span()) CHECK(v == 0.f);
    });
    int count = 0;
    const attention mha(cfg_mha(), attention_weights::random(cfg_mha(), 1));
    mha.weights().for_each([&](std::string_view, const tensor<float>&) { ++count; });
    CHECK(count == 4);
    // weights_mut: the optimizer's handle; a changed weight changes the next forward.
    std::vector<float> y2(x.size());
    m.weights_mut().o_proj.fill(0.f);
    m.forward_train(cpu, b, xv, tensor_view<float, 2>(y2.data(), {N, d}), tc);
    for (float v : y2) CHECK(v == 0.f);
}

TEST_CASE("sliding_window_attention trains through attention's forward_train / backward") {
    const cpu_backend cpu(2);
    const auto c = cfg_window();
    const auto w = attention_weights::random(c, 41);
    const attention a(c, w);
    sliding_window_attention s(c, w);
    const seq_batch b = packed_with_padding();
    const std::int64_t d = c.d_model, N = b.n_rows;
    const auto x = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 42);
    const auto dy = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 43);
    const train_run<cpu_backend> ra(cpu, a, b, x, dy);
    sliding_window_attention::train_cache tc;
    std::vector<float> y(x.size()), dx(x.size());
    auto g = s.weights().zeros_like();
    s.forward_train(cpu, b, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<float, 2>(y.data(), {N, d}), tc);
    s.backward(cpu, b, tc, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<const float, 2>(dy.data(), {N, d}),
               tensor_view<float, 2>(dx.data(), {N, d}), g);
    CHECK(y == ra.y);
    CHECK(dx == ra.dx);
    CHECK(&s.weights_mut() == &s.weights());
}

TEST_CASE("attention training: bad arguments throw shape_error naming the argument") {
    const cpu_backend cpu(1);
    const auto c = cfg_mha();
    const attention m(c, attention_weights::random(c, 1));
    const seq_batch b = seq_batch::dense(1, 6);
    const std::int64_t d = c.d_model;
    std::vector<float> x(static_cast<std::size_t>(6 * d), 0.1f), y(x.size()), dx(x.size());
    attention::train_cache tc;
    CHECK_THROWS_AS(m.forward_train(cpu, b, tensor_view<const float, 2>(x.data(), {5, d}), tensor_view<float, 2>(y.data(), {6, d}), tc),
                    shape_error);
    m.forward_train(cpu, b, tensor_view<const float, 2>(x.data(), {6, d}), tensor_view<float, 2>(y.data(), {6, d}), tc);
    auto g = m.weights().zeros_like();
    const tensor_view<const float, 2> xv(x.data(), {6, d});
    CHECK_THROWS_AS(m.backward(cpu, b, tc, xv, tensor_view<const float, 2>(y.data(), {6, d - 1}), tensor_view<float, 2>(dx.data(), {6, d}), g),
                    shape_error);
    // A cache of another batch.
    const seq_batch other = seq_batch::dense(2, 3);
    CHECK_THROWS_AS(m.backward(cpu, other, tc, xv, tensor_view<const float, 2>(y.data(), {6, d}), tensor_view<float, 2>(dx.data(), {6, d}), g),
                    shape_error);
    // A cache of another layer shape (the same layer with an output gate: q_proj has twice the rows).
    auto cg = c;
    cg.output_gate = true;
    const attention gated(cg, attention_weights::random(cg, 2));
    auto gg = gated.weights().zeros_like();
    CHECK_THROWS_AS(gated.backward(cpu, b, tc, xv, tensor_view<const float, 2>(y.data(), {6, d}), tensor_view<float, 2>(dx.data(), {6, d}), gg),
                    shape_error);
    // Gradient weights of another shape.
    auto bad = attention_weights::random(cfg_qwen(), 1);
    CHECK_THROWS_AS(m.backward(cpu, b, tc, xv, tensor_view<const float, 2>(y.data(), {6, d}), tensor_view<float, 2>(dx.data(), {6, d}), bad),
                    shape_error);
    // Overlapping sequences.
    seq_batch ov;
    ov.add(0, 4, 0);
    ov.add(2, 4, 1);
    ov.n_rows = 6;
    CHECK_THROWS_AS(m.forward_train(cpu, ov, xv, tensor_view<float, 2>(y.data(), {6, d}), tc), shape_error);
}

TEST_CASE("attention training: one train_cache reused across batches of other shapes and layouts gives fresh-cache results") {
    const cpu_backend cpu(2);
    const auto c = cfg_qwen(16, 8);
    const attention m(c, attention_weights::random(c, 51));
    const std::int64_t d = c.d_model;
    const seq_batch a = packed_with_padding();  // 14 rows, two of them padding
    const seq_batch b = seq_batch::dense(2, 7);  // 14 rows, all live
    const seq_batch e = seq_batch::dense(1, 30);
    attention::train_cache tc;
    for (const seq_batch* bp : {&b, &a, &e, &a}) {
        const seq_batch& bb = *bp;
        const std::int64_t N = bb.n_rows;
        const auto x = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 60 + static_cast<std::uint64_t>(N));
        const auto dy = test::uniform(static_cast<std::size_t>(N * d), -1.f, 1.f, 61 + static_cast<std::uint64_t>(N));
        train_run<cpu_backend> fresh(cpu, m, bb, x, dy);
        std::vector<float> y(x.size()), dx(x.size());
        auto g = m.weights().zeros_like();
        m.forward_train(cpu, bb, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<float, 2>(y.data(), {N, d}), tc);
        m.backward(cpu, bb, tc, tensor_view<const float, 2>(x.data(), {N, d}), tensor_view<const float, 2>(dy.data(), {N, d}),
                   tensor_view<float, 2>(dx.data(), {N, d}), g);
        CHECK(y == fresh.y);
        CHECK(dx == fresh.dx);
        CHECK(g.q_proj.span()[5] == fresh.g.q_proj.span()[5]);
        CHECK(std::equal(g.k_norm.span().begin(), g.k_norm.span().end(), fresh.g.k_norm.span().begin()));
    }
}
