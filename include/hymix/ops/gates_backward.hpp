// Ops: backward of the gate preparations — Mamba-2's Δ = clamp(softplus(dt + dt_bias), lo, hi) (spec.md §3.2 step
// 4, §8 invariants 9–10) and GDN's g = min(−exp(A_log)·softplus(a + dt_bias), −floor), β = σ(b) (×2) (§4.2 step 4,
// invariant 11). CPU: kernels/gates_backward.hpp over fixed 256-row blocks, per-head parameter gradients summed in
// block order (deterministic for any thread count). Reference: the same formulas in fp64.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hymix/kernels/gates_backward.hpp"
#include "hymix/ops/common.hpp"

namespace hymix {
namespace ops {

struct ssd_delta_backward_op {};
struct gdn_gates_backward_op {};

/// Backward of ops::ssd_delta. raw [n, H] and ddelta [n, H] (any strides), bias [H]; draw [n, H] overwritten (empty
/// view: not wanted), dbias [H] accumulated (null: not wanted). The gradient is exactly 0 where the clamp is active.
template <backend B>
void ssd_delta_backward(const B& be, view_of<B, const float, 2> raw, const float* bias, float lo, float hi,
                        view_of<B, const float, 2> ddelta, view_of<B, float, 2> draw, float* dbias) {
    dispatch<ssd_delta_backward_op>(be, raw, bias, lo, hi, ddelta, draw, dbias);
}

/// Backward of ops::gdn_gates. a, b, dg, dbeta [n, H] (any strides), dt_bias, A_log [H]; da, db [n, H] overwritten
/// (empty: not wanted); d_dt_bias, dA_log [H] accumulated (null: not wanted). g's gradients are 0 exactly where the
/// decay floor clamps.
template <backend B>
void gdn_gates_backward(const B& be, view_of<B, const float, 2> a, view_of<B, const float, 2> b, const float* dt_bias,
                        const float* A_log, float floor, bool allow_neg_eigval, view_of<B, const float, 2> dg,
                        view_of<B, const float, 2> dbeta, view_of<B, float, 2> da, view_of<B, float, 2> db, float* d_dt_bias,
                        float* dA_log) {
    dispatch<gdn_gates_backward_op>(be, a, b, dt_bias, A_log, floor, allow_neg_eigval, dg, dbeta, da, db, d_dt_bias, dA_log);
}

}  // namespace ops

namespace detail {
/// Rows per block of the gate backwards: the partition (and so the summation order of the parameter gradients)
/// never depends on the thread count.
inline constexpr std::int64_t gate_rows_per_block = 256;

/// Runs body(r0, r1, partial) over fixed row blocks, each with its own zeroed partial of `width` floats, then adds
/// the partials in block order onto out[0..width) (out[k] null: that part is skipped by the caller's body).
template <class Backend, class Body>
void gate_blocks(const Backend& be, std::int64_t n, std::int64_t width, Body&& body, float* const* outs, std::int64_t n_outs) {
    const std::int64_t nb = (n + gate_rows_per_block - 1) / gate_rows_per_block;
    std::vector<float> part(static_cast<std::size_t>(nb * width), 0.f);
    be.parallel_for(nb, 1, [&](std::int64_t b0, std::int64_t b1) {
        for (std::int64_t i = b0; i < b1; ++i)
            body(i * gate_rows_per_block, std::min(n, (i + 1) * gate_rows_per_block), part.data() + i * width);
    });
    const std::int64_t per = width / n_outs;
    for (std::int64_t o = 0; o < n_outs; ++o) {
        if (!outs[o]) continue;
        for (std::int64_t i = 0; i < nb; ++i)
            for (std::int64_t h = 0; h < per; ++h) outs[o][h] += part[static_cast<std::size_t>(i * width + o * per + h)];
    }
}
}  // namespace detail

template <class Arch>
struct op_impl<ops::ssd_delta_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> raw, const float* bias, float lo, float hi,
                    tensor_view<const float, 2> ddelta, tensor_view<float, 2> draw, float* dbias) {
        kernels::detail::check_ssd_delta_backward<float>(raw, bias, lo, hi, ddelta, draw);
        const std::int64_t H = raw.dim(1);
        float* outs[1] = {dbias};
        detail::gate_blocks(
            be, raw.dim(0), H,
            [&](std::int64_t r0, std::int64_t r1, float* part) {
                kernels::ssd_delta_backward_rows<float>(raw, bias, lo, hi, ddelta, draw, dbias ? part : nullptr, r0, r1);
            },
            outs, 1);
    }
};

template <class Arch>
struct op_impl<ops::gdn_gates_backward_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, tensor_view<const float, 2> a, tensor_view<const float, 2> b,
                    const float* dt_bias, const float* A_log, float floor, bool neg, tensor_view<const float, 2> dg,
                    tensor_view<const float, 2> dbeta, tensor_view<float, 2> da, tensor_view<float, 2> db, float* d_dt_bias,
                    float* dA_log) {
        kernels::detail::check_gdn_gates_backward<float>(a, b, dt_bias, A_log, dg, dbeta, da, db);
        const std::int64_t H = a.dim(1);
        float* outs[2] = {d_dt_bias, dA_log};
        detail::gate_blocks(
            be, a.dim(0), 2 * H,
            [&](std::int64_t r0, std::int64_t r1, float* part) {
                kernels::gdn_gates_backward_rows<float>(a, b, dt_bias, A_log, floor, neg, dg, dbeta, da, db, d_dt_bias ? part : nullptr,
                                                        dA_log ? part + H : nullptr, r0, r1);
            },
            outs, 2);
    }
};

template <>
struct op_impl<ops::ssd_delta_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> raw, const float* bias, float lo, float hi,
                    tensor_view<const float, 2> ddelta, tensor_view<float, 2> draw, float* dbias) {
        kernels::detail::check_ssd_delta_backward<float>(raw, bias, lo, hi, ddelta, draw);
        const std::int64_t n = raw.dim(0), H = raw.dim(1);
        detail::f64_copy<2> rd(raw), dd(ddelta);
        const auto bd = detail::f64_vector(bias, H);
        tensor<double> dr({n, H});
        std::vector<double> db(static_cast<std::size_t>(H), 0.0);
        kernels::ssd_delta_backward_ref<double>(rd.v, bd.data(), lo, hi, dd.v, dr.view<2>(), db.data());
        if (draw.data) detail::f64_copy<2>::for_each_index(draw.shape, [&](const std::array<std::int64_t, 2>& i) {
            draw(i[0], i[1]) = static_cast<float>(dr.view<2>()(i[0], i[1]));
        });
        if (dbias)
            for (std::int64_t h = 0; h < H; ++h) dbias[h] = static_cast<float>(double(dbias[h]) + db[static_cast<std::size_t>(h)]);
    }
};

template <>
struct op_impl<ops::gdn_gates_backward_op, reference_backend> {
    static void run(const reference_backend&, tensor_view<const float, 2> a, tensor_view<const float, 2> b, const float* dt_bias,
                    const float* A_log, float floor, bool neg, tensor_view<const float, 2> dg, tensor_view<const float, 2> dbeta,
                    tensor_view<float, 2> da, tensor_view<float, 2> db, float* d_dt_bias, float* dA_log) {
        kernels::detail::check_gdn_gates_backward<float>(a, b, dt_bias, A_log, dg, dbeta, da, db);
        const std::int64_t n = a.dim(0), H = a.dim(1);
        detail::f64_copy<2> ad(a), bd(b), dgd(dg), dbd(dbeta);
        const auto dtb = detail::f64_vector(dt_bias, H), al = detail::f64_vector(A_log, H);
        tensor<double> dad({n, H}), dbo({n, H});
        std::vector<double> gdt(static_cast<std::size_t>(H), 0.0), gal(static_cast<std::size_t>(H), 0.0);
        kernels::gdn_gates_backward_ref<double>(ad.v, bd.v, dtb.data(), al.data(), floor, neg, dgd.v, dbd.v, dad.view<2>(),
                                                dbo.view<2>(), gdt.data(), gal.data());
        detail::f64_copy<2>::for_each_index(a.shape, [&](const std::array<std::int64_t, 2>& i) {
            if (da.data) da(i[0], i[1]) = static_cast<float>(dad.view<2>()(i[0], i[1]));
            if (db.data) db(i[0], i[1]) = static_cast<float>(dbo.view<2>()(i[0], i[1]));
        });
        for (std::int64_t h = 0; h < H; ++h) {
            if (d_dt_bias) d_dt_bias[h] = static_cast<float>(double(d_dt_bias[h]) + gdt[static_cast<std::size_t>(h)]);
            if (dA_log) dA_log[h] = static_cast<float>(double(dA_log[h]) + gal[static_cast<std::size_t>(h)]);
        }
    }
};

}  // namespace hymix
