// Tensor views (non-owning: pointer + shape + strides, rank fixed at compile time) and owning tensors
// (64-byte aligned, rank chosen at run time). Layout is row-major, last index fastest (spec.md §0).
// Views map onto Eigen matrices without copying; shape checks throw hymix::shape_error. A view's memory space is
// part of its type (host_space by default): a view of device memory cannot be dereferenced on the host or passed
// where a host view is expected (core/memory_space.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <new>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/memory_space.hpp"

namespace hymix {

/// "[2, 3, 4]" — used in every shape error message.
template <class Range>
std::string shape_string(const Range& r) {
    std::string s = "[";
    bool first = true;
    for (auto v : r) {
        if (!first) s += ", ";
        s += std::to_string(v);
        first = false;
    }
    return s + "]";
}

namespace detail {
inline std::string label(std::string_view what, std::string_view part) {
    std::string s(what);
    if (!part.empty()) s.append(": ").append(part);
    return s;
}
}  // namespace detail

template <class T>
class tensor;

/// Non-owning strided view of a rank-R tensor of T in memory space `Space`. Strides are in elements.
/// Element access (operator(), matrix()) exists only for host-accessible spaces. An owning host `tensor<T>` converts
/// implicitly to a view of its matching rank, so a tensor can be passed wherever a view is expected.
template <class T, std::size_t R, memory_space Space = host_space>
struct tensor_view {
    using value_type = T;
    using space = Space;
    using index_array = std::array<std::int64_t, R>;
    static constexpr std::size_t rank = R;

    T* data = nullptr;
    index_array shape{};
    index_array strides{};

    tensor_view() = default;
    /// Contiguous row-major view.
    tensor_view(T* p, const index_array& s) : data(p), shape(s), strides(contiguous_strides(s)) {}
    tensor_view(T* p, const index_array& s, const index_array& st) : data(p), shape(s), strides(st) {}
    /// A view of const T from a view of T (same memory space only: there is no conversion between spaces).
    template <class U>
        requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
    tensor_view(const tensor_view<U, R, Space>& o) : data(o.data), shape(o.shape), strides(o.strides) {}
    /// A view of a whole owning tensor (host memory), so that a `tensor<float>` can be passed where a
    /// `tensor_view<float, R>` or `tensor_view<const float, R>` is expected. Throws shape_error when the tensor's rank
    /// is not R. Only from an lvalue: a view of a temporary tensor would dangle.
    tensor_view(tensor<std::remove_const_t<T>>& t)  // NOLINT: implicit by design
        requires std::is_same_v<Space, host_space>
        : tensor_view(t.template view<R>()) {}
    tensor_view(const tensor<std::remove_const_t<T>>& t)  // NOLINT: implicit by design
        requires(std::is_same_v<Space, host_space> && std::is_const_v<T>)
        : tensor_view(t.template view<R>()) {}
    tensor_view(tensor<std::remove_const_t<T>>&&) = delete;

    static index_array contiguous_strides(const index_array& s) {
        index_array st{};
        std::int64_t acc = 1;
        for (std::size_t i = R; i-- > 0;) {
            st[i] = acc;
            acc *= s[i];
        }
        return st;
    }

    std::int64_t dim(std::size_t i) const { return shape[i]; }
    std::int64_t numel() const {
        return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>{});
    }
    bool empty() const { return numel() == 0; }
    bool is_contiguous() const { return strides == contiguous_strides(shape); }

    template <class... I>
        requires(sizeof...(I) == R && Space::host_accessible)
    T& operator()(I... idx) const {
        const std::array<std::int64_t, R> i{static_cast<std::int64_t>(idx)...};
        std::int64_t off = 0;
        for (std::size_t k = 0; k < R; ++k) off += i[k] * strides[k];
        return data[off];
    }

    /// Sub-view fixing the leading index: rank R-1.
    tensor_view<T, R - 1, Space> operator[](std::int64_t i) const
        requires(R > 1)
    {
        tensor_view<T, R - 1, Space> v;
        v.data = data + i * strides[0];
        std::copy(shape.begin() + 1, shape.end(), v.shape.begin());
        std::copy(strides.begin() + 1, strides.end(), v.strides.begin());
        return v;
    }

    /// Rows [begin, begin+count) along the leading axis.
    tensor_view slice(std::int64_t begin, std::int64_t count) const {
        tensor_view v = *this;
        v.data = data + begin * strides[0];
        v.shape[0] = count;
        return v;
    }

    /// Throws shape_error unless the shape equals `expected` (-1 in `expected` matches anything). The message is
    /// "<what>[: <part>]: expected shape [...], found [...]"; it is only built on failure, so checks on the hot
    /// path allocate nothing.
    void require_shape(const index_array& expected, std::string_view what, std::string_view part = {}) const {
        for (std::size_t i = 0; i < R; ++i)
            if (expected[i] >= 0 && expected[i] != shape[i])
                throw shape_error(detail::label(what, part) + ": expected shape " + shape_string(expected) + ", found " +
                                  shape_string(shape));
    }
    void require_contiguous(std::string_view what, std::string_view part = {}) const {
        if (!is_contiguous())
            throw shape_error(detail::label(what, part) + ": expected a contiguous tensor, found strides " + shape_string(strides));
    }

    /// Eigen map of a rank-2 view (row-major, unit inner stride required).
    auto matrix() const
        requires(R == 2 && Space::host_accessible)
    {
        using M = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
        using MapT = std::conditional_t<std::is_const_v<T>, const M, M>;
        if (strides[1] != 1) throw shape_error("Eigen map needs unit inner stride, found " + std::to_string(strides[1]));
        return Eigen::Map<MapT, Eigen::Unaligned, Eigen::OuterStride<>>(data, shape[0], shape[1],
                                                                        Eigen::OuterStride<>(strides[0]));
    }
};

namespace detail {
struct aligned_free {
    void operator()(void* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
};
}  // namespace detail

/// Owning tensor of T, 64-byte aligned, contiguous row-major, rank known at run time.
/// Zero-initialised on construction. Use view<R>() to obtain a typed view.
template <class T>
class tensor {
public:
    using value_type = T;

    tensor() = default;
    explicit tensor(std::vector<std::int64_t> shape) : shape_(std::move(shape)) { allocate(); }
    tensor(std::initializer_list<std::int64_t> shape) : tensor(std::vector<std::int64_t>(shape)) {}

    tensor(const tensor& o) : shape_(o.shape_) {
        if (!o.buf_) return;  // a default-constructed (unallocated) tensor copies as one
        allocate();
        std::copy(o.data(), o.data() + o.numel(), data());
    }
    tensor& operator=(const tensor& o) {
        if (this != &o) {
            if (!o.buf_) {  // copying an unallocated tensor
                shape_ = o.shape_;
                buf_.reset();
                return *this;
            }
            if (!buf_ || o.numel() != numel()) {
                shape_ = o.shape_;
                allocate();
            }
            shape_ = o.shape_;
            std::copy(o.data(), o.data() + o.numel(), data());
        }
        return *this;
    }
    tensor(tensor&&) noexcept = default;
    tensor& operator=(tensor&&) noexcept = default;

    T* data() noexcept { return static_cast<T*>(buf_.get()); }
    const T* data() const noexcept { return static_cast<const T*>(buf_.get()); }
    const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
    std::int64_t dim(std::size_t i) const { return shape_.at(i); }
    std::size_t rank() const noexcept { return shape_.size(); }
    std::int64_t numel() const noexcept {
        return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1}, std::multiplies<>{});
    }
    std::span<T> span() noexcept { return {data(), static_cast<std::size_t>(numel())}; }
    std::span<const T> span() const noexcept { return {data(), static_cast<std::size_t>(numel())}; }
    T& operator[](std::int64_t i) noexcept { return data()[i]; }
    const T& operator[](std::int64_t i) const noexcept { return data()[i]; }

    void fill(T v) { std::fill(data(), data() + numel(), v); }
    void zero() { fill(T{}); }

    /// Change the shape without changing the element count.
    void reshape(std::vector<std::int64_t> s) {
        const auto n = std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>{});
        if (n != numel())
            throw shape_error("reshape from " + shape_string(shape_) + " to " + shape_string(s) + " changes the element count");
        shape_ = std::move(s);
    }

    template <std::size_t R>
    tensor_view<T, R> view() {
        return tensor_view<T, R>(data(), check_rank<R>());
    }
    template <std::size_t R>
    tensor_view<const T, R> view() const {
        return tensor_view<const T, R>(data(), check_rank<R>());
    }

private:
    template <std::size_t R>
    std::array<std::int64_t, R> check_rank() const {
        if (shape_.size() != R)
            throw shape_error("view of rank " + std::to_string(R) + " requested for a tensor of shape " + shape_string(shape_));
        std::array<std::int64_t, R> a{};
        for (std::size_t i = 0; i < R; ++i) a[i] = shape_[i];
        return a;
    }
    void allocate() {
        for (auto d : shape_)
            if (d < 0) throw shape_error("negative dimension in shape " + shape_string(shape_));
        const std::size_t n = static_cast<std::size_t>(numel());
        const std::size_t bytes = std::max<std::size_t>(64, (n * sizeof(T) + 63) / 64 * 64);
        buf_.reset(::operator new(bytes, std::align_val_t{64}));
        std::fill(data(), data() + n, T{});
    }

    std::vector<std::int64_t> shape_;
    std::unique_ptr<void, detail::aligned_free> buf_;
};

}  // namespace hymix
