// expect: (satisfaction of [^ ]*backend<B>|does not satisfy [^ ]*backend')
// Must not compile: a type without parallel_for is passed to kernels::linear, which requires
// hymix::cpu_backend_type (and so hymix::backend). The diagnostic must name the backend concept.
// Built with -DHYMIX_FAILTEST_CONTROL the type gains parallel_for and the file must compile, which proves
// that the missing member is the only error.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include <xsimd/xsimd.hpp>

#include "hymix/core/tensor.hpp"
#include "hymix/kernels/linear.hpp"

namespace {

struct serial_backend_missing_parallel_for {
    using arch = xsimd::default_arch;
    using memory_space = hymix::host_space;
    static constexpr const char* name = "broken";
    int num_threads() const { return 1; }
    void* allocate(std::size_t bytes) const { return ::operator new(bytes); }
    void deallocate(void* p, std::size_t) const { ::operator delete(p); }
    void copy_to_host(void* d, const void* s, std::size_t n) const { std::memcpy(d, s, n); }
    void copy_from_host(void* d, const void* s, std::size_t n) const { std::memcpy(d, s, n); }
    void synchronize() const {}
    template <class F>
    void parallel_for_static(std::int64_t n, F&& f, std::int64_t = 1) const {
        f(std::int64_t{0}, n);
    }
#ifdef HYMIX_FAILTEST_CONTROL
    template <class F>
    void parallel_for(std::int64_t n, std::int64_t, F&& f) const {
        f(std::int64_t{0}, n);
    }
#endif
};

}  // namespace

int main() {
    hymix::tensor<float> x{2, 3}, w{4, 3}, y{2, 4};
    hymix::kernels::linear(serial_backend_missing_parallel_for{}, x.view<2>(), w.view<2>(), nullptr, y.view<2>());
    return 0;
}
