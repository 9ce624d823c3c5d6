// The named stages of the chunked gated delta rule (kernels/gated_delta.hpp, spec.md §4.3): each fp32 stage against
// its fp64 twin on the same inputs, on odd sizes (T not a multiple of the chunk, chunk 1, single tokens, empty and
// invalid sequences, grouped value heads, d_k ≠ d_v) with non-zero initial states; the composed stages against the
// token recurrence (gated_delta_rule_ref); gated_delta_rule_chunked against the composed stages (bit for bit on
// sequences of two or more tokens); the intra-chunk inverse (I + A)⁻¹ on every SIMD width; checks.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

std::vector<double> widen(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

/// Random inputs for a packed batch: sequences of the given lengths and slots one after the other, then 2 padding rows
/// (g there is positive and β NaN: no stage may read them). q, k L2-normalised, g in [−2, −1e-3], β in [0, 1].
struct problem {
    std::int64_t R, Hk, Hv, dk, dv, S;
    seq_batch batch;
    std::vector<float> q, k, v, g, beta, s0;
    problem(const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& slots, std::int64_t Hk_, std::int64_t Hv_, std::int64_t dk_,
            std::int64_t dv_, std::uint64_t seed)
        : Hk(Hk_), Hv(Hv_), dk(dk_), dv(dv_), S(static_cast<std::int64_t>(lens.size()) + 3) {
        std::int64_t r = 0;
        for (std::size_t i = 0; i < lens.size(); ++i) {
            batch.add(r, lens[i], slots[i]);
            r += lens[i];
        }
        R = batch.n_rows = r + 2;
        q = uniform(std::size_t(R * Hk * dk), -1.f, 1.f, seed);
        k = uniform(q.size(), -1.f, 1.f, seed + 1);
        v = uniform(std::size_t(R * Hv * dv), -1.f, 1.f, seed + 2);
        g = uniform(std::size_t(R * Hv), -2.f, -1e-3f, seed + 3);
        beta = uniform(g.size(), 0.f, 1.f, seed + 4);
        for (std::int64_t i = (R - 2) * Hv; i < R * Hv; ++i) {
            g[std::size_t(i)] = 1.f;
            beta[std::size_t(i)] = std::nanf("");
        }
        for (auto* x : {&q, &k})
            for (std::size_t i = 0; i < x->size(); i += std::size_t(dk)) {
                double ss = 0;
                for (std::int64_t a = 0; a < dk; ++a) ss += double((*x)[i + a]) * (*x)[i + a];
                for (std::int64_t a = 0; a < dk; ++a) (*x)[i + a] = float((*x)[i + a] / std::sqrt(ss));
            }
        s0 = uniform(std::size_t(S * Hv * dk * dv), -0.5f, 0.5f, seed + 5);
    }
    float scale() const { return 1.f / std::sqrt(float(dk)); }
    template <class T>
    tensor_view<const T, 3> qk(const std::vector<T>& x) const { return tensor_view<const T, 3>(x.data(), {R, Hk, dk}); }
    template <class T>
    tensor_view<const T, 3> vv(const std::vector<T>& x) const { return tensor_view<const T, 3>(x.data(), {R, Hv, dv}); }
    template <class T>
    tensor_view<const T, 2> gg(const std::vector<T>& x) const { return tensor_view<const T, 2>(x.data(), {R, Hv}); }
};

/// Everything the five fp32 stages produce.
struct staged {
    std::vector<float> gamma, A, W, U, chunk_states, v_new, state, o;
};

staged run_stages(const cpu_backend& be, const problem& pb, std::int64_t C) {
    const auto chunks = kernels::gdn_chunk_layout(pb.batch, C);
    const std::int64_t R = pb.R, Hv = pb.Hv, dk = pb.dk, dv = pb.dv, K = chunks.n_chunks(), Wd = chunks.width();
    staged f;
    f.gamma.assign(std::size_t(R * Hv), -7.f);
    f.A.assign(std::size_t(R * Hv * Wd), -7.f);
    f.W.assign(std::size_t(R * Hv * dk), -7.f);
    f.U.assign(std::size_t(R * Hv * dv), -7.f);
    f.v_new.assign(f.U.size(), -7.f);
    f.o.assign(f.U.size(), -7.f);
    f.chunk_states.assign(std::size_t(K * Hv * dk * dv), -7.f);
    f.state = pb.s0;
    kernels::gdn_chunk_cumsum(be, chunks, pb.gg(pb.g), tensor_view<float, 2>(f.gamma.data(), {R, Hv}));
    kernels::gdn_wy_prepare(be, chunks, pb.qk(pb.k), pb.gg(pb.g), pb.gg(pb.beta), tensor_view<float, 3>(f.A.data(), {R, Hv, Wd}));
    kernels::gdn_intra_chunk_solve(be, chunks, pb.qk(pb.k), pb.vv(pb.v), pb.gg(pb.beta), pb.gg(f.gamma),
                                   tensor_view<const float, 3>(f.A.data(), {R, Hv, Wd}), tensor_view<float, 3>(f.W.data(), {R, Hv, dk}),
                                   tensor_view<float, 3>(f.U.data(), {R, Hv, dv}));
    kernels::gdn_state_pass(be, pb.batch, chunks, pb.qk(pb.k), pb.gg(pb.g), pb.gg(f.gamma), tensor_view<const float, 3>(f.W.data(), {R, Hv, dk}),
                            pb.vv(f.U), tensor_view<float, 4>(f.state.data(), {pb.S, Hv, dk, dv}),
                            tensor_view<float, 4>(f.chunk_states.data(), {K, Hv, dk, dv}), tensor_view<float, 3>(f.v_new.data(), {R, Hv, dv}));
    kernels::gdn_chunk_output(be, chunks, pb.qk(pb.q), pb.qk(pb.k), pb.gg(pb.g), pb.gg(f.gamma),
                              tensor_view<const float, 4>(f.chunk_states.data(), {K, Hv, dk, dv}), pb.vv(f.v_new), pb.scale(),
                              tensor_view<float, 3>(f.o.data(), {R, Hv, dv}));
    return f;
}

struct stage_case {
    std::vector<std::int64_t> lens, slots;
    std::int64_t C;
};

const std::vector<stage_case> cases{
    {{1}, {0}, 4},                              // a single token
    {{7}, {1}, 1},                              // chunk 1
    {{13}, {0}, 4},                             // T not a multiple of the chunk
    {{5, 0, 9, 1, 8, 3}, {4, 0, 2, 5, -1, 1}, 4},  // empty, single-token and invalid (slot −1) sequences, a multiple of C
    {{3, 2}, {1, 0}, 64},                       // chunks longer than every sequence
    {{50}, {2}, 16},
    {{64, 11}, {0, 1}, 64},
    {{45, 7}, {0, 1}, 20},                      // chunk widths that are no multiple of the SIMD width
    {{100}, {1}, 37},
};

/// The rows of o of the valid sequences (the stages write no other rows).
std::vector<std::size_t> valid_rows(const problem& pb) {
    std::vector<std::size_t> rows;
    for (std::int64_t s = 0; s < pb.batch.n_seq(); ++s)
        if (pb.batch.slots[std::size_t(s)] >= 0)
            for (std::int64_t t = pb.batch.starts[std::size_t(s)]; t < pb.batch.starts[std::size_t(s)] + pb.batch.lengths[std::size_t(s)]; ++t)
                rows.push_back(std::size_t(t));
    return rows;
}

template <class T>
std::vector<T> gather(const std::vector<T>& x, const std::vector<std::size_t>& rows, std::int64_t width) {
    std::vector<T> out;
    for (auto r : rows) out.insert(out.end(), x.begin() + std::int64_t(r) * width, x.begin() + std::int64_t(r + 1) * width);
    return out;
}

}  // namespace

TEST_CASE("gated delta stages: each fp32 stage equals its fp64 twin on the same inputs") {
    const cpu_backend be(2);
    const std::int64_t Hk = 2, Hv = 4, dk = 13, dv = 11;
    for (const auto& cs : cases) {
        CAPTURE(cs.lens.size());
        CAPTURE(cs.lens[0]);
        CAPTURE(cs.C);
        const problem pb(cs.lens, cs.slots, Hk, Hv, dk, dv, 500 + std::uint64_t(cs.C * 13 + cs.lens[0]));
        const staged f = run_stages(be, pb, cs.C);
        const auto chunks = kernels::gdn_chunk_layout(pb.batch, cs.C);
        const std::int64_t R = pb.R, K = chunks.n_chunks(), Wd = chunks.width();
        const auto q = widen(pb.q), k = widen(pb.k), v = widen(pb.v), g = widen(pb.g), beta = widen(pb.beta);
        const auto rows = valid_rows(pb);

        // 1. cumsum.
        std::vector<double> gamma(f.gamma.size(), -7.0);
        kernels::gdn_chunk_cumsum_ref(chunks, pb.gg(g), tensor_view<double, 2>(gamma.data(), {R, Hv}));
        CHECK(rel_error(f.gamma, gamma) < 1e-6);
        // 2. A = strict_lower(diag(β) K Kᵀ ⊙ Γ).
        std::vector<double> A(f.A.size(), -7.0);
        kernels::gdn_wy_prepare_ref(chunks, pb.qk(k), pb.gg(g), pb.gg(beta), tensor_view<double, 3>(A.data(), {R, Hv, Wd}));
        CHECK(rel_error(gather(f.A, rows, Hv * Wd), gather(A, rows, Hv * Wd)) < 1e-6);
        // 3. W, U from the fp32 A and γ.
        const auto A32 = widen(f.A), gamma32 = widen(f.gamma);
        std::vector<double> W(f.W.size()), U(f.U.size());
        kernels::gdn_intra_chunk_solve_ref(chunks, pb.qk(k), pb.vv(v), pb.gg(beta), pb.gg(gamma32),
                                           tensor_view<const double, 3>(A32.data(), {R, Hv, Wd}),
                                           tensor_view<double, 3>(W.data(), {R, Hv, dk}), tensor_view<double, 3>(U.data(), {R, Hv, dv}));
        CHECK(rel_error(gather(f.W, rows, Hv * dk), gather(W, rows, Hv * dk)) < 1e-6);
        CHECK(rel_error(gather(f.U, rows, Hv * dv), gather(U, rows, Hv * dv)) < 1e-6);
        // 4. state pass from the fp32 W and U.
        const auto W32 = widen(f.W), U32 = widen(f.U);
        std::vector<double> state = widen(pb.s0), cst(f.chunk_states.size()), vn(f.v_new.size());
        kernels::gdn_state_pass_ref(pb.batch, chunks, pb.qk(k), pb.gg(g), pb.gg(gamma32), tensor_view<const double, 3>(W32.data(), {R, Hv, dk}),
                                    pb.vv(U32), tensor_view<double, 4>(state.data(), {pb.S, Hv, dk, dv}),
                                    tensor_view<double, 4>(cst.data(), {K, Hv, dk, dv}), tensor_view<double, 3>(vn.data(), {R, Hv, dv}));
        CHECK(rel_error(f.chunk_states, cst) < 1e-6);
        CHECK(rel_error(gather(f.v_new, rows, Hv * dv), gather(vn, rows, Hv * dv)) < 1e-6);
        CHECK(rel_error(f.state, state) < 1e-6);
        // 5. output from the fp32 chunk states and V_new.
        const auto cst32 = widen(f.chunk_states), vn32 = widen(f.v_new);
        std::vector<double> o(f.o.size(), -7.0);
        kernels::gdn_chunk_output_ref(chunks, pb.qk(q), pb.qk(k), pb.gg(g), pb.gg(gamma32),
                                      tensor_view<const double, 4>(cst32.data(), {K, Hv, dk, dv}), pb.vv(vn32), 1.0 / std::sqrt(double(dk)),
                                      tensor_view<double, 3>(o.data(), {R, Hv, dv}));
        CHECK(rel_error(gather(f.o, rows, Hv * dv), gather(o, rows, Hv * dv)) < 1e-6);
        // Rows of no valid sequence are untouched by every stage.
        for (std::int64_t i = (R - 2) * Hv * dv; i < R * Hv * dv; ++i) REQUIRE(f.o[std::size_t(i)] == -7.f);
        for (std::int64_t i = (R - 2) * Hv; i < R * Hv; ++i) REQUIRE(f.gamma[std::size_t(i)] == -7.f);
    }
}

TEST_CASE("gated delta stages: the composed stages equal the token recurrence; the chunked kernel equals them") {
    const std::int64_t Hk = 1, Hv = 3, dk = 8, dv = 10;
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (const auto& cs : cases) {
            CAPTURE(threads);
            CAPTURE(cs.lens.size());
            CAPTURE(cs.lens[0]);
            CAPTURE(cs.C);
            const problem pb(cs.lens, cs.slots, Hk, Hv, dk, dv, 700 + std::uint64_t(cs.C * 3 + cs.lens[0]));
            const staged f = run_stages(be, pb, cs.C);
            const auto rows = valid_rows(pb);

            const auto q = widen(pb.q), k = widen(pb.k), v = widen(pb.v), g = widen(pb.g), beta = widen(pb.beta);
            std::vector<double> s_rec = widen(pb.s0), o_rec(f.o.size());
            kernels::gated_delta_rule_ref<double>(pb.batch, pb.qk(q), pb.qk(k), pb.vv(v), pb.gg(g), pb.gg(beta), 1.0 / std::sqrt(double(dk)),
                                                  tensor_view<double, 4>(s_rec.data(), {pb.S, Hv, dk, dv}),
                                                  tensor_view<double, 3>(o_rec.data(), {pb.R, Hv, dv}));
            CHECK(rel_error(gather(f.o, rows, Hv * dv), gather(o_rec, rows, Hv * dv)) < 2e-6);
            CHECK(rel_error(f.state, s_rec) < 2e-6);

            std::vector<float> s = pb.s0, o(f.o.size(), -7.f);
            kernels::gated_delta_rule_chunked(be, pb.batch, pb.qk(pb.q), pb.qk(pb.k), pb.vv(pb.v), pb.gg(pb.g), pb.gg(pb.beta), pb.scale(),
                                              tensor_view<float, 4>(s.data(), {pb.S, Hv, dk, dv}), tensor_view<float, 3>(o.data(), {pb.R, Hv, dv}),
                                              cs.C);
            // The same tiles in the same order: the same bits for every sequence of two or more tokens (a one-token
            // sequence takes the decode step's arithmetic in the fused kernel: within rounding).
            CHECK(rel_error(gather(o, rows, Hv * dv), gather(f.o, rows, Hv * dv)) < 1e-6);
            CHECK(rel_error(s, f.state) < 1e-6);
            for (std::int64_t si = 0; si < pb.batch.n_seq(); ++si) {
                const auto z = static_cast<std::size_t>(si);
                if (pb.batch.slots[z] < 0 || pb.batch.lengths[z] < 2) continue;
                CAPTURE(si);
                bool same = true;
                for (std::int64_t t = pb.batch.starts[z]; t < pb.batch.starts[z] + pb.batch.lengths[z]; ++t)
                    for (std::int64_t e = 0; e < Hv * dv; ++e) same = same && o[std::size_t(t * Hv * dv + e)] == f.o[std::size_t(t * Hv * dv + e)];
                const std::int64_t slot = pb.batch.slots[z], per_slot = Hv * dk * dv;
                for (std::int64_t e = slot * per_slot; e < (slot + 1) * per_slot; ++e) same = same && s[std::size_t(e)] == f.state[std::size_t(e)];
                CHECK(same);
            }
        }
    }
}

TEST_CASE("gated delta stages: the fp64 twins composed equal the token recurrence") {
    const std::int64_t Hk = 2, Hv = 2, dk = 5, dv = 6;
    for (const auto& cs : cases) {
        CAPTURE(cs.lens[0]);
        CAPTURE(cs.C);
        const problem pb(cs.lens, cs.slots, Hk, Hv, dk, dv, 40 + std::uint64_t(cs.C));
        const auto chunks = kernels::gdn_chunk_layout(pb.batch, cs.C);
        const std::int64_t R = pb.R, K = chunks.n_chunks(), Wd = chunks.width();
        const auto q = widen(pb.q), k = widen(pb.k), v = widen(pb.v), g = widen(pb.g), beta = widen(pb.beta);
        std::vector<double> gamma(std::size_t(R * Hv)), A(std::size_t(R * Hv * Wd)), W(std::size_t(R * Hv * dk)), U(std::size_t(R * Hv * dv)),
            vn(U.size()), o(U.size(), 0.0), cst(std::size_t(K * Hv * dk * dv)), state = widen(pb.s0);
        kernels::gdn_chunk_cumsum_ref(chunks, pb.gg(g), tensor_view<double, 2>(gamma.data(), {R, Hv}));
        kernels::gdn_wy_prepare_ref(chunks, pb.qk(k), pb.gg(g), pb.gg(beta), tensor_view<double, 3>(A.data(), {R, Hv, Wd}));
        kernels::gdn_intra_chunk_solve_ref(chunks, pb.qk(k), pb.vv(v), pb.gg(beta), pb.gg(gamma), tensor_view<const double, 3>(A.data(), {R, Hv, Wd}),
                                           tensor_view<double, 3>(W.data(), {R, Hv, dk}), tensor_view<double, 3>(U.data(), {R, Hv, dv}));
        kernels::gdn_state_pass_ref(pb.batch, chunks, pb.qk(k), pb.gg(g), pb.gg(gamma), tensor_view<const double, 3>(W.data(), {R, Hv, dk}), pb.vv(U),
                                    tensor_view<double, 4>(state.data(), {pb.S, Hv, dk, dv}), tensor_view<double, 4>(cst.data(), {K, Hv, dk, dv}),
                                    tensor_view<double, 3>(vn.data(), {R, Hv, dv}));
        kernels::gdn_chunk_output_ref(chunks, pb.qk(q), pb.qk(k), pb.gg(g), pb.gg(gamma), tensor_view<const double, 4>(cst.data(), {K, Hv, dk, dv}),
                                      pb.vv(vn), 1.0 / std::sqrt(double(dk)), tensor_view<double, 3>(o.data(), {R, Hv, dv}));
        std::vector<double> s_rec = widen(pb.s0), o_rec(o.size());
        kernels::gated_delta_rule_ref<double>(pb.batch, pb.qk(q), pb.qk(k), pb.vv(v), pb.gg(g), pb.gg(beta), 1.0 / std::sqrt(double(dk)),
                                              tensor_view<double, 4>(s_rec.data(), {pb.S, Hv, dk, dv}),
                                              tensor_view<double, 3>(o_rec.data(), {R, Hv, dv}));
        const auto rows = valid_rows(pb);
        CHECK(rel_error(gather(o, rows, Hv * dv), gather(o_rec, rows, Hv * dv)) < 1e-12);
        CHECK(rel_error(state, s_rec) < 1e-12);
    }
}

namespace {

/// unit_lower_inverse on one SIMD width: T (I + A) = I on and below the diagonal within fp32 rounding, a diagonal of
/// exact ones and exact zeros above it, with NaN planted on and above A's diagonal (never read); a T narrower than
/// inverse_row_length(n) is refused.
template <class Arch>
void check_inverse(const char* name) {
    CAPTURE(name);
    for (std::int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 37, 64, 100}) {
        CAPTURE(n);
        kernels::detail::row_matrix A(n, n), T(n, kernels::detail::inverse_row_length(n));
        const auto r = uniform(std::size_t(n * n), -0.4f, 0.4f, 900 + std::uint64_t(n));
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j) A(i, j) = j < i ? r[std::size_t(i * n + j)] : std::numeric_limits<float>::quiet_NaN();
        const kernels::detail::const_row_map Am(A.data(), n, n, Eigen::OuterStride<>(n));
        kernels::detail::unit_lower_inverse<Arch>(Am, T);
        double worst = 0;
        bool exact = true;
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
                if (j > i) {
                    exact = exact && T(i, j) == 0.f;
                    continue;
                }
                if (j == i) exact = exact && T(i, i) == 1.f;
                // (T (I + A))_ij = T_ij + Σ_{j<l≤i} T_il A_lj, magnitudes summed for the bound.
                double s = T(i, j), mag = std::abs(double(T(i, j)));
                for (std::int64_t l = j + 1; l <= i; ++l) {
                    s += double(T(i, l)) * double(A(l, j));
                    mag += std::abs(double(T(i, l)) * double(A(l, j)));
                }
                worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)) / std::max(mag, 1.0));
            }
        CHECK(exact);
        CHECK(worst < 1e-5);
        kernels::detail::row_matrix narrow(n, n);  // rows of n floats: too short unless n is a multiple of the padding
        if (n % kernels::detail::inverse_row_pad != 0) CHECK_THROWS_AS(kernels::detail::unit_lower_inverse<Arch>(Am, narrow), shape_error);
    }
}

}  // namespace

TEST_CASE("gated delta: (I + A)⁻¹ by SIMD forward substitution inverts I + A on every SIMD width, reading A's strict lower part only") {
#if defined(__AVX512F__)
    check_inverse<xsimd::avx512f>("avx512f");
#endif
    if constexpr (xsimd::avx2::supported()) check_inverse<xsimd::avx2>("avx2");
    if constexpr (xsimd::sse2::supported()) check_inverse<xsimd::sse2>("sse2");
}

TEST_CASE("gated delta stages: shape, stride and value errors name the argument") {
    const cpu_backend be(1);
    const problem pb({6, 5}, {0, 1}, 2, 4, 8, 8, 3);
    const auto chunks = kernels::gdn_chunk_layout(pb.batch, 4);
    const std::int64_t R = pb.R, Hv = 4, dk = 8, dv = 8, K = chunks.n_chunks(), Wd = chunks.width();
    std::vector<float> gamma(std::size_t(R * Hv)), A(std::size_t(R * Hv * Wd)), W(std::size_t(R * Hv * dk)), U(std::size_t(R * Hv * dv)),
        vn(U.size()), o(U.size()), cst(std::size_t(K * Hv * dk * dv)), state = pb.s0, big(4 * cst.size() + 4 * U.size());
    using doctest::Contains;
    const tensor_view<const float, 2> gv = pb.gg(pb.g), gam(gamma.data(), {R, Hv});
    const tensor_view<const float, 3> Wv(W.data(), {R, Hv, dk});

    CHECK_THROWS_WITH_AS(kernels::gdn_chunk_cumsum(be, chunks, gv, tensor_view<float, 2>(gamma.data(), {R, Hv - 1})), Contains("gamma"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::gdn_wy_prepare(be, chunks, pb.qk(pb.k), gv, pb.gg(pb.beta),
                                                 tensor_view<float, 3>(big.data(), {R, Hv, Wd}, {Hv * Wd * 2, Wd * 2, 2})),
                         Contains("A [n_rows, H_v, W] needs a unit stride"), shape_error);
    CHECK_THROWS_WITH_AS(
        kernels::gdn_intra_chunk_solve(be, chunks, tensor_view<const float, 3>(big.data(), {R, 2, dk}, {2 * dk * 2, dk * 2, 2}),
                                       pb.vv(pb.v), pb.gg(pb.beta), gam, tensor_view<const float, 3>(A.data(), {R, Hv, Wd}),
                                       tensor_view<float, 3>(W.data(), {R, Hv, dk}), tensor_view<float, 3>(U.data(), {R, Hv, dv})),
        Contains("k [n_rows, H_k, d_k] needs a unit stride"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::gdn_state_pass(be, pb.batch, chunks, pb.qk(pb.k), gv, gam, Wv, pb.vv(U),
                                                 tensor_view<float, 4>(state.data(), {pb.S, Hv, dk, dv}),
                                                 tensor_view<float, 4>(big.data(), {K, Hv, dk, dv}, {Hv * dk * dv, dk * dv, 1, dk}),
                                                 tensor_view<float, 3>(vn.data(), {R, Hv, dv})),
                         Contains("chunk_states [n_chunks, H_v, d_k, d_v] matrix"), shape_error);
    CHECK_THROWS_WITH_AS(
        kernels::gdn_chunk_output(be, chunks, pb.qk(pb.q), pb.qk(pb.k), gv, gam, tensor_view<const float, 4>(cst.data(), {K, Hv, dk, dv}),
                                  pb.vv(vn), 0.3f, tensor_view<float, 3>(big.data(), {R, Hv, dv}, {Hv * dv * 2, dv * 2, 2})),
        Contains("o [n_rows, H_v, d_v] needs a unit stride"), shape_error);
    // v_new is written before U is read: sharing memory with U (an in-place call) is refused, naming both.
    CHECK_THROWS_WITH_AS(kernels::gdn_state_pass(be, pb.batch, chunks, pb.qk(pb.k), gv, gam, Wv, pb.vv(U),
                                                 tensor_view<float, 4>(state.data(), {pb.S, Hv, dk, dv}),
                                                 tensor_view<float, 4>(cst.data(), {K, Hv, dk, dv}), tensor_view<float, 3>(U.data(), {R, Hv, dv})),
                         Contains("v_new"), shape_error);
    // H_v not a multiple of H_k.
    CHECK_THROWS_AS(kernels::gdn_wy_prepare(be, chunks, pb.qk(pb.k), tensor_view<const float, 2>(big.data(), {R, 3}),
                                            tensor_view<const float, 2>(big.data(), {R, 3}), tensor_view<float, 3>(A.data(), {R, 3, Wd})),
                    config_error);
    // The state pass needs the layout of its own batch.
    const auto other = kernels::gdn_chunk_layout(seq_batch::dense(1, R), 4);
    CHECK_THROWS_WITH_AS(
        kernels::gdn_state_pass(be, pb.batch, other, pb.qk(pb.k), gv, gam, Wv, pb.vv(U),
                                tensor_view<float, 4>(state.data(), {pb.S, Hv, dk, dv}), tensor_view<float, 4>(cst.data(), {K, Hv, dk, dv}),
                                tensor_view<float, 3>(vn.data(), {R, Hv, dv})),
        Contains("not made from this batch"), shape_error);
    // A positive log-decay inside a sequence: value_error naming the row and head, in every stage that reads g and in
    // the fp64 twins. (The padding rows of this problem hold g = 1 and are never read.)
    problem pos = pb;
    pos.g[std::size_t(7 * Hv + 2)] = 0.5f;
    CHECK_THROWS_WITH_AS(kernels::gdn_chunk_cumsum(be, chunks, pos.gg(pos.g), tensor_view<float, 2>(gamma.data(), {R, Hv})),
                         Contains("g[7, 2]"), value_error);
    CHECK_THROWS_AS(
        kernels::gdn_wy_prepare(be, chunks, pb.qk(pb.k), pos.gg(pos.g), pb.gg(pb.beta), tensor_view<float, 3>(A.data(), {R, Hv, Wd})),
        value_error);
    CHECK_THROWS_AS(kernels::gdn_chunk_output(be, chunks, pb.qk(pb.q), pb.qk(pb.k), pos.gg(pos.g), gam,
                                              tensor_view<const float, 4>(cst.data(), {K, Hv, dk, dv}), pb.vv(vn), 0.3f,
                                              tensor_view<float, 3>(o.data(), {R, Hv, dv})),
                    value_error);
    const auto gd = widen(pos.g);
    std::vector<double> gamma64(gamma.size());
    CHECK_THROWS_AS(kernels::gdn_chunk_cumsum_ref(chunks, pos.gg(gd), tensor_view<double, 2>(gamma64.data(), {R, Hv})), value_error);
}
