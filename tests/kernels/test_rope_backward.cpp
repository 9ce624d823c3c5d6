// RoPE backward (kernels/rope_backward.hpp, ops/rope_backward.hpp): the fp64 reference vs central finite
// differences of the fp64 rope_ref (rotate-half, interleaved, none; full and partial d_rot; arbitrary positions),
// rope_backward(rope(x)) == x, CPU fp32 (1 and 2 threads, strided views) vs the reference, and argument errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "hymix/kernels/rope.hpp"
#include "hymix/kernels/rope_backward.hpp"
#include "hymix/ops/attention.hpp"
#include "hymix/ops/rope_backward.hpp"
#include "support/grad_check.hpp"
#include "support/random.hpp"

using namespace hymix;
using hymix::test::check_gradient;
using hymix::test::cotangent;
using hymix::test::dot;
using hymix::test::rel_error;
using hymix::test::uniform;
using kernels::rope_mode;

namespace {
std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST_CASE("rope backward: fp64 reference equals central finite differences of rope_ref") {
    const std::int64_t T = 5, H = 3, dh = 10;
    const std::vector<std::int64_t> pos{0, 3, 7, 100, 5};
    for (rope_mode mode : {rope_mode::rotate_half, rope_mode::interleaved, rope_mode::none})
        for (std::int64_t d_rot : {10, 6})
            for (double theta : {10000.0, 1e6}) {
                CAPTURE(static_cast<int>(mode));
                CAPTURE(d_rot);
                CAPTURE(theta);
                auto x = to_f64(uniform(std::size_t(T * H * dh), -1.f, 1.f, std::uint64_t(d_rot)));
                const auto c = cotangent(x.size(), 9);
                auto g = c;  // the upstream gradient, rotated back in place
                kernels::rope_backward_ref<double>(tensor_view<double, 3>(g.data(), {T, H, dh}), pos, mode, theta, d_rot);
                auto loss = [&] {
                    auto y = x;
                    kernels::rope_ref(tensor_view<double, 3>(y.data(), {T, H, dh}), pos, mode, theta, d_rot);
                    return dot(c, y);
                };
                check_gradient("dx", x, g, loss, 1e-6, 1e-6, 200);
                if (mode == rope_mode::none) CHECK(g == c);
                // channels >= d_rot pass through unchanged
                for (std::int64_t t = 0; t < T; ++t)
                    for (std::int64_t h = 0; h < H; ++h)
                        for (std::int64_t i = d_rot; i < dh; ++i) CHECK(g[std::size_t((t * H + h) * dh + i)] == c[std::size_t((t * H + h) * dh + i)]);
            }
}

TEST_CASE("rope backward undoes rope: rope_backward(rope(x)) == x (fp64, fp32 kernel, both backends)") {
    const std::int64_t T = 9, H = 4, dh = 16;
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) pos[std::size_t(t)] = 3 * t * t + 1;  // up to 193: large angles
    for (rope_mode mode : {rope_mode::rotate_half, rope_mode::interleaved})
        for (std::int64_t d_rot : {16, 8}) {
            CAPTURE(static_cast<int>(mode));
            CAPTURE(d_rot);
            const auto x0 = uniform(std::size_t(T * H * dh), -1.f, 1.f, 3);
            auto xd = to_f64(x0);
            const auto xd0 = xd;
            kernels::rope_ref(tensor_view<double, 3>(xd.data(), {T, H, dh}), pos, mode, 10000.0, d_rot);
            CHECK(rel_error(xd, xd0) > 1e-2);  // it did rotate
            kernels::rope_backward_ref<double>(tensor_view<double, 3>(xd.data(), {T, H, dh}), pos, mode, 10000.0, d_rot);
            CHECK(hymix::test::max_abs_diff(xd, xd0) < 1e-14);
            auto xf = x0;
            kernels::rope(tensor_view<float, 3>(xf.data(), {T, H, dh}), pos, mode, 10000.0, d_rot);
            kernels::rope_backward(tensor_view<float, 3>(xf.data(), {T, H, dh}), pos, mode, 10000.0, d_rot);
            CHECK(hymix::test::max_abs_diff(xf, x0) < 1e-6);
            for (int bk = 0; bk < 3; ++bk) {
                auto xb = x0;
                const tensor_view<float, 3> v(xb.data(), {T, H, dh});
                if (bk == 0) {
                    ops::rope(reference_backend(), v, pos, mode, 10000.0, d_rot);
                    ops::rope_backward(reference_backend(), v, pos, mode, 10000.0, d_rot);
                } else {
                    const cpu_backend be(bk);
                    ops::rope(be, v, pos, mode, 10000.0, d_rot);
                    ops::rope_backward(be, v, pos, mode, 10000.0, d_rot);
                }
                CHECK(hymix::test::max_abs_diff(xb, x0) < 1e-6);
            }
        }
}

TEST_CASE("rope backward: CPU fp32 (1 and 2 threads, strided) equals the reference; reference op equals rope_backward_ref") {
    const std::int64_t T = 37, H = 5, dh = 12, ld_t = H * 20;  // heads 20 apart inside 100-wide token rows
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    for (std::int64_t t = 0; t < T; ++t) pos[std::size_t(t)] = (t * 7919) % 4096;
    for (rope_mode mode : {rope_mode::rotate_half, rope_mode::interleaved})
        for (std::int64_t d_rot : {12, 4}) {
            CAPTURE(static_cast<int>(mode));
            CAPTURE(d_rot);
            const auto wide = uniform(std::size_t(T * ld_t), -2.f, 2.f, 11);
            auto run = [&](int bk) {
                auto buf = wide;
                const tensor_view<float, 3> v(buf.data() + 3, {T, H, dh}, {ld_t, 20, 1});
                if (bk == 0) ops::rope_backward(reference_backend(), v, pos, mode, 5e5, d_rot);
                else ops::rope_backward(cpu_backend(bk), v, pos, mode, 5e5, d_rot);
                return buf;
            };
            const auto ref = run(0), c1 = run(1), c2 = run(2);
            CHECK(rel_error(c1, ref) < 1e-5);
            CHECK(c1 == c2);
            for (std::int64_t t = 0; t < T; ++t)  // nothing outside the view is touched
                for (std::int64_t k = 0; k < ld_t; ++k) {
                    const std::int64_t off = k - 3;
                    const bool inside = off >= 0 && off % 20 < dh && off / 20 < H;
                    if (!inside) CHECK(c1[std::size_t(t * ld_t + k)] == wide[std::size_t(t * ld_t + k)]);
                }
            std::vector<double> d(std::size_t(T * H * dh));
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t i = 0; i < dh; ++i) d[std::size_t((t * H + h) * dh + i)] = wide[std::size_t(t * ld_t + 3 + h * 20 + i)];
            kernels::rope_backward_ref<double>(tensor_view<double, 3>(d.data(), {T, H, dh}), pos, mode, 5e5, d_rot);
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t h = 0; h < H; ++h)
                    for (std::int64_t i = 0; i < dh; ++i)
                        CHECK(ref[std::size_t(t * ld_t + 3 + h * 20 + i)] == static_cast<float>(d[std::size_t((t * H + h) * dh + i)]));
        }
}

TEST_CASE("rope backward: bad arguments throw errors naming them") {
    std::vector<float> buf(256, 1.f);
    const std::vector<std::int64_t> pos{0, 1, 2, 3};
    const cpu_backend cpu(1);
    const reference_backend ref;
    auto both = [&](tensor_view<float, 3> v, std::span<const std::int64_t> p, rope_mode m, double theta, std::int64_t d_rot, const char* what,
                    bool shape) {
        CAPTURE(what);
        if (shape) {
            CHECK_THROWS_WITH_AS(ops::rope_backward(cpu, v, p, m, theta, d_rot), doctest::Contains(what), shape_error);
            CHECK_THROWS_WITH_AS(ops::rope_backward(ref, v, p, m, theta, d_rot), doctest::Contains(what), shape_error);
            CHECK_THROWS_WITH_AS(kernels::rope_backward(v, p, m, theta, d_rot), doctest::Contains(what), shape_error);
        } else {
            CHECK_THROWS_WITH_AS(ops::rope_backward(cpu, v, p, m, theta, d_rot), doctest::Contains(what), value_error);
            CHECK_THROWS_WITH_AS(ops::rope_backward(ref, v, p, m, theta, d_rot), doctest::Contains(what), value_error);
            CHECK_THROWS_WITH_AS(kernels::rope_backward(v, p, m, theta, d_rot), doctest::Contains(what), value_error);
        }
    };
    const tensor_view<float, 3> ok(buf.data(), {4, 2, 8});
    CHECK_NOTHROW(ops::rope_backward(cpu, ok, pos, rope_mode::rotate_half, 1e4, 8));
    both(tensor_view<float, 3>(buf.data(), {3, 2, 8}), pos, rope_mode::rotate_half, 1e4, 8, "rope_backward: x has 3 tokens but 4 positions", true);
    both(ok, pos, rope_mode::rotate_half, 1e4, 5, "rope_backward: rotary dims 5 must be even and <= head_dim 8", true);
    both(ok, pos, rope_mode::rotate_half, 1e4, 10, "rotary dims 10", true);
    both(tensor_view<float, 3>(buf.data(), {4, 2, 8}, {16, 1, 2}), pos, rope_mode::rotate_half, 1e4, 8,
         "rope_backward: dx [4, 2, 8] needs unit stride along axis 2", true);
    both(tensor_view<float, 3>(buf.data(), {4, 2, 8}, {8, 4, 1}), pos, rope_mode::rotate_half, 1e4, 8,
         "rope_backward: dx [4, 2, 8] is written, but its strides", true);
    both(ok, pos, static_cast<rope_mode>(9), 1e4, 8, "rope_backward: unknown mode 9", false);
    both(ok, pos, rope_mode::interleaved, -1.0, 8, "rope_backward: base (rope_theta) must be finite and > 0", false);
    const std::vector<std::int64_t> neg{0, 1, -2, 3};
    both(ok, neg, rope_mode::interleaved, 1e4, 8, "rope_backward: positions[2] = -2 is negative", false);
}
