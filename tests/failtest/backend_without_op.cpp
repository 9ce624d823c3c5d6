// expect: (Op = (hymix::)?ops::linear_op; Backend = [^;]*toy_backend|dispatch<hymix::ops::linear_op, [^>]*toy_backend)
// Must not compile: ops::linear is dispatched to a backend that has no implementation of it. The diagnostic must
// name both the op (linear_op) and the backend (toy_backend).
// Built with -DHYMIX_FAILTEST_CONTROL the backend gains op_impl<ops::linear_op, toy_backend> and the file must
// compile, which proves that the missing op is the only error.
#include "hymix/backend/concepts.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/ops/linear.hpp"
#include "support/host_backend.hpp"

namespace {

/// A complete host backend (memory, copies, threads) that implements no op.
struct toy_backend : hymix::test::minimal_host_backend {
    static constexpr const char* name = "toy";
};
static_assert(hymix::backend<toy_backend>);

}  // namespace

#ifdef HYMIX_FAILTEST_CONTROL
template <>
struct hymix::op_impl<hymix::ops::linear_op, toy_backend> {
    static void run(const toy_backend&, hymix::tensor_view<const float, 2> x, hymix::tensor_view<const float, 2> w, const float* b,
                    hymix::tensor_view<float, 2> y) {
        hymix::kernels::linear_ref<float, float, float>(x, w, b, y);
    }
};
#endif

int main() {
    const toy_backend be;
    hymix::tensor<float> x{2, 3}, w{4, 3}, y{2, 4};
    hymix::ops::linear(be, x.view<2>(), w.view<2>(), nullptr, y.view<2>());
    return 0;
}
