// The smallest complete backend (memory, copies, one thread) with no ops of its own, for tests of what a backend of
// one's own gets from hymix: derive from it, give the derived type its own `name`, and specialise hymix::op_impl for
// the ops it should run. The memory space is a parameter, so a device backend's stand-in (whose memory is plain host
// memory underneath) is the same few members; the build-fails tests (tests/failtest) derive from it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "hymix/core/memory_space.hpp"

namespace hymix::test {

template <class Space>
struct minimal_backend {
    using memory_space = Space;
    static constexpr const char* name = "minimal";
    int num_threads() const { return 1; }
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t, F&& f) const {
        if (n > 0) f(std::int64_t{0}, n);
    }
    void* allocate(std::size_t bytes) const { return ::operator new(bytes); }
    void deallocate(void* p, std::size_t) const { ::operator delete(p); }
    void copy_to_host(void* d, const void* s, std::size_t n) const { std::memcpy(d, s, n); }
    void copy_from_host(void* d, const void* s, std::size_t n) const { std::memcpy(d, s, n); }
    void synchronize() const {}
};

using minimal_host_backend = minimal_backend<hymix::host_space>;

}  // namespace hymix::test
