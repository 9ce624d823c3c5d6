// The named stages of the chunked SSD (kernels/ssd.hpp, spec.md §3.3): each fp32 stage against its fp64 twin on the
// same inputs, on odd sizes (T not a multiple of the chunk, chunk 1, single tokens, empty sequences, several
// sequences) with non-zero initial states; the composed stages against the token recurrence (ssd_ref); ssd_chunked
// against the composed stages; the layout; argument checks of the stages.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/kernels/ssd.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::rel_error;
using hymix::test::uniform;

namespace {

template <class T>
std::vector<T> cast(const std::vector<float>& x) {
    return std::vector<T>(x.begin(), x.end());
}
std::vector<double> widen(const std::vector<float>& x) { return cast<double>(x); }

/// A random SSD problem: sequences of the given lengths packed one after the other, then `pad` rows outside every
/// sequence; fp32 inputs and their fp64 copies; per-sequence initial states (sequence 1, when there is one, has none).
struct problem {
    std::int64_t R, H, P, G, N;
    std::vector<std::int64_t> lens;
    std::vector<float> x, dt, A, B, C, D;
    std::vector<double> xd, dtd, Ad, Bd, Cd, Dd;
    std::vector<std::vector<float>> s0;
    bool D_per_channel;

    problem(std::vector<std::int64_t> lens_, std::int64_t H_, std::int64_t P_, std::int64_t G_, std::int64_t N_, std::uint64_t seed,
            bool d_hdim, std::int64_t pad = 2)
        : H(H_), P(P_), G(G_), N(N_), lens(std::move(lens_)), D_per_channel(d_hdim) {
        R = std::accumulate(lens.begin(), lens.end(), std::int64_t{0}) + pad;
        x = uniform(std::size_t(R * H * P), -1.f, 1.f, seed);
        dt = uniform(std::size_t(R * H), 0.001f, 0.5f, seed + 1);
        A = uniform(std::size_t(H), -4.f, -0.05f, seed + 2);
        B = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 3);
        C = uniform(std::size_t(R * G * N), -1.f, 1.f, seed + 4);
        D = uniform(std::size_t(d_hdim ? H * P : H), -1.f, 1.f, seed + 5);
        xd = widen(x), dtd = widen(dt), Ad = widen(A), Bd = widen(B), Cd = widen(C), Dd = widen(D);
        for (std::size_t s = 0; s < lens.size(); ++s) s0.push_back(uniform(std::size_t(H * P * N), -1.f, 1.f, seed + 10 + s));
    }
    template <class T>
    kernels::ssd_inputs<T> inputs(const std::vector<T>& x_, const std::vector<T>& dt_, const std::vector<T>& A_, const std::vector<T>& B_,
                                  const std::vector<T>& C_, const std::vector<T>& D_) const {
        kernels::ssd_inputs<T> in;
        in.x = tensor_view<const T, 3>(x_.data(), {R, H, P});
        in.dt = tensor_view<const T, 2>(dt_.data(), {R, H});
        in.A = A_.data();
        in.B = tensor_view<const T, 3>(B_.data(), {R, G, N});
        in.C = tensor_view<const T, 3>(C_.data(), {R, G, N});
        in.D = D_.data();
        in.D_per_channel = D_per_channel;
        return in;
    }
    kernels::ssd_inputs<float> in32() const { return inputs(x, dt, A, B, C, D); }
    kernels::ssd_inputs<double> in64() const { return inputs(xd, dtd, Ad, Bd, Cd, Dd); }
    /// Sequences over the given state buffers (sequence 1 without a state).
    template <class T>
    std::vector<kernels::ssd_sequence<T>> seqs(std::vector<std::vector<T>>& states) const {
        std::vector<kernels::ssd_sequence<T>> out;
        std::int64_t r = 0;
        for (std::size_t s = 0; s < lens.size(); ++s) {
            out.push_back({r, lens[s], s == 1 ? nullptr : states[s].data()});
            r += lens[s];
        }
        return out;
    }
    std::size_t y_size() const { return std::size_t(R * H * P); }
};

/// Everything the five fp32 stages produce.
struct staged {
    std::vector<double> dA;
    std::vector<float> cb, states, init, y;
    std::vector<std::vector<float>> final_states;
};

staged run_stages(const cpu_backend& be, const problem& pb, std::int64_t Q) {
    staged r;
    r.final_states = pb.s0;
    const auto seqs = pb.seqs(r.final_states);
    const auto in = pb.in32();
    const auto chunks = kernels::ssd_chunk_layout(std::span<const kernels::ssd_sequence<float>>(seqs), pb.R, Q);
    const std::int64_t K = chunks.n_chunks(), W = chunks.width();
    r.dA.assign(std::size_t(pb.R * pb.H), -123.0);
    r.cb.assign(std::size_t(K * pb.G * W * W), -7.f);
    r.states.assign(std::size_t(K * pb.H * pb.P * pb.N), -7.f);
    r.init.assign(r.states.size(), -7.f);
    r.y.assign(pb.y_size(), -7.f);
    kernels::ssd_chunk_cumsum(be, in, chunks, tensor_view<double, 2>(r.dA.data(), {pb.R, pb.H}));
    kernels::ssd_chunk_cb(be, in, chunks, tensor_view<float, 4>(r.cb.data(), {K, pb.G, W, W}));
    kernels::ssd_chunk_state(be, in, chunks, tensor_view<const double, 2>(r.dA.data(), {pb.R, pb.H}),
                             tensor_view<float, 4>(r.states.data(), {K, pb.H, pb.P, pb.N}));
    kernels::ssd_state_passing(be, std::span<const kernels::ssd_sequence<float>>(seqs), chunks,
                               tensor_view<const double, 2>(r.dA.data(), {pb.R, pb.H}),
                               tensor_view<const float, 4>(r.states.data(), {K, pb.H, pb.P, pb.N}),
                               tensor_view<float, 4>(r.init.data(), {K, pb.H, pb.P, pb.N}));
    kernels::ssd_chunk_scan(be, in, chunks, tensor_view<const float, 4>(r.cb.data(), {K, pb.G, W, W}),
                            tensor_view<const double, 2>(r.dA.data(), {pb.R, pb.H}),
                            tensor_view<const float, 4>(r.init.data(), {K, pb.H, pb.P, pb.N}), tensor_view<float, 3>(r.y.data(), {pb.R, pb.H, pb.P}));
    return r;
}

/// Rows [r0, r0 + n) of a [R, H, P] buffer.
template <class T>
std::vector<T> rows(const std::vector<T>& y, std::int64_t r0, std::int64_t n, std::int64_t width) {
    return std::vector<T>(y.begin() + r0 * width, y.begin() + (r0 + n) * width);
}

struct stage_case {
    std::vector<std::int64_t> lens;
    std::int64_t Q;
};

const std::vector<stage_case> cases{
    {{1}, 4},                // a single token
    {{7}, 1},                // chunk 1
    {{13}, 4},               // T not a multiple of the chunk
    {{5, 0, 9, 1, 16}, 4},   // several sequences: an empty one, a single token, a multiple of the chunk
    {{3, 2}, 64},            // chunks longer than every sequence
    {{50}, 16},
    {{64, 11}, 64},
};

}  // namespace

TEST_CASE("ssd chunk layout: chunks per sequence, the last one shorter, none for empty sequences") {
    const std::vector<std::int64_t> starts{0, 5, 5, 14}, lengths{5, 0, 9, 1};
    const kernels::chunk_layout c(16, 4, starts, lengths);
    CHECK(c.n_rows() == 16);
    CHECK(c.n_seq() == 4);
    REQUIRE(c.n_chunks() == 6);
    CHECK(c.width() == 4);
    const std::vector<std::int64_t> rows{0, 4, 5, 9, 13, 14}, lens{4, 1, 4, 4, 1, 1}, seqs{0, 0, 2, 2, 2, 3}, first{0, 2, 2, 5, 6};
    for (std::int64_t k = 0; k < 6; ++k) {
        CHECK(c.row(k) == rows[std::size_t(k)]);
        CHECK(c.length(k) == lens[std::size_t(k)]);
        CHECK(c.seq(k) == seqs[std::size_t(k)]);
    }
    for (std::int64_t s = 0; s <= 4; ++s) CHECK(c.first_chunk(s) == first[std::size_t(s)]);
    CHECK(c.seq_start(2) == 5);
    CHECK(c.seq_length(2) == 9);
    CHECK_THROWS_AS(kernels::chunk_layout(16, 0, starts, lengths), config_error);
    const std::vector<std::int64_t> bad{0, 5, 5, 16};
    CHECK_THROWS_AS(kernels::chunk_layout(16, 4, bad, lengths), shape_error);
    const kernels::chunk_layout wide(3, 64, std::vector<std::int64_t>{0}, std::vector<std::int64_t>{3});
    CHECK(wide.width() == 3);
    CHECK(wide.n_chunks() == 1);
}

TEST_CASE("ssd stages: each fp32 stage equals its fp64 twin on the same inputs") {
    const cpu_backend be(2);
    const std::int64_t H = 6, P = 5, G = 3, N = 7;
    for (const auto& cs : cases)
        for (bool d_hdim : {false, true}) {
            CAPTURE(cs.lens.size());
            CAPTURE(cs.lens[0]);
            CAPTURE(cs.Q);
            CAPTURE(d_hdim);
            const problem pb(cs.lens, H, P, G, N, 300 + std::uint64_t(cs.Q * 11 + cs.lens[0]), d_hdim);
            const staged f = run_stages(be, pb, cs.Q);
            std::vector<std::vector<double>> s64;
            for (const auto& s : pb.s0) s64.push_back(widen(s));
            const auto seqs64 = pb.seqs(s64);
            const auto in64 = pb.in64();
            const auto chunks = kernels::ssd_chunk_layout(std::span<const kernels::ssd_sequence<double>>(seqs64), pb.R, cs.Q);
            const std::int64_t K = chunks.n_chunks(), W = chunks.width(), R = pb.R;

            // 1. cumsum: fp64 accumulation of the same products, so equal to rounding of the last bit at most.
            std::vector<double> dA(std::size_t(R * H), -123.0);
            kernels::ssd_chunk_cumsum_ref(in64, chunks, tensor_view<double, 2>(dA.data(), {R, H}));
            CHECK(rel_error(f.dA, dA) < 1e-15);
            // 2. C·Bᵀ.
            std::vector<double> cb(f.cb.size());
            kernels::ssd_chunk_cb_ref(in64, chunks, tensor_view<double, 4>(cb.data(), {K, G, W, W}));
            CHECK(rel_error(f.cb, cb) < 1e-6);
            // 3. chunk states from the same cumsum.
            std::vector<double> st(f.states.size());
            kernels::ssd_chunk_state_ref(in64, chunks, tensor_view<const double, 2>(f.dA.data(), {R, H}),
                                         tensor_view<double, 4>(st.data(), {K, H, P, N}));
            CHECK(rel_error(f.states, st) < 1e-6);
            // 4. state passing from the fp32 chunk states.
            const auto st32 = widen(f.states);
            std::vector<double> init(f.init.size());
            kernels::ssd_state_passing_ref(std::span<const kernels::ssd_sequence<double>>(seqs64), chunks,
                                           tensor_view<const double, 2>(f.dA.data(), {R, H}),
                                           tensor_view<const double, 4>(st32.data(), {K, H, P, N}),
                                           tensor_view<double, 4>(init.data(), {K, H, P, N}));
            CHECK(rel_error(f.init, init) < 1e-6);
            for (std::size_t s = 0; s < cs.lens.size(); ++s)
                if (s != 1) CHECK(rel_error(f.final_states[s], s64[s]) < 1e-6);
            // 5. chunk scan from the fp32 C·Bᵀ and chunk initial states.
            const auto cb32 = widen(f.cb), init32 = widen(f.init);
            std::vector<double> y(pb.y_size(), -7.0);
            kernels::ssd_chunk_scan_ref(in64, chunks, tensor_view<const double, 4>(cb32.data(), {K, G, W, W}),
                                        tensor_view<const double, 2>(f.dA.data(), {R, H}),
                                        tensor_view<const double, 4>(init32.data(), {K, H, P, N}), tensor_view<double, 3>(y.data(), {R, H, P}));
            CHECK(rel_error(f.y, y) < 1e-6);
            // Padding rows are untouched by every stage.
            for (std::int64_t i = (R - 2) * H * P; i < R * H * P; ++i) REQUIRE(f.y[std::size_t(i)] == -7.f);
            for (std::int64_t i = (R - 2) * H; i < R * H; ++i) REQUIRE(f.dA[std::size_t(i)] == -123.0);
        }
}

TEST_CASE("ssd stages: the composed stages equal the token recurrence; ssd_chunked equals them") {
    const std::int64_t H = 4, P = 6, G = 2, N = 9;
    for (int threads : {1, 2}) {
        const cpu_backend be(threads);
        for (const auto& cs : cases) {
            CAPTURE(threads);
            CAPTURE(cs.lens.size());
            CAPTURE(cs.lens[0]);
            CAPTURE(cs.Q);
            const problem pb(cs.lens, H, P, G, N, 900 + std::uint64_t(cs.Q * 7 + cs.lens[0]), cs.Q % 2 == 0);
            const staged f = run_stages(be, pb, cs.Q);

            // Token by token in fp64, each sequence from its own initial state.
            const auto in64 = pb.in64();
            std::vector<double> y_rec(pb.y_size(), 0.0);
            std::int64_t r = 0;
            for (std::size_t s = 0; s < cs.lens.size(); ++s) {
                std::vector<double> st = s == 1 ? std::vector<double>(std::size_t(H * P * N), 0.0) : widen(pb.s0[s]);
                kernels::ssd_ref(in64, {r, cs.lens[s], st.data()}, tensor_view<double, 3>(y_rec.data(), {pb.R, H, P}));
                if (cs.lens[s] > 0) CHECK(rel_error(rows(f.y, r, cs.lens[s], H * P), rows(y_rec, r, cs.lens[s], H * P)) < 1e-6);
                if (s != 1) CHECK(rel_error(f.final_states[s], st) < 1e-6);
                r += cs.lens[s];
            }

            // The fused kernel: the same tiles in the same order, so equal up to the summation order Eigen picks for tiny
            // products, which follows the alignment of the data (scratch there, stage tensors here).
            std::vector<std::vector<float>> states = pb.s0;
            const auto seqs = pb.seqs(states);
            std::vector<float> y(pb.y_size(), -7.f);
            kernels::ssd_chunked(be, pb.in32(), std::span<const kernels::ssd_sequence<float>>(seqs), cs.Q,
                                 tensor_view<float, 3>(y.data(), {pb.R, H, P}));
            CHECK(rel_error(y, f.y) < 1e-6);
            for (std::size_t s = 0; s < states.size(); ++s) CHECK(rel_error(states[s], f.final_states[s]) < 1e-6);
        }
    }
}

TEST_CASE("ssd stages: the fp64 twins composed equal the token recurrence") {
    const std::int64_t H = 3, P = 4, G = 1, N = 5;
    for (const auto& cs : cases) {
        CAPTURE(cs.lens[0]);
        CAPTURE(cs.Q);
        const problem pb(cs.lens, H, P, G, N, 77 + std::uint64_t(cs.Q), true);
        const auto in = pb.in64();
        std::vector<std::vector<double>> s64;
        for (const auto& s : pb.s0) s64.push_back(widen(s));
        const auto seqs = pb.seqs(s64);
        const auto chunks = kernels::ssd_chunk_layout(std::span<const kernels::ssd_sequence<double>>(seqs), pb.R, cs.Q);
        const std::int64_t K = chunks.n_chunks(), W = chunks.width(), R = pb.R;
        std::vector<double> dA(std::size_t(R * H)), cb(std::size_t(K * G * W * W)), st(std::size_t(K * H * P * N)), init(st.size()),
            y(pb.y_size(), 0.0);
        kernels::ssd_chunk_cumsum_ref(in, chunks, tensor_view<double, 2>(dA.data(), {R, H}));
        kernels::ssd_chunk_cb_ref(in, chunks, tensor_view<double, 4>(cb.data(), {K, G, W, W}));
        kernels::ssd_chunk_state_ref(in, chunks, tensor_view<const double, 2>(dA.data(), {R, H}), tensor_view<double, 4>(st.data(), {K, H, P, N}));
        kernels::ssd_state_passing_ref(std::span<const kernels::ssd_sequence<double>>(seqs), chunks, tensor_view<const double, 2>(dA.data(), {R, H}),
                                       tensor_view<const double, 4>(st.data(), {K, H, P, N}), tensor_view<double, 4>(init.data(), {K, H, P, N}));
        kernels::ssd_chunk_scan_ref(in, chunks, tensor_view<const double, 4>(cb.data(), {K, G, W, W}),
                                    tensor_view<const double, 2>(dA.data(), {R, H}),
                                    tensor_view<const double, 4>(init.data(), {K, H, P, N}), tensor_view<double, 3>(y.data(), {R, H, P}));
        std::vector<double> y_rec(pb.y_size(), 0.0);
        std::int64_t r = 0;
        for (std::size_t s = 0; s < cs.lens.size(); ++s) {
            std::vector<double> s_rec = s == 1 ? std::vector<double>(std::size_t(H * P * N), 0.0) : widen(pb.s0[s]);
            kernels::ssd_ref(in, {r, cs.lens[s], s_rec.data()}, tensor_view<double, 3>(y_rec.data(), {R, H, P}));
            if (s != 1) CHECK(rel_error(s64[s], s_rec) < 1e-12);
            r += cs.lens[s];
        }
        CHECK(rel_error(y, y_rec) < 1e-12);
    }
}

TEST_CASE("ssd stages: shape, stride and value errors name the argument") {
    const cpu_backend be(1);
    const problem pb({6, 5}, 4, 3, 2, 5, 11, false);
    std::vector<std::vector<float>> states = pb.s0;
    const auto seqs = pb.seqs(states);
    const auto in = pb.in32();
    const auto chunks = kernels::ssd_chunk_layout(std::span<const kernels::ssd_sequence<float>>(seqs), pb.R, 4);
    const std::int64_t K = chunks.n_chunks(), W = chunks.width(), R = pb.R, H = 4, P = 3, G = 2, N = 5;
    std::vector<double> dA(std::size_t(R * H));
    std::vector<float> cb(std::size_t(K * G * W * W)), st(std::size_t(K * H * P * N)), init(st.size()), y(pb.y_size()), big(4 * st.size());
    const tensor_view<const double, 2> dAv(dA.data(), {R, H});
    using doctest::Contains;

    // Wrong sizes.
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cumsum(be, in, chunks, tensor_view<double, 2>(dA.data(), {R, H - 1})), Contains("dA_cumsum"),
                         shape_error);
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cb(be, in, chunks, tensor_view<float, 4>(cb.data(), {K, G, W, W - 1})), Contains("cb"), shape_error);
    // A layout made for other rows.
    const auto other = kernels::ssd_chunk_layout(std::span<const kernels::ssd_sequence<float>>(seqs), R + 1, 4);
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cumsum(be, in, other, tensor_view<double, 2>(dA.data(), {R, H})), Contains("chunk layout"), shape_error);
    // Strides: cb rows must be contiguous, state matrices dense.
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cb(be, in, chunks, tensor_view<float, 4>(big.data(), {K, G, W, W}, {G * W * W * 2, W * W * 2, W * 2, 2})),
                         Contains("cb [n_chunks, G, W, W] needs a unit stride"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_state(be, in, chunks, dAv,
                                                  tensor_view<float, 4>(big.data(), {K, H, P, N}, {H * P * 2 * N, P * 2 * N, 2 * N, 1})),
                         Contains("states [n_chunks, H, P, N] matrix"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::ssd_state_passing(be, std::span<const kernels::ssd_sequence<float>>(seqs), chunks, dAv,
                                                    tensor_view<const float, 4>(st.data(), {K, H, P, N}),
                                                    tensor_view<float, 4>(big.data(), {K, H, P, N}, {H * P * N, P * N, 1, P})),
                         Contains("chunk_init"), shape_error);
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_scan(be, in, chunks, tensor_view<const float, 4>(cb.data(), {K, G, W, W}), dAv,
                                                 tensor_view<const float, 4>(init.data(), {K, H, P, N}),
                                                 tensor_view<float, 3>(big.data(), {R, H, P}, {H * P * 2, P * 2, 2})),
                         Contains("y [R, H, P] needs a unit stride"), shape_error);
    // The sequences handed to state passing must be those of the layout.
    const std::vector<kernels::ssd_sequence<float>> fewer(seqs.begin(), seqs.begin() + 1);
    CHECK_THROWS_WITH_AS(
        kernels::ssd_state_passing(be, std::span<const kernels::ssd_sequence<float>>(fewer), chunks, dAv,
                                   tensor_view<const float, 4>(st.data(), {K, H, P, N}), tensor_view<float, 4>(init.data(), {K, H, P, N})),
        Contains("differ from those the chunk layout"), shape_error);
    // Values: Δ < 0, Δ = +∞, A > 0 are rejected by every stage that reads them; the fp64 twins too.
    problem neg = pb;
    neg.dt[7] = -0.25f;
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cumsum(be, neg.in32(), chunks, tensor_view<double, 2>(dA.data(), {R, H})), Contains("dt[1, 3]"),
                         value_error);
    CHECK_THROWS_AS(kernels::ssd_chunk_state(be, neg.in32(), chunks, dAv, tensor_view<float, 4>(st.data(), {K, H, P, N})), value_error);
    neg.dtd[7] = -0.25;
    CHECK_THROWS_AS(kernels::ssd_chunk_cumsum_ref(neg.in64(), chunks, tensor_view<double, 2>(dA.data(), {R, H})), value_error);
    problem inf = pb;
    inf.dt[5] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_AS(kernels::ssd_chunk_scan(be, inf.in32(), chunks, tensor_view<const float, 4>(cb.data(), {K, G, W, W}), dAv,
                                            tensor_view<const float, 4>(init.data(), {K, H, P, N}), tensor_view<float, 3>(y.data(), {R, H, P})),
                    value_error);
    problem pos = pb;
    pos.A[2] = 0.5f;
    CHECK_THROWS_WITH_AS(kernels::ssd_chunk_cb(be, pos.in32(), chunks, tensor_view<float, 4>(cb.data(), {K, G, W, W})), Contains("A[2]"),
                         value_error);
}
