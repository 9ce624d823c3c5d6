// SwiGLU MLP (spec.md §1): y = W_down(silu(W_gate x) ⊙ W_up x), Hugging Face `mlp.{gate,up,down}_proj` layout;
// fp32 fast path (one fused gate|up projection) and its fp64 reference twin.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/kernels/linear.hpp"

namespace hymix {

/// SwiGLU weights in the Hugging Face layout; `gate_up` [2·d_ff, d] is built once from gate_proj and up_proj so
/// one projection reads x once for both (the first d_ff rows are the gate).
struct swiglu_weights {
    linear_weight gate_proj;  // [d_ff, d]
    linear_weight up_proj;    // [d_ff, d]
    linear_weight down_proj;  // [d, d_ff]
    linear_weight gate_up;    // [2·d_ff, d], filled by prepare()

    std::int64_t d_ff() const { return gate_proj.rank() == 2 ? gate_proj.dim(0) : 0; }

    /// Throws shape_error naming the tensor (prefixed by `where`, e.g. "layers.3.mlp") on a mismatch.
    void validate(std::int64_t d_model, const std::string& where) const {
        auto need = [&](const linear_weight& t, std::int64_t a, std::int64_t b, const char* n) {
            if (t.rank() != 2 || t.dim(0) != a || t.dim(1) != b)
                throw shape_error(where + "." + n + ": expected shape " + shape_string(std::vector<std::int64_t>{a, b}) +
                                  ", found " + shape_string(t.shape()));
        };
        if (gate_proj.rank() != 2) throw shape_error(where + ".gate_proj: expected a 2-D weight, found " + shape_string(gate_proj.shape()));
        const std::int64_t f = gate_proj.dim(0);
        need(gate_proj, f, d_model, "gate_proj");
        need(up_proj, f, d_model, "up_proj");
        need(down_proj, d_model, f, "down_proj");
    }
    /// Random weights with the Hugging Face initialisation of Llama-style MLPs (Qwen3.5's `initializer_range`):
    /// gate_proj, up_proj [d_ff, d_model] and down_proj [d_model, d_ff], every element N(0, 0.02). Throws
    /// config_error on a non-positive size.
    static swiglu_weights random(std::int64_t d_model, std::int64_t d_ff, std::uint64_t seed) {
        if (d_model <= 0 || d_ff <= 0)
            throw config_error("swiglu_weights::random: d_model and d_ff must be positive, found " + std::to_string(d_model) +
                               " and " + std::to_string(d_ff));
        std::mt19937_64 gen(seed);
        std::normal_distribution<float> n(0.0f, 0.02f);
        swiglu_weights w;
        w.gate_proj = tensor<float>({d_ff, d_model});
        w.up_proj = tensor<float>({d_ff, d_model});
        w.down_proj = tensor<float>({d_model, d_ff});
        for (auto* t : {&w.gate_proj, &w.up_proj, &w.down_proj})
            for (auto& x : t->span()) x = n(gen);
        return w;
    }
    /// Builds gate_up from gate_proj and up_proj, in their storage (f32, or the bf16 / f16 they are stored as).
    /// Throws shape_error / value_error (the two stored differently) and leaves gate_up as it was.
    void prepare() { gate_up = linear_weight::concat_rows(gate_proj, up_proj, "mlp.gate_up"); }
};

namespace kernels {

namespace detail {
/// The SwiGLU entry points' argument checks, naming `who` and the argument (shape_error): the weights' shapes against
/// x's width and y [M, d]; for the CPU kernel (`unit_strides`) the prepared gate_up, unit inner strides of x, gu and
/// y, and no overlap of y with x or gu; for the reference, gate_proj and up_proj.
inline void require_swiglu_args(const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2> gu,
                                tensor_view<float, 2> y, const char* who, bool unit_strides) {
    const std::int64_t M = x.dim(0), d = x.dim(1);
    if (w.down_proj.rank() != 2 || w.down_proj.dim(0) != d)
        throw shape_error(std::string(who) + ": weights.down_proj: expected [" + std::to_string(d) + ", d_ff] for x " +
                          shape_string(x.shape) + ", found " + shape_string(w.down_proj.shape()));
    const std::int64_t F = w.down_proj.dim(1);
    const auto need = [&](const linear_weight& t, std::int64_t rows, const char* name, const char* hint) {
        if (t.shape() != std::vector<std::int64_t>{rows, d})
            throw shape_error(std::string(who) + ": weights." + name + ": expected " + shape_string(std::vector<std::int64_t>{rows, d}) +
                              ", found " + shape_string(t.shape()) + hint);
    };
    if (unit_strides) {  // the CPU kernel reads the fused matrix
        need(w.gate_up, 2 * F, "gate_up", " (call swiglu_weights::prepare())");
    } else {  // the reference reads the two
        need(w.gate_proj, F, "gate_proj", "");
        need(w.up_proj, F, "up_proj", "");
    }
    y.require_shape({M, d}, who, "y");
    if (!unit_strides) return;
    gu.require_shape({M, 2 * F}, who, "scratch gu");
    hymix::detail::require_unit_stride(x, 1, who, "x", true);
    hymix::detail::require_unit_stride(gu, 1, who, "scratch gu", true);
    hymix::detail::require_unit_stride(y, 1, who, "y", true);
    hymix::detail::require_no_overlap(y, "y", x, "x", who);
    hymix::detail::require_no_overlap(y, "y", gu, "scratch gu", who);
}
}  // namespace detail

/// SwiGLU forward. x [M, d], w.gate_up [2F, d] (prepared), w.down_proj [d, F]; scratch gu [M, 2F]; y [M, d].
/// y must not alias x. fp32, parallel inside the projections and over rows between them. Throws shape_error naming "swiglu" and the argument.
template <cpu_backend_type Backend>
void swiglu(const Backend& be, const swiglu_weights& w, tensor_view<const float, 2> x, tensor_view<float, 2> gu,
            tensor_view<float, 2> y) {
    detail::require_swiglu_args(w, x, gu, y, "swiglu", true);
    const std::int64_t M = x.dim(0), F = w.down_proj.dim(1);
    linear(be, x, w.gate_up, nullptr, gu);
    // Compact silu(g) ⊙ u into the first F columns of each row, then project down from that strided view. Rows in
    // parallel: run serially (1.8M exponentials for Qwen3.5 0.8B's MLP, M 512, F 3584), this step kept the MLP from
    // scaling on 16 cores (docs/scaling_16core.md, op profiles).
    be.parallel_for(M, task_grain(4 * F), [&](std::int64_t m0, std::int64_t m1) {
        for (std::int64_t m = m0; m < m1; ++m) {
            float* r = &gu(m, 0);
            for (std::int64_t i = 0; i < F; ++i) r[i] = silu(r[i]) * r[F + i];
        }
    });
    tensor_view<const float, 2> act(gu.data, {M, F}, {gu.strides[0], 1});
    linear(be, act, w.down_proj, nullptr, y);
}

/// Reference twin in double precision with obvious loops: x [M, d] (float or double, const or not) → y [M, d],
/// from gate_proj/up_proj/down_proj (16-bit weights are widened exactly into a copy first).
template <class TX, class TY>
void swiglu_ref(const swiglu_weights& w, tensor_view<TX, 2> x, tensor_view<TY, 2> y) {
    if (!w.gate_proj.is_f32() || !w.up_proj.is_f32() || !w.down_proj.is_f32()) {
        swiglu_weights wide;
        wide.gate_proj = w.gate_proj, wide.up_proj = w.up_proj, wide.down_proj = w.down_proj;
        for (auto* t : {&wide.gate_proj, &wide.up_proj, &wide.down_proj}) t->store_as(dtype::f32);
        return swiglu_ref(wide, x, y);
    }
    const std::int64_t M = x.dim(0), d = x.dim(1), F = w.gate_proj.dim(0);
    const float *wg = w.gate_proj.data(), *wu = w.up_proj.data(), *wd = w.down_proj.data();
    std::vector<double> a(static_cast<std::size_t>(F));
    for (std::int64_t m = 0; m < M; ++m) {
        for (std::int64_t f = 0; f < F; ++f) {
            double g = 0, u = 0;
            for (std::int64_t k = 0; k < d; ++k) {
                g += static_cast<double>(wg[f * d + k]) * static_cast<double>(x(m, k));
                u += static_cast<double>(wu[f * d + k]) * static_cast<double>(x(m, k));
            }
            a[static_cast<std::size_t>(f)] = silu(g) * u;
        }
        for (std::int64_t o = 0; o < d; ++o) {
            double s = 0;
            for (std::int64_t f = 0; f < F; ++f) s += static_cast<double>(wd[o * F + f]) * a[static_cast<std::size_t>(f)];
            y(m, o) = static_cast<TY>(s);
        }
    }
}

}  // namespace kernels

}  // namespace hymix
