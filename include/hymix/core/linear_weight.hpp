// The weight of a projection (nn.Linear's [out, in] matrix, the embedding / LM head): fp32 by default, or kept as
// bf16 / f16 for inference so a decode step streams half the bytes, or as 8-bit integers with one fp32 scale per row
// (symmetric absmax quantization: a quarter of the bytes, plus 4 per row) (issue 12). Loaders, optimizers and fp64
// references reach its fp32 tensor through f32(); while the weight is 16- or 8-bit the fp32 buffer is released and
// every fp32 access throws value_error instead of reading nothing, and ops::linear / ops::embedding read the stored values
// directly (widened exactly in registers, so a projection gives the bits of the fp32 kernel on the widened weights;
// an 8-bit weight's row sums are scaled once per output, see q8_view).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "hymix/core/convert.hpp"
#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix {

/// Name of a weight storage type: "f32", "bf16", "f16" or "i8".
inline const char* weight_dtype_name(dtype d) noexcept {
    switch (d) {
        case dtype::f32: return "f32";
        case dtype::bf16: return "bf16";
        case dtype::f16: return "f16";
        case dtype::i8: return "i8";
        default: return "unsupported";
    }
}

/// True for the storage types a linear_weight takes: f32, bf16, f16, i8.
constexpr bool is_weight_dtype(dtype d) noexcept { return d == dtype::f32 || d == dtype::bf16 || d == dtype::f16 || d == dtype::i8; }

/// Parses "f32" / "fp32" / "float32", "bf16" / "bfloat16", "f16" / "fp16" / "float16", "i8" / "int8" / "q8" (8-bit
/// integers with per-row scales). Throws config_error otherwise.
inline dtype parse_weight_dtype(std::string_view s) {
    if (s == "f32" || s == "fp32" || s == "float32") return dtype::f32;
    if (s == "bf16" || s == "bfloat16") return dtype::bf16;
    if (s == "f16" || s == "fp16" || s == "float16") return dtype::f16;
    if (s == "i8" || s == "int8" || s == "q8") return dtype::i8;
    throw config_error("weight dtype: expected f32, bf16, f16 or i8, found \"" + std::string(s) + "\"");
}

/// An 8-bit weight matrix as kernels read it: w[n, k] ≈ scale[n] · q[n, k], q in [−127, 127] (symmetric absmax per
/// row: scale[n] = max_k |w[n, k]| / 127, q = round-half-away(w / scale); an all-zero row has scale 0). A product
/// x · wᵀ is computed as scale[n] · Σ_k x[k] · q[n, k] (the integer weights widened exactly to fp32, every product and
/// sum fp32, one multiply by the scale per output), so a row's result does not depend on the batch. Rows of a
/// rank-R weight are its first dimension (the rest flattened). Non-owning, like tensor_view.
struct q8_view {
    tensor_view<const std::int8_t, 2> q;  // [N, K], unit inner stride
    const float* scale = nullptr;         // [N]

    std::int64_t dim(std::size_t i) const { return q.dim(i); }
    /// Rows [r0, r0 + n).
    q8_view rows(std::int64_t r0, std::int64_t n) const {
        return {tensor_view<const std::int8_t, 2>(q.data + r0 * q.strides[0], {n, q.dim(1)}, {q.strides[0], q.strides[1]}), scale + r0};
    }
    /// w[n, k] as fp32 (scale · q: one rounding).
    float at(std::int64_t n, std::int64_t k) const { return scale[n] * static_cast<float>(q(n, k)); }
};

/// True for q8_view (callers that visit a weight's storage pick out the 8-bit case with it).
template <class T>
inline constexpr bool is_q8_view_v = std::is_same_v<std::remove_cvref_t<T>, q8_view>;

/// A projection weight: rank and shape as stored (usually [N, K]); storage fp32 (trainable) or bf16 / f16 / i8
/// (inference only). Copies copy the storage as it is; a moved-from weight is empty (rank 0, fp32).
///
/// It holds its fp32 values in a tensor<float> it owns rather than being one, so nothing can reach an empty fp32
/// buffer behind a 16- or 8-bit weight: fp32 access (data(), view(), span(), operator[], fill(), f32()) throws
/// value_error naming the storage while the weight is not f32, and parameter visitors that take tensor<float>& get f32()
/// (stack/model.hpp's for_each_param), so they too refuse such a weight instead of seeing nothing.
class linear_weight {
public:
    linear_weight() = default;
    linear_weight(tensor<float> t) : f32_(std::move(t)) {}  // NOLINT: implicit by design (loaders assign tensor<float>)
    explicit linear_weight(std::vector<std::int64_t> shape) : f32_(std::move(shape)) {}
    linear_weight(std::initializer_list<std::int64_t> shape) : f32_(shape) {}
    linear_weight(const linear_weight&) = default;
    linear_weight& operator=(const linear_weight&) = default;
    linear_weight(linear_weight&& o) noexcept
        : storage_(o.storage_),
          shape_(std::move(o.shape_)),
          f32_(std::move(o.f32_)),
          b16_(std::move(o.b16_)),
          h16_(std::move(o.h16_)),
          q8_(std::move(o.q8_)),
          q8_scale_(std::move(o.q8_scale_)) {
        o.reset();
    }
    linear_weight& operator=(linear_weight&& o) noexcept {
        if (this != &o) {
            storage_ = o.storage_;
            shape_ = std::move(o.shape_);
            f32_ = std::move(o.f32_);
            b16_ = std::move(o.b16_);
            h16_ = std::move(o.h16_);
            q8_ = std::move(o.q8_);
            q8_scale_ = std::move(o.q8_scale_);
            o.reset();
        }
        return *this;
    }
    linear_weight& operator=(tensor<float> t) {
        reset();
        f32_ = std::move(t);
        return *this;
    }

    /// The storage type: dtype::f32, dtype::bf16, dtype::f16 or dtype::i8.
    dtype storage() const noexcept { return storage_; }
    bool is_f32() const noexcept { return storage_ == dtype::f32; }
    /// Bytes of the stored values (an 8-bit weight's per-row scales included).
    std::size_t stored_bytes() const noexcept {
        if (storage_ == dtype::i8) return static_cast<std::size_t>(q8_.numel()) + static_cast<std::size_t>(q8_scale_.numel()) * sizeof(float);
        return static_cast<std::size_t>(numel()) * (is_f32() ? sizeof(float) : sizeof(std::uint16_t));
    }

    /// Converts the storage to `d` (f32, bf16, f16 or i8). To 16 bits: rounds to nearest even and releases the fp32
    /// buffer; values already representable (a bf16 checkpoint stored as bf16) are kept exactly. To i8: per-row
    /// symmetric absmax quantization (q8_view; rows are the first dimension), which rounds every value. Back to f32:
    /// widens (exactly from 16 bits; scale · q from i8). Throws value_error naming `name` where a finite value would
    /// overflow f16 (|w| >= 65520, which rounds to infinity), nonfinite_error (a value_error) where a value to quantize
    /// to i8 is not finite (a scale cannot carry it), and config_error for another dtype; the weight is unchanged when it throws. Otherwise
    /// non-finite values are kept as they are.
    void store_as(dtype d, std::string_view name = "weight") {
        if (d == storage_) return;
        check_storable(d, name);
        if (is_f32() && f32_.rank() == 0) return;  // an absent (empty) weight stays absent
        if (d == dtype::f32) {
            tensor<float> wide = widened();
            reset();
            f32_ = std::move(wide);
            return;
        }
        const tensor<float> wide = is_f32() ? tensor<float>() : widened();  // between 16 / 8 bits through fp32
        const tensor<float>& src = is_f32() ? f32_ : wide;
        const std::size_t n = static_cast<std::size_t>(src.numel());
        tensor<bf16> b;
        tensor<f16> h;
        tensor<std::int8_t> q;
        tensor<float> qs;
        if (d == dtype::f16) {
            h = tensor<f16>(src.shape());
            convert(src.data(), h.data(), n);
        } else if (d == dtype::bf16) {
            b = tensor<bf16>(src.shape());
            convert(src.data(), b.data(), n);
        } else {
            quantize_rows(src, q, qs);
        }
        std::vector<std::int64_t> s = src.shape();
        reset();  // releases the fp32 values
        b16_ = std::move(b);
        h16_ = std::move(h);
        q8_ = std::move(q);
        q8_scale_ = std::move(qs);
        shape_ = std::move(s);
        storage_ = d;
    }

    /// Throws what store_as(d, name) would throw, converting nothing (a model checks every weight before it converts).
    void check_storable(dtype d, std::string_view name = "weight") const {
        if (!is_weight_dtype(d))
            throw config_error(std::string(name) + ": weights can be stored as f32, bf16, f16 or i8, not " + weight_dtype_name(d));
        if (d == dtype::i8 && storage_ != dtype::i8 && rank() > 0) {
            const tensor<float> wide = is_f32() ? tensor<float>() : widened();
            const tensor<float>& src = is_f32() ? f32_ : wide;
            for (std::int64_t i = 0; i < src.numel(); ++i)
                if (!std::isfinite(src.data()[i]))
                    throw nonfinite_error(std::string(name) + ": value " + std::to_string(src.data()[i]) + " at " + position(i) +
                                          " cannot be quantized to i8 (a per-row scale holds finite values only); store it as f32, bf16 or f16");
        }
        if (d == dtype::f16 && storage_ != dtype::f16 && rank() > 0) {
            if (is_f32()) {
                require_f16_range(f32_.data(), static_cast<std::size_t>(f32_.numel()), name);
            } else {  // bf16: its values widened
                const tensor<float> wide = widened();
                require_f16_range(wide.data(), static_cast<std::size_t>(wide.numel()), name);
            }
        }
    }

    /// A weight whose rows are a's rows then b's (both of rank 2 with equal widths and storage), in that storage: the
    /// fused gate|up matrix of a SwiGLU MLP. Throws shape_error / value_error naming `name` otherwise.
    static linear_weight concat_rows(const linear_weight& a, const linear_weight& b, std::string_view name = "weight") {
        if (a.rank() != 2 || b.rank() != 2 || a.dim(1) != b.dim(1))
            throw shape_error(std::string(name) + ": rows of " + shape_string(a.shape()) + " and " + shape_string(b.shape()) +
                              " cannot be stacked (two matrices of one width expected)");
        if (a.storage_ != b.storage_)
            throw value_error(std::string(name) + ": rows stored as " + weight_dtype_name(a.storage_) + " and " +
                              weight_dtype_name(b.storage_) + " cannot be stacked (one storage expected)");
        const std::vector<std::int64_t> s{a.dim(0) + b.dim(0), a.dim(1)};
        auto stack = [&](const auto& ta, const auto& tb, auto& out) {
            out = std::remove_cvref_t<decltype(ta)>(s);
            std::copy_n(ta.data(), ta.numel(), out.data());
            std::copy_n(tb.data(), tb.numel(), out.data() + ta.numel());
        };
        linear_weight w;
        w.storage_ = a.storage_;
        switch (a.storage_) {
            case dtype::bf16: stack(a.b16_, b.b16_, w.b16_); break;
            case dtype::f16: stack(a.h16_, b.h16_, w.h16_); break;
            case dtype::i8: {
                stack(a.q8_, b.q8_, w.q8_);
                w.q8_scale_ = tensor<float>({s[0]});
                std::copy_n(a.q8_scale_.data(), a.q8_scale_.numel(), w.q8_scale_.data());
                std::copy_n(b.q8_scale_.data(), b.q8_scale_.numel(), w.q8_scale_.data() + a.q8_scale_.numel());
                break;
            }
            default: stack(a.f32_, b.f32_, w.f32_); break;
        }
        if (!w.is_f32()) w.shape_ = s;
        return w;
    }

    // Shape queries report the stored shape whatever the storage.
    const std::vector<std::int64_t>& shape() const noexcept { return is_f32() ? f32_.shape() : shape_; }
    std::int64_t dim(std::size_t i) const { return shape().at(i); }
    std::size_t rank() const noexcept { return shape().size(); }
    std::int64_t numel() const noexcept { return is_f32() ? f32_.numel() : static_cast<std::int64_t>(n16()); }

    // fp32 access: only while stored as f32 (value_error otherwise).
    /// The fp32 tensor itself (for loaders, optimizers, savers and fp64 references).
    tensor<float>& f32() { return require_f32(), f32_; }
    const tensor<float>& f32() const { return require_f32(), f32_; }
    float* data() { return f32().data(); }
    const float* data() const { return f32().data(); }
    std::span<float> span() { return f32().span(); }
    std::span<const float> span() const { return f32().span(); }
    float& operator[](std::int64_t i) { return f32()[i]; }
    const float& operator[](std::int64_t i) const { return f32()[i]; }
    void fill(float v) { f32().fill(v); }
    void zero() { f32().zero(); }
    template <std::size_t R>
    tensor_view<float, R> view() {
        return f32().template view<R>();
    }
    template <std::size_t R>
    tensor_view<const float, R> view() const {
        return f32().template view<R>();
    }

    // The stored values as typed views (throws value_error when stored otherwise).
    template <class T, std::size_t R>
    tensor_view<const T, R> stored_view() const {
        if constexpr (std::is_same_v<T, float>) return view<R>();
        else {
            static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "stored_view: f32, bf16 or f16 (i8: q8())");
            if (storage_ != dtype_of<T>::value)
                throw value_error(std::string("linear_weight: ") + weight_dtype_name(dtype_of<T>::value) + " view of a weight stored as " +
                                  weight_dtype_name(storage_));
            if constexpr (std::is_same_v<T, bf16>) return b16_.template view<R>();
            else return h16_.template view<R>();
        }
    }
    /// The 8-bit values and their row scales, the weight seen as [dim(0), numel / dim(0)] (value_error unless i8).
    q8_view q8() const {
        if (storage_ != dtype::i8)
            throw value_error(std::string("linear_weight: i8 view of a weight stored as ") + weight_dtype_name(storage_));
        const std::int64_t rows = shape_.empty() ? 1 : shape_[0], cols = row_width(shape_);
        return {tensor_view<const std::int8_t, 2>(q8_.data(), {rows, cols}), q8_scale_.data()};
    }

    /// Calls f(tensor_view<const T, R>) with the stored values, T = float, bf16 or f16, or f(q8_view) for i8 (R = 2).
    /// A storage the visitor cannot take (an i8 weight met by a visitor of tensor views only, or R != 2; a backend
    /// whose op runs some storages only, see runs_op) throws value_error naming the storage.
    template <std::size_t R, class F>
    decltype(auto) visit_stored(F&& f) const {
        switch (storage_) {
            case dtype::bf16:
                if constexpr (std::is_invocable_v<F&, tensor_view<const bf16, R>>) return f(stored_view<bf16, R>());
                else throw unvisitable("bf16");
            case dtype::f16:
                if constexpr (std::is_invocable_v<F&, tensor_view<const f16, R>>) return f(stored_view<f16, R>());
                else throw unvisitable("f16");
            case dtype::i8:
                if constexpr (R == 2 && std::is_invocable_v<F&, q8_view>) return f(q8());
                else throw unvisitable("i8 (per-row scales)");
            default:
                if constexpr (std::is_invocable_v<F&, tensor_view<const float, R>>) return f(stored_view<float, R>());
                else throw unvisitable("f32");
        }
    }

private:
    value_error unvisitable(std::string_view storage) const {
        return value_error("linear_weight: a weight of shape " + shape_string(shape()) + " stored as " + std::string(storage) +
                           " is read here by code (or a backend's op) that does not take that storage; store it as another dtype");
    }
    // f16's largest finite value is 65504; round-to-nearest-even sends |w| < 65520 there and |w| >= 65520 to infinity.
    void require_f16_range(const float* p, std::size_t n, std::string_view name) const {
        for (std::size_t i = 0; i < n; ++i)
            if (std::isfinite(p[i]) && std::abs(p[i]) >= 65520.0f)
                throw value_error(std::string(name) + ": value " + std::to_string(p[i]) + " at " + position(static_cast<std::int64_t>(i)) +
                                  " overflows f16 (|w| < 65520 rounds to at most 65504); store it as bf16 or f32");
    }
    // "[row, column]" of the i-th stored value, the weight seen as [dim 0, product of the rest] as for the i8 scales
    // (a rank-1 weight's element i is [i, 0]; a rank-3 one's column counts over its last two dimensions).
    std::string position(std::int64_t i) const {
        const std::int64_t w = std::max<std::int64_t>(row_width(shape()), 1);
        std::string s = "[";  // appended piece by piece (GCC 12 warns falsely on "[" + std::to_string(...))
        s += std::to_string(i / w);
        s += ", ";
        s += std::to_string(i % w);
        s += ']';
        return s;
    }
    void require_f32() const {
        if (!is_f32())
            throw value_error(std::string("linear_weight: fp32 access to a weight of shape ") + shape_string(shape_) + " stored as " +
                              weight_dtype_name(storage_) + " for inference (training and fp64 references need store_as(dtype::f32))");
    }
    std::size_t n16() const noexcept {
        switch (storage_) {
            case dtype::bf16: return static_cast<std::size_t>(b16_.numel());
            case dtype::f16: return static_cast<std::size_t>(h16_.numel());
            default: return static_cast<std::size_t>(q8_.numel());
        }
    }
    // The fp32 values of a 16-bit weight (exact) or of an 8-bit one (scale · q).
    tensor<float> widened() const {
        tensor<float> wide(shape_);
        if (storage_ == dtype::bf16) convert(b16_.data(), wide.data(), n16());
        else if (storage_ == dtype::f16) convert(h16_.data(), wide.data(), n16());
        else {
            const q8_view v = q8();
            for (std::int64_t n = 0; n < v.dim(0); ++n)
                for (std::int64_t k = 0; k < v.dim(1); ++k) wide.data()[n * v.dim(1) + k] = v.at(n, k);
        }
        return wide;
    }
    // Elements per row (the first dimension's rows): the product of the other dimensions.
    static std::int64_t row_width(const std::vector<std::int64_t>& s) {
        std::int64_t w = 1;
        for (std::size_t i = 1; i < s.size(); ++i) w *= s[i];
        return w;
    }
    // Per-row symmetric absmax quantization of finite values (check_storable has refused the others).
    static void quantize_rows(const tensor<float>& src, tensor<std::int8_t>& q, tensor<float>& scale) {
        const std::int64_t rows = src.rank() == 0 ? 1 : src.dim(0), cols = row_width(src.shape());
        q = tensor<std::int8_t>(src.shape());
        scale = tensor<float>({rows});
        for (std::int64_t n = 0; n < rows; ++n) {
            const float* w = src.data() + n * cols;
            std::int8_t* qn = q.data() + n * cols;
            float amax = 0.f;
            for (std::int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::abs(w[k]));
            const float s = amax / 127.f;
            scale.data()[n] = s;
            for (std::int64_t k = 0; k < cols; ++k)
                qn[k] = s > 0 ? static_cast<std::int8_t>(std::clamp(std::lround(w[k] / s), -127L, 127L)) : std::int8_t{0};
        }
    }
    void reset() noexcept {
        f32_ = tensor<float>();
        b16_ = tensor<bf16>();
        h16_ = tensor<f16>();
        q8_ = tensor<std::int8_t>();
        q8_scale_ = tensor<float>();
        shape_.clear();
        storage_ = dtype::f32;
    }

    dtype storage_ = dtype::f32;
    std::vector<std::int64_t> shape_;  // while 16- or 8-bit (f32_ is empty then)
    tensor<float> f32_;
    tensor<bf16> b16_;
    tensor<f16> h16_;
    tensor<std::int8_t> q8_;
    tensor<float> q8_scale_;  // [rows] while i8
};

/// True for hymix::linear_weight (parameter visitors use it to pick out projection weights).
template <class T>
inline constexpr bool is_linear_weight_v = std::is_same_v<std::remove_cvref_t<T>, linear_weight>;

/// Calls f(name, p) for one parameter p (a tensor<float> or a linear_weight). A visitor that takes a linear_weight
/// (a generic one) gets the weight as it is; one that takes only tensor<float>& gets the weight's fp32 tensor, and a
/// 16- or 8-bit weight throws value_error naming the parameter there (fp32 visitors: optimizers, savers, counters).
template <class F, class N, class P>
void visit_param(F&& f, const N& name, P& p) {
    if constexpr (!is_linear_weight_v<P> || std::is_invocable_v<F&, const N&, P&>) {
        f(name, p);
    } else {
        if (!p.is_f32())
            throw value_error(std::string(name) + ": stored as " + weight_dtype_name(p.storage()) +
                              " for inference; this needs fp32 weights (store_weights_as(dtype::f32) first)");
        f(name, p.f32());
    }
}

}  // namespace hymix
