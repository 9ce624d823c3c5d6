// The Oryx multi-mixer layer (spec.md §6.2–6.5, invariant §8.25): the mixer harness for both instances (GDN,
// Mamba-2) in each fixed mode; mode invariance of the states; all-attention = the plain attention layer, all-linear =
// the plain GDN layer; switching modes anywhere (block boundaries, inside blocks, prefill and decode, packed batches)
// = one pass with that per-token list; skipped work = computing both read-outs and selecting.

// GCC 12 reports `__Y is used uninitialized` inside its own AVX-512 intrinsics (the _mm512_undefined_* placeholders)
// when xsimd's exp is emitted out of line, as it is in this large translation unit (GCC bug 105593, fixed in 13);
// the CMake flags silence the `maybe` variant of the same false positive. It must precede the intrinsics headers.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

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
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/mixer/oryx.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "support/mixer_harness.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;

namespace {

oryx_config small_config(oryx_linear_kind kind, token_mode mode = token_mode::attention) {
    oryx_config c;
    c.d_model = 20;
    c.n_heads = 3;
    c.head_dim = 8;
    c.d_conv = 4;
    c.linear = kind;
    c.gdn_chunk = 8;
    c.ssd_chunk = 8;
    c.default_mode = mode;
    return c;
}

/// Random weights scaled so activations, gates and norms are O(1) in a tiny layer, with non-trivial o_norm, D and
/// dt_bias (the initialisers' values would leave them at 1 / the same everywhere).
oryx_weights test_weights(const oryx_config& c, std::uint64_t seed) {
    auto w = oryx_weights::random(c, seed);
    const float s = c.is_gdn() ? 10.f : 1.5f;  // fla's N(0, 0.02) is tiny at d = 20
    w.for_each([&](std::string_view name, tensor<float>& t) {
        if (name.ends_with("proj.weight")) for (auto& v : t.span()) v *= s;
    });
    const auto nw = hymix::test::uniform(static_cast<std::size_t>(c.head_dim), 0.5f, 1.5f, seed + 1);
    std::copy(nw.begin(), nw.end(), w.o_norm.data());
    const auto db = hymix::test::uniform(static_cast<std::size_t>(c.n_heads), -1.5f, 1.f, seed + 2);
    std::copy(db.begin(), db.end(), w.dt_bias.data());
    if (!c.is_gdn()) {
        const auto dd = hymix::test::uniform(static_cast<std::size_t>(c.n_heads), 0.5f, 1.5f, seed + 3);
        std::copy(dd.begin(), dd.end(), w.D.data());
    }
    return w;
}

oryx make_oryx(oryx_linear_kind kind, token_mode mode, std::uint64_t seed = 11) {
    const auto c = small_config(kind, mode);
    return oryx(c, test_weights(c, seed));
}

std::vector<float> random_x(std::int64_t rows, std::int64_t d, std::uint64_t seed) {
    return hymix::test::uniform(static_cast<std::size_t>(rows * d), -1.f, 1.f, seed);
}

template <class B>
std::vector<float> run(const oryx& m, const B& be, oryx_state& st, const seq_batch& b, const std::vector<float>& x,
                       const std::vector<unsigned char>& modes = {}) {
    const std::int64_t d = m.config().d_model;
    std::vector<float> y(static_cast<std::size_t>(b.n_rows * d), 5.f);
    m.forward(be, st, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(y.data(), {b.n_rows, d}), modes);
    return y;
}

std::vector<double> run_ref(const oryx& m, oryx_ref_slots& st, const seq_batch& b, const std::vector<float>& x,
                            const std::vector<unsigned char>& modes = {}) {
    const std::int64_t d = m.config().d_model;
    std::vector<double> xd(x.begin(), x.end()), y(static_cast<std::size_t>(b.n_rows * d));
    oryx_layer_ref(m.config(), m.weights(), b, tensor_view<const double, 2>(xd.data(), {b.n_rows, d}), st,
                   tensor_view<double, 2>(y.data(), {b.n_rows, d}), modes);
    return y;
}

std::string kind_name(oryx_linear_kind k) { return k == oryx_linear_kind::gdn ? "GDN" : "Mamba-2"; }

std::vector<unsigned char> bytes(std::string_view s) {  // "AALLA…" → 1 1 0 0 1 …
    std::vector<unsigned char> m;
    for (char ch : s) m.push_back(ch == 'A' ? 1 : 0);
    return m;
}

}  // namespace

HYMIX_MIXER_HARNESS("oryx-GDN, all attention", make_oryx(oryx_linear_kind::gdn, token_mode::attention))
HYMIX_MIXER_HARNESS("oryx-GDN, all linear", make_oryx(oryx_linear_kind::gdn, token_mode::linear))
HYMIX_MIXER_HARNESS("oryx-Mamba-2, all attention", make_oryx(oryx_linear_kind::mamba2, token_mode::attention))
HYMIX_MIXER_HARNESS("oryx-Mamba-2, all linear", make_oryx(oryx_linear_kind::mamba2, token_mode::linear))

TEST_CASE("oryx: mixed modes match the fp64 reference that computes both read-outs") {
    for (auto kind : {oryx_linear_kind::gdn, oryx_linear_kind::mamba2}) {
        const auto m = make_oryx(kind, token_mode::attention);
        const std::int64_t d = m.config().d_model;
        const std::vector<std::int64_t> cu{0, 9, 12, 25};
        const auto b = seq_batch::packed(cu, std::vector<std::int64_t>{2, 0, 1});
        const auto x = random_x(25, d, 40);
        const auto modes = bytes("AALLLAALL" "LAL" "LLLLAAAAALLAL");
        oryx_ref_slots rs(m.config(), 3);
        const auto yr = run_ref(m, rs, b, x, modes);
        for (int be_kind = 0; be_kind < 2; ++be_kind) {
            auto st = m.make_state(3);
            const auto y = be_kind ? run(m, reference_backend(), st, b, x, modes) : run(m, cpu_backend(2), st, b, x, modes);
            INFO("instance " << kind_name(kind) << ", backend " << std::string(be_kind ? "reference" : "cpu"));
            CHECK(rel_error(y, yr) <= (be_kind ? 1e-6 : 1e-5));
        }
    }
}

// ---- spec.md §8.25: mode invariance -----------------------------------------------------------------------------------

namespace {
/// Every stored key and value of a slot, as one vector.
std::vector<float> kv_contents(const oryx_state& st, std::int64_t slot) {
    std::vector<float> out;
    const auto n = st.kv.length(slot);
    for (auto v : {st.kv.key_range(slot, 0, n), st.kv.value_range(slot, 0, n)})
        for (std::int64_t t = 0; t < v.dim(0); ++t)
            for (std::int64_t h = 0; h < v.dim(1); ++h)
                for (std::int64_t c = 0; c < v.dim(2); ++c) out.push_back(v(t, h, c));
    return out;
}
std::vector<float> values(const tensor<float>& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

template <class B>
void check_mode_invariance(const B& be) {
    for (auto kind : {oryx_linear_kind::gdn, oryx_linear_kind::mamba2}) {
        const auto m = make_oryx(kind, token_mode::attention);
        const std::int64_t d = m.config().d_model, T = 21;
        const auto x = random_x(T, d, 70), nxt = random_x(1, d, 71);
        const std::vector<std::string> lists{std::string(T, 'A'), std::string(T, 'L'), "ALALALALALALALALALALA", "AAAALLLLAAAALLLLAAAAL",
                                             "LLLAALLLLLLLLAALLLLLA"};
        auto base = m.make_state(1);
        const auto y_att = run(m, be, base, seq_batch::dense(1, T), x, bytes(lists[0]));
        auto cont = base;
        const auto y_base = run(m, be, cont, seq_batch::dense(1, 1), nxt);
        for (const auto& l : lists) {
            INFO("instance " << kind_name(kind) << ", modes " << l);
            auto st = m.make_state(1);
            const auto y = run(m, be, st, seq_batch::dense(1, T), x, bytes(l));
            CHECK(st.kv.length(0) == T);
            CHECK(kv_contents(st, 0) == kv_contents(base, 0));  // bit for bit
            CHECK(values(st.lin) == values(base.lin));
            CHECK(values(st.conv) == values(base.conv));
            CHECK(run(m, be, st, seq_batch::dense(1, 1), nxt) == y_base);  // so every continuation agrees
            if (l != lists[0]) CHECK(rel_error(y, y_att) > 1e-3);  // the modes do change the outputs
        }
    }
}
}  // namespace

TEST_CASE("oryx: KV cache, linear and conv states after T tokens are the same for every mode list (spec.md §8.25)") {
    SUBCASE("cpu") { check_mode_invariance(cpu_backend(2)); }
    SUBCASE("reference") { check_mode_invariance(reference_backend()); }
}

TEST_CASE("oryx: the all-attention list equals the plain attention layer with the same weights (spec.md §8.25)") {
    // Mamba-2 instance (no activation after the convs) with identity conv taps, so k = x W_Kᵀ, v = x W_Vᵀ as in a plain
    // attention layer; its o_proj is the identity (d = H·d_h), which exposes the attention output before Oryx's gated
    // norm and W_O, applied here in fp64.
    auto c = small_config(oryx_linear_kind::mamba2, token_mode::attention);
    c.d_model = c.inner();
    auto w = test_weights(c, 21);
    for (auto* t : {&w.conv_k, &w.conv_v}) {
        t->zero();
        for (std::int64_t ch = 0; ch < c.inner(); ++ch) (*t)[ch * c.d_conv + c.d_conv - 1] = 1.f;
    }
    const oryx m(c, w);
    attention_config ac;
    ac.d_model = c.d_model;
    ac.n_heads = ac.n_kv_heads = c.n_heads;
    ac.head_dim = c.head_dim;
    ac.rope = {rope_mode::rotate_half, c.rope_theta, 1.0};
    attention_weights aw;
    aw.q_proj = w.q_attn_proj;
    aw.k_proj = w.k_proj;
    aw.v_proj = w.v_proj;
    aw.o_proj = tensor<float>({c.d_model, c.inner()});
    for (std::int64_t i = 0; i < c.inner(); ++i) aw.o_proj[i * c.inner() + i] = 1.f;
    const attention plain(ac, aw);
    cpu_backend be(2);
    const std::int64_t d = c.d_model, H = c.n_heads, dh = c.head_dim;
    auto so = m.make_state(3);
    auto sa = plain.make_state(3);
    std::uint64_t seed = 80;
    for (const auto& cu : std::vector<std::vector<std::int64_t>>{{0, 6, 15, 16}, {0, 1, 2, 3}, {0, 5, 5, 12}}) {
        const auto b = seq_batch::packed(cu, std::vector<std::int64_t>{1, 2, 0});
        const auto x = random_x(b.n_rows, d, seed++);
        const auto y = run(m, be, so, b, x);
        std::vector<float> o(static_cast<std::size_t>(b.n_rows * d));
        plain.forward(be, sa, b, tensor_view<const float, 2>(x.data(), {b.n_rows, d}), tensor_view<float, 2>(o.data(), {b.n_rows, d}));
        std::vector<double> want(static_cast<std::size_t>(b.n_rows * d));
        for (std::int64_t r = 0; r < b.n_rows; ++r) {
            std::vector<double> u(static_cast<std::size_t>(d));
            for (std::int64_t h = 0; h < H; ++h) {
                double ss = 0;
                for (std::int64_t a = 0; a < dh; ++a) ss += double(o[r * d + h * dh + a]) * o[r * d + h * dh + a];
                const double inv = 1.0 / std::sqrt(ss / double(dh) + double(c.norm_eps));
                for (std::int64_t a = 0; a < dh; ++a) {
                    double gz = 0;
                    for (std::int64_t i = 0; i < d; ++i) gz += double(w.g_proj[(h * dh + a) * d + i]) * x[r * d + i];
                    u[h * dh + a] = double(w.o_norm[a]) * o[r * d + h * dh + a] * inv * silu(gz);
                }
            }
            for (std::int64_t i = 0; i < d; ++i) {
                double acc = 0;
                for (std::int64_t j = 0; j < d; ++j) acc += double(w.o_proj[i * d + j]) * u[j];
                want[r * d + i] = acc;
            }
        }
        CHECK(rel_error(y, want) <= 1e-5);
        for (std::int64_t slot = 0; slot < 3; ++slot) {  // the caches hold the same keys and values
            const auto n = sa.length(slot);
            REQUIRE(so.kv.length(slot) == n);
            const auto ka = sa.key_range(slot, 0, n), ko = so.kv.key_range(slot, 0, n);
            const auto va = sa.value_range(slot, 0, n), vo = so.kv.value_range(slot, 0, n);
            double e = 0;
            for (std::int64_t t = 0; t < n; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t a = 0; a < dh; ++a)
                        e = std::max({e, std::abs(double(ka(t, h, a)) - ko(t, h, a)), std::abs(double(va(t, h, a)) - vo(t, h, a))});
            CHECK(e <= 1e-6);
        }
    }
}

TEST_CASE("oryx: the all-linear list of the GDN instance equals the plain Gated DeltaNet layer (spec.md §8.25)") {
    const auto c = small_config(oryx_linear_kind::gdn, token_mode::linear);
    const auto w = test_weights(c, 31);
    const oryx m(c, w);
    gated_deltanet_config gc;
    gc.d_model = c.d_model;
    gc.n_k_heads = gc.n_v_heads = c.n_heads;
    gc.d_k = gc.d_v = c.head_dim;
    gc.d_conv = c.d_conv;
    gc.chunk_size = c.gdn_chunk;
    gc.norm_eps = c.norm_eps;
    gc.l2_eps = c.l2_eps;
    auto stack_rows = []<class W>(std::initializer_list<const W*> ts) {  // tensor<float> or linear_weight rows
        std::int64_t rows = 0;
        for (auto* t : ts) rows += t->dim(0);
        tensor<float> out({rows, (*ts.begin())->dim(1)});
        float* p = out.data();
        for (auto* t : ts) p = std::copy(t->data(), t->data() + t->numel(), p);
        return out;
    };
    gated_deltanet_weights gw;
    gw.in_proj_qkv = stack_rows({&w.q_lin_proj, &w.k_proj, &w.v_proj});
    gw.in_proj_z = w.g_proj;
    gw.in_proj_b = w.b_proj;
    gw.in_proj_a = w.a_proj;
    gw.conv1d_weight = stack_rows({&w.conv_q, &w.conv_k, &w.conv_v});
    gw.dt_bias = w.dt_bias;
    gw.A_log = w.A_log;
    gw.norm_weight = w.o_norm;
    gw.out_proj = w.o_proj;
    const gated_deltanet plain(gc, gw);
    for (int be_kind = 0; be_kind < 2; ++be_kind) {
        auto so = m.make_state(3);
        auto sg = plain.make_state(3);
        const std::int64_t d = c.d_model;
        std::uint64_t seed = 90;
        for (const auto& cu : std::vector<std::vector<std::int64_t>>{{0, 13, 17, 26}, {0, 1, 2, 3}, {0, 9, 9, 10}}) {
            const auto b = seq_batch::packed(cu, std::vector<std::int64_t>{2, 0, 1});
            const auto x = random_x(b.n_rows, d, seed++);
            std::vector<float> yg(static_cast<std::size_t>(b.n_rows * d));
            std::vector<float> yo;
            const tensor_view<const float, 2> xv(x.data(), {b.n_rows, d});
            const tensor_view<float, 2> ygv(yg.data(), {b.n_rows, d});
            if (be_kind) {
                yo = run(m, reference_backend(), so, b, x);
                plain.forward(reference_backend(), sg, b, xv, ygv);
            } else {
                yo = run(m, cpu_backend(2), so, b, x);
                plain.forward(cpu_backend(2), sg, b, xv, ygv);
            }
            INFO("backend " << std::string(be_kind ? "reference" : "cpu") << ", call with " << b.n_rows << " rows");
            CHECK(rel_error(yo, yg) <= (be_kind ? 1e-6 : 1e-5));
            CHECK(rel_error(values(so.lin), values(sg.ssm)) <= (be_kind ? 1e-6 : 1e-5));
            CHECK(values(so.conv) == values(sg.conv));  // same layout [q | k | v], same pre-conv inputs
        }
    }
}

// ---- switching modes anywhere ---------------------------------------------------------------------------------------

namespace {
/// Runs x [T, d] of one sequence as calls of the given sizes (a size of −1: one decode step through step()), each with
/// its slice of the mode list; returns the concatenated outputs.
template <class B>
std::vector<float> run_split(const oryx& m, const B& be, const std::vector<float>& x, const std::vector<unsigned char>& modes,
                             const std::vector<std::int64_t>& sizes) {
    const std::int64_t d = m.config().d_model;
    auto st = m.make_state(1);
    std::vector<float> y;
    std::int64_t r = 0;
    for (auto sz : sizes) {
        const std::int64_t len = sz < 0 ? 1 : sz;
        const std::vector<float> xs(x.begin() + r * d, x.begin() + (r + len) * d);
        const std::vector<unsigned char> ms(modes.begin() + r, modes.begin() + r + len);
        std::vector<float> ys(static_cast<std::size_t>(len * d));
        const tensor_view<const float, 2> xv(xs.data(), {len, d});
        const tensor_view<float, 2> yv(ys.data(), {len, d});
        if (sz < 0)
            m.step(be, st, seq_batch::dense(1, 1), xv, yv, ms);
        else
            m.forward(be, st, seq_batch::dense(1, len), xv, yv, ms);
        y.insert(y.end(), ys.begin(), ys.end());
        r += len;
    }
    return y;
}

template <class B>
void check_switching(const B& be, double tol) {
    for (auto kind : {oryx_linear_kind::gdn, oryx_linear_kind::mamba2}) {
        const auto m = make_oryx(kind, token_mode::linear);
        const std::int64_t d = m.config().d_model, T = 40;
        const auto x = random_x(T, d, 100);
        // blocks of 4: switches on block boundaries (4, 8, 16, ...) and inside blocks (10, 13, 30, ...)
        const auto modes = bytes("AAAALLLLAALLLLLLAAAALALALLLLLLALLLLAAAAA");
        REQUIRE(static_cast<std::int64_t>(modes.size()) == T);
        const auto one = run_split(m, be, x, modes, {T});
        const std::vector<std::vector<std::int64_t>> splits{
            {8, 8, 24},                                     // calls end on block boundaries
            {10, 3, 17, 10},                                // calls end inside blocks
            {30, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},  // prefill, then decode through mode switches
            {5, -1, -1, -1, 7, -1, 24},                    // prefill and decode interleaved
        };
        for (const auto& s : splits) {
            INFO("instance " << kind_name(kind) << ", first call " << s[0] << " of " << s.size());
            CHECK(rel_error(run_split(m, be, x, modes, s), one) <= tol);
        }
        std::vector<std::int64_t> all_steps(static_cast<std::size_t>(T), -1);
        CHECK(rel_error(run_split(m, be, x, modes, all_steps), one) <= tol);

        // Packed batches: three sequences with their own lists, prefixes packed in one call and the rest as one
        // packed decode step and one packed chunk, equal to each sequence's single pass.
        const std::vector<std::int64_t> lens{17, 9, 14};
        const std::vector<std::string> lists{"LLLLAAAALLAALLLLA", "AAALLLLLA", "LALALLLLAAAAAL"};
        const auto xs = random_x(40, d, 101);
        std::vector<std::vector<float>> solo;
        std::int64_t off = 0;
        for (std::size_t i = 0; i < 3; ++i) {
            solo.push_back(run_split(m, be, std::vector<float>(xs.begin() + off * d, xs.begin() + (off + lens[i]) * d), bytes(lists[i]), {lens[i]}));
            off += lens[i];
        }
        const std::vector<std::int64_t> first{10, 4, 8};  // then 1 decode token each, then the rest
        auto st = m.make_state(3);
        std::vector<std::vector<float>> got(3);
        auto call = [&](const std::vector<std::int64_t>& from, const std::vector<std::int64_t>& len, bool step) {
            std::vector<std::int64_t> cu{0};
            std::vector<float> xc;
            std::vector<unsigned char> mc;
            std::int64_t base = 0;
            for (std::size_t i = 0; i < 3; ++i) {
                cu.push_back(cu.back() + len[i]);
                xc.insert(xc.end(), xs.begin() + (base + from[i]) * d, xs.begin() + (base + from[i] + len[i]) * d);
                const auto bl = bytes(lists[i]);
                mc.insert(mc.end(), bl.begin() + from[i], bl.begin() + from[i] + len[i]);
                base += lens[i];
            }
            const std::vector<std::int64_t> slots{2, 0, 1};
            const auto b = step ? seq_batch::decode(slots) : seq_batch::packed(cu, slots);
            std::vector<float> yc(static_cast<std::size_t>(b.n_rows * d));
            const tensor_view<const float, 2> xv(xc.data(), {b.n_rows, d});
            const tensor_view<float, 2> yv(yc.data(), {b.n_rows, d});
            if (step)
                m.step(be, st, b, xv, yv, mc);
            else
                m.forward(be, st, b, xv, yv, mc);
            for (std::size_t i = 0; i < 3; ++i)
                got[i].insert(got[i].end(), yc.begin() + cu[i] * d, yc.begin() + cu[i + 1] * d);
        };
        call({0, 0, 0}, first, false);
        call(first, {1, 1, 1}, true);
        call({first[0] + 1, first[1] + 1, first[2] + 1}, {lens[0] - first[0] - 1, lens[1] - first[1] - 1, lens[2] - first[2] - 1}, false);
        for (std::size_t i = 0; i < 3; ++i) {
            INFO("packed sequence " << i);
            CHECK(rel_error(got[i], solo[i]) <= tol);
        }
    }
}
}  // namespace

TEST_CASE("oryx: switching modes at block boundaries, inside blocks, in prefill and decode, in packed batches = one pass") {
    SUBCASE("cpu") { check_switching(cpu_backend(2), 1e-5); }
    SUBCASE("reference") { check_switching(reference_backend(), 1e-6); }
}

TEST_CASE("oryx: the skipped work (no attention rows for linear tokens) equals computing both read-outs and selecting") {
    // The read-out is followed only by per-row maps (gated norm, W_O), so selecting rows of the all-attention and the
    // all-linear outputs is selecting read-outs.
    for (int be_kind = 0; be_kind < 2; ++be_kind)
        for (auto kind : {oryx_linear_kind::gdn, oryx_linear_kind::mamba2}) {
            const auto m = make_oryx(kind, token_mode::attention);
            const std::int64_t d = m.config().d_model;
            seq_batch b;
            b.add(0, 14, 1);
            b.add(15, 9, 0);
            b.add(24, 3, -1);
            b.n_rows = 27;
            const auto x = random_x(b.n_rows, d, 110);
            const auto modes = bytes("LLAAALLLLALAAA" "A" "AAAALLLLA" "ALA");
            auto sel = [&](const auto& be) {
                auto s1 = m.make_state(2), s2 = m.make_state(2), s3 = m.make_state(2);
                const auto ya = run(m, be, s1, b, x, std::vector<unsigned char>(27, 1));
                const auto yl = run(m, be, s2, b, x, std::vector<unsigned char>(27, 0));
                const auto ym = run(m, be, s3, b, x, modes);
                std::vector<float> want(ya.size());
                for (std::int64_t r = 0; r < b.n_rows; ++r)
                    for (std::int64_t i = 0; i < d; ++i) want[r * d + i] = modes[r] ? ya[r * d + i] : yl[r * d + i];
                return rel_error(ym, want);
            };
            const double e = be_kind ? sel(reference_backend()) : sel(cpu_backend(2));
            INFO("backend " << std::string(be_kind ? "reference" : "cpu") << ", instance " << kind_name(kind));
            CHECK(e <= 1e-6);
        }
}

TEST_CASE("oryx: argument errors") {
    const auto m = make_oryx(oryx_linear_kind::gdn, token_mode::attention);
    const std::int64_t d = m.config().d_model;
    cpu_backend be(1);
    auto st = m.make_state(1);
    const auto x = random_x(4, d, 160);
    CHECK_THROWS_AS(run(m, be, st, seq_batch::dense(1, 4), x, std::vector<unsigned char>(3, 1)), shape_error);
    auto other = make_oryx(oryx_linear_kind::mamba2, token_mode::attention);
    auto c2 = small_config(oryx_linear_kind::gdn);
    c2.n_heads = 2;
    auto wrong = oryx(c2, oryx_weights::random(c2, 1)).make_state(1);
    CHECK_THROWS_AS(run(m, be, wrong, seq_batch::dense(1, 4), x), shape_error);
    auto c = small_config(oryx_linear_kind::gdn);
    c.head_dim = 7;
    CHECK_THROWS_AS(c.validate(), config_error);
    // the GDN instance rejects Mamba-2 weights and vice versa
    CHECK_THROWS_AS(oryx(m.config(), other.weights()), shape_error);
    auto w = m.weights();
    w.o_norm = tensor<float>({3});
    CHECK_THROWS_AS(oryx(m.config(), w), shape_error);
}

// A 16-bit KV cache (oryx::set_kv_dtype): the shared invariants keep the f32 tolerance between runs of the layer (keys
// and values are rounded once, when cached), and the layer stays within the rounding of the fp64 reference.
namespace {
oryx with_kv(oryx m, dtype t) {
    m.set_kv_dtype(t);
    return m;
}
}  // namespace
TEST_CASE("oryx-GDN, all attention, bf16 KV cache: spec invariants on the CPU backend") {
    const auto m = with_kv(make_oryx(oryx_linear_kind::gdn, token_mode::attention), dtype::bf16);
    CHECK(m.make_state(1).kv.kv_dtype() == dtype::bf16);
    hymix::test::run_mixer_harness(m, cpu_backend(2), hymix::test::harness_tolerance{2e-2, 1e-5});
}
TEST_CASE("oryx-Mamba-2, all attention, f16 KV cache: spec invariants on the reference backend") {
    hymix::test::run_mixer_harness(with_kv(make_oryx(oryx_linear_kind::mamba2, token_mode::attention), dtype::f16), reference_backend(),
                                   hymix::test::harness_tolerance{3e-3, 1e-6});
}
TEST_CASE("oryx: set_kv_dtype refuses dtypes other than f32, bf16 and f16") {
    auto m = make_oryx(oryx_linear_kind::gdn, token_mode::attention);
    CHECK_THROWS_AS(m.set_kv_dtype(dtype::i8), config_error);
    CHECK(m.kv_dtype() == dtype::f32);
}
