// Shared pieces of the op wrappers in hymix/ops/: the view type of a backend's memory space and fp32 <-> fp64
// copies used by the reference backend's implementations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/backend/cpu.hpp"
#include "hymix/backend/op.hpp"
#include "hymix/backend/reference.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix {

/// A view of T, rank R, in backend B's memory space: what B's ops read and write.
template <class B, class T, std::size_t R>
using view_of = tensor_view<T, R, typename B::memory_space>;

namespace ops {
/// A tuning query: backend B's answer to query op `Op` (an op_impl whose run returns the value), or `fallback` when B
/// does not implement it (a new backend need not tune everything at once).
template <class Op, backend B, class... Args>
std::int64_t tuning_query(const B& be, std::int64_t fallback, Args... args) {
    if constexpr (implements_op<Op, B>)
        return dispatch<Op>(be, args...);
    else
        return fallback;
}
}  // namespace ops

namespace detail {

/// Contiguous fp64 copy of a host view (any strides), with the view over it.
template <std::size_t R>
struct f64_copy {
    std::vector<double> buf;
    tensor_view<double, R> v;
    template <class T>
    explicit f64_copy(tensor_view<T, R> src) : buf(static_cast<std::size_t>(src.numel())), v(buf.data(), src.shape) {
        for_each_index(src.shape, [&](const std::array<std::int64_t, R>& i) {
            const auto& x = at(src, i);
            if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(x)>>)
                at(v, i) = static_cast<double>(x);
            else
                at(v, i) = static_cast<double>(x.to_float());  // bf16 / f16: exact
        });
    }
    /// Writes the values back (rounded to the destination's type).
    template <class T>
    void store(tensor_view<T, R> dst) const {
        for_each_index(dst.shape, [&](const std::array<std::int64_t, R>& i) { at(dst, i) = static_cast<T>(at(v, i)); });
    }
    template <class V>
    static auto& at(const V& view, const std::array<std::int64_t, R>& i) {
        std::int64_t off = 0;
        for (std::size_t k = 0; k < R; ++k) off += i[k] * view.strides[k];
        return view.data[off];
    }
    template <class F>
    static void for_each_index(const std::array<std::int64_t, R>& shape, F&& f) {
        for (auto s : shape)
            if (s <= 0) return;
        std::array<std::int64_t, R> i{};
        while (true) {
            f(i);
            std::size_t k = R;
            while (k-- > 0) {
                if (++i[k] < shape[k]) break;
                i[k] = 0;
                if (k == 0) return;
            }
        }
    }
};

inline std::vector<double> f64_vector(const float* p, std::int64_t n) {
    return p ? std::vector<double>(p, p + n) : std::vector<double>();
}

}  // namespace detail
}  // namespace hymix
