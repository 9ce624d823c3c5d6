// expect: (could not convert|no matching function|cannot convert|no known conversion).*
// Must not compile: a host tensor view is passed to an op of a backend whose memory space is a device's. Views carry
// their memory space in their type, and there is no conversion between spaces.
// Built with -DHYMIX_FAILTEST_CONTROL the op gets views of the device's memory space and the file must compile.
#include "hymix/backend/concepts.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/linear.hpp"
#include "support/host_backend.hpp"

namespace {

using dev = hymix::device_space<0>;

/// A device backend stand-in: its memory space is a device's (nothing here touches a real device).
struct toy_device_backend : hymix::test::minimal_backend<dev> {
    static constexpr const char* name = "toy_device";
};
static_assert(hymix::backend<toy_device_backend> && !hymix::host_backend<toy_device_backend>);

}  // namespace

template <>
struct hymix::op_impl<hymix::ops::linear_op, toy_device_backend> {
    static void run(const toy_device_backend&, hymix::tensor_view<const float, 2, dev>, hymix::tensor_view<const float, 2, dev>,
                    const float*, hymix::tensor_view<float, 2, dev>) {}
};

int main() {
    const toy_device_backend be;
    float* p = static_cast<float*>(be.allocate(64 * sizeof(float)));
#ifdef HYMIX_FAILTEST_CONTROL
    hymix::tensor_view<float, 2, dev> x(p, {2, 3}), w(p + 8, {4, 3}), y(p + 24, {2, 4});
#else
    hymix::tensor_view<float, 2> x(p, {2, 3}), w(p + 8, {4, 3}), y(p + 24, {2, 4});  // host views
#endif
    hymix::ops::linear(be, x, w, nullptr, y);
    be.deallocate(p, 64 * sizeof(float));
    return 0;
}
