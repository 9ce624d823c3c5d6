// Backward of the elementwise gate preparations (spec.md §3.2 step 4, §4.2 step 4, §8 invariants 9–11):
//   Mamba-2 Δ = clamp(softplus(x), lo, hi), x = raw + dt_bias:        dx = dΔ · σ(x) · [lo ≤ softplus(x) ≤ hi]
//   GDN g = min(−exp(A_log) · softplus(x), −floor), x = a + dt_bias:  dx = −dg · exp(A_log) · σ(x) · [g_raw ≤ −floor],
//        dA_log = dg · g_raw · [g_raw ≤ −floor];   β = σ(b) (or 2σ(b)):  db = dβ · σ(b) σ(−b) (×2).
// softplus' derivative is σ(x), evaluated in the form that never divides by an overflowed exp (finite for every
// finite x, also where softplus(x) = x above 20); a clamp passes the gradient only where it is inactive. The
// per-head parameter gradients are sums over rows (fixed row blocks, summed in block order: deterministic).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "hymix/core/check.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/gated_delta.hpp"

namespace hymix::kernels {

/// σ(x) without overflow for any finite x: 1/(1+e^{−x}) for x ≥ 0, e^{x}/(1+e^{x}) below.
template <class T>
inline T sigmoid_stable(T x) noexcept {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
}

/// d softplus / dx = σ(x) (spec.md §0; also above the threshold 20, where it is 1 to working precision).
template <class T>
inline T softplus_grad(T x) noexcept {
    return sigmoid_stable(x);
}

/// Gradient of Δ = clamp(softplus(x), lo, hi) w.r.t. x: σ(x) where lo ≤ softplus(x) ≤ hi, exactly 0 elsewhere.
template <class T>
inline T ssd_delta_grad(T x, T lo, T hi) noexcept {
    const T sp = softplus(x);
    return (sp < lo || sp > hi) ? T(0) : softplus_grad(x);
}

/// Partial derivatives of g = gdn_log_decay(a, dt_bias, A_log, floor): d/da (= d/d dt_bias) and d/dA_log; both 0
/// where the floor clamp is active (g_raw > −floor).
template <class T>
struct gdn_log_decay_grads {
    T dx, dA_log;
};
template <class T>
inline gdn_log_decay_grads<T> gdn_log_decay_grad(T a, T dt_bias, T a_log, T floor = T(0)) noexcept {
    const T x = a + dt_bias, e = std::exp(a_log);
    const T g_raw = -e * softplus(x);
    if (g_raw > -floor) return {T(0), T(0)};
    return {-e * softplus_grad(x), g_raw};
}

/// dβ/db for β = gdn_beta(b): σ(b) σ(−b), ×2 with negative eigenvalues (each factor computed without 1 − σ).
template <class T>
inline T gdn_beta_grad(T b, bool allow_neg_eigval) noexcept {
    const T d = sigmoid_stable(b) * sigmoid_stable(-b);
    return allow_neg_eigval ? T(2) * d : d;
}

namespace detail {

/// Shared checks: every [n, H] view has the shape of `ref_view`; written views do not overlap themselves.
template <class T, class U>
void require_gate_shape(const tensor_view<T, 2>& v, const tensor_view<U, 2>& ref_view, std::string_view who, std::string_view name) {
    v.require_shape(ref_view.shape, who, name);
    if constexpr (!std::is_const_v<T>) hymix::detail::require_no_self_overlap(v, who, name);
}

template <class T>
void check_ssd_delta_backward(tensor_view<const T, 2> raw, const T* bias, double lo, double hi, tensor_view<const T, 2> ddelta,
                              tensor_view<T, 2> draw) {
    constexpr std::string_view who = "ssd_delta_backward";
    hymix::detail::require_pointer(bias, raw.dim(1), who, "bias");
    require_gate_shape(ddelta, raw, who, "ddelta");
    if (draw.data) require_gate_shape(draw, raw, who, "draw");
    if (!(lo <= hi)) throw value_error("ssd_delta_backward: lo " + std::to_string(lo) + " must be <= hi " + std::to_string(hi));
}

template <class T>
void check_gdn_gates_backward(tensor_view<const T, 2> a, tensor_view<const T, 2> b, const T* dt_bias, const T* A_log,
                              tensor_view<const T, 2> dg, tensor_view<const T, 2> dbeta, tensor_view<T, 2> da, tensor_view<T, 2> db) {
    constexpr std::string_view who = "gdn_gates_backward";
    require_gate_shape(b, a, who, "b");
    hymix::detail::require_pointer(dt_bias, a.dim(1), who, "dt_bias");
    hymix::detail::require_pointer(A_log, a.dim(1), who, "A_log");
    require_gate_shape(dg, a, who, "dg");
    require_gate_shape(dbeta, a, who, "dbeta");
    if (da.data) require_gate_shape(da, a, who, "da");
    if (db.data) require_gate_shape(db, a, who, "db");
    if (da.data && db.data) hymix::detail::require_no_overlap(da, "da", db, "db", who);
}

}  // namespace detail

/// Rows [r0, r1) of the Δ backward: raw, ddelta, draw [n, H] (any strides; draw empty: not wanted); dbias [H]
/// (+=, or null), summed over those rows in order. Works for float (the CPU kernel) and double (the reference).
template <class T>
void ssd_delta_backward_rows(tensor_view<const T, 2> raw, const T* bias, T lo, T hi, tensor_view<const T, 2> ddelta,
                             tensor_view<T, 2> draw, T* dbias, std::int64_t r0, std::int64_t r1) {
    const std::int64_t H = raw.dim(1);
    for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t h = 0; h < H; ++h) {
            const T g = ddelta(r, h) * ssd_delta_grad(raw(r, h) + bias[h], lo, hi);
            if (draw.data) draw(r, h) = g;
            if (dbias) dbias[h] += g;
        }
}

/// fp64 (any T) reference of the Δ backward over all rows: draw (=), dbias (+=).
template <class T>
void ssd_delta_backward_ref(tensor_view<const T, 2> raw, const T* bias, T lo, T hi, tensor_view<const T, 2> ddelta,
                            tensor_view<T, 2> draw, T* dbias) {
    detail::check_ssd_delta_backward<T>(raw, bias, double(lo), double(hi), ddelta, draw);
    ssd_delta_backward_rows<T>(raw, bias, lo, hi, ddelta, draw, dbias, 0, raw.dim(0));
}

/// Rows [r0, r1) of the GDN gates backward: a, b, dg, dbeta [n, H]; da, db (=, or empty); d_dt_bias, dA_log (+=, or
/// null), summed over those rows in order.
template <class T>
void gdn_gates_backward_rows(tensor_view<const T, 2> a, tensor_view<const T, 2> b, const T* dt_bias, const T* A_log, T floor,
                             bool allow_neg_eigval, tensor_view<const T, 2> dg, tensor_view<const T, 2> dbeta, tensor_view<T, 2> da,
                             tensor_view<T, 2> db, T* d_dt_bias, T* dA_log, std::int64_t r0, std::int64_t r1) {
    const std::int64_t H = a.dim(1);
    for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t h = 0; h < H; ++h) {
            const auto gg = gdn_log_decay_grad(a(r, h), dt_bias[h], A_log[h], floor);
            const T dx = dg(r, h) * gg.dx;
            if (da.data) da(r, h) = dx;
            if (d_dt_bias) d_dt_bias[h] += dx;
            if (dA_log) dA_log[h] += dg(r, h) * gg.dA_log;
            if (db.data) db(r, h) = dbeta(r, h) * gdn_beta_grad(b(r, h), allow_neg_eigval);
        }
}

/// fp64 (any T) reference of the GDN gates backward over all rows.
template <class T>
void gdn_gates_backward_ref(tensor_view<const T, 2> a, tensor_view<const T, 2> b, const T* dt_bias, const T* A_log, T floor,
                            bool allow_neg_eigval, tensor_view<const T, 2> dg, tensor_view<const T, 2> dbeta, tensor_view<T, 2> da,
                            tensor_view<T, 2> db, T* d_dt_bias, T* dA_log) {
    detail::check_gdn_gates_backward<T>(a, b, dt_bias, A_log, dg, dbeta, da, db);
    gdn_gates_backward_rows<T>(a, b, dt_bias, A_log, floor, allow_neg_eigval, dg, dbeta, da, db, d_dt_bias, dA_log, 0, a.dim(0));
}

}  // namespace hymix::kernels
