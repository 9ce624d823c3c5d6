// Causal softmax attention kernels (spec.md §2, invariant 21): a flash-style tiled prefill with online softmax
// over key tiles (no materialised [T, T] scores), a decode kernel for one query row per sequence over a long KV
// cache (split-K with log-sum-exp merge), and an fp64 reference with a materialised mask. Bottom-right causal
// alignment (query i of Tq sees keys 0 … Tk−Tq+i), GQA by head mapping h → h / (H/H_kv), optional sliding window.
// Keys and values may be stored in bf16 or f16 (a 16-bit KV cache): the kernels widen them exactly as they load them
// (kernels/widen.hpp) and keep every product and sum in fp32, in the same order as for f32 keys and values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/lane_sum.hpp"
#include "hymix/kernels/widen.hpp"

namespace hymix::kernels {

/// Scalar parameters shared by every attention kernel.
struct attention_params {
    double scale = 0.0;       // 0 → 1/sqrt(d_h)
    std::int64_t window = 0;  // sliding window w (0 = none): key j visible to query i iff Tk−Tq+i−w < j ≤ Tk−Tq+i
};

/// One sequence's attention problem. The Tq queries are the last Tq tokens of the Tk keys (bottom-right mask);
/// Tk < Tq is allowed (the first Tq−Tk rows then see no key: o = 0, lse = −∞). KV is the element type keys and
/// values are stored in: T, or on the CPU also bf16 / f16 (a 16-bit KV cache), widened exactly to fp32 as loaded.
template <class T, class KV = T>
struct attention_problem {
    tensor_view<const T, 3> q;   // [Tq, H, d_h]      unit stride along d_h
    tensor_view<const KV, 3> k;  // [Tk, H_kv, d_h]   unit stride along d_h (any token / head strides)
    tensor_view<const KV, 3> v;  // [Tk, H_kv, d_h]
    tensor_view<T, 3> o;        // [Tq, H, d_h]      unit stride along d_h; no two elements at one address; no overlap
                                //                   with q, k, v
    tensor_view<T, 2> lse;      // [Tq, H] natural-log LSE of the scaled scores, or data == nullptr for none (any
                                //         strides; no overlap with o, q, k, v or itself)
};

namespace detail {

// Argument checks of every attention entry point, in every build: shapes, GQA divisibility, the unit stride along
// d_h that the dot products and row copies assume (token and head strides are free, also 0 or negative for inputs),
// outputs whose elements do not overlap each other or the inputs, a finite scale and a window >= 0. They cost a few
// dozen comparisons per problem. Not checked, on purpose: the values of q, k and v (finiteness would need a pass
// over the whole KV cache on every decode step, as expensive as the attention itself); a NaN or Inf there
// propagates to o and LSE instead (spec.md §2), where callers check results.
template <class T, class KV>
void attention_check(const attention_problem<T, KV>& p, const char* who) {
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
    const std::string_view w(who);
    p.k.require_shape({Tk, Hkv, dh}, w, "k");
    p.v.require_shape({Tk, Hkv, dh}, w, "v");
    p.o.require_shape({Tq, H, dh}, w, "o");
    if (p.lse.data) p.lse.require_shape({Tq, H}, w, "lse");
    if (Hkv <= 0 || H % Hkv != 0)
        throw shape_error(std::string(w) + ": query heads " + std::to_string(H) + " not a multiple of key/value heads " + std::to_string(Hkv));
    if (dh < 1) throw shape_error(std::string(w) + ": head_dim must be >= 1, found " + std::to_string(dh));
    hymix::detail::require_unit_stride(p.q, 2, w, "q");
    hymix::detail::require_unit_stride(p.k, 2, w, "k");
    hymix::detail::require_unit_stride(p.v, 2, w, "v");
    hymix::detail::require_unit_stride(p.o, 2, w, "o");
    hymix::detail::require_no_self_overlap(p.o, w, "o");
    hymix::detail::require_no_overlap(p.o, "o", p.q, "q", w);
    hymix::detail::require_no_overlap(p.o, "o", p.k, "k", w);
    hymix::detail::require_no_overlap(p.o, "o", p.v, "v", w);
    if (p.lse.data) {
        hymix::detail::require_no_self_overlap(p.lse, w, "lse");
        hymix::detail::require_no_overlap(p.lse, "lse", p.q, "q", w);
        hymix::detail::require_no_overlap(p.lse, "lse", p.k, "k", w);
        hymix::detail::require_no_overlap(p.lse, "lse", p.v, "v", w);
        hymix::detail::require_no_overlap(p.lse, "lse", p.o, "o", w);
    }
}

inline void attention_check_params(const attention_params& a, const char* who) {
    hymix::detail::require_finite(a.scale, who, "params.scale");
    if (a.window < 0) throw value_error(std::string(who) + ": params.window must be >= 0 (0 = none), found " + std::to_string(a.window));
}

inline double attention_scale(const attention_params& a, std::int64_t dh) {
    return a.scale != 0.0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(dh));
}

/// Visible key range [lo, hi) of query row i (0-based in the call).
inline void visible_keys(std::int64_t i, std::int64_t Tq, std::int64_t Tk, std::int64_t window, std::int64_t& lo,
                         std::int64_t& hi) {
    hi = std::min(Tk, Tk - Tq + i + 1);
    lo = window > 0 ? std::max<std::int64_t>(0, Tk - Tq + i - window + 1) : 0;
    if (hi < lo) hi = lo;
}

/// Per-thread scratch, grown on demand and kept, so repeated calls do not allocate.
struct attention_scratch {
    std::vector<float> s, o, m, l, q, part;
    static attention_scratch& get() {
        thread_local attention_scratch sc;
        return sc;
    }
};

inline void grow(std::vector<float>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
}

/// Σ a[i]·b[i] over n values (b widened to fp32 as loaded).
template <class Arch, class TB>
inline float dot(const float* a, const TB* b, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    std::int64_t i = 0;
    V acc0(0.f), acc1(0.f);
    for (; i + 2 * W <= n; i += 2 * W) {
        acc0 = xsimd::fma(V::load_unaligned(a + i), load_widened<Arch>(b + i), acc0);
        acc1 = xsimd::fma(V::load_unaligned(a + i + W), load_widened<Arch>(b + i + W), acc1);
    }
    for (; i + W <= n; i += W) acc0 = xsimd::fma(V::load_unaligned(a + i), load_widened<Arch>(b + i), acc0);
    float s = xsimd::hadd(acc0 + acc1);
    for (; i < n; ++i) s += a[i] * widen(b[i]);
    return s;
}

/// y[i] += p·x[i] over n values (x widened to fp32 as loaded).
template <class Arch, class TX>
inline void axpy(float* y, float p, const TX* x, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    const V pv(p);
    std::int64_t i = 0;
    for (; i + W <= n; i += W) xsimd::fma(pv, load_widened<Arch>(x + i), V::load_unaligned(y + i)).store_unaligned(y + i);
    for (; i < n; ++i) y[i] += p * widen(x[i]);
}

/// In place: s[j] ← exp(s[j]·scale − m) over n floats; returns the sum.
template <class Arch>
inline float exp_scaled_sum(float* s, std::int64_t n, float scale, float m) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    const V sc(scale), mv(m);
    V acc(0.f);
    std::int64_t j = 0;
    for (; j + W <= n; j += W) {
        const V e = xsimd::exp(xsimd::fms(V::load_unaligned(s + j), sc, mv));
        e.store_unaligned(s + j);
        acc += e;
    }
    float sum = xsimd::hadd(acc);
    for (; j < n; ++j) {
        s[j] = std::exp(s[j] * scale - m);
        sum += s[j];
    }
    return sum;
}

template <class Arch>
inline float max_of(const float* s, std::int64_t n) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    float mx = -std::numeric_limits<float>::infinity();
    std::int64_t j = 0;
    if (n >= W) {
        V acc = V::load_unaligned(s);
        for (j = W; j + W <= n; j += W) acc = xsimd::max(acc, V::load_unaligned(s + j));
        alignas(64) float lanes[V::size];
        acc.store_aligned(lanes);
        for (std::size_t i = 0; i < V::size; ++i) mx = std::max(mx, lanes[i]);
    }
    for (; j < n; ++j) mx = std::max(mx, s[j]);
    return mx;
}

/// Query rows per work item for architecture Arch: four SIMD registers of queries (64 with AVX-512).
template <class Arch>
inline constexpr std::int64_t tile_q = 4 * static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
inline constexpr std::int64_t tile_k = 64;   // keys per inner tile

// The tile works in a transposed layout so that neither K nor V needs repacking: queries run along SIMD lanes.
//   Qt [d_h, bqp]  scaled query tile, transposed once per work item (bqp = NV·W padded query lanes)
//   St [bk, bqp]   scores, then probabilities, of one key tile: St[j, i] = Σ_c K[j, c] · Qt[c, i]
//   Ot [d_h, bqp]  unnormalised output accumulator: Ot[c, i] = α_i·Ot[c, i] + Σ_j V[j, c] · St[j, i]
// Both products broadcast one K or V element against NV query vectors (R × NV accumulators in registers).

/// St rows [j, j + R): R key rows against all NV query vectors, over d_h.
template <class Arch, int NV, int R, class KV>
inline void score_rows(const float* Qt, std::int64_t bqp, const KV* k, std::int64_t ks, std::int64_t dh, float* St) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc[R][NV];
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n] = V(0.f);
    for (std::int64_t c = 0; c < dh; ++c) {
        V q[NV];
        for (int n = 0; n < NV; ++n) q[n] = V::load_aligned(Qt + c * bqp + n * W);
        for (int r = 0; r < R; ++r) {
            const V kb(widen(k[r * ks + c]));
            for (int n = 0; n < NV; ++n) acc[r][n] = xsimd::fma(kb, q[n], acc[r][n]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n].store_aligned(St + r * bqp + n * W);
}

/// Ot rows [c, c + R) ← α ⊙ Ot rows + Σ_j V[j, c..c+R) · St[j, :] over the bk keys of the tile.
template <class Arch, int NV, int R, class KV>
inline void accumulate_rows(const float* St, std::int64_t bqp, std::int64_t bk, const KV* v, std::int64_t vs,
                            const float* alpha, float* Ot) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc[R][NV];
    for (int n = 0; n < NV; ++n) {
        const V a = V::load_aligned(alpha + n * W);
        for (int r = 0; r < R; ++r) acc[r][n] = V::load_aligned(Ot + r * bqp + n * W) * a;
    }
    for (std::int64_t j = 0; j < bk; ++j) {
        V pv[NV];
        for (int n = 0; n < NV; ++n) pv[n] = V::load_aligned(St + j * bqp + n * W);
        for (int r = 0; r < R; ++r) {
            const V vb(widen(v[j * vs + r]));
            for (int n = 0; n < NV; ++n) acc[r][n] = xsimd::fma(vb, pv[n], acc[r][n]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int n = 0; n < NV; ++n) acc[r][n].store_aligned(Ot + r * bqp + n * W);
}

/// Queries [i0, i1) (at most tile_q) of head h of one problem, NV = ceil((i1 − i0) / W): loops over the visible
/// key tiles with an online softmax. Masked scores become −∞; a lane whose running max is still −∞ uses 0 as its
/// reference, so exp(−∞ − (−∞)) is never evaluated and a row with no visible key ends with l = 0 → o = 0, LSE −∞.
template <class Arch, int NV, class KV>
void attention_tile_nv(const attention_problem<float, KV>& p, std::int64_t h, std::int64_t i0, std::int64_t i1, float scale,
                       std::int64_t window) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    constexpr std::int64_t bqp = NV * W;
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0);
    const std::int64_t hk = h / (H / p.k.dim(1));
    const std::int64_t bq = i1 - i0, off = Tk - Tq;
    auto& sc = attention_scratch::get();
    // Each buffer starts at the first 64-byte boundary of its vector: up to 15 floats of slack whatever W is (a
    // slack of W floats overran the buffers by up to 48 bytes with SSE2 or AVX2 lanes).
    constexpr std::int64_t slack = 64 / sizeof(float) - 1;
    grow(sc.q, static_cast<std::size_t>(dh * bqp + slack));
    grow(sc.s, static_cast<std::size_t>(tile_k * bqp + slack));
    grow(sc.o, static_cast<std::size_t>(dh * bqp + slack));
    grow(sc.m, static_cast<std::size_t>(3 * bqp + slack));
    auto align = [](float* ptr) {
        const auto a = reinterpret_cast<std::uintptr_t>(ptr);
        return reinterpret_cast<float*>((a + 63) / 64 * 64);
    };
    float* Qt = align(sc.q.data());   // [d_h, bqp]
    float* St = align(sc.s.data());   // [tile_k, bqp]
    float* Ot = align(sc.o.data());   // [d_h, bqp]
    float* m = align(sc.m.data());    // [bqp] running max
    float* l = m + bqp;               // [bqp] running sum
    float* alpha = l + bqp;           // [bqp] rescale factor of this tile
    const float ninf = -std::numeric_limits<float>::infinity();
    for (std::int64_t c = 0; c < dh; ++c) {
        for (std::int64_t i = 0; i < bq; ++i) Qt[c * bqp + i] = scale * p.q(i0 + i, h, c);
        for (std::int64_t i = bq; i < bqp; ++i) Qt[c * bqp + i] = 0.f;
    }
    std::fill(Ot, Ot + dh * bqp, 0.f);
    std::fill(m, m + bqp, ninf);
    std::fill(l, l + bqp, 0.f);

    std::int64_t lo_first, hi_first, lo_last, hi_last;
    visible_keys(i0, Tq, Tk, window, lo_first, hi_first);
    visible_keys(i1 - 1, Tq, Tk, window, lo_last, hi_last);
    const std::int64_t klo = lo_first, khi = hi_last;  // union of the rows' visible ranges (both ends grow with i)
    alignas(64) float iota[W];
    for (std::int64_t w = 0; w < W; ++w) iota[w] = static_cast<float>(w);
    const V lane = V::load_aligned(iota);
    const std::int64_t ks = p.k.strides[0], vs = p.v.strides[0];

    for (std::int64_t j0 = klo; j0 < khi; j0 += tile_k) {
        const std::int64_t bk = std::min(tile_k, khi - j0);
        const KV* kt = &p.k(j0, hk, 0);
        const KV* vt = &p.v(j0, hk, 0);
        std::int64_t j = 0;
        for (; j + 4 <= bk; j += 4) score_rows<Arch, NV, 4>(Qt, bqp, kt + j * ks, ks, dh, St + j * bqp);
        for (; j < bk; ++j) score_rows<Arch, NV, 1>(Qt, bqp, kt + j * ks, ks, dh, St + j * bqp);
        // Mask only tiles that cross a boundary: key j is visible to query i iff j − off ≤ i < j − off + window.
        const bool causal_edge = j0 + bk > hi_first;
        const bool window_edge = window > 0 && j0 < lo_last;
        if (causal_edge || window_edge) {
            const V vninf(ninf);
            for (std::int64_t jj = 0; jj < bk; ++jj) {
                const auto rel = static_cast<float>(j0 + jj - off - i0);  // lane index of the first query seeing key jj
                for (int n = 0; n < NV; ++n) {
                    const V idx = lane + V(static_cast<float>(n * W));
                    auto vis = idx >= V(rel);
                    if (window > 0) vis = vis && (idx < V(rel + static_cast<float>(window)));
                    float* s = St + jj * bqp + n * W;
                    xsimd::select(vis, V::load_aligned(s), vninf).store_aligned(s);
                }
            }
        }
        // Online softmax over the tile, vectorised over queries.
        for (int n = 0; n < NV; ++n) {
            V mx(ninf);
            for (std::int64_t jj = 0; jj < bk; ++jj) mx = xsimd::max(mx, V::load_aligned(St + jj * bqp + n * W));
            const V m_old = V::load_aligned(m + n * W);
            const V m_new = xsimd::max(m_old, mx);
            const auto empty = m_new == V(ninf);
            const V ref = xsimd::select(empty, V(0.f), m_new);  // never exp(−∞ − (−∞))
            const V a = xsimd::exp(m_old - ref);                // m_old = −∞ → 0
            V sum(0.f);
            for (std::int64_t jj = 0; jj < bk; ++jj) {
                float* s = St + jj * bqp + n * W;
                const V e = xsimd::exp(V::load_aligned(s) - ref);
                e.store_aligned(s);
                sum += e;
            }
            (V::load_aligned(l + n * W) * a + sum).store_aligned(l + n * W);
            m_new.store_aligned(m + n * W);
            a.store_aligned(alpha + n * W);
        }
        std::int64_t c = 0;
        for (; c + 4 <= dh; c += 4) accumulate_rows<Arch, NV, 4>(St, bqp, bk, vt + c, vs, alpha, Ot + c * bqp);
        for (; c < dh; ++c) accumulate_rows<Arch, NV, 1>(St, bqp, bk, vt + c, vs, alpha, Ot + c * bqp);
    }
    for (std::int64_t i = 0; i < bq; ++i) {
        float* orow = &p.o(i0 + i, h, 0);
        if (l[i] != 0.f) {  // l >= 1 once a key is visible; NaN (a NaN score or value) must propagate, not vanish
            const float inv = 1.f / l[i];
            for (std::int64_t c = 0; c < dh; ++c) orow[c] = Ot[c * bqp + i] * inv;
            if (p.lse.data) p.lse(i0 + i, h) = m[i] + std::log(l[i]);
        } else {  // no visible key: o = 0, LSE = −∞
            std::fill(orow, orow + dh, 0.f);
            if (p.lse.data) p.lse(i0 + i, h) = ninf;
        }
    }
}

template <class Arch, class KV>
void attention_tile(const attention_problem<float, KV>& p, std::int64_t h, std::int64_t i0, std::int64_t i1, float scale,
                    std::int64_t window) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    switch ((i1 - i0 + W - 1) / W) {
        case 1: attention_tile_nv<Arch, 1, KV>(p, h, i0, i1, scale, window); break;
        case 2: attention_tile_nv<Arch, 2, KV>(p, h, i0, i1, scale, window); break;
        case 3: attention_tile_nv<Arch, 3, KV>(p, h, i0, i1, scale, window); break;
        default: attention_tile_nv<Arch, 4, KV>(p, h, i0, i1, scale, window); break;
    }
}

/// Keys per block of the decode kernel (decode_group's score buffer holds g · decode_block floats).
inline constexpr std::int64_t decode_block = 512;

/// Prefetches the n values from p into L2 (one request per 64-byte line; hint T1, as kernels::linear's weight
/// prefetch). The decode kernel fetches a whole block of keys or values (256 KiB of f32 at d_h 128) one pass ahead of
/// its use, more than L1 holds, so hint T0 (into L1) would evict lines still in use. Measured with bench_attention
/// (docs/attn_decode_prefetch_2core/): on a 2-core AMD EPYC (Zen 5) 32K f32 keys of 32 / 8 heads × 128 were read at
/// 16.1 GB/s against 12.1 with T0 (medians of three alternated rounds); on a 16-core Xeon no change beyond the spread.
template <class T>
inline void prefetch_values(const T* p, std::int64_t n) {
    const auto* b = reinterpret_cast<const char*>(p);
    const std::int64_t bytes = n * static_cast<std::int64_t>(sizeof(T));
    for (std::int64_t c = 0; c < bytes; c += 64) __builtin_prefetch(b + c, 0, 2);
}

/// Register tiles of the decode kernel: `tile` accumulators (16 with 32 vector registers, 8 with 16), split between
/// query heads and keys (scores) or query heads and d_h vectors (P·V). heads(g): the query heads per tile, the largest
/// of 4, 2, 1 that divides the group size g.
template <class Arch>
struct decode_tiles {
    static constexpr int tile = std::is_base_of_v<xsimd::avx512f, Arch> ? 16 : 8;
    static int heads(std::int64_t g) { return g % 4 == 0 ? 4 : g % 2 == 0 ? 2 : 1; }
};

/// Scores of HC query heads × KC keys: s[h·ld + j] = scale · (q_h · k_j) over d_h (a multiple of the SIMD width), one
/// accumulator per (head, key) fed by each loaded key vector HC times; the sums of all HC·KC accumulators at once
/// (lane_tree_sum16 with AVX-512). A key's score is the same bits in any tile shape.
template <class Arch, int HC, int KC, class KV>
inline void score_tile(const float* q, std::int64_t qs, const KV* k, std::int64_t ks, std::int64_t dh, float scale, float* s,
                       std::int64_t ld) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc[HC * KC];
    static_for<HC * KC>([&](auto i) { acc[i] = V(0.f); });
    for (std::int64_t d = 0; d < dh; d += W) {
        V kv[KC];
        static_for<KC>([&](auto j) { kv[j] = load_widened<Arch>(k + j * ks + d); });
        static_for<HC>([&](auto h) {
            const V qv = V::load_unaligned(q + h * qs + d);
            static_for<KC>([&](auto j) { acc[h * KC + j] = xsimd::fma(qv, kv[j], acc[h * KC + j]); });
        });
    }
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, Arch> && HC * KC <= 16) {
        alignas(64) float sums[16];
        _mm512_store_ps(sums, _mm512_mul_ps(lane_tree_sum16<HC * KC>([&](auto i) -> __m512 { return acc[i]; }), _mm512_set1_ps(scale)));
        static_for<HC * KC>([&](auto i) { s[(i / KC) * ld + i % KC] = sums[i]; });
        return;
    }
#endif
    static_for<HC * KC>([&](auto i) { s[(i / KC) * ld + i % KC] = lane_tree_sum<Arch>(acc[i]) * scale; });
}

/// o_h[c0 …] ← α_h · o_h[c0 …] + Σ_j p[h·ld + j] · v_j[c0 …] for HC heads (rows o + h·os) and VC SIMD vectors of d_h
/// from column c0, over n keys: the HC·VC sums stay in registers for the whole key block, each loaded value vector
/// feeding HC of them. With `pf`, row j of [pf, pf + pn·pfs) (the next block's keys, row_floats each) is prefetched
/// while key j is summed, so the memory reads of the next block overlap this block's arithmetic.
template <class Arch, int HC, int VC, class KV>
inline void pv_tile(const float* p, std::int64_t ld, const KV* v, std::int64_t vs, std::int64_t n, std::int64_t c0,
                    float* o, std::int64_t os, const float* alpha, const KV* pf = nullptr, std::int64_t pfs = 0,
                    std::int64_t pn = 0, std::int64_t row_floats = 0) {
    using V = xsimd::batch<float, Arch>;
    constexpr std::int64_t W = static_cast<std::int64_t>(V::size);
    V acc[HC * VC];
    static_for<HC * VC>([&](auto i) { acc[i] = V(0.f); });
    for (std::int64_t j = 0; j < n; ++j) {
        if (j < pn) prefetch_values(pf + j * pfs, row_floats);
        V vv[VC];
        static_for<VC>([&](auto c) { vv[c] = load_widened<Arch>(v + j * vs + c0 + c * W); });
        static_for<HC>([&](auto h) {
            const V pj(p[h * ld + j]);
            static_for<VC>([&](auto c) { acc[h * VC + c] = xsimd::fma(pj, vv[c], acc[h * VC + c]); });
        });
    }
    static_for<HC>([&](auto h) {
        const V a(alpha[h]);
        static_for<VC>([&](auto c) {
            float* oc = o + h * os + c0 + c * W;
            xsimd::fma(V::load_unaligned(oc), a, acc[h * VC + c]).store_unaligned(oc);
        });
    });
}

/// The g = H/H_kv query heads of KV head hk over keys [j0, j1): partial rows [g, 2 + d_h] = (m, l, unnormalised o)
/// each. Keys go in blocks of 512; per block, one pass over K for the scores of all heads of the group (register
/// tiles of heads × keys) and one over V for their outputs (tiles of heads × d_h vectors, accumulated in registers
/// over the block), so K and V are read from memory once per group. sbuf holds g · decode_block floats, alpha g.
/// d_h not a multiple of the SIMD width takes a plain path with the same maths.
template <class Arch, class KV>
void decode_group(const attention_problem<float, KV>& p, std::int64_t hk, std::int64_t j0, std::int64_t j1, float scale,
                  float* rows, std::int64_t pw, float* sbuf, float* alpha) {
    constexpr std::int64_t W = static_cast<std::int64_t>(xsimd::batch<float, Arch>::size);
    constexpr int tile = decode_tiles<Arch>::tile;
    const std::int64_t dh = p.q.dim(2), g = p.q.dim(1) / p.k.dim(1);
    constexpr std::int64_t blk = decode_block, key_ahead = 32;
    const float ninf = -std::numeric_limits<float>::infinity();
    for (std::int64_t r = 0; r < g; ++r) {
        rows[r * pw] = ninf;
        rows[r * pw + 1] = 0.f;
        std::fill(rows + r * pw + 2, rows + r * pw + 2 + dh, 0.f);
    }
    const std::int64_t ks = p.k.strides[0], vs = p.v.strides[0];
    const bool tiled = dh % W == 0;
    const int hc = decode_tiles<Arch>::heads(g);
    const float* q0 = &p.q(0, hk * g, 0);  // head r of the group at q0 + r·qs, its output row at rows + r·pw + 2
    const std::int64_t qs = p.q.strides[1];
    for (std::int64_t b0 = j0; b0 < j1; b0 += blk) {
        const std::int64_t n = std::min(blk, j1 - b0);
        const KV* kb = &p.k(b0, hk, 0);
        const KV* vb = &p.v(b0, hk, 0);
        // 1. Scores s[r, j] of every head r of the group.
        if (tiled) {
            with_constant<4>(hc, [&](auto HC) {
                constexpr int KC = tile / HC;
                for (std::int64_t r = 0; r < g; r += HC) {
                    std::int64_t j = 0;
                    for (; j + KC <= n; j += KC) {
                        // Bring the same keys' values in while their scores are computed; in the first block (not
                        // prefetched by a previous one) also run ahead of its keys.
                        for (std::int64_t jj = j; r == 0 && jj < j + KC; ++jj) {
                            prefetch_values(vb + jj * vs, dh);
                            if (b0 == j0 && jj + key_ahead < n) prefetch_values(kb + (jj + key_ahead) * ks, dh);
                        }
                        score_tile<Arch, HC, KC>(q0 + r * qs, qs, kb + j * ks, ks, dh, scale, sbuf + r * blk + j, blk);
                    }
                    for (; j < n; ++j) score_tile<Arch, HC, 1>(q0 + r * qs, qs, kb + j * ks, ks, dh, scale, sbuf + r * blk + j, blk);
                }
            });
        } else {
            for (std::int64_t r = 0; r < g; ++r)
                for (std::int64_t j = 0; j < n; ++j) sbuf[r * blk + j] = scale * dot<Arch>(q0 + r * qs, kb + j * ks, dh);
        }
        // 2. Online softmax per head: new running max, weights exp(s − max), the rescale α of what came before.
        for (std::int64_t r = 0; r < g; ++r) {
            float* row = rows + r * pw;
            float* sr = sbuf + r * blk;
            const float m_old = row[0];
            const float m_new = std::max(m_old, max_of<Arch>(sr, n));
            // While no finite score has been seen (m_new = −∞: the block's scores are all −∞), the weights are taken
            // relative to 0 instead of m_new, so exp(−∞ − (−∞)) is never evaluated: −∞ gives 0, NaN stays NaN.
            const float ref = m_new == ninf ? 0.f : m_new;
            const float a = m_old == ninf ? 0.f : std::exp(m_old - m_new);
            const float sum = exp_scaled_sum<Arch>(sr, n, 1.f, ref);
            row[1] = row[1] * a + sum;
            row[0] = m_new;
            alpha[r] = a;
        }
        // 3. o_r ← α_r o_r + Σ_j p[r, j] v_j.
        if (tiled) {
            with_constant<4>(hc, [&](auto HC) {
                constexpr int VC = tile / HC;
                const std::int64_t nv = dh / W;
                // The next block's keys come in while this block's values are summed (first tile only).
                const std::int64_t nn = std::min(blk, j1 - b0 - n);
                for (std::int64_t r = 0; r < g; r += HC) {
                    std::int64_t c = 0;
                    for (; c + VC <= nv; c += VC)
                        pv_tile<Arch, HC, VC>(sbuf + r * blk, blk, vb, vs, n, c * W, rows + r * pw + 2, pw, alpha + r,
                                              kb + n * ks, ks, r == 0 && c == 0 ? nn : 0, dh);
                    if (c < nv)
                        with_constant<VC>(static_cast<int>(nv - c), [&](auto RC) {
                            pv_tile<Arch, HC, decltype(RC)::value>(sbuf + r * blk, blk, vb, vs, n, c * W, rows + r * pw + 2, pw,
                                                                   alpha + r);
                        });
                }
            });
        } else {
            for (std::int64_t r = 0; r < g; ++r) {
                float* o_acc = rows + r * pw + 2;
                const float a = alpha[r];
                if (a != 1.f)
                    for (std::int64_t c = 0; c < dh; ++c) o_acc[c] *= a;
                for (std::int64_t j = 0; j < n; ++j) axpy<Arch>(o_acc, sbuf[r * blk + j], vb + j * vs, dh);
            }
        }
    }
}

}  // namespace detail

template <cpu_backend_type Backend, class KV>
void attention_decode(const Backend& be, std::span<const attention_problem<float, KV>> problems, const attention_params& prm);

/// Tiled causal attention over a batch of independent problems (one per sequence). Work items are
/// (problem, head, tile of 4 SIMD widths of queries: 64 with AVX-512), run in parallel with the backend's parallel_for; each item loops over
/// its visible key tiles with an online softmax (running max / sum in fp32), so memory stays O(tile).
/// Problems with a single query row go to attention_decode instead (one call for all of them, after the tiles), so a
/// one-token sequence gets the same bits in a prefill call, beside longer sequences, as in a decode step (batch
/// invariance, spec.md §0).
/// Throws shape_error on inconsistent shapes, H % H_kv != 0 or views that break the stride rules of attention_problem,
/// value_error on a non-finite scale or a negative window.
template <cpu_backend_type Backend, class KV>
void attention_prefill(const Backend& be, std::span<const attention_problem<float, KV>> problems, const attention_params& prm) {
    struct item {
        std::int64_t p, h, i0, i1;
    };
    detail::attention_check_params(prm, "attention_prefill");
    std::vector<item> items;
    std::vector<attention_problem<float, KV>> single;  // Tq = 1: the decode kernel
    for (std::size_t pi = 0; pi < problems.size(); ++pi) {
        const auto& p = problems[pi];
        detail::attention_check(p, "attention_prefill");
        const std::int64_t Tq = p.q.dim(0);
        if (Tq == 1) {
            single.push_back(p);
            continue;
        }
        // Later query tiles see more keys: enumerate them first so the expensive items start early.
        constexpr std::int64_t tq = detail::tile_q<typename Backend::arch>;
        for (std::int64_t i0 = (Tq - 1) / tq * tq; i0 >= 0 && Tq > 0; i0 -= tq)
            for (std::int64_t h = 0; h < p.q.dim(1); ++h)
                items.push_back({static_cast<std::int64_t>(pi), h, i0, std::min(Tq, i0 + tq)});
    }
    be.parallel_for(static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t it = b; it < e; ++it) {
            const auto& w = items[static_cast<std::size_t>(it)];
            const auto& p = problems[static_cast<std::size_t>(w.p)];
            const auto scale = static_cast<float>(detail::attention_scale(prm, p.q.dim(2)));
            detail::attention_tile<typename Backend::arch>(p, w.h, w.i0, w.i1, scale, prm.window);
        }
    });
    if (!single.empty()) attention_decode(be, std::span<const attention_problem<float, KV>>(single), prm);
}

/// Decode: every problem has exactly one query row (Tq = 1, else shape_error) over Tk cached keys. Work items
/// are (problem, KV head, key block): all H/H_kv query heads of a group share each K/V read, and a long key range
/// is split into blocks of at least 1024 keys, run in parallel and merged through their LSE in block order: up to
/// 64 / H_kv blocks per KV head (so a problem offers about 64 work items), never shorter than 1024 keys (longer
/// blocks stream K and V with fewer cold starts). The blocks depend on the sequence's own key count and head shape
/// only — never on the thread count or the rest of the batch — so a sequence's output is the same bits in any batch
/// (batch invariance, spec.md §0).
template <cpu_backend_type Backend, class KV>
void attention_decode(const Backend& be, std::span<const attention_problem<float, KV>> problems, const attention_params& prm) {
    using Arch = typename Backend::arch;
    struct item {
        std::int64_t p, hk, j0, j1, slot;  // slot: first row of this item's partial results
    };
    std::vector<item> items;
    detail::attention_check_params(prm, "attention_decode");
    for (const auto& p : problems) {
        detail::attention_check(p, "attention_decode");
        if (p.q.dim(0) != 1)
            throw shape_error("attention_decode: every sequence must have exactly 1 query token, found " + std::to_string(p.q.dim(0)));
    }
    constexpr std::int64_t min_keys = 1024, items_per_problem = 64;
    std::int64_t n_partial = 0;
    for (std::size_t pi = 0; pi < problems.size(); ++pi) {
        const auto& p = problems[pi];
        const std::int64_t Tk = p.k.dim(0), Hkv = p.k.dim(1), g = p.q.dim(1) / Hkv;
        std::int64_t lo, hi;
        detail::visible_keys(0, 1, Tk, prm.window, lo, hi);
        const std::int64_t n = hi - lo;
        const std::int64_t splits = std::max<std::int64_t>(1, std::min(n / min_keys, items_per_problem / Hkv));
        const std::int64_t len = (n + splits - 1) / splits;
        for (std::int64_t hk = 0; hk < Hkv; ++hk)
            for (std::int64_t s = 0; s < splits; ++s) {
                const std::int64_t j0 = lo + s * len, j1 = std::min(hi, j0 + len);
                items.push_back({static_cast<std::int64_t>(pi), hk, j0, std::max(j0, j1), n_partial});
                n_partial += g;
            }
    }
    std::int64_t dh_max = 0, g_max = 1;
    for (const auto& p : problems) {
        dh_max = std::max(dh_max, p.q.dim(2));
        g_max = std::max(g_max, p.q.dim(1) / p.k.dim(1));
    }
    // Partial rows: [n_partial, 2 + d_h]: m, l, unnormalised o.
    const std::int64_t pw = 2 + dh_max;
    auto& part = detail::attention_scratch::get().part;  // the calling thread's scratch (workers use their own)
    detail::grow(part, static_cast<std::size_t>(n_partial * pw));
    float* P = part.data();
    be.parallel_for(static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b, std::int64_t e) {
        auto& sc = detail::attention_scratch::get();
        detail::grow(sc.s, static_cast<std::size_t>(detail::decode_block * g_max));
        detail::grow(sc.m, static_cast<std::size_t>(g_max));
        for (std::int64_t it = b; it < e; ++it) {
            const auto& w = items[static_cast<std::size_t>(it)];
            const auto& p = problems[static_cast<std::size_t>(w.p)];
            const auto scale = static_cast<float>(detail::attention_scale(prm, p.q.dim(2)));
            detail::decode_group<Arch>(p, w.hk, w.j0, w.j1, scale, P + w.slot * pw, pw, sc.s.data(), sc.m.data());
        }
    });
    // Merge the splits of each (problem, head) through their LSE.
    const float ninf = -std::numeric_limits<float>::infinity();
    std::size_t it = 0;
    for (std::size_t pi = 0; pi < problems.size(); ++pi) {
        const auto& p = problems[pi];
        const std::int64_t Hkv = p.k.dim(1), g = p.q.dim(1) / Hkv, dh = p.q.dim(2);
        for (std::int64_t hk = 0; hk < Hkv; ++hk) {
            std::size_t first = it;
            while (it < items.size() && items[it].p == static_cast<std::int64_t>(pi) && items[it].hk == hk) ++it;
            for (std::int64_t r = 0; r < g; ++r) {
                float m = ninf;
                for (std::size_t s = first; s < it; ++s) {
                    const float ms = P[(items[s].slot + r) * pw];
                    m = (ms > m || std::isnan(ms)) && !std::isnan(m) ? ms : m;  // a NaN split maximum wins
                }
                // Splits with no finite score (m_s = −∞, l_s = 0) get weight exp(−∞ − ref) = 0. When no split has a
                // finite score (m = −∞) the reference is 0, so exp(−∞ − (−∞)) is never evaluated here either.
                const float ref = m == ninf ? 0.f : m;
                float* orow = &p.o(0, hk * g + r, 0);
                std::fill(orow, orow + dh, 0.f);
                float l = 0.f;
                for (std::size_t s = first; s < it; ++s) {
                    const float* row = P + (items[s].slot + r) * pw;
                    const float f = std::exp(row[0] - ref);
                    l += row[1] * f;
                    for (std::int64_t c = 0; c < dh; ++c) orow[c] += f * row[2 + c];
                }
                if (l != 0.f) {  // NaN propagates
                    const float inv = 1.f / l;
                    for (std::int64_t c = 0; c < dh; ++c) orow[c] *= inv;
                } else {  // no visible key, or every visible score −∞: o = 0, LSE −∞ (spec.md §2)
                    std::fill(orow, orow + dh, 0.f);
                }
                if (p.lse.data) p.lse(0, hk * g + r) = l != 0.f ? ref + std::log(l) : ninf;
            }
        }
    }
}

/// Reference: materialises the scaled score matrix [Tq, Tk] per head with the bottom-right causal (and window)
/// mask as −∞, a plain max-subtracted softmax, o = P·V, in fp64. A row with no visible key gives o = 0 and LSE −∞.
/// q [Tq, H, d_h], k, v [Tk, H_kv, d_h], o [Tq, H, d_h], lse [Tq, H] or empty.
inline void attention_ref(const attention_problem<double>& p, const attention_params& prm) {
    detail::attention_check(p, "attention_ref");
    detail::attention_check_params(prm, "attention_ref");
    const std::int64_t Tq = p.q.dim(0), H = p.q.dim(1), dh = p.q.dim(2), Tk = p.k.dim(0), Hkv = p.k.dim(1);
    const double scale = detail::attention_scale(prm, dh);
    const double ninf = -std::numeric_limits<double>::infinity();
    std::vector<double> s(static_cast<std::size_t>(Tq * Tk));
    for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t hk = h / (H / Hkv);
        for (std::int64_t i = 0; i < Tq; ++i)
            for (std::int64_t j = 0; j < Tk; ++j) {
                const std::int64_t last = Tk - Tq + i;  // newest key query i may see
                bool visible = j <= last;
                if (prm.window > 0 && j <= last - prm.window) visible = false;
                double acc = 0;
                for (std::int64_t c = 0; c < dh; ++c) acc += p.q(i, h, c) * p.k(j, hk, c);
                s[i * Tk + j] = visible ? scale * acc : ninf;
            }
        for (std::int64_t i = 0; i < Tq; ++i) {
            double* si = s.data() + i * Tk;  // Tk may be 0: no element access
            const double mx = Tk > 0 ? *std::max_element(si, si + Tk) : ninf;
            for (std::int64_t c = 0; c < dh; ++c) p.o(i, h, c) = 0;
            if (mx == ninf) {
                if (p.lse.data) p.lse(i, h) = ninf;
                continue;
            }
            double sum = 0;
            for (std::int64_t j = 0; j < Tk; ++j) sum += (si[j] = std::exp(si[j] - mx));
            for (std::int64_t j = 0; j < Tk; ++j)
                for (std::int64_t c = 0; c < dh; ++c) p.o(i, h, c) += si[j] / sum * p.v(j, hk, c);
            if (p.lse.data) p.lse(i, h) = mx + std::log(sum);
        }
    }
}

}  // namespace hymix::kernels
