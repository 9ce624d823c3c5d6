// Locating ../shared (pretrained checkpoints, KJV text) for tests that need it. Tests that need it call
// HYMIX_REQUIRE_SHARED(path) and are skipped with a clear message when it is absent.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <doctest/doctest.h>

namespace hymix::test {

/// The shared directory: $HYMIX_SHARED if set, else the path configured at build time.
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("HYMIX_SHARED")) return env;
    return HYMIX_SHARED_DIR;
}

inline std::filesystem::path tmp_dir() { return HYMIX_TEST_TMP; }

}  // namespace hymix::test

/// Skips the rest of the current test case (with a message) when `rel` under the shared directory is missing.
#define HYMIX_REQUIRE_SHARED(rel)                                                                          \
    do {                                                                                                   \
        if (!std::filesystem::exists(::hymix::test::shared_dir() / (rel))) {                               \
            MESSAGE("SKIPPED: " << (::hymix::test::shared_dir() / (rel)).string()                          \
                                << " not found (set HYMIX_SHARED to the shared/ directory to run this test)"); \
            return;                                                                                        \
        }                                                                                                  \
    } while (0)
