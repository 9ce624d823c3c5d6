// The reference backend: every op is the plain double-precision reference of its kernel (obvious loops, fp64
// accumulation, one thread), reading and writing the same fp32 host tensors as the CPU backend. It is the oracle
// that the fast CPU backend and every future backend (CUDA) are tested against, the role ggml's CPU backend plays
// in its test harness. Its op implementations (op_impl<Op, reference_backend>) live beside each op in hymix/ops/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "hymix/backend/concepts.hpp"

namespace hymix {

/// Double-precision reference execution on the host, single-threaded and deterministic.
class reference_backend {
public:
    using memory_space = host_space;
    static constexpr const char* name = "ref";

    /// `threads` is accepted for symmetry with cpu_backend and ignored: the reference runs on the calling thread.
    explicit reference_backend(int /*threads*/ = 1) {}

    int num_threads() const noexcept { return 1; }
    static const char* arch_name() noexcept { return "none (fp64 reference loops)"; }
    /// fp32 lanes per SIMD operation: the reference uses none, so 1.
    static constexpr std::size_t simd_width() noexcept { return 1; }
    /// Calls f(0, n) on the calling thread.
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t /*grain*/, F&& f) const {
        if (n > 0) f(std::int64_t{0}, n);
    }
    void* allocate(std::size_t bytes) const { return ::operator new(std::max<std::size_t>(bytes, 64), std::align_val_t{64}); }
    void deallocate(void* p, std::size_t /*bytes*/) const noexcept { ::operator delete(p, std::align_val_t{64}); }
    void copy_to_host(void* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
    void copy_from_host(void* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
    void synchronize() const noexcept {}
};

static_assert(host_backend<reference_backend>);

}  // namespace hymix
