// Non-finite weights: scans every floating-point tensor of a safetensors checkpoint for NaN / ±Inf in place (the
// IEEE exponent bits of the stored f32, f64, bf16 or f16 values, no conversion), so that loading can refuse a
// damaged checkpoint naming the tensor and the first bad element (spec.md §0 dtypes; issue: non-finite results).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/dtype.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/io/safetensors.hpp"

namespace hymix::models {

/// One tensor holding non-finite values: how many, and the first (flat index, its multi-index and what it is).
struct nonfinite_tensor {
    std::string name, file;
    std::vector<std::int64_t> shape;
    std::int64_t count = 0;
    std::int64_t first = 0;       // flat (row-major) index of the first non-finite element
    std::string first_value;      // "NaN", "+Inf" or "-Inf"

    /// "tensor 'lm_head.weight' [256, 64] in '…/model.safetensors' holds 64 non-finite values, the first +Inf at [3, 0]"
    std::string describe() const {
        std::vector<std::int64_t> at(shape.size());
        std::int64_t r = first;
        for (std::size_t i = shape.size(); i-- > 0;) {
            at[i] = shape[i] > 0 ? r % shape[i] : 0;
            r = shape[i] > 0 ? r / shape[i] : 0;
        }
        return "tensor '" + name + "' " + shape_string(shape) + " in '" + file + "' holds " + std::to_string(count) +
               " non-finite value" + (count == 1 ? "" : "s") + ", the first " + first_value + " at " + shape_string(at);
    }
};

namespace detail {

/// Counts the elements of raw little-endian IEEE data whose exponent bits are all ones (Inf or NaN).
/// U: the unsigned integer of the element's width; exp_mask / man_mask: the exponent and mantissa bits.
template <class U>
void scan_ieee(std::span<const std::byte> bytes, U exp_mask, U man_mask, U sign_mask, nonfinite_tensor& out) {
    const std::size_t n = bytes.size() / sizeof(U);
    for (std::size_t i = 0; i < n; ++i) {
        U u;
        std::memcpy(&u, bytes.data() + i * sizeof(U), sizeof(U));  // any alignment
        if ((u & exp_mask) != exp_mask) continue;
        if (out.count++ == 0) {
            out.first = static_cast<std::int64_t>(i);
            out.first_value = (u & man_mask) != 0 ? "NaN" : (u & sign_mask) != 0 ? "-Inf" : "+Inf";
        }
    }
}

}  // namespace detail

/// The non-finite values of one tensor of `f` (count 0 when it is finite or not a floating-point tensor).
inline nonfinite_tensor scan_nonfinite(const safetensors::file& f, const safetensors::tensor_info& t) {
    nonfinite_tensor r{t.name, f.origin(), t.shape, 0, 0, {}};
    const auto b = f.bytes(t.name);
    switch (t.type) {
        case dtype::f32: detail::scan_ieee<std::uint32_t>(b, 0x7f800000u, 0x007fffffu, 0x80000000u, r); break;
        case dtype::f64:
            detail::scan_ieee<std::uint64_t>(b, 0x7ff0000000000000ull, 0x000fffffffffffffull, 0x8000000000000000ull, r);
            break;
        case dtype::bf16: detail::scan_ieee<std::uint16_t>(b, 0x7f80u, 0x007fu, 0x8000u, r); break;
        case dtype::f16: detail::scan_ieee<std::uint16_t>(b, 0x7c00u, 0x03ffu, 0x8000u, r); break;
        case dtype::i32:
        case dtype::i64:
        case dtype::i8: break;
    }
    return r;
}

/// Every tensor of the checkpoint holding non-finite values, in the checkpoint's name order.
inline std::vector<nonfinite_tensor> find_nonfinite_weights(const safetensors::sharded_file& ck) {
    std::vector<nonfinite_tensor> bad;
    for (const auto& name : ck.names()) {
        const auto& f = ck.shard_of(name);
        auto r = scan_nonfinite(f, f.info(name));
        if (r.count > 0) bad.push_back(std::move(r));
    }
    return bad;
}
/// The same for one safetensors file (an AMOR file, say), in the file's order.
inline std::vector<nonfinite_tensor> find_nonfinite_weights(const safetensors::file& f) {
    std::vector<nonfinite_tensor> bad;
    for (const auto& t : f.tensors()) {
        auto r = scan_nonfinite(f, t);
        if (r.count > 0) bad.push_back(std::move(r));
    }
    return bad;
}

namespace detail {
inline void throw_if_nonfinite(const std::vector<nonfinite_tensor>& bad, const std::string& hint) {
    if (bad.empty()) return;
    std::string m = "checkpoint " + bad.front().describe();
    if (bad.size() > 1) m += " (and " + std::to_string(bad.size() - 1) + " more tensors hold non-finite values)";
    throw nonfinite_error(m + hint);
}
}  // namespace detail

/// Throws nonfinite_error naming the first tensor with non-finite values (and how many other tensors have some).
/// `hint` is appended to the message (e.g. the option that allows such weights).
inline void require_finite_weights(const safetensors::sharded_file& ck, const std::string& hint = {}) {
    detail::throw_if_nonfinite(find_nonfinite_weights(ck), hint);
}
inline void require_finite_weights(const safetensors::file& f, const std::string& hint = {}) {
    detail::throw_if_nonfinite(find_nonfinite_weights(f), hint);
}

/// The same for the checkpoint of a model directory (model.safetensors or a sharded index).
inline void require_finite_weights(const std::filesystem::path& dir, const std::string& hint = {}) {
    require_finite_weights(safetensors::open_checkpoint(dir), hint);
}

}  // namespace hymix::models
