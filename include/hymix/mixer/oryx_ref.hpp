// Token-by-token fp64 reference of the Oryx layer (spec.md §6.2–6.4): both read-outs (softmax attention over the
// cached RoPE'd keys, and the Gated DeltaNet §4.1 / Mamba-2 §3.2 recurrence) computed for every token with obvious
// loops and the one of the token's mode selected; the oracle of the mixer's forward and of its gradients.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/gated_delta.hpp"
#include "hymix/kernels/rope.hpp"
#include "hymix/mixer/oryx_config.hpp"

namespace hymix {

/// fp64 states of every slot for oryx_layer_ref: per slot the RoPE'd keys and values of every token, the linear state
/// [S, H, d_h, d_h] and the conv state [S, 3·H·d_h, K−1] (the reference twin of oryx_state, never evicting).
struct oryx_ref_slots {
    std::int64_t hd = 0;
    std::vector<std::vector<double>> k, v;  // [S][n · H·d_h]
    tensor<double> lin;                     // [S, H, d_h, d_h]
    tensor<double> conv;                    // [S, 3·H·d_h, K−1]

    oryx_ref_slots(const oryx_config& c, std::int64_t n_slots)
        : hd(c.inner()), k(static_cast<std::size_t>(n_slots)), v(static_cast<std::size_t>(n_slots)),
          lin({n_slots, c.n_heads, c.head_dim, c.head_dim}), conv({n_slots, c.conv_dim(), c.d_conv - 1}) {}
    std::int64_t n_slots() const { return static_cast<std::int64_t>(k.size()); }
    std::int64_t length(std::int64_t slot) const { return static_cast<std::int64_t>(k.at(static_cast<std::size_t>(slot)).size()) / hd; }
    void reset_slot(std::int64_t i) {
        k.at(static_cast<std::size_t>(i)).clear();
        v.at(static_cast<std::size_t>(i)).clear();
        std::fill_n(lin.data() + i * (lin.numel() / n_slots()), lin.numel() / n_slots(), 0.0);
        std::fill_n(conv.data() + i * (conv.numel() / n_slots()), conv.numel() / n_slots(), 0.0);
    }
    void copy_slot(std::int64_t from, std::int64_t to) {
        k.at(static_cast<std::size_t>(to)) = k.at(static_cast<std::size_t>(from));
        v.at(static_cast<std::size_t>(to)) = v.at(static_cast<std::size_t>(from));
        const auto a = lin.numel() / n_slots(), b = conv.numel() / n_slots();
        std::copy_n(lin.data() + from * a, a, lin.data() + to * a);
        std::copy_n(conv.data() + from * b, b, conv.data() + to * b);
    }
};

/// The whole layer in fp64, token by token, with obvious loops, continuing each slot's states: projections; conv window
/// + φ on q_l, k, v; RoPE(k) and v appended to the cache; BOTH read-outs for every token — attention (RoPE(q_a) against
/// every cached key, materialised softmax) and linear (GDN: L2 norms, g, β and the §4.1 update, o = Sᵀq_l/√d_h; Mamba-2:
/// Δ, h ← e^{ΔA}h + Δ v kᵀ, o = h q_l + D v) — and the read-out of mode modes[r] (empty: c.default_mode); then the gated
/// norm and W_O. Weights of any element type W (fp32, or fp64 for finite differences). x, y [n_rows, d]; rows outside
/// valid sequences get y = 0. Optional per-row outputs of both read-outs: o_attn, o_lin [n_rows, H·d_h] (null: not
/// wanted). Throws config_error / shape_error on bad arguments.
template <class W>
void oryx_layer_ref(const oryx_config& c, const basic_oryx_weights<W>& w, const seq_batch& batch, tensor_view<const double, 2> x,
                    oryx_ref_slots& st, tensor_view<double, 2> y, std::span<const unsigned char> modes = {},
                    tensor_view<double, 2> o_attn = {}, tensor_view<double, 2> o_lin = {}) {
    c.validate();
    w.validate(c);
    const std::int64_t d = c.d_model, H = c.n_heads, dh = c.head_dim, HD = c.inner(), K = c.d_conv;
    x.require_shape({batch.n_rows, d}, "oryx_layer_ref: x");
    y.require_shape({batch.n_rows, d}, "oryx_layer_ref: y");
    batch.validate(st.n_slots());
    if (!modes.empty() && static_cast<std::int64_t>(modes.size()) != batch.n_rows)
        throw shape_error("oryx_layer_ref: mode list has " + std::to_string(modes.size()) + " entries for " + std::to_string(batch.n_rows) + " rows");
    const bool gdn = c.is_gdn();
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    for (std::int64_t r = 0; r < batch.n_rows; ++r)
        for (std::int64_t i = 0; i < d; ++i) y(r, i) = 0;
    auto dot = [](const W* wrow, const double* xt, std::int64_t len) {
        double acc = 0;
        for (std::int64_t i = 0; i < len; ++i) acc += static_cast<double>(wrow[i]) * xt[i];
        return acc;
    };
    auto phi = [gdn](double a) { return gdn ? silu(a) : a; };
    auto l2 = [&](double* h) {
        double ss = 0;
        for (std::int64_t a = 0; a < dh; ++a) ss += h[a] * h[a];
        const double nrm = std::sqrt(ss + static_cast<double>(c.l2_eps));
        for (std::int64_t a = 0; a < dh; ++a) h[a] /= nrm;
    };
    std::vector<double> xt(static_cast<std::size_t>(d)), pre(static_cast<std::size_t>(3 * HD)), post(pre.size()), gz(static_cast<std::size_t>(HD)),
        qa(gz.size()), ol(gz.size()), oa(gz.size()), o(gz.size()), u(static_cast<std::size_t>(dh)), sc;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const auto si = static_cast<std::size_t>(s);
        const std::int64_t slot = batch.slots[si];
        if (slot < 0) continue;
        auto& kc = st.k[static_cast<std::size_t>(slot)];
        auto& vc = st.v[static_cast<std::size_t>(slot)];
        for (std::int64_t r = batch.starts[si]; r < batch.starts[si] + batch.lengths[si]; ++r) {
            const std::int64_t p = st.length(slot);
            for (std::int64_t i = 0; i < d; ++i) xt[static_cast<std::size_t>(i)] = x(r, i);
            for (std::int64_t ch = 0; ch < HD; ++ch) {
                pre[static_cast<std::size_t>(ch)] = dot(&w.q_lin_proj[ch * d], xt.data(), d);
                pre[static_cast<std::size_t>(HD + ch)] = dot(&w.k_proj[ch * d], xt.data(), d);
                pre[static_cast<std::size_t>(2 * HD + ch)] = dot(&w.v_proj[ch * d], xt.data(), d);
                gz[static_cast<std::size_t>(ch)] = dot(&w.g_proj[ch * d], xt.data(), d);
                qa[static_cast<std::size_t>(ch)] = dot(&w.q_attn_proj[ch * d], xt.data(), d);
            }
            // Conv windows [state | current], tap K−1 on the current token, then φ; shift the states.
            for (std::int64_t ch = 0; ch < 3 * HD; ++ch) {
                const auto& cw = ch < HD ? w.conv_q : ch < 2 * HD ? w.conv_k : w.conv_v;
                const std::int64_t cc = ch % HD;
                double acc = static_cast<double>(cw[cc * K + K - 1]) * pre[static_cast<std::size_t>(ch)];
                for (std::int64_t j = 0; j < K - 1; ++j) acc += static_cast<double>(cw[cc * K + j]) * st.conv.view<3>()(slot, ch, j);
                post[static_cast<std::size_t>(ch)] = phi(acc);
                for (std::int64_t j = 0; j + 1 < K - 1; ++j) st.conv.view<3>()(slot, ch, j) = st.conv.view<3>()(slot, ch, j + 1);
                if (K > 1) st.conv.view<3>()(slot, ch, K - 2) = pre[static_cast<std::size_t>(ch)];
            }
            double* ql = post.data();
            double* k = post.data() + HD;
            const double* v = post.data() + 2 * HD;
            // Attention: RoPE(k) and v appended, RoPE(q_a) against every cached key.
            {
                std::vector<double> kr(k, k + HD);
                const std::int64_t pp[1] = {p};
                kernels::rope_ref(tensor_view<double, 3>(kr.data(), {1, H, dh}), pp, kernels::rope_mode::rotate_half, c.rope_theta, dh);
                kernels::rope_ref(tensor_view<double, 3>(qa.data(), {1, H, dh}), pp, kernels::rope_mode::rotate_half, c.rope_theta, dh);
                kc.insert(kc.end(), kr.begin(), kr.end());
                vc.insert(vc.end(), v, v + HD);
                const std::int64_t nk = p + 1;
                sc.assign(static_cast<std::size_t>(nk), 0.0);
                for (std::int64_t h = 0; h < H; ++h) {
                    double mx = -std::numeric_limits<double>::infinity();
                    for (std::int64_t j = 0; j < nk; ++j) {
                        double acc = 0;
                        for (std::int64_t a = 0; a < dh; ++a) acc += qa[static_cast<std::size_t>(h * dh + a)] * kc[static_cast<std::size_t>(j * HD + h * dh + a)];
                        sc[static_cast<std::size_t>(j)] = acc * scale;
                        mx = std::max(mx, sc[static_cast<std::size_t>(j)]);
                    }
                    double sum = 0;
                    for (auto& e : sc) sum += (e = std::exp(e - mx));
                    for (std::int64_t a = 0; a < dh; ++a) {
                        double acc = 0;
                        for (std::int64_t j = 0; j < nk; ++j) acc += sc[static_cast<std::size_t>(j)] * vc[static_cast<std::size_t>(j * HD + h * dh + a)];
                        oa[static_cast<std::size_t>(h * dh + a)] = acc / sum;
                    }
                }
            }
            // Linear read-out (the state update happens whatever the mode).
            for (std::int64_t h = 0; h < H; ++h) {
                auto S = st.lin.view<4>()[slot][h];  // GDN [d_k, d_v]; Mamba-2 [P (v), N (k)]
                double* qh = ql + h * dh;
                double* kh = k + h * dh;
                const double* vh = v + h * dh;
                if (gdn) {
                    l2(qh);
                    l2(kh);
                    const double a_raw = dot(&w.a_proj[h * d], xt.data(), d), b_raw = dot(&w.b_proj[h * d], xt.data(), d);
                    const double gt = kernels::gdn_log_decay<double>(a_raw, static_cast<double>(w.dt_bias[h]), static_cast<double>(w.A_log[h]));
                    const double bt = kernels::gdn_beta<double>(b_raw, false);
                    for (std::int64_t a = 0; a < dh; ++a)
                        for (std::int64_t b = 0; b < dh; ++b) S(a, b) *= std::exp(gt);
                    for (std::int64_t b = 0; b < dh; ++b) {
                        double sk = 0;
                        for (std::int64_t a = 0; a < dh; ++a) sk += S(a, b) * kh[a];
                        u[static_cast<std::size_t>(b)] = bt * (vh[b] - sk);
                    }
                    for (std::int64_t a = 0; a < dh; ++a)
                        for (std::int64_t b = 0; b < dh; ++b) S(a, b) += kh[a] * u[static_cast<std::size_t>(b)];
                    for (std::int64_t b = 0; b < dh; ++b) {
                        double acc = 0;
                        for (std::int64_t a = 0; a < dh; ++a) acc += S(a, b) * qh[a] * scale;
                        ol[static_cast<std::size_t>(h * dh + b)] = acc;
                    }
                } else {
                    const double dt = softplus(dot(&w.dt_proj[h * d], xt.data(), d) + static_cast<double>(w.dt_bias[h]));
                    const double dA = std::exp(dt * -std::exp(static_cast<double>(w.A_log[h])));
                    for (std::int64_t a = 0; a < dh; ++a) {
                        double acc = 0;
                        for (std::int64_t b = 0; b < dh; ++b) {
                            S(a, b) = dA * S(a, b) + dt * vh[a] * kh[b];
                            acc += S(a, b) * qh[b];
                        }
                        ol[static_cast<std::size_t>(h * dh + a)] = acc + static_cast<double>(w.D[h]) * vh[a];
                    }
                }
            }
            const bool attn = modes.empty() ? c.default_mode == token_mode::attention : modes[static_cast<std::size_t>(r)] != 0;
            for (std::int64_t i = 0; i < HD; ++i) {
                o[static_cast<std::size_t>(i)] = attn ? oa[static_cast<std::size_t>(i)] : ol[static_cast<std::size_t>(i)];
                if (o_attn.data) o_attn(r, i) = oa[static_cast<std::size_t>(i)];
                if (o_lin.data) o_lin(r, i) = ol[static_cast<std::size_t>(i)];
            }
            // Gated norm, norm-then-gate per head, then W_O.
            for (std::int64_t h = 0; h < H; ++h) {
                double ss = 0;
                for (std::int64_t a = 0; a < dh; ++a) ss += o[static_cast<std::size_t>(h * dh + a)] * o[static_cast<std::size_t>(h * dh + a)];
                const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dh) + static_cast<double>(c.norm_eps));
                for (std::int64_t a = 0; a < dh; ++a) {
                    auto& e = o[static_cast<std::size_t>(h * dh + a)];
                    e = static_cast<double>(w.o_norm[a]) * e * inv * silu(gz[static_cast<std::size_t>(h * dh + a)]);
                }
            }
            for (std::int64_t i = 0; i < d; ++i) y(r, i) = dot(&w.o_proj[i * HD], o.data(), HD);
        }
    }
}

}  // namespace hymix
