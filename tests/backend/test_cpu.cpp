// The CPU backend: thread count, parallel_for covers [0, n) exactly once, single-thread inline path.
#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "hymix/backend/cpu.hpp"

using namespace hymix;

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
