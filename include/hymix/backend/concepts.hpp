// What a backend must provide to run hymix kernels: a thread count, a parallel loop over index ranges,
// and (for CPU backends) the SIMD architecture kernels are compiled for. Backends are types, never macros.
#pragma once

#include <concepts>
#include <cstdint>

namespace hymix {

namespace detail {
struct range_fn {
    void operator()(std::int64_t, std::int64_t) const {}
};
}  // namespace detail

/// A backend executes work: `parallel_for(n, grain, f)` calls f(begin, end) over a partition of [0, n).
template <class B>
concept backend = requires(const B& b, std::int64_t n, detail::range_fn f) {
    { b.num_threads() } -> std::convertible_to<int>;
    b.parallel_for(n, n, f);
    { B::name } -> std::convertible_to<const char*>;
};

/// A CPU backend additionally names its xsimd architecture.
template <class B>
concept cpu_backend_type = backend<B> && requires { typename B::arch; };

}  // namespace hymix
