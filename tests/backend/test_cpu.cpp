// The CPU backend: thread count, parallel_for covers [0, n) exactly once, single-thread inline path.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/grain.hpp"
#include "hymix/backend/op.hpp"
#include "support/host_backend.hpp"

using namespace hymix;

namespace {
struct count_calls_op {};  // an op with no arguments besides the backend
int count_calls = 0;

/// A user's own backend parameterised on an xsimd architecture (copyable, so xsimd::dispatch could take it).
template <class Arch>
struct simd_user_backend : test::minimal_host_backend {
    static constexpr const char* name = "user-simd";
};
static_assert(backend<simd_user_backend<xsimd::default_arch>>);
}  // namespace

template <class Arch>
struct hymix::op_impl<count_calls_op, hymix::basic_cpu_backend<Arch>> {
    static void run(const hymix::basic_cpu_backend<Arch>&) { ++count_calls; }
};
template <class Arch>
struct hymix::op_impl<count_calls_op, simd_user_backend<Arch>> {
    static void run(const simd_user_backend<Arch>&) { ++count_calls; }
};

TEST_CASE("dispatch written unqualified runs the op on a non-const, const or temporary CPU backend") {
    // The backend's template argument is an xsimd type, so argument-dependent lookup also finds
    // xsimd::dispatch<ArchList>(F&&), which would take `be` and return an unused dispatcher, running nothing.
    count_calls = 0;
    cpu_backend be(1);
    dispatch<count_calls_op>(be);
    CHECK(count_calls == 1);
    const cpu_backend& cbe = be;
    dispatch<count_calls_op>(cbe);
    CHECK(count_calls == 2);
    dispatch<count_calls_op>(cpu_backend(1));
    CHECK(count_calls == 3);
    hymix::dispatch<count_calls_op>(be);
    CHECK(count_calls == 4);
    dispatch<count_calls_op>(std::move(cbe));  // a const rvalue
    CHECK(count_calls == 5);
    dispatch<count_calls_op, cpu_backend>(cpu_backend(1));  // the backend type named
    CHECK(count_calls == 6);
    // A backend of the user's own on an xsimd architecture: lvalue, const lvalue, temporary.
    simd_user_backend<xsimd::default_arch> ub;
    dispatch<count_calls_op>(ub);
    dispatch<count_calls_op>(std::as_const(ub));
    dispatch<count_calls_op>(simd_user_backend<xsimd::default_arch>{});
    CHECK(count_calls == 9);
}

TEST_CASE("parallel_for visits every index exactly once") {
    for (int threads : {1, 2}) {
        cpu_backend be(threads);
        CHECK(be.num_threads() == threads);
        for (std::int64_t n : {0, 1, 7, 1000}) {
            std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
            be.parallel_for(n, 3, [&](std::int64_t b, std::int64_t e) {
                for (auto i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
            });
            for (auto& h : hits) CHECK(h.load() == 1);
        }
    }
}

TEST_CASE("backend reports its SIMD architecture") {
    cpu_backend be;
    CHECK(be.num_threads() >= 1);
    CHECK(cpu_backend::simd_width() >= 4);
    CHECK(std::string(cpu_backend::arch_name()).size() > 0);
}

TEST_CASE("parallel_for_static: every index once, parts of at least min_items, the same parts at every call") {
    for (int threads : {1, 2, 3, 4, 16}) {
        const hymix::cpu_backend be(threads);
        for (std::int64_t n : {0, 1, 2, 5, 8, 24, 48, 1000}) {
            for (std::int64_t min_items : {1, 3, 4, 100}) {
                CAPTURE(threads);
                CAPTURE(n);
                CAPTURE(min_items);
                auto run = [&] {
                    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
                    std::mutex m;
                    std::vector<std::pair<std::int64_t, std::int64_t>> parts;
                    be.parallel_for_static(n, [&](std::int64_t b, std::int64_t e) {
                        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
                        const std::lock_guard<std::mutex> lock(m);
                        parts.emplace_back(b, e);
                    }, min_items);
                    for (const auto& h : hits) CHECK(h.load() == 1);
                    std::sort(parts.begin(), parts.end());
                    return parts;
                };
                const auto parts = run();
                const std::int64_t want = std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / min_items));
                if (n > 0) {
                    CHECK(static_cast<std::int64_t>(parts.size()) == want);
                    if (parts.size() > 1)
                        for (const auto& [b, e] : parts) CHECK(e - b >= min_items);
                } else {
                    CHECK(parts.empty());
                }
                CHECK(run() == parts);  // the same partition again
            }
        }
    }
}

TEST_CASE("items_per_task and split_grain: parallel_for pieces hold at least the minimum of items, short ranges run as one") {
    CHECK(items_per_task(1, 1) == 1);
    CHECK(items_per_task(6144, min_task_macs) == 11);   // a 24-column group of a 256-wide projection at batch 1
    CHECK(items_per_task(0, min_task_macs) == min_task_macs);
    CHECK(items_per_task(std::int64_t{1} << 30, min_task_macs) == 1);
    CHECK(task_grain(6144) == split_grain(11));
    CHECK(task_grain(std::int64_t{1} << 30) == 1);
    for (int threads : {2, 3, 4, 16}) {
        const hymix::cpu_backend be(threads);
        for (std::int64_t n : {1, 5, 21, 22, 43, 100, 1000}) {
            for (std::int64_t min_items : {1, 3, 11}) {
                CAPTURE(threads);
                CAPTURE(n);
                CAPTURE(min_items);
                std::mutex m;
                std::vector<std::int64_t> sizes;
                std::int64_t covered = 0;
                be.parallel_for(n, split_grain(min_items), [&](std::int64_t b, std::int64_t e) {
                    const std::lock_guard<std::mutex> lock(m);
                    sizes.push_back(e - b);
                    covered += e - b;
                });
                CHECK(covered == n);
                CHECK(*std::min_element(sizes.begin(), sizes.end()) >= std::min(n, min_items));
                if (n < 2 * min_items) CHECK(sizes.size() == 1);
            }
        }
    }
}
