// The Mamba-2 mixer layer (spec.md §3.1–3.5): in_proj → causal conv + SiLU over xBC → Δ → SSD → gated RMSNorm
// → out_proj, with fp32 SSM and conv states in slots; its training forward and backward (issue 8: each op's backward
// in reverse order, chunk states recomputed); plus a token-by-token fp64 reference of the whole layer.
// Weight names and shapes follow HF Mamba2ForCausalLM's `backbone.layers.{i}.mixer.*` (conv weights stored [C, K]).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/cpu.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/math.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/linear_weight.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/ssd.hpp"
#include "hymix/ops/conv1d.hpp"
#include "hymix/ops/conv1d_backward.hpp"
#include "hymix/ops/elementwise.hpp"
#include "hymix/ops/gates_backward.hpp"
#include "hymix/ops/linear.hpp"
#include "hymix/ops/linear_backward.hpp"
#include "hymix/ops/norm.hpp"
#include "hymix/ops/norm_backward.hpp"
#include "hymix/ops/ssd.hpp"
#include "hymix/ops/ssd_backward.hpp"
#include "hymix/mixer/concepts.hpp"

namespace hymix {

/// Δ clamp after the softplus (HF `time_step_limit`); the default (0, +inf) is a no-op.
struct mamba2_dt_limit {
    float lo = 0.0f;
    float hi = std::numeric_limits<float>::infinity();
};

/// Sizes and options of one Mamba-2 layer (HF Mamba2Config / state-spaces Mamba2 kwargs).
struct mamba2_config {
    std::int64_t d_model = 0;          // hidden_size / d_model
    std::int64_t n_heads = 0;          // H (num_heads)
    std::int64_t head_dim = 64;        // P (head_dim / headdim)
    std::int64_t d_state = 128;        // N (state_size / d_state)
    std::int64_t n_groups = 1;         // G (n_groups / ngroups)
    std::int64_t d_conv = 4;           // K (conv_kernel / d_conv)
    std::int64_t chunk_size = 0;       // Q of the chunked SSD; 0: the backend's choice (ops::ssd_chunk_length). Changes
                                       // cost and rounding only; a checkpoint's value (256) is not used
    std::int64_t expand = 0;           // 0: unchecked; else expand · d_model must equal H · P
    std::int64_t d_ssm = 0;            // 0: = d_inner (the only supported value)
    bool conv_bias = true;             // use_conv_bias
    bool proj_bias = false;            // use_bias (in_proj and out_proj)
    mamba2_dt_limit dt_limit{};        // time_step_limit
    float norm_eps = 1e-5f;            // layer_norm_epsilon of the gated norm
    std::int64_t norm_group_size = 0;  // 0: d_inner / G (grouped); d_inner: HF eager full-width norm
    bool D_has_hdim = false;           // D is [d_inner] instead of [H]

    std::int64_t d_inner() const noexcept { return n_heads * head_dim; }
    std::int64_t conv_dim() const noexcept { return d_inner() + 2 * n_groups * d_state; }
    std::int64_t d_in_proj() const noexcept { return 2 * d_inner() + 2 * n_groups * d_state + n_heads; }
    std::int64_t group_size() const noexcept {
        return norm_group_size > 0 ? norm_group_size : (n_groups > 0 ? d_inner() / n_groups : 0);
    }

    /// Throws config_error when sizes are non-positive or inconsistent.
    void validate() const {
        auto positive = [](std::int64_t v, const char* name) {
            if (v <= 0) throw config_error(std::string("mamba2_config: ") + name + " must be positive, found " + std::to_string(v));
        };
        positive(d_model, "d_model");
        positive(n_heads, "n_heads");
        positive(head_dim, "head_dim");
        positive(d_state, "d_state");
        positive(n_groups, "n_groups");
        positive(d_conv, "d_conv");
        if (chunk_size < 0)
            throw config_error("mamba2_config: chunk_size must be positive, or 0 for the backend's choice, found " +
                               std::to_string(chunk_size));
        if (n_heads % n_groups != 0)
            throw config_error("mamba2_config: n_heads " + std::to_string(n_heads) + " is not a multiple of n_groups " +
                               std::to_string(n_groups));
        if (expand != 0 && expand * d_model != d_inner())
            throw config_error("mamba2_config: expand * d_model = " + std::to_string(expand * d_model) +
                               " but n_heads * head_dim = " + std::to_string(d_inner()));
        if (d_ssm != 0 && d_ssm != d_inner())
            throw config_error("mamba2_config: d_ssm " + std::to_string(d_ssm) + " != d_inner " + std::to_string(d_inner()) +
                               " (the extra gated-MLP slice d_ssm < d_inner is not supported)");
        if (norm_group_size < 0 || (norm_group_size > 0 && d_inner() % norm_group_size != 0))
            throw config_error("mamba2_config: norm_group_size " + std::to_string(norm_group_size) + " does not divide d_inner " +
                               std::to_string(d_inner()));
        if (!(dt_limit.lo >= 0.0f) || !(dt_limit.hi >= dt_limit.lo))
            throw config_error("mamba2_config: dt_limit must satisfy 0 <= lo <= hi, found (" + std::to_string(dt_limit.lo) +
                               ", " + std::to_string(dt_limit.hi) + ")");
        if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
            throw config_error("mamba2_config: norm_eps (layer_norm_epsilon) must be positive and finite, found " + std::to_string(norm_eps));
    }
};

namespace detail {
template <class W>  // tensor<float> or linear_weight (its stored shape)
inline void require_weight(const W& t, const std::vector<std::int64_t>& expected, const char* name) {
    if (t.shape() != expected)
        throw shape_error(std::string("mamba2 weights: ") + name + ": expected shape " + shape_string(expected) + ", found " +
                          shape_string(t.shape()));
}
}  // namespace detail

/// Parameters of one Mamba-2 layer, fp32, names as in HF `backbone.layers.{i}.mixer.*`.
struct mamba2_weights {
    linear_weight in_proj;        // in_proj.weight  [2·d_inner + 2GN + H, d]
    tensor<float> in_proj_bias;   // in_proj.bias    [2·d_inner + 2GN + H]   (only if proj_bias)
    tensor<float> conv1d_weight;  // conv1d.weight   [conv_dim, K]           (checkpoint [conv_dim, 1, K])
    tensor<float> conv1d_bias;    // conv1d.bias     [conv_dim]              (only if conv_bias)
    tensor<float> dt_bias;        // dt_bias         [H]
    tensor<float> A_log;          // A_log           [H]
    tensor<float> D;              // D               [H] (or [d_inner] if D_has_hdim)
    tensor<float> norm_weight;    // norm.weight     [d_inner]
    linear_weight out_proj;       // out_proj.weight [d, d_inner]
    tensor<float> out_proj_bias;  // out_proj.bias   [d]                     (only if proj_bias)

    /// Calls f(name, tensor) for every present (allocated) tensor, with its HF name relative to the mixer
    /// (`in_proj.weight`, `conv1d.weight`, `A_log`, ...), in the order of the members above.
    template <class F>
    void for_each(F&& f) {
        visit(*this, f);
    }
    template <class F>
    void for_each(F&& f) const {
        visit(*this, f);
    }

    /// Zero tensors of the same shapes (absent tensors stay absent): a gradient accumulator.
    mamba2_weights zeros_like() const {
        mamba2_weights z;
        const auto zero = [](const auto& t) { return t.data() ? tensor<float>(t.shape()) : tensor<float>(); };
        z.in_proj = zero(in_proj);
        z.in_proj_bias = zero(in_proj_bias);
        z.conv1d_weight = zero(conv1d_weight);
        z.conv1d_bias = zero(conv1d_bias);
        z.dt_bias = zero(dt_bias);
        z.A_log = zero(A_log);
        z.D = zero(D);
        z.norm_weight = zero(norm_weight);
        z.out_proj = zero(out_proj);
        z.out_proj_bias = zero(out_proj_bias);
        return z;
    }

    /// Throws shape_error naming the first tensor whose shape does not match `cfg`.
    void validate(const mamba2_config& cfg) const {
        const std::int64_t d = cfg.d_model, di = cfg.d_inner(), H = cfg.n_heads, cd = cfg.conv_dim(), np = cfg.d_in_proj();
        detail::require_weight(in_proj, {np, d}, "in_proj.weight");
        if (cfg.proj_bias) detail::require_weight(in_proj_bias, {np}, "in_proj.bias");
        detail::require_weight(conv1d_weight, {cd, cfg.d_conv}, "conv1d.weight");
        if (cfg.conv_bias) detail::require_weight(conv1d_bias, {cd}, "conv1d.bias");
        detail::require_weight(dt_bias, {H}, "dt_bias");
        detail::require_weight(A_log, {H}, "A_log");
        detail::require_weight(D, {cfg.D_has_hdim ? di : H}, "D");
        detail::require_weight(norm_weight, {di}, "norm.weight");
        detail::require_weight(out_proj, {d, di}, "out_proj.weight");
        if (cfg.proj_bias) detail::require_weight(out_proj_bias, {d}, "out_proj.bias");
    }

    /// Random weights with the state-spaces initialisation of spec.md §3.5: linear and conv layers PyTorch's
    /// default U(±1/sqrt(fan_in)) (biases likewise for conv, zero for projections), A ~ U(1, 16) with
    /// A_log = log A, Δ ~ exp(U(log 1e-3, log 0.1)) clamped ≥ 1e-4 and dt_bias = softplus⁻¹(Δ), D = 1,
    /// norm weight 1. out_proj is not rescaled (one layer). Throws config_error for an invalid config.
    static mamba2_weights random(const mamba2_config& cfg, std::uint64_t seed) {
        cfg.validate();
        std::mt19937_64 gen(seed);
        auto fill_uniform = [&](auto& t, double lo, double hi) {  // tensor<float> or linear_weight
            std::uniform_real_distribution<double> u(lo, hi);
            for (auto& v : t.span()) v = static_cast<float>(u(gen));
        };
        const std::int64_t d = cfg.d_model, di = cfg.d_inner(), H = cfg.n_heads, cd = cfg.conv_dim(), np = cfg.d_in_proj();
        mamba2_weights w;
        w.in_proj = tensor<float>({np, d});
        fill_uniform(w.in_proj, -1.0 / std::sqrt(double(d)), 1.0 / std::sqrt(double(d)));
        if (cfg.proj_bias) w.in_proj_bias = tensor<float>({np});
        w.conv1d_weight = tensor<float>({cd, cfg.d_conv});
        const double cb = 1.0 / std::sqrt(double(cfg.d_conv));
        fill_uniform(w.conv1d_weight, -cb, cb);
        if (cfg.conv_bias) {
            w.conv1d_bias = tensor<float>({cd});
            fill_uniform(w.conv1d_bias, -cb, cb);
        }
        w.A_log = tensor<float>({H});
        w.dt_bias = tensor<float>({H});
        std::uniform_real_distribution<double> ua(1.0, 16.0), udt(std::log(1e-3), std::log(0.1));
        for (std::int64_t h = 0; h < H; ++h) {
            w.A_log[h] = static_cast<float>(std::log(ua(gen)));
            const double dt = std::max(std::exp(udt(gen)), 1e-4);
            w.dt_bias[h] = static_cast<float>(dt + std::log(-std::expm1(-dt)));
        }
        w.D = tensor<float>({cfg.D_has_hdim ? di : H});
        w.D.fill(1.0f);
        w.norm_weight = tensor<float>({di});
        w.norm_weight.fill(1.0f);
        w.out_proj = tensor<float>({d, di});
        fill_uniform(w.out_proj, -1.0 / std::sqrt(double(di)), 1.0 / std::sqrt(double(di)));
        if (cfg.proj_bias) w.out_proj_bias = tensor<float>({d});
        return w;
    }

private:
    template <class Self, class F>
    static void visit(Self& w, F& f) {
        const auto v = [&](std::string_view name, auto& t) {
            if (t.rank() > 0) visit_param(f, name, t);  // present (a 16-bit weight has no fp32 data)
        };
        v("in_proj.weight", w.in_proj);
        v("in_proj.bias", w.in_proj_bias);
        v("conv1d.weight", w.conv1d_weight);
        v("conv1d.bias", w.conv1d_bias);
        v("dt_bias", w.dt_bias);
        v("A_log", w.A_log);
        v("D", w.D);
        v("norm.weight", w.norm_weight);
        v("out_proj.weight", w.out_proj);
        v("out_proj.bias", w.out_proj_bias);
    }
};

/// Per-sequence recurrent state in numbered slots: ssm [S, H, P, N] and conv [S, conv_dim, K−1] (the last
/// K−1 pre-conv xBC inputs, oldest in column 0), both fp32.
struct mamba2_state {
    tensor<float> ssm;   // [S, H, P, N]
    tensor<float> conv;  // [S, conv_dim, K − 1]

    mamba2_state() = default;
    /// Zeroed state of n_slots slots for `cfg`.
    mamba2_state(const mamba2_config& cfg, std::int64_t n_slots)
        : ssm({n_slots, cfg.n_heads, cfg.head_dim, cfg.d_state}), conv({n_slots, cfg.conv_dim(), cfg.d_conv - 1}) {}

    std::int64_t n_slots() const { return ssm.rank() == 4 ? ssm.dim(0) : 0; }
    std::int64_t ssm_slot_size() const { return n_slots() ? ssm.numel() / n_slots() : 0; }
    std::int64_t conv_slot_size() const { return n_slots() ? conv.numel() / n_slots() : 0; }
    float* ssm_slot(std::int64_t i) { return ssm.data() + i * ssm_slot_size(); }     // [H, P, N]
    float* conv_slot(std::int64_t i) { return conv.data() + i * conv_slot_size(); }  // [conv_dim, K − 1]
    const float* ssm_slot(std::int64_t i) const { return ssm.data() + i * ssm_slot_size(); }
    const float* conv_slot(std::int64_t i) const { return conv.data() + i * conv_slot_size(); }

    /// Zeroes slot i (a fresh sequence). Throws shape_error when i is out of range.
    void reset_slot(std::int64_t i) {
        check(i, "reset_slot");
        std::fill_n(ssm_slot(i), ssm_slot_size(), 0.0f);
        std::fill_n(conv_slot(i), conv_slot_size(), 0.0f);
    }
    /// Slot `to` becomes a copy of slot `from`. Throws shape_error when either is out of range.
    void copy_slot(std::int64_t from, std::int64_t to) {
        check(from, "copy_slot");
        check(to, "copy_slot");
        if (from == to) return;
        std::copy_n(ssm_slot(from), ssm_slot_size(), ssm_slot(to));
        std::copy_n(conv_slot(from), conv_slot_size(), conv_slot(to));
    }
    /// Throws shape_error unless the state's shapes match `cfg`.
    void validate(const mamba2_config& cfg) const {
        const std::int64_t S = n_slots();
        const std::vector<std::int64_t> es{S, cfg.n_heads, cfg.head_dim, cfg.d_state}, ec{S, cfg.conv_dim(), cfg.d_conv - 1};
        if (ssm.shape() != es)
            throw shape_error("mamba2_state: ssm expected shape " + shape_string(es) + ", found " + shape_string(ssm.shape()));
        if (conv.shape() != ec)
            throw shape_error("mamba2_state: conv expected shape " + shape_string(ec) + ", found " + shape_string(conv.shape()));
    }

private:
    void check(std::int64_t i, const char* what) const {
        if (i < 0 || i >= n_slots())
            throw shape_error(std::string("mamba2_state::") + what + ": slot " + std::to_string(i) + " outside [0, " +
                              std::to_string(n_slots()) + ")");
    }
};

/// One Mamba-2 layer (spec.md §3.2). Thread-safe for concurrent calls on distinct states.
class mamba2 {
public:
    using config_type = mamba2_config;
    using weights_type = mamba2_weights;
    using state_type = mamba2_state;
    static constexpr kind_info kind{layer_kind::mamba2, {"mamba2", "mamba", "m2"}};

    /// Validates both (config_error / shape_error).
    mamba2(mamba2_config cfg, mamba2_weights w) : cfg_(cfg), w_(std::move(w)) {
        cfg_.validate();
        w_.validate(cfg_);
    }

    const mamba2_config& config() const noexcept { return cfg_; }
    const mamba2_weights& weights() const noexcept { return w_; }
    /// Mutable weights (an optimizer's step). Nothing is derived from them at construction (A = −exp(A_log) is
    /// computed per call), so changes take effect at the next call; shapes must not change.
    mamba2_weights& weights_mut() noexcept { return w_; }
    /// A zeroed state with n_slots slots.
    mamba2_state make_state(std::int64_t n_slots) const { return mamba2_state(cfg_, n_slots); }
    /// The chunk length the SSD runs at on backend be: config.chunk_size, or the backend's choice when it is 0.
    template <backend B>
    std::int64_t chunk_for(const B& be) const {
        return cfg_.chunk_size > 0 ? cfg_.chunk_size : ops::ssd_chunk_length(be, cfg_.head_dim, cfg_.d_state);
    }

    /// Any token counts (chunked prefill; dispatches to the step path when every sequence has one token).
    /// x [n_rows, d] fp32, y [n_rows, d] fp32 (rows outside valid sequences are zeroed). The state is read and
    /// updated at each sequence's slot (slot −1: zero output, no state touched). Throws shape_error on shape,
    /// slot or state mismatches.
    template <host_backend B, batch_like Batch>
    void forward(const B& be, mamba2_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        st.validate(cfg_);
        std::optional<validated_batch> tmp;
        const validated_batch& vb = as_validated(batch, st.n_slots(), tmp);
        run(be, st, vb, x, y, vb.is_decode());
    }

    /// Decode step: every sequence must hold exactly one token (shape_error otherwise). Shapes as forward.
    template <host_backend B, batch_like Batch>
    void step(const B& be, mamba2_state& st, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        const seq_batch& b = batch;
        for (std::int64_t i = 0; i < b.n_seq(); ++i)
            if (b.lengths[i] != 1)
                throw shape_error("mamba2::step: sequence " + std::to_string(i) + " has " + std::to_string(b.lengths[i]) +
                                  " tokens, a decode step takes exactly 1 per sequence");
        st.validate(cfg_);
        std::optional<validated_batch> tmp;
        run(be, st, as_validated(batch, st.n_slots(), tmp), x, y, true);
    }

private:
    /// Per-thread scratch reused across calls (fresh pages cost ~10% of a long prefill in page faults). It grows
    /// to the largest call seen on the thread; a re-entrant call on the same thread gets its own allocation.
    class scratch {
    public:
        explicit scratch(std::size_t n) {
            auto& ws = tls();
            if (!ws.in_use) {
                ws.in_use = true;
                if (ws.buf.size() < n) ws.buf = std::vector<float>(n);
                data_ = ws.buf.data();
                owner_ = &ws;
            } else {
                own_ = std::make_unique_for_overwrite<float[]>(std::max<std::size_t>(n, 1));
                data_ = own_.get();
            }
        }
        ~scratch() {
            if (owner_) owner_->in_use = false;
        }
        scratch(const scratch&) = delete;
        scratch& operator=(const scratch&) = delete;
        /// Carves n floats (64-byte aligned offsets) off the front.
        float* take(std::size_t n) {
            float* p = data_ + used_;
            used_ += (n + 15) / 16 * 16;
            return p;
        }
        static std::size_t rounded(std::size_t n) { return (n + 15) / 16 * 16; }
        static void release() {
            auto& ws = tls();
            if (!ws.in_use) std::vector<float>().swap(ws.buf);
        }

    private:
        struct per_thread {
            std::vector<float> buf;
            bool in_use = false;
        };
        static per_thread& tls() {
            thread_local per_thread ws;
            return ws;
        }
        per_thread* owner_ = nullptr;
        std::unique_ptr<float[]> own_;
        float* data_ = nullptr;
        std::size_t used_ = 0;
    };

    template <host_backend B>
    void run(const B& be, mamba2_state& st, const validated_batch& vb, tensor_view<const float, 2> x,
             tensor_view<float, 2> y, bool decode) const {
        const seq_batch& batch = vb.batch();
        const std::int64_t d = cfg_.d_model, di = cfg_.d_inner(), H = cfg_.n_heads, P = cfg_.head_dim, G = cfg_.n_groups,
                           N = cfg_.d_state, K = cfg_.d_conv, cd = cfg_.conv_dim(), np = cfg_.d_in_proj();
        x.require_shape({batch.n_rows, d}, "mamba2: x");
        y.require_shape({batch.n_rows, d}, "mamba2: y");
        if (x.strides[1] != 1 || y.strides[1] != 1) throw shape_error("mamba2: x and y need unit inner stride");

        // Valid sequences, packed into rows [0, Rp) of the work buffers.
        struct item {
            std::int64_t src, packed, len, slot;
        };
        std::vector<item> items;
        std::int64_t Rp = 0;
        for (std::int64_t i = 0; i < batch.n_seq(); ++i)
            if (batch.slots[i] >= 0 && batch.lengths[i] > 0) {
                items.push_back({batch.starts[i], Rp, batch.lengths[i], batch.slots[i]});
                Rp += batch.lengths[i];
            }
        // When the valid sequences already tile all rows in order, x and y are used in place (no gather/scatter).
        bool in_place = Rp == batch.n_rows;
        for (const auto& it : items) in_place = in_place && it.src == it.packed;
        if (!in_place) ops::zero_rows(be, y, std::vector<unsigned char>(static_cast<std::size_t>(y.dim(0)), 0));
        if (Rp == 0) return;

        const auto sz = [](std::int64_t n) { return scratch::rounded(static_cast<std::size_t>(n)); };
        scratch ws((in_place ? 0 : sz(Rp * d) * 2) + sz(Rp * np) + sz(Rp * cd) + sz(Rp * H) + sz(Rp * di));
        tensor_view<const float, 2> xin = x;  // [Rp, d]
        tensor_view<float, 2> yout = y;       // [Rp, d]
        std::vector<std::int64_t> rows;       // packed row -> caller's row
        if (!in_place) {
            rows.resize(static_cast<std::size_t>(Rp));
            for (const auto& it : items)
                for (std::int64_t t = 0; t < it.len; ++t) rows[static_cast<std::size_t>(it.packed + t)] = it.src + t;
            tensor_view<float, 2> xp(ws.take(std::size_t(Rp * d)), {Rp, d});
            ops::gather_rows(be, x, rows, xp);
            xin = xp;
            yout = tensor_view<float, 2>(ws.take(std::size_t(Rp * d)), {Rp, d});
        }

        // 1. zxbcdt = x W_inᵀ  [Rp, 2·d_inner + 2GN + H] = [z | xBC | dt]
        float* zx = ws.take(std::size_t(Rp * np));
        tensor_view<float, 2> zxv(zx, {Rp, np});
        ops::linear(be, xin, w_.in_proj, cfg_.proj_bias ? w_.in_proj_bias.data() : nullptr, zxv);

        // 2. xBC ← silu(conv(xBC) + b), one problem per (sequence, channel block); the conv state slot is updated.
        float* xbc = ws.take(std::size_t(Rp * cd));
        const std::int64_t cblk = 128, n_cblk = (cd + cblk - 1) / cblk;
        std::vector<ops::conv_problem<>> convs;
        convs.reserve(items.size() * static_cast<std::size_t>(n_cblk));
        for (const auto& it : items)
            for (std::int64_t c0 = 0; c0 < cd; c0 += cblk) {
                const std::int64_t cn = std::min(cblk, cd - c0);
                ops::conv_problem<> p;
                p.x = tensor_view<const float, 2>(zx + it.packed * np + di + c0, {it.len, cn}, {np, 1});
                p.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * K, {cn, K});
                p.bias = cfg_.conv_bias ? w_.conv1d_bias.data() + c0 : nullptr;
                p.state = st.conv_slot(it.slot) + c0 * (K - 1);
                p.out = tensor_view<float, 2>(xbc + it.packed * cd + c0, {it.len, cn}, {cd, 1});
                convs.push_back(p);
            }
        ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(convs), kernels::conv_activation::silu);

        // 3. Δ = clamp(softplus(dt + dt_bias), lo, hi)  [Rp, H]
        float* dtv = ws.take(std::size_t(Rp * H));
        ops::ssd_delta(be, tensor_view<const float, 2>(zx + np - H, {Rp, H}, {np, 1}), w_.dt_bias.data(), cfg_.dt_limit.lo,
                       cfg_.dt_limit.hi, tensor_view<float, 2>(dtv, {Rp, H}));

        // 4. SSD (+ D x)  → ys [Rp, H, P]
        kernels::ssd_inputs<float> in;
        in.x = tensor_view<const float, 3>(xbc, {Rp, H, P}, {cd, P, 1});
        in.dt = tensor_view<const float, 2>(dtv, {Rp, H});
        const std::vector<float> A = A_values();
        in.A = A.data();
        in.B = tensor_view<const float, 3>(xbc + di, {Rp, G, N}, {cd, N, 1});
        in.C = tensor_view<const float, 3>(xbc + di + G * N, {Rp, G, N}, {cd, N, 1});
        in.D = w_.D.data();
        in.D_per_channel = cfg_.D_has_hdim;
        std::vector<kernels::ssd_sequence<float>> seqs;
        for (const auto& it : items) seqs.push_back({it.packed, it.len, st.ssm_slot(it.slot)});
        float* ys = ws.take(std::size_t(Rp * di));
        tensor_view<float, 3> ysv(ys, {Rp, H, P});
        if (decode)
            ops::ssd_step(be, in, std::span<const kernels::ssd_sequence<float>>(seqs), ysv);
        else
            ops::ssd_chunked(be, in, std::span<const kernels::ssd_sequence<float>>(seqs), chunk_for(be), ysv);

        // 5. gated RMSNorm (gate then norm, per group), in place on ys.
        const std::int64_t gs = cfg_.group_size(), ng = di / gs;
        ops::gated_rms_norm(be, tensor_view<const float, 3>(ys, {Rp, ng, gs}), tensor_view<const float, 3>(zx, {Rp, ng, gs}, {np, gs, 1}),
                            w_.norm_weight.data(), di, kernels::gate_order::gate_then_norm, cfg_.norm_eps,
                            tensor_view<float, 3>(ys, {Rp, ng, gs}));

        // 6. out = y' W_outᵀ, scattered back to the caller's rows.
        ops::linear(be, tensor_view<const float, 2>(ys, {Rp, di}), w_.out_proj,
                    cfg_.proj_bias ? w_.out_proj_bias.data() : nullptr, yout);
        if (!in_place) ops::scatter_rows(be, tensor_view<const float, 2>(yout), rows, y);
    }

public:
    /// Frees the calling thread's reusable scratch (it otherwise keeps the size of the largest call seen).
    static void release_scratch() { scratch::release(); }

    // ---- training (issue 8; TRAINING_PLAN.md "The interface the mixers will get") ------------------------------

    /// What forward_train keeps for backward, fp32, reused across calls (it grows to the largest batch seen). Per
    /// token of the batch's sequences (packed in sequence order): the in_proj output [z | xBC before the conv | raw
    /// dt] (2·d_inner + 2GN + H), the conv + SiLU output [x | B | C] (d_inner + 2GN), Δ (H) and the SSD output
    /// before the gated norm (d_inner): 4·d_inner + 4GN + 2H floats, O(T·d). Recomputed in backward instead of
    /// stored: the gated norm's output (one norm pass) and the SSD chunk states (inside the SSD backward).
    struct train_cache {
        std::int64_t n_rows = -1;                    // rows of the batch it was made for (−1: none yet)
        std::vector<std::int64_t> starts, lengths;   // [n] the sequences (length > 0) in batch order
        std::vector<std::int64_t> packed;            // [n] each sequence's first packed row
        std::vector<std::int64_t> rows;              // [Rp] packed row → batch row; empty when the batch is dense
        std::int64_t packed_rows = 0;                // Rp
        bool in_place = true;                        // the sequences tile all rows in order: x, y used as they are
        std::vector<float> zxbcdt;                   // [Rp, 2·d_inner + 2GN + H]
        std::vector<float> xbc;                      // [Rp, conv_dim]
        std::vector<float> delta;                    // [Rp, H]
        std::vector<float> y;                        // [Rp, d_inner]
    };

    /// Training forward from zero initial states (conv and SSM) over every sequence of `batch` (packed rows; slots
    /// are ignored). x, y [n_rows, d]; rows outside every sequence get y = 0. Equals forward() on fresh states.
    /// Throws shape_error on mismatched shapes or overlapping / out-of-range sequences.
    template <host_backend B>
    void forward_train(const B& be, const seq_batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y,
                       train_cache& tc) const {
        const std::int64_t d = cfg_.d_model, di = cfg_.d_inner(), H = cfg_.n_heads, cd = cfg_.conv_dim(), np = cfg_.d_in_proj();
        x.require_shape({batch.n_rows, d}, "mamba2::forward_train: x");
        y.require_shape({batch.n_rows, d}, "mamba2::forward_train: y");
        if (x.strides[1] != 1 || y.strides[1] != 1) throw shape_error("mamba2::forward_train: x and y need unit inner stride");
        plan_training(batch, tc);
        const std::int64_t Rp = tc.packed_rows;
        const bool dense = tc.in_place;
        if (!dense) ops::zero_rows(be, y, std::vector<unsigned char>(static_cast<std::size_t>(y.dim(0)), 0));
        if (Rp == 0) return;
        tc.zxbcdt.resize(static_cast<std::size_t>(Rp * np));
        tc.xbc.resize(static_cast<std::size_t>(Rp * cd));
        tc.delta.resize(static_cast<std::size_t>(Rp * H));
        tc.y.resize(static_cast<std::size_t>(Rp * di));
        const auto sz = [](std::int64_t n) { return scratch::rounded(static_cast<std::size_t>(n)); };
        scratch ws((dense ? 0 : 2 * sz(Rp * d)) + sz(Rp * di));
        tensor_view<const float, 2> xin = x;  // [Rp, d]
        tensor_view<float, 2> yout = y;       // [Rp, d]
        if (!dense) {
            tensor_view<float, 2> xp(ws.take(std::size_t(Rp * d)), {Rp, d});
            ops::gather_rows(be, x, tc.rows, xp);
            xin = xp;
            yout = tensor_view<float, 2>(ws.take(std::size_t(Rp * d)), {Rp, d});
        }
        float* zx = tc.zxbcdt.data();
        ops::linear(be, xin, w_.in_proj, cfg_.proj_bias ? w_.in_proj_bias.data() : nullptr, tensor_view<float, 2>(zx, {Rp, np}));
        std::vector<ops::conv_problem<>> convs;
        for_each_conv_block(tc, [&](std::int64_t r, std::int64_t len, std::int64_t c0, std::int64_t cn) {
            ops::conv_problem<> p;
            p.x = tensor_view<const float, 2>(zx + r * np + di + c0, {len, cn}, {np, 1});
            p.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * cfg_.d_conv, {cn, cfg_.d_conv});
            p.bias = cfg_.conv_bias ? w_.conv1d_bias.data() + c0 : nullptr;
            p.out = tensor_view<float, 2>(tc.xbc.data() + r * cd + c0, {len, cn}, {cd, 1});
            convs.push_back(p);
        });
        ops::causal_conv1d(be, std::span<const ops::conv_problem<>>(convs), kernels::conv_activation::silu);
        ops::ssd_delta(be, tensor_view<const float, 2>(zx + np - H, {Rp, H}, {np, 1}), w_.dt_bias.data(), cfg_.dt_limit.lo,
                       cfg_.dt_limit.hi, tensor_view<float, 2>(tc.delta.data(), {Rp, H}));
        const std::vector<float> A = A_values();
        const auto in = ssd_inputs_of(tc, A.data());
        std::vector<kernels::ssd_sequence<float>> seqs;
        for (std::size_t i = 0; i < tc.starts.size(); ++i) seqs.push_back({tc.packed[i], tc.lengths[i], nullptr});
        ops::ssd_chunked(be, in, std::span<const kernels::ssd_sequence<float>>(seqs), chunk_for(be),
                         tensor_view<float, 3>(tc.y.data(), {Rp, H, cfg_.head_dim}));
        float* yn = ws.take(std::size_t(Rp * di));
        gated_norm(be, tc, yn);
        ops::linear(be, tensor_view<const float, 2>(yn, {Rp, di}), w_.out_proj, cfg_.proj_bias ? w_.out_proj_bias.data() : nullptr,
                    yout);
        if (!dense) ops::scatter_rows(be, tensor_view<const float, 2>(yout), tc.rows, y);
    }

    /// Backward of forward_train (same batch, its cache, its input x): dx [n_rows, d] overwritten (0 outside the
    /// sequences); every parameter gradient accumulated into g (shaped like the weights: weights().zeros_like()).
    /// Reverse order of the forward: out_proj → gated norm (norm output recomputed) → SSD and D (chunk states
    /// recomputed) → Δ (softplus, clamp, dt_bias) → conv + SiLU (weights, bias) → in_proj; dA_log = dA · A.
    /// Throws shape_error when the batch differs from the cache's or a shape does not match.
    template <host_backend B>
    void backward(const B& be, const seq_batch& batch, const train_cache& tc, tensor_view<const float, 2> x,
                  tensor_view<const float, 2> dy, tensor_view<float, 2> dx, mamba2_weights& g) const {
        const std::int64_t d = cfg_.d_model, di = cfg_.d_inner(), H = cfg_.n_heads, P = cfg_.head_dim, G = cfg_.n_groups,
                           N = cfg_.d_state, cd = cfg_.conv_dim(), np = cfg_.d_in_proj();
        constexpr const char* who = "mamba2::backward";
        x.require_shape({batch.n_rows, d}, who, "x");
        dy.require_shape({batch.n_rows, d}, who, "dy");
        dx.require_shape({batch.n_rows, d}, who, "dx");
        if (x.strides[1] != 1 || dy.strides[1] != 1 || dx.strides[1] != 1)
            throw shape_error(std::string(who) + ": x, dy and dx need unit inner stride");
        g.validate(cfg_);
        check_cache(batch, tc, who);
        const std::int64_t Rp = tc.packed_rows;
        const bool dense = tc.in_place;
        if (!dense) ops::zero_rows(be, dx, std::vector<unsigned char>(static_cast<std::size_t>(dx.dim(0)), 0));
        if (Rp == 0) return;
        const auto sz = [](std::int64_t n) { return scratch::rounded(static_cast<std::size_t>(n)); };
        scratch ws((dense ? 0 : 3 * sz(Rp * d)) + 2 * sz(Rp * di) + sz(Rp * np) + sz(Rp * cd) + sz(Rp * H));
        tensor_view<const float, 2> xin = x, dyin = dy;  // [Rp, d]
        tensor_view<float, 2> dxout = dx;                // [Rp, d]
        if (!dense) {
            tensor_view<float, 2> xp(ws.take(std::size_t(Rp * d)), {Rp, d}), dyp(ws.take(std::size_t(Rp * d)), {Rp, d});
            ops::gather_rows(be, x, tc.rows, xp);
            ops::gather_rows(be, dy, tc.rows, dyp);
            xin = xp;
            dyin = dyp;
            dxout = tensor_view<float, 2>(ws.take(std::size_t(Rp * d)), {Rp, d});
        }
        const float* zx = tc.zxbcdt.data();
        float* yn = ws.take(std::size_t(Rp * di));     // [Rp, d_inner] gated norm output (recomputed)
        float* dyn = ws.take(std::size_t(Rp * di));    // [Rp, d_inner] its gradient, then (in place) the SSD output's
        float* dzx = ws.take(std::size_t(Rp * np));    // [Rp, np]      gradient of the in_proj output
        float* dxbc = ws.take(std::size_t(Rp * cd));   // [Rp, cd]      gradient of the conv output
        float* ddelta = ws.take(std::size_t(Rp * H));  // [Rp, H]       gradient of Δ
        const auto dview = [&](float* p, std::int64_t cols, std::int64_t ld) { return tensor_view<float, 2>(p, {Rp, cols}, {ld, 1}); };

        // out = y' W_outᵀ (+ b)
        gated_norm(be, tc, yn);
        ops::linear_backward(be, tensor_view<const float, 2>(yn, {Rp, di}), w_.out_proj.view<2>(), dyin, dview(dyn, di, di),
                             g.out_proj.view<2>(), cfg_.proj_bias ? g.out_proj_bias.data() : nullptr);
        // y' = GatedRMSNorm(y, z): dy (in place) and dz (the z columns of dzx)
        const std::int64_t gs = cfg_.group_size(), ng = di / gs;
        ops::gated_rms_norm_backward(be, tensor_view<const float, 3>(tc.y.data(), {Rp, ng, gs}),
                                     tensor_view<const float, 3>(zx, {Rp, ng, gs}, {np, gs, 1}), w_.norm_weight.data(), di,
                                     kernels::gate_order::gate_then_norm, cfg_.norm_eps, tensor_view<const float, 3>(dyn, {Rp, ng, gs}),
                                     tensor_view<float, 3>(dyn, {Rp, ng, gs}), tensor_view<float, 3>(dzx, {Rp, ng, gs}, {np, gs, 1}),
                                     g.norm_weight.data());
        // y = SSD(x, Δ, A, B, C) + D x: dx, dB, dC into dxbc; dΔ; dA (then dA_log = dA·A); dD
        const std::vector<float> A = A_values();
        const auto in = ssd_inputs_of(tc, A.data());
        std::vector<float> dA(static_cast<std::size_t>(H), 0.f);
        kernels::ssd_grads<float> sg;
        sg.dx = tensor_view<float, 3>(dxbc, {Rp, H, P}, {cd, P, 1});
        sg.ddt = tensor_view<float, 2>(ddelta, {Rp, H});
        sg.dB = tensor_view<float, 3>(dxbc + di, {Rp, G, N}, {cd, N, 1});
        sg.dC = tensor_view<float, 3>(dxbc + di + G * N, {Rp, G, N}, {cd, N, 1});
        sg.dA = dA.data();
        sg.dD = g.D.data();
        std::vector<kernels::ssd_backward_sequence<float>> seqs;
        for (std::size_t i = 0; i < tc.starts.size(); ++i) seqs.push_back({tc.packed[i], tc.lengths[i], nullptr, nullptr, nullptr});
        ops::ssd_chunked_backward(be, in, std::span<const kernels::ssd_backward_sequence<float>>(seqs), chunk_for(be),
                                  tensor_view<const float, 3>(dyn, {Rp, H, P}), sg);
        for (std::int64_t h = 0; h < H; ++h) g.A_log[h] += dA[static_cast<std::size_t>(h)] * A[static_cast<std::size_t>(h)];
        // Δ = clamp(softplus(dt + dt_bias), lo, hi): the dt columns of dzx, dt_bias
        ops::ssd_delta_backward(be, tensor_view<const float, 2>(zx + np - H, {Rp, H}, {np, 1}), w_.dt_bias.data(), cfg_.dt_limit.lo,
                                cfg_.dt_limit.hi, tensor_view<const float, 2>(ddelta, {Rp, H}), dview(dzx + np - H, H, np),
                                g.dt_bias.data());
        // xBC = silu(conv(xBC_in) + b) from zero conv states: the xBC columns of dzx, conv weight and bias
        std::vector<ops::conv_backward_problem<>> convs;
        for_each_conv_block(tc, [&](std::int64_t r, std::int64_t len, std::int64_t c0, std::int64_t cn) {
            const std::int64_t K = cfg_.d_conv;
            ops::conv_backward_problem<> b;
            b.x = tensor_view<const float, 2>(zx + r * np + di + c0, {len, cn}, {np, 1});
            b.w = tensor_view<const float, 2>(w_.conv1d_weight.data() + c0 * K, {cn, K});
            b.bias = cfg_.conv_bias ? w_.conv1d_bias.data() + c0 : nullptr;
            b.dout = tensor_view<const float, 2>(dxbc + r * cd + c0, {len, cn}, {cd, 1});
            b.dx = tensor_view<float, 2>(dzx + r * np + di + c0, {len, cn}, {np, 1});
            b.dw = tensor_view<float, 2>(g.conv1d_weight.data() + c0 * K, {cn, K});
            b.dbias = cfg_.conv_bias ? g.conv1d_bias.data() + c0 : nullptr;
            convs.push_back(b);
        });
        ops::causal_conv1d_backward(be, std::span<const ops::conv_backward_problem<>>(convs), kernels::conv_activation::silu);
        // zxbcdt = x W_inᵀ (+ b)
        ops::linear_backward(be, xin, w_.in_proj.view<2>(), tensor_view<const float, 2>(dzx, {Rp, np}), dxout, g.in_proj.view<2>(),
                             cfg_.proj_bias ? g.in_proj_bias.data() : nullptr);
        if (!dense) ops::scatter_rows(be, tensor_view<const float, 2>(dxout), tc.rows, dx);
    }

private:
    /// A = −exp(A_log) [H], fp32, derived per call (so an optimizer may change A_log between calls).
    std::vector<float> A_values() const {
        std::vector<float> A(static_cast<std::size_t>(cfg_.n_heads));
        for (std::int64_t h = 0; h < cfg_.n_heads; ++h) A[static_cast<std::size_t>(h)] = -std::exp(w_.A_log[h]);
        return A;
    }

    /// The sequences of a training batch (slots ignored, empty ones dropped) packed in batch order into tc.
    static void plan_training(const seq_batch& batch, train_cache& tc) {
        seq_batch b = batch;  // the slots are ignored: check rows only
        b.slots.resize(b.starts.size());
        for (std::size_t i = 0; i < b.slots.size(); ++i) b.slots[i] = static_cast<std::int64_t>(i);
        b.validate();
        tc.n_rows = batch.n_rows;
        tc.starts.clear();
        tc.lengths.clear();
        tc.packed.clear();
        tc.rows.clear();
        std::int64_t Rp = 0;
        bool dense = true;
        for (std::int64_t i = 0; i < batch.n_seq(); ++i)
            if (batch.lengths[i] > 0) {
                tc.starts.push_back(batch.starts[i]);
                tc.lengths.push_back(batch.lengths[i]);
                tc.packed.push_back(Rp);
                dense = dense && batch.starts[i] == Rp;
                Rp += batch.lengths[i];
            }
        tc.packed_rows = Rp;
        tc.in_place = dense && Rp == batch.n_rows;
        if (tc.in_place) return;
        tc.rows.resize(static_cast<std::size_t>(Rp));
        for (std::size_t i = 0; i < tc.starts.size(); ++i)
            for (std::int64_t t = 0; t < tc.lengths[i]; ++t) tc.rows[static_cast<std::size_t>(tc.packed[i] + t)] = tc.starts[i] + t;
    }

    /// Throws shape_error unless tc was made by forward_train for this batch.
    static void check_cache(const seq_batch& batch, const train_cache& tc, const char* who) {
        bool same = tc.n_rows == batch.n_rows;
        std::size_t j = 0;
        for (std::int64_t i = 0; same && i < batch.n_seq(); ++i) {
            if (batch.lengths[i] <= 0) continue;
            same = j < tc.starts.size() && tc.starts[j] == batch.starts[i] && tc.lengths[j] == batch.lengths[i];
            ++j;
        }
        if (!same || j != tc.starts.size())
            throw shape_error(std::string(who) + ": the train_cache was made by forward_train for another batch (" +
                              std::to_string(tc.starts.size()) + " sequences over " + std::to_string(tc.n_rows) + " rows)");
    }

    /// f(packed row, length, first channel, channels) for every (sequence, block of 128 xBC channels) of the cache:
    /// the conv problems of training, as forward() cuts them (zero initial conv states).
    template <class F>
    void for_each_conv_block(const train_cache& tc, F&& f) const {
        const std::int64_t cd = cfg_.conv_dim(), cblk = 128;
        for (std::size_t i = 0; i < tc.starts.size(); ++i)
            for (std::int64_t c0 = 0; c0 < cd; c0 += cblk) f(tc.packed[i], tc.lengths[i], c0, std::min(cblk, cd - c0));
    }

    /// The SSD inputs over the cache's packed rows (x, B, C from the conv output, Δ) with A [H] and D.
    kernels::ssd_inputs<float> ssd_inputs_of(const train_cache& tc, const float* A) const {
        const std::int64_t Rp = tc.packed_rows, di = cfg_.d_inner(), H = cfg_.n_heads, P = cfg_.head_dim, G = cfg_.n_groups,
                           N = cfg_.d_state, cd = cfg_.conv_dim();
        kernels::ssd_inputs<float> in;
        in.x = tensor_view<const float, 3>(tc.xbc.data(), {Rp, H, P}, {cd, P, 1});
        in.dt = tensor_view<const float, 2>(tc.delta.data(), {Rp, H});
        in.A = A;
        in.B = tensor_view<const float, 3>(tc.xbc.data() + di, {Rp, G, N}, {cd, N, 1});
        in.C = tensor_view<const float, 3>(tc.xbc.data() + di + G * N, {Rp, G, N}, {cd, N, 1});
        in.D = w_.D.data();
        in.D_per_channel = cfg_.D_has_hdim;
        return in;
    }

    /// y' = GatedRMSNorm(y, z) of the cached SSD output into out [Rp, d_inner].
    template <host_backend B>
    void gated_norm(const B& be, const train_cache& tc, float* out) const {
        const std::int64_t Rp = tc.packed_rows, di = cfg_.d_inner(), np = cfg_.d_in_proj(), gs = cfg_.group_size(), ng = di / gs;
        ops::gated_rms_norm(be, tensor_view<const float, 3>(tc.y.data(), {Rp, ng, gs}),
                            tensor_view<const float, 3>(tc.zxbcdt.data(), {Rp, ng, gs}, {np, gs, 1}), w_.norm_weight.data(), di,
                            kernels::gate_order::gate_then_norm, cfg_.norm_eps, tensor_view<float, 3>(out, {Rp, ng, gs}));
    }

    mamba2_config cfg_;
    mamba2_weights w_;
};

static_assert(mixer<mamba2, cpu_backend>);
static_assert(mixer<mamba2, reference_backend>);

/// fp64 state of one sequence for mamba2_reference: ssm [H, P, N], conv [conv_dim, K − 1] (same layouts as a slot).
struct mamba2_ref_state {
    std::vector<double> ssm;
    std::vector<double> conv;
    explicit mamba2_ref_state(const mamba2_config& cfg)
        : ssm(static_cast<std::size_t>(cfg.n_heads * cfg.head_dim * cfg.d_state), 0.0),
          conv(static_cast<std::size_t>(cfg.conv_dim() * (cfg.d_conv - 1)), 0.0) {}
};

/// The whole layer in double precision, token by token, as written in spec.md §3.2 / §3.4: one sequence,
/// x [T, d] row-major, returns y [T, d]; `st` is updated to the state after the last token.
/// Throws shape_error when x.size() != T·d or the state sizes do not match.
inline std::vector<double> mamba2_reference(const mamba2_config& cfg, const mamba2_weights& w, std::span<const double> x,
                                            std::int64_t T, mamba2_ref_state& st) {
    const std::int64_t d = cfg.d_model, di = cfg.d_inner(), H = cfg.n_heads, P = cfg.head_dim, G = cfg.n_groups,
                       N = cfg.d_state, K = cfg.d_conv, cd = cfg.conv_dim(), np = cfg.d_in_proj();
    if (static_cast<std::int64_t>(x.size()) != T * d)
        throw shape_error("mamba2_reference: x has " + std::to_string(x.size()) + " values, expected T*d = " + std::to_string(T * d));
    if (static_cast<std::int64_t>(st.ssm.size()) != H * P * N || static_cast<std::int64_t>(st.conv.size()) != cd * (K - 1))
        throw shape_error("mamba2_reference: state sizes do not match the config");
    std::vector<double> y(static_cast<std::size_t>(T * d), 0.0), zxbcdt(np), xbc(cd), ys(di), u(di);
    for (std::int64_t t = 0; t < T; ++t) {
        const double* xt = x.data() + t * d;
        for (std::int64_t o = 0; o < np; ++o) {
            double acc = cfg.proj_bias ? w.in_proj_bias[o] : 0.0;
            for (std::int64_t i = 0; i < d; ++i) acc += double(w.in_proj[o * d + i]) * xt[i];
            zxbcdt[o] = acc;
        }
        const double* z = zxbcdt.data();
        const double* xbc_in = zxbcdt.data() + di;
        const double* dt_raw = zxbcdt.data() + di + cd;
        // conv step over the window [state | current]
        for (std::int64_t c = 0; c < cd; ++c) {
            double* s = st.conv.data() + c * (K - 1);
            double acc = cfg.conv_bias ? w.conv1d_bias[c] : 0.0;
            for (std::int64_t j = 0; j < K - 1; ++j) acc += double(w.conv1d_weight[c * K + j]) * s[j];
            acc += double(w.conv1d_weight[c * K + K - 1]) * xbc_in[c];
            for (std::int64_t j = 0; j + 1 < K - 1; ++j) s[j] = s[j + 1];
            if (K > 1) s[K - 2] = xbc_in[c];
            xbc[c] = silu(acc);
        }
        const double* xs = xbc.data();
        const double* Bt = xbc.data() + di;
        const double* Ct = xbc.data() + di + G * N;
        for (std::int64_t h = 0; h < H; ++h) {
            const std::int64_t g = h / (H / G);
            const double delta = std::clamp(softplus(dt_raw[h] + double(w.dt_bias[h])), double(cfg.dt_limit.lo), double(cfg.dt_limit.hi));
            const double dA = std::exp(delta * -std::exp(double(w.A_log[h])));
            for (std::int64_t p = 0; p < P; ++p) {
                double* s = st.ssm.data() + (h * P + p) * N;
                const double xv = xs[h * P + p];
                double acc = 0;
                for (std::int64_t n = 0; n < N; ++n) {
                    s[n] = dA * s[n] + delta * xv * Bt[g * N + n];
                    acc += s[n] * Ct[g * N + n];
                }
                const double Dv = cfg.D_has_hdim ? w.D[h * P + p] : w.D[h];
                ys[h * P + p] = acc + Dv * xv;
            }
        }
        // gated norm, gate then norm, per group
        const std::int64_t gs = cfg.group_size();
        for (std::int64_t i = 0; i < di; ++i) u[i] = ys[i] * silu(z[i]);
        for (std::int64_t g0 = 0; g0 < di; g0 += gs) {
            double ss = 0;
            for (std::int64_t i = g0; i < g0 + gs; ++i) ss += u[i] * u[i];
            const double r = 1.0 / std::sqrt(ss / double(gs) + double(cfg.norm_eps));
            for (std::int64_t i = g0; i < g0 + gs; ++i) u[i] = double(w.norm_weight[i]) * u[i] * r;
        }
        for (std::int64_t o = 0; o < d; ++o) {
            double acc = cfg.proj_bias ? w.out_proj_bias[o] : 0.0;
            for (std::int64_t i = 0; i < di; ++i) acc += double(w.out_proj[o * di + i]) * u[i];
            y[t * d + o] = acc;
        }
    }
    return y;
}

/// fp64 states of every slot for mamba2_layer_ref (the reference twin of mamba2_state).
struct mamba2_ref_slots {
    std::vector<mamba2_ref_state> slots;
    mamba2_config cfg;
    mamba2_ref_slots(const mamba2_config& c, std::int64_t n_slots) : slots(static_cast<std::size_t>(n_slots), mamba2_ref_state(c)), cfg(c) {}
    void reset_slot(std::int64_t i) { slots.at(static_cast<std::size_t>(i)) = mamba2_ref_state(cfg); }
    void copy_slot(std::int64_t from, std::int64_t to) { slots.at(static_cast<std::size_t>(to)) = slots.at(static_cast<std::size_t>(from)); }
};

/// The whole layer in fp64 over a batch (the common signature of every *_layer_ref): for each sequence of `batch`
/// with a valid slot, its rows of x [n_rows, d] run token by token (mamba2_reference) from and into st.slots[slot];
/// y [n_rows, d] gets those rows, every other row 0. Throws shape_error on mismatched shapes or slots.
inline void mamba2_layer_ref(const mamba2_config& cfg, const mamba2_weights& w, const seq_batch& batch,
                             tensor_view<const double, 2> x, mamba2_ref_slots& st, tensor_view<double, 2> y) {
    const std::int64_t d = cfg.d_model;
    x.require_shape({batch.n_rows, d}, "mamba2_layer_ref: x");
    y.require_shape({batch.n_rows, d}, "mamba2_layer_ref: y");
    batch.validate(static_cast<std::int64_t>(st.slots.size()));
    for (std::int64_t r = 0; r < batch.n_rows; ++r)
        for (std::int64_t i = 0; i < d; ++i) y(r, i) = 0;
    for (std::int64_t s = 0; s < batch.n_seq(); ++s) {
        const auto i = static_cast<std::size_t>(s);
        if (batch.slots[i] < 0 || batch.lengths[i] == 0) continue;
        std::vector<double> xs(static_cast<std::size_t>(batch.lengths[i] * d));
        for (std::int64_t t = 0; t < batch.lengths[i]; ++t)
            for (std::int64_t c = 0; c < d; ++c) xs[static_cast<std::size_t>(t * d + c)] = x(batch.starts[i] + t, c);
        const auto ys = mamba2_reference(cfg, w, xs, batch.lengths[i], st.slots[static_cast<std::size_t>(batch.slots[i])]);
        for (std::int64_t t = 0; t < batch.lengths[i]; ++t)
            for (std::int64_t c = 0; c < d; ++c) y(batch.starts[i] + t, c) = ys[static_cast<std::size_t>(t * d + c)];
    }
}

/// Mixer-level hooks used by generic tests (tests/support/mixer_harness.hpp).
inline mamba2_ref_slots make_ref_state(const mamba2& m, std::int64_t n_slots) { return mamba2_ref_slots(m.config(), n_slots); }
inline void layer_ref(const mamba2& m, const seq_batch& b, tensor_view<const double, 2> x, mamba2_ref_slots& st, tensor_view<double, 2> y) {
    mamba2_layer_ref(m.config(), m.weights(), b, x, st, y);
}

}  // namespace hymix
