// The weight of a projection (nn.Linear's [out, in] matrix, the embedding / LM head): fp32 by default, or kept as
// bf16 / f16 for inference so a decode step streams half the bytes (issue 12). It is a tensor<float> — loaders,
// optimizers and fp64 references use it as one — that can also hold its values as 16 bits. While 16-bit, the fp32
// buffer is released; fp32 access (data(), view(), span(), operator[]) throws value_error instead of reading
// nothing, and ops::linear / ops::embedding read the 16-bit values directly (widened exactly in registers, so a
// projection gives the bits of the fp32 kernel on the widened weights).
#pragma once

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
#include "hymix/core/tensor.hpp"

namespace hymix {

/// Name of a weight storage type: "f32", "bf16" or "f16".
inline const char* weight_dtype_name(dtype d) noexcept {
    switch (d) {
        case dtype::f32: return "f32";
        case dtype::bf16: return "bf16";
        case dtype::f16: return "f16";
        default: return "unsupported";
    }
}

/// Parses "f32" / "fp32" / "float32", "bf16" / "bfloat16", "f16" / "fp16" / "float16". Throws config_error otherwise.
inline dtype parse_weight_dtype(std::string_view s) {
    if (s == "f32" || s == "fp32" || s == "float32") return dtype::f32;
    if (s == "bf16" || s == "bfloat16") return dtype::bf16;
    if (s == "f16" || s == "fp16" || s == "float16") return dtype::f16;
    throw config_error("weight dtype: expected f32, bf16 or f16, found \"" + std::string(s) + "\"");
}

/// A projection weight: rank and shape as stored (usually [N, K]); storage fp32 (trainable) or bf16 / f16
/// (inference only). Copies copy the storage as it is.
class linear_weight : public tensor<float> {
public:
    using base = tensor<float>;

    linear_weight() = default;
    linear_weight(base t) : base(std::move(t)) {}  // NOLINT: implicit by design (loaders assign tensor<float>)
    explicit linear_weight(std::vector<std::int64_t> shape) : base(std::move(shape)) {}
    linear_weight(std::initializer_list<std::int64_t> shape) : base(shape) {}
    linear_weight& operator=(base t) {
        base::operator=(std::move(t));
        release_compact();
        return *this;
    }

    /// The storage type: dtype::f32, dtype::bf16 or dtype::f16.
    dtype storage() const noexcept { return storage_; }
    bool is_f32() const noexcept { return storage_ == dtype::f32; }
    /// Bytes of the stored values.
    std::size_t stored_bytes() const noexcept {
        return static_cast<std::size_t>(numel()) * (is_f32() ? sizeof(float) : sizeof(std::uint16_t));
    }

    /// Converts the storage to `d` (f32, bf16 or f16). To 16 bits: rounds to nearest even and releases the fp32
    /// buffer; values already representable (a bf16 checkpoint stored as bf16) are kept exactly. Back to f32: widens
    /// exactly. Throws value_error naming `name` where a finite value would overflow f16 (|w| > 65504), and
    /// config_error for another dtype; the weight is unchanged when it throws. Non-finite values are kept as they are.
    void store_as(dtype d, std::string_view name = "weight") {
        if (d == storage_) return;
        if (d != dtype::f32 && d != dtype::bf16 && d != dtype::f16)
            throw config_error(std::string(name) + ": weights can be stored as f32, bf16 or f16, not " + weight_dtype_name(d));
        if (is_f32() && base::rank() == 0) return;  // an absent (empty) weight stays absent
        base wide;  // the exact fp32 values of a 16-bit weight
        if (!is_f32()) {
            wide = base(shape_);
            if (storage_ == dtype::bf16) convert(b16_.data(), wide.data(), n16());
            else convert(h16_.data(), wide.data(), n16());
        }
        if (d == dtype::f32) {
            base::operator=(std::move(wide));
            release_compact();
            return;
        }
        const base& src = is_f32() ? static_cast<const base&>(*this) : wide;
        const std::size_t n = static_cast<std::size_t>(src.numel());
        const float* p = src.data();
        tensor<bf16> b;
        tensor<f16> h;
        if (d == dtype::f16) {
            require_f16_range(p, n, name);
            h = tensor<f16>(src.shape());
            convert(p, h.data(), n);
        } else {
            b = tensor<bf16>(src.shape());
            convert(p, b.data(), n);
        }
        std::vector<std::int64_t> s = src.shape();
        base::operator=(base());  // release the fp32 values
        b16_ = std::move(b);
        h16_ = std::move(h);
        shape_ = std::move(s);
        storage_ = d;
    }

    /// Throws what store_as(d, name) would throw, converting nothing (a model checks every weight before it converts).
    void check_storable(dtype d, std::string_view name = "weight") const {
        if (d != dtype::f32 && d != dtype::bf16 && d != dtype::f16)
            throw config_error(std::string(name) + ": weights can be stored as f32, bf16 or f16, not " + weight_dtype_name(d));
        if (d == dtype::f16 && storage_ != dtype::f16 && rank() > 0) {
            if (is_f32()) {
                require_f16_range(base::data(), static_cast<std::size_t>(base::numel()), name);
            } else {  // bf16: its values widened
                std::vector<float> wide(n16());
                convert(b16_.data(), wide.data(), wide.size());
                require_f16_range(wide.data(), wide.size(), name);
            }
        }
    }

    // Shape queries report the stored shape whatever the storage.
    const std::vector<std::int64_t>& shape() const noexcept { return is_f32() ? base::shape() : shape_; }
    std::int64_t dim(std::size_t i) const { return shape().at(i); }
    std::size_t rank() const noexcept { return shape().size(); }
    std::int64_t numel() const noexcept { return is_f32() ? base::numel() : static_cast<std::int64_t>(n16()); }

    // fp32 access: only while stored as f32.
    float* data() { return require_f32(), base::data(); }
    const float* data() const { return require_f32(), base::data(); }
    std::span<float> span() { return require_f32(), base::span(); }
    std::span<const float> span() const { return require_f32(), base::span(); }
    float& operator[](std::int64_t i) { return require_f32(), base::operator[](i); }
    const float& operator[](std::int64_t i) const { return require_f32(), base::operator[](i); }
    template <std::size_t R>
    tensor_view<float, R> view() {
        return require_f32(), base::template view<R>();
    }
    template <std::size_t R>
    tensor_view<const float, R> view() const {
        return require_f32(), base::template view<R>();
    }

    // The stored values as typed views (throws value_error when stored otherwise).
    template <class T, std::size_t R>
    tensor_view<const T, R> stored_view() const {
        if constexpr (std::is_same_v<T, float>) return view<R>();
        else {
            if (storage_ != dtype_of<T>::value)
                throw value_error(std::string("linear_weight: ") + weight_dtype_name(dtype_of<T>::value) + " view of a weight stored as " +
                                  weight_dtype_name(storage_));
            if constexpr (std::is_same_v<T, bf16>) return b16_.template view<R>();
            else return h16_.template view<R>();
        }
    }

    /// Calls f(tensor_view<const T, R>) with the stored values, T = float, bf16 or f16.
    template <std::size_t R, class F>
    decltype(auto) visit_stored(F&& f) const {
        switch (storage_) {
            case dtype::bf16: return f(stored_view<bf16, R>());
            case dtype::f16: return f(stored_view<f16, R>());
            default: return f(stored_view<float, R>());
        }
    }

private:
    static void require_f16_range(const float* p, std::size_t n, std::string_view name) {
        for (std::size_t i = 0; i < n; ++i)
            if (std::isfinite(p[i]) && std::abs(p[i]) > 65504.0f)
                throw value_error(std::string(name) + ": value " + std::to_string(p[i]) + " at element " + std::to_string(i) +
                                  " overflows f16 (|w| <= 65504); store it as bf16 or f32");
    }
    void require_f32() const {
        if (!is_f32())
            throw value_error(std::string("linear_weight: fp32 access to a weight of shape ") + shape_string(shape_) + " stored as " +
                              weight_dtype_name(storage_) + " for inference (training and fp64 references need store_as(dtype::f32))");
    }
    std::size_t n16() const noexcept {
        return storage_ == dtype::bf16 ? static_cast<std::size_t>(b16_.numel()) : static_cast<std::size_t>(h16_.numel());
    }
    void release_compact() {
        b16_ = tensor<bf16>();
        h16_ = tensor<f16>();
        shape_.clear();
        storage_ = dtype::f32;
    }

    dtype storage_ = dtype::f32;
    std::vector<std::int64_t> shape_;  // while 16-bit (the base tensor is empty then)
    tensor<bf16> b16_;
    tensor<f16> h16_;
};

/// True for hymix::linear_weight (parameter visitors use it to pick out projection weights).
template <class T>
inline constexpr bool is_linear_weight_v = std::is_same_v<std::remove_cvref_t<T>, linear_weight>;

}  // namespace hymix
