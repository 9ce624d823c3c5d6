// What a backend is: a device that owns a memory space (allocation, host<->device copies, synchronisation) and
// executes work (a thread count and a parallel loop over index ranges). Backends are types, never macros:
// tensors carry their memory space in their type (core/tensor.hpp), and every op is reached through one dispatch
// point per backend (backend/op.hpp), so a host view cannot reach a device kernel and a missing op is a compile
// error that names the op and the backend.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "hymix/core/memory_space.hpp"

namespace hymix {

namespace detail {
struct range_fn {
    void operator()(std::int64_t, std::int64_t) const {}
};
}  // namespace detail

/// A backend owns a memory space and executes work:
///  - `memory_space`: the tag type of the memory its ops read and write (host_space for CPU backends);
///  - `allocate(bytes)` / `deallocate(p, bytes)`: 64-byte aligned memory in that space;
///  - `copy_to_host(dst, src, bytes)` / `copy_from_host(dst, src, bytes)`, `synchronize()`;
///  - `num_threads()`, `parallel_for(n, grain, f)` calling f(begin, end) over a partition of [0, n);
///  - `name`: a short name ("cpu", "ref") used by tools and error messages.
template <class B>
concept backend = memory_space<typename B::memory_space> &&
                  requires(const B& b, std::int64_t n, detail::range_fn f, void* p, const void* cp, std::size_t bytes) {
                      { b.num_threads() } -> std::convertible_to<int>;
                      b.parallel_for(n, n, f);
                      { B::name } -> std::convertible_to<const char*>;
                      { b.allocate(bytes) } -> std::same_as<void*>;
                      b.deallocate(p, bytes);
                      b.copy_to_host(p, cp, bytes);
                      b.copy_from_host(p, cp, bytes);
                      b.synchronize();
                  };

/// A backend whose memory is the host's: its ops take ordinary host tensor views.
template <class B>
concept host_backend = backend<B> && std::same_as<typename B::memory_space, host_space>;

/// A CPU backend additionally names its xsimd architecture (the SIMD width its kernels are compiled for) and has
/// `parallel_for_static(n, f, min_items)`: a partition of [0, n) with the same sub-range on the same thread at every
/// call, each part at least min_items long (fewer threads, or inline, for little work), for decode steps whose state
/// should stay in the cache of the core that last updated it.
template <class B>
concept cpu_backend_type = host_backend<B> && requires(const B& b, std::int64_t n, detail::range_fn f) {
    typename B::arch;
    b.parallel_for_static(n, f);
    b.parallel_for_static(n, f, n);
};

}  // namespace hymix
