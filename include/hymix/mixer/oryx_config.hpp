// Configuration, weights and state of the Oryx multi-mixer layer (spec.md §6.2–6.4): one head structure with tied
// W_K, W_V, W_G, W_O, output norm and short convs, a query projection per read-out mode, and the linear mixer's own
// gates (Gated DeltaNet or Mamba-2, §6.3); the state keeps a KV cache and the linear and conv states of every slot.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/mixer/kv_cache.hpp"
#include "hymix/schedule/mode_schedule.hpp"

namespace hymix {

/// The linear mixer of an Oryx instance (spec.md §6.3).
enum class oryx_linear_kind { gdn, mamba2 };

/// Sizes and options of one Oryx layer. Everything not stated by the paper is a hymix choice (spec.md §6.2).
struct oryx_config {
    std::int64_t d_model = 0;                       // d
    std::int64_t n_heads = 0;                       // H (both modes; no GQA)
    std::int64_t head_dim = 64;                     // d_h (even: full-width rotate-half RoPE)
    std::int64_t d_conv = 4;                        // K of the short convs on q_l, k, v
    oryx_linear_kind linear = oryx_linear_kind::gdn;
    float norm_eps = 1e-5f;                         // o_norm (gated RMSNorm, norm-then-gate per head)
    float l2_eps = 1e-6f;                           // GDN: inside the sqrt of the q_l / k L2 norms
    std::int64_t gdn_chunk = 64;                    // chunk of the gated-delta prefill (cost only)
    std::int64_t ssd_chunk = 128;                   // chunk of the SSD prefill (cost only)
    double rope_theta = 1e4;                        // RoPE base (rotate-half over the full d_h)
    token_mode default_mode = token_mode::attention;  // the read-out of calls given no mode list

    bool is_gdn() const noexcept { return linear == oryx_linear_kind::gdn; }
    std::int64_t inner() const noexcept { return n_heads * head_dim; }  // H·d_h
    std::int64_t conv_dim() const noexcept { return 3 * inner(); }      // conv state channels [q_l | k | v]

    /// Throws config_error naming the offending field.
    void validate() const {
        auto pos = [](std::int64_t v, const char* n) {
            if (v <= 0) throw config_error(std::string("oryx_config: ") + n + " must be > 0, found " + std::to_string(v));
        };
        pos(d_model, "d_model");
        pos(n_heads, "n_heads");
        pos(head_dim, "head_dim");
        pos(d_conv, "d_conv");
        pos(gdn_chunk, "gdn_chunk");
        pos(ssd_chunk, "ssd_chunk");
        if (head_dim % 2 != 0) throw config_error("oryx_config: head_dim must be even (full-width RoPE), found " + std::to_string(head_dim));
        if (linear != oryx_linear_kind::gdn && linear != oryx_linear_kind::mamba2)
            throw config_error("oryx_config: unknown linear kind " + std::to_string(static_cast<int>(linear)));
        if (!(norm_eps >= 0.f) || !std::isfinite(norm_eps) || !(l2_eps >= 0.f) || !std::isfinite(l2_eps))
            throw config_error("oryx_config: norm_eps and l2_eps must be finite and >= 0, found " + std::to_string(norm_eps) + ", " +
                               std::to_string(l2_eps));
        if (!(rope_theta > 0) || !std::isfinite(rope_theta))
            throw config_error("oryx_config: rope_theta must be finite and > 0, found " + std::to_string(rope_theta));
        if (default_mode != token_mode::linear && default_mode != token_mode::attention)
            throw config_error("oryx_config: unknown default_mode " + std::to_string(static_cast<int>(default_mode)));
    }
};

/// Weights of one layer in [out, in] layout, element type T (fp32 for the mixer; fp64 copies feed the reference in
/// gradient checks). Shared tensors are tied across the two read-outs; the instance's own gates are present, the other
/// instance's are absent (rank 0).
template <class T>
struct basic_oryx_weights {
    /// The projections' type: a linear_weight for fp32 (so inference may keep them as bf16 / f16), tensor<T> else.
    using proj_type = std::conditional_t<std::is_same_v<T, float>, linear_weight, tensor<T>>;

    proj_type q_attn_proj;  // q_attn_proj.weight [H·d_h, d]   W_Q^attn
    proj_type q_lin_proj;   // q_lin_proj.weight  [H·d_h, d]   W_Q^lin
    proj_type k_proj;       // k_proj.weight      [H·d_h, d]   W_K (tied)
    proj_type v_proj;       // v_proj.weight      [H·d_h, d]   W_V (tied)
    proj_type g_proj;       // g_proj.weight      [H·d_h, d]   W_G (tied; gate of o_norm)
    proj_type o_proj;       // o_proj.weight      [d, H·d_h]   W_O (tied)
    tensor<T> o_norm;       // o_norm.weight      [d_h]        shared by every head (tied)
    tensor<T> conv_q;       // q_conv1d.weight    [H·d_h, 1, K] stored [H·d_h, K]; no bias (linear query)
    tensor<T> conv_k;       // k_conv1d.weight    [H·d_h, K] (tied)
    tensor<T> conv_v;       // v_conv1d.weight    [H·d_h, K] (tied)
    proj_type a_proj;       // GDN: a_proj.weight [H, d]  decay pre-activation
    proj_type b_proj;       // GDN: b_proj.weight [H, d]  β pre-activation
    proj_type dt_proj;      // Mamba-2: dt_proj.weight [H, d]
    tensor<T> A_log;        // A_log [H]
    tensor<T> dt_bias;      // dt_bias [H]
    tensor<T> D;            // Mamba-2: D [H]

    /// f(name, tensor&) for every present tensor, with its name relative to the mixer.
    template <class F>
    void for_each(F&& f) {
        visit(*this, f);
    }
    template <class F>
    void for_each(F&& f) const {
        visit(*this, f);
    }

    /// Throws shape_error naming the first tensor whose shape differs from the config (or that the other instance uses).
    void validate(const oryx_config& c) const {
        const std::int64_t d = c.d_model, H = c.n_heads, HD = c.inner();
        auto need = [](const auto& t, std::vector<std::int64_t> want, const char* name) {  // tensor<T> or linear_weight
            if (t.shape() != want)
                throw shape_error(std::string("oryx_weights: ") + name + ": expected shape " + shape_string(want) + ", found " +
                                  (t.rank() == 0 ? std::string("none") : shape_string(t.shape())));
        };
        auto absent = [](const auto& t, const char* name, const char* inst) {
            if (t.rank() != 0)
                throw shape_error(std::string("oryx_weights: ") + name + " is not used by the " + inst + " instance, found shape " +
                                  shape_string(t.shape()));
        };
        need(q_attn_proj, {HD, d}, "q_attn_proj.weight");
        need(q_lin_proj, {HD, d}, "q_lin_proj.weight");
        need(k_proj, {HD, d}, "k_proj.weight");
        need(v_proj, {HD, d}, "v_proj.weight");
        need(g_proj, {HD, d}, "g_proj.weight");
        need(o_proj, {d, HD}, "o_proj.weight");
        need(o_norm, {c.head_dim}, "o_norm.weight");
        need(conv_q, {HD, c.d_conv}, "q_conv1d.weight");
        need(conv_k, {HD, c.d_conv}, "k_conv1d.weight");
        need(conv_v, {HD, c.d_conv}, "v_conv1d.weight");
        need(A_log, {H}, "A_log");
        need(dt_bias, {H}, "dt_bias");
        if (c.is_gdn()) {
            need(a_proj, {H, d}, "a_proj.weight");
            need(b_proj, {H, d}, "b_proj.weight");
            absent(dt_proj, "dt_proj.weight", "GDN");
            absent(D, "D", "GDN");
        } else {
            need(dt_proj, {H, d}, "dt_proj.weight");
            need(D, {H}, "D");
            absent(a_proj, "a_proj.weight", "Mamba-2");
            absent(b_proj, "b_proj.weight", "Mamba-2");
        }
    }

    /// Random weights with the initialisation of the instance's linear mixer (spec.md §6.3). GDN (fla, §4.5): every
    /// projection N(0, 0.02); A ~ U(0, 16), A_log = log A; Δ ~ exp(U(log 1e-3, log 0.1)) clamped ≥ 1e-4 and
    /// dt_bias = softplus⁻¹(Δ). Mamba-2 (state-spaces, §3.5): projections U(±1/sqrt(fan_in)); A ~ U(1, 16); dt_bias as
    /// GDN; D = 1. Both: convs U(±1/sqrt(K)) (PyTorch's depthwise default), o_norm 1. Throws config_error.
    static basic_oryx_weights random(const oryx_config& c, std::uint64_t seed) {
        c.validate();
        std::mt19937_64 gen(seed);
        const std::int64_t d = c.d_model, H = c.n_heads, HD = c.inner(), K = c.d_conv;
        auto proj = [&](std::int64_t rows, std::int64_t fan_in) {
            tensor<T> t({rows, fan_in});
            if (c.is_gdn()) {
                std::normal_distribution<double> nd(0.0, 0.02);
                for (auto& v : t.span()) v = static_cast<T>(nd(gen));
            } else {
                const double b = 1.0 / std::sqrt(static_cast<double>(fan_in));
                std::uniform_real_distribution<double> ud(-b, b);
                for (auto& v : t.span()) v = static_cast<T>(ud(gen));
            }
            return t;
        };
        auto conv = [&] {
            tensor<T> t({HD, K});
            const double b = 1.0 / std::sqrt(static_cast<double>(K));
            std::uniform_real_distribution<double> ud(-b, b);
            for (auto& v : t.span()) v = static_cast<T>(ud(gen));
            return t;
        };
        basic_oryx_weights w;
        w.q_attn_proj = proj(HD, d);
        w.q_lin_proj = proj(HD, d);
        w.k_proj = proj(HD, d);
        w.v_proj = proj(HD, d);
        w.g_proj = proj(HD, d);
        w.o_proj = proj(d, HD);
        w.o_norm = tensor<T>({c.head_dim});
        w.o_norm.fill(T(1));
        w.conv_q = conv();
        w.conv_k = conv();
        w.conv_v = conv();
        w.A_log = tensor<T>({H});
        w.dt_bias = tensor<T>({H});
        std::uniform_real_distribution<double> ua(c.is_gdn() ? 0.0 : 1.0, 16.0), udt(std::log(1e-3), std::log(0.1));
        for (std::int64_t h = 0; h < H; ++h) {
            w.A_log[h] = static_cast<T>(std::log(std::max(ua(gen), 1e-4)));
            const double dt = std::max(std::exp(udt(gen)), 1e-4);
            w.dt_bias[h] = static_cast<T>(dt + std::log(-std::expm1(-dt)));
        }
        if (c.is_gdn()) {
            w.a_proj = proj(H, d);
            w.b_proj = proj(H, d);
        } else {
            w.dt_proj = proj(H, d);
            w.D = tensor<T>({H});
            w.D.fill(T(1));
        }
        return w;
    }

    /// The same tensors, zero-filled (a gradient accumulator).
    basic_oryx_weights zeros_like() const {
        basic_oryx_weights z = *this;
        z.for_each([](std::string_view, tensor<T>& t) { t.zero(); });
        return z;
    }

    /// A copy with elements converted to U (fp64 weights for the reference in gradient checks).
    template <class U>
    basic_oryx_weights<U> cast() const {
        basic_oryx_weights<U> r;
        auto conv = [](const auto& s) {
            if (s.rank() == 0) return tensor<U>();
            tensor<U> t(s.shape());
            std::transform(s.data(), s.data() + s.numel(), t.data(), [](T v) { return static_cast<U>(v); });
            return t;
        };
        r.q_attn_proj = conv(q_attn_proj);
        r.q_lin_proj = conv(q_lin_proj);
        r.k_proj = conv(k_proj);
        r.v_proj = conv(v_proj);
        r.g_proj = conv(g_proj);
        r.o_proj = conv(o_proj);
        r.o_norm = conv(o_norm);
        r.conv_q = conv(conv_q);
        r.conv_k = conv(conv_k);
        r.conv_v = conv(conv_v);
        r.a_proj = conv(a_proj);
        r.b_proj = conv(b_proj);
        r.dt_proj = conv(dt_proj);
        r.A_log = conv(A_log);
        r.dt_bias = conv(dt_bias);
        r.D = conv(D);
        return r;
    }

private:
    template <class Self, class F>
    static void visit(Self& s, F& f) {
        auto one = [&](std::string_view n, auto& t) {
            if (t.rank() != 0) visit_param(f, n, t);
        };
        one("q_attn_proj.weight", s.q_attn_proj);
        one("q_lin_proj.weight", s.q_lin_proj);
        one("k_proj.weight", s.k_proj);
        one("v_proj.weight", s.v_proj);
        one("g_proj.weight", s.g_proj);
        one("o_proj.weight", s.o_proj);
        one("o_norm.weight", s.o_norm);
        one("q_conv1d.weight", s.conv_q);
        one("k_conv1d.weight", s.conv_k);
        one("v_conv1d.weight", s.conv_v);
        one("a_proj.weight", s.a_proj);
        one("b_proj.weight", s.b_proj);
        one("dt_proj.weight", s.dt_proj);
        one("A_log", s.A_log);
        one("dt_bias", s.dt_bias);
        one("D", s.D);
    }
};

using oryx_weights = basic_oryx_weights<float>;

/// Per-sequence state in numbered slots: the KV cache (RoPE(k) and v of every token, whatever its mode), the linear
/// state and the last K−1 pre-conv inputs of q_l, k and v. All fp32.
struct oryx_state {
    kv_cache kv;         // [S, H, capacity, d_h]
    tensor<float> lin;   // [S, H, d_h, d_h]: GDN S [d_k, d_v] (§4.1); Mamba-2 h [P = d_h (v), N = d_h (k)] (§3.2)
    tensor<float> conv;  // [S, 3·H·d_h, K−1] channels [q_l | k | v], oldest input in column 0

    std::int64_t n_slots() const noexcept { return kv.n_slots(); }
    /// A fresh sequence in slot i: empty cache, zero states. Throws shape_error when i is out of range.
    void reset_slot(std::int64_t i) {
        kv.reset_slot(i);
        std::fill_n(lin_slot(i), lin_size(), 0.f);
        std::fill_n(conv_slot(i), conv_size(), 0.f);
    }
    /// Slot `to` becomes a copy of slot `from` (prompt caching). Throws shape_error when either is out of range.
    void copy_slot(std::int64_t from, std::int64_t to) {
        kv.copy_slot(from, to);
        if (from == to) return;
        std::copy_n(lin_slot(from), lin_size(), lin_slot(to));
        std::copy_n(conv_slot(from), conv_size(), conv_slot(to));
    }
    float* lin_slot(std::int64_t i) { return lin.data() + i * lin_size(); }    // [H, d_h, d_h]
    float* conv_slot(std::int64_t i) { return conv.data() + i * conv_size(); }  // [3·H·d_h, K−1]

    /// Throws shape_error unless the shapes match `c`.
    void validate(const oryx_config& c) const {
        const std::int64_t S = n_slots();
        const std::vector<std::int64_t> wl{S, c.n_heads, c.head_dim, c.head_dim}, wc{S, c.conv_dim(), c.d_conv - 1};
        if (kv.n_kv_heads() != c.n_heads || kv.head_dim() != c.head_dim)
            throw shape_error("oryx_state: kv cache holds [H, d_h] = [" + std::to_string(kv.n_kv_heads()) + ", " +
                              std::to_string(kv.head_dim()) + "], the layer needs [" + std::to_string(c.n_heads) + ", " +
                              std::to_string(c.head_dim) + "]");
        if (lin.shape() != wl) throw shape_error("oryx_state: lin: expected shape " + shape_string(wl) + ", found " + shape_string(lin.shape()));
        if (conv.shape() != wc)
            throw shape_error("oryx_state: conv: expected shape " + shape_string(wc) + ", found " + shape_string(conv.shape()));
    }

private:
    std::int64_t lin_size() const { return n_slots() ? lin.numel() / n_slots() : 0; }
    std::int64_t conv_size() const { return n_slots() ? conv.numel() / n_slots() : 0; }
};

}  // namespace hymix
