// Downstream use of the installed hymix headers: RMSNorm followed by a linear layer on the CPU backend,
// checked against values worked out by hand. Exits 1 if any output is wrong.
#include <cmath>
#include <cstdio>

#include <hymix/backend/cpu.hpp>
#include <hymix/core/tensor.hpp>
#include <hymix/kernels/linear.hpp>
#include <hymix/kernels/norm.hpp>

int main() {
    const hymix::cpu_backend be(2);

    // x [2, 4]: row 0 has rms 2, row 1 has rms 3, so rms_norm gives [1, -1, 1, -1] and [1, 1, 1, 1] times w.
    hymix::tensor<float> x{2, 4};
    const float x_values[] = {2, -2, 2, -2, 3, 3, 3, 3};
    for (int i = 0; i < 8; ++i) x[i] = x_values[i];
    const float norm_w[] = {1, 2, 3, 4};  // [4]

    hymix::tensor<float> h{2, 4};
    hymix::kernels::rms_norm<float>(x.view<2>(), norm_w, 1e-6f, hymix::kernels::rms_flavor::plain, h.view<2>());

    // w [3, 4] in the [out, in] layout, bias [3].
    hymix::tensor<float> w{3, 4};
    const float w_values[] = {1, 0, 0, 0, 1, 1, 1, 1, 0.5f, -0.5f, 0.5f, -0.5f};
    for (int i = 0; i < 12; ++i) w[i] = w_values[i];
    const float bias[] = {0, 1, -1};

    hymix::tensor<float> y{2, 3};
    hymix::kernels::linear(be, h.view<2>(), w.view<2>(), bias, y.view<2>());

    // h = [[1, -2, 3, -4], [1, 2, 3, 4]]  =>  y = h wᵀ + b
    const float expected[] = {1, -1, 4, 1, 11, -2};
    int wrong = 0;
    for (int i = 0; i < 6; ++i) {
        if (std::abs(y[i] - expected[i]) > 1e-4f) {
            std::printf("y[%d] = %g, expected %g\n", i, static_cast<double>(y[i]), static_cast<double>(expected[i]));
            ++wrong;
        }
    }
    if (wrong != 0) return 1;
    std::printf("hymix_consumer: rms_norm + linear on %s (%s, %d threads) match the hand-computed values\n",
                be.name, be.arch_name(), be.num_threads());
    return 0;
}
