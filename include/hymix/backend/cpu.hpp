// The CPU backend: host memory, a oneTBB task_arena with a settable thread count, and the xsimd architecture fixed
// at compile time (the best one the compiler flags allow: AVX-512 when built with -march=native here).
// Its op implementations (op_impl<Op, basic_cpu_backend<Arch>>) live beside each op in hymix/ops/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <xsimd/xsimd.hpp>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/float_env.hpp"
#include "hymix/backend/op_profile.hpp"
#include "hymix/core/error.hpp"

namespace hymix {

/// CPU execution: oneTBB arena (threads) + xsimd architecture `Arch` (SIMD width).
/// Thread-safe to share between threads for read-only use; kernels take it by const reference.
template <class Arch = xsimd::default_arch>
class basic_cpu_backend {
public:
    using arch = Arch;
    using memory_space = host_space;
    static constexpr const char* name = "cpu";

    /// threads <= 0 means every core the process may use.
    explicit basic_cpu_backend(int threads = 0)
        : threads_(threads > 0 ? threads : tbb::info::default_concurrency()),
          arena_(std::make_unique<tbb::task_arena>(threads_)) {
        if (threads_ > 4096) throw config_error("cpu_backend: thread count " + std::to_string(threads_) + " is not sensible");
    }

    int num_threads() const noexcept { return threads_; }
    /// SIMD lanes of fp32 for this architecture (16 for AVX-512).
    static constexpr std::size_t simd_width() noexcept { return xsimd::batch<float, Arch>::size; }
    static const char* arch_name() noexcept { return Arch::name(); }

    /// Whether this backend's work runs with subnormal numbers flushed to zero (default: yes; backend/float_env.hpp
    /// says why). Every parallel_for / parallel_for_static body runs under exactly this setting, on whichever thread
    /// runs it, and the calling thread's own setting is restored when the call returns. Turning it off gives IEEE
    /// subnormals (results that differ only below 2^-126 in magnitude, at a cost of up to several times the time of
    /// a chunked scan with fast-decaying heads on x86), even where the caller flushes. Not thread-safe against
    /// concurrent calls: set it before sharing the backend.
    void set_flush_subnormals(bool on) noexcept { flush_subnormals_ = on; }
    bool flush_subnormals() const noexcept { return flush_subnormals_; }

    /// Calls f(begin, end) on disjoint sub-ranges covering [0, n), each at least `grain` long when possible.
    /// Runs inline when there is one thread or too little work for two.
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t grain, F&& f) const {
        if (n <= 0) return;
        grain = std::max<std::int64_t>(grain, 1);
        if (threads_ == 1 || n <= grain) {
            const subnormal_flush_scope fp(flush_subnormals_);
            f(std::int64_t{0}, n);
            return;
        }
        arena_->execute([&] {
            tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, grain), [&](const tbb::blocked_range<std::int64_t>& r) {
                const subnormal_flush_scope fp(flush_subnormals_);
                f(r.begin(), r.end());
            });
        });
    }

    /// Calls f(begin, end) on contiguous sub-ranges of [0, n), one per taking part thread, with the same sub-range
    /// on the same arena slot at every call (oneTBB static_partitioner): for decode steps, whose recurrent state then
    /// stays in the cache of the core that updated it last time. Each part holds at least `min_items` items (≥ 1), so
    /// p = min(num_threads(), n / min_items) threads take part and the call runs inline when p ≤ 1: a fork and join
    /// costs a few microseconds, more than a small layer's whole decode step (callers size min_items from the work
    /// per item; see kernels::ssd_step and gated_delta_rule_step). The partition depends on n, min_items and the
    /// thread count only.
    template <class F>
    void parallel_for_static(std::int64_t n, F&& f, std::int64_t min_items = 1) const {
        if (n <= 0) return;
        const std::int64_t parts = std::min<std::int64_t>(threads_, n / std::max<std::int64_t>(min_items, 1));
        if (parts <= 1) {
            const subnormal_flush_scope fp(flush_subnormals_);
            f(std::int64_t{0}, n);
            return;
        }
        // Parts are indices 0 … parts − 1 (part p = items [p·n/parts, (p+1)·n/parts), at least n / parts ≥ min_items
        // long); the static partitioner deals them out to the arena's threads the same way at every call.
        arena_->execute([&] {
            tbb::parallel_for(
                tbb::blocked_range<std::int64_t>(0, parts, 1),
                [&](const tbb::blocked_range<std::int64_t>& r) {
                    const subnormal_flush_scope fp(flush_subnormals_);
                    for (std::int64_t p = r.begin(); p < r.end(); ++p) f(p * n / parts, (p + 1) * n / parts);
                },
                tbb::static_partitioner{});
        });
    }

    /// 64-byte aligned host memory (not zeroed). Throws std::bad_alloc.
    void* allocate(std::size_t bytes) const { return ::operator new(std::max<std::size_t>(bytes, 64), std::align_val_t{64}); }
    void deallocate(void* p, std::size_t /*bytes*/) const noexcept { ::operator delete(p, std::align_val_t{64}); }
    void copy_to_host(void* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
    void copy_from_host(void* dst, const void* src, std::size_t bytes) const { std::memcpy(dst, src, bytes); }
    /// Every op has finished when it returns (parallel_for joins), so there is nothing to wait for.
    void synchronize() const noexcept {}

    /// Times every op this backend runs into `p` (backend/op_profile.hpp) until set back to nullptr; the profile
    /// must outlive that. Costs a branch per op when unset, and a clock read and a map update per op when set.
    void set_op_profile(op_profile* p) noexcept { profile_ = p; }
    op_profile* op_profiler() const noexcept { return profile_; }

private:
    int threads_;
    bool flush_subnormals_ = true;
    op_profile* profile_ = nullptr;
    std::unique_ptr<tbb::task_arena> arena_;  // task_arena::execute is non-const; the arena is an execution resource
};

using cpu_backend = basic_cpu_backend<>;
static_assert(cpu_backend_type<cpu_backend>);

}  // namespace hymix
