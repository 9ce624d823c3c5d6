// Non-finite weight detection (models/check_weights.hpp) on checkpoints written here: every floating dtype
// (f32, f64, bf16, f16), NaN / +Inf / -Inf told apart, the first element's multi-index, integer tensors ignored,
// unaligned data, and the error naming the tensor and the file.
#include <doctest/doctest.h>

#include <filesystem>
#include <limits>
#include <vector>

#include "hymix/models/check_weights.hpp"
#include "support/shared.hpp"

using namespace hymix;

namespace {
const float k_inf = std::numeric_limits<float>::infinity(), k_nan = std::numeric_limits<float>::quiet_NaN();

template <class T>
std::vector<T> converted(const std::vector<float>& v) {
    std::vector<T> out;
    for (float x : v) {
        if constexpr (std::is_same_v<T, hymix::bf16> || std::is_same_v<T, hymix::f16>)
            out.push_back(T::from_float(x));
        else
            out.push_back(static_cast<T>(x));
    }
    return out;
}

/// [2, 3] tensor with `bad` at flat index 4 (multi-index [1, 1]) and -Inf at index 5.
std::vector<float> two_bad(float bad) { return {0.5f, -2.0f, 6e4f, 3.0f, bad, -k_inf}; }  // 6e4: finite in every dtype
}  // namespace

TEST_CASE("scan_nonfinite: every float dtype, the kind and position of the first value, the count") {
    safetensors::writer w;
    const std::vector<std::int64_t> shape{2, 3};
    w.add("f32_nan", shape, std::span<const float>(converted<float>(two_bad(k_nan))));
    w.add("f64_inf", shape, std::span<const double>(converted<double>(two_bad(k_inf))));
    w.add("bf16_nan", shape, std::span<const hymix::bf16>(converted<hymix::bf16>(two_bad(k_nan))));
    w.add("f16_inf", shape, std::span<const hymix::f16>(converted<hymix::f16>(two_bad(k_inf))));
    w.add("f16_big", shape, std::span<const hymix::f16>(converted<hymix::f16>({1, 2, 3, 60000, -65504, 0})));  // finite extremes
    w.add("bf16_ok", shape, std::span<const hymix::bf16>(converted<hymix::bf16>({1, 2, 3e38f, 4, 5, -3e38f})));
    const std::vector<std::int64_t> ints{-1, 0x7ff0000000000000LL, 3, 4, 5, 6};  // Inf's f64 bits, as an integer
    w.add("i64", shape, std::span<const std::int64_t>(ints));
    w.add("one_byte_pad", {1}, std::span<const hymix::f16>(converted<hymix::f16>({1.0f})));  // makes the next tensor unaligned
    w.add("f32_odd", {3}, std::span<const float>(std::vector<float>{1.0f, 2.0f, -k_inf}));
    const auto img = w.serialize();
    const auto f = safetensors::file::from_bytes(img, "mem.safetensors");

    auto scan = [&](const char* n) { return models::scan_nonfinite(f, f.info(n)); };
    for (const char* n : {"f32_nan", "bf16_nan"}) {
        const auto r = scan(n);
        CHECK(r.count == 2);
        CHECK(r.first == 4);
        CHECK(r.first_value == "NaN");
    }
    for (const char* n : {"f64_inf", "f16_inf"}) {
        const auto r = scan(n);
        CHECK(r.count == 2);
        CHECK(r.first_value == "+Inf");
        CHECK(r.describe() == std::string("tensor '") + n + "' [2, 3] in 'mem.safetensors' holds 2 non-finite values, the first +Inf at [1, 1]");
    }
    CHECK(scan("f16_big").count == 0);
    CHECK(scan("bf16_ok").count == 0);
    CHECK(scan("i64").count == 0);
    const auto odd = scan("f32_odd");
    CHECK(odd.count == 1);
    CHECK(odd.first_value == "-Inf");
    CHECK(odd.describe().find("holds 1 non-finite value, the first -Inf at [2]") != std::string::npos);
}

TEST_CASE("require_finite_weights names the first bad tensor and the file, and counts the others") {
    const auto dir = test::tmp_dir() / "check_weights";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    safetensors::writer ok;
    ok.add("a", {2}, std::span<const float>(std::vector<float>{1, 2}));
    ok.write(dir / "model.safetensors");
    CHECK_NOTHROW(models::require_finite_weights(dir));
    CHECK(models::find_nonfinite_weights(safetensors::open_checkpoint(dir)).empty());

    safetensors::writer bad;
    bad.add("a", {2}, std::span<const float>(std::vector<float>{1, 2}));
    bad.add("lm_head.weight", {4, 2}, std::span<const float>(std::vector<float>{0, 0, 0, 0, 0, 0, k_inf, k_inf}));
    bad.add("z", {1}, std::span<const float>(std::vector<float>{k_nan}));
    bad.write(dir / "model.safetensors");
    const auto path = (dir / "model.safetensors").string();
    CHECK_THROWS_WITH_AS(models::require_finite_weights(dir, "; try --allow-nonfinite"),
                         ("checkpoint tensor 'lm_head.weight' [4, 2] in '" + path +
                          "' holds 2 non-finite values, the first +Inf at [3, 0] (and 1 more tensors hold non-finite values)"
                          "; try --allow-nonfinite").c_str(),
                         nonfinite_error);
    const auto all = models::find_nonfinite_weights(safetensors::open_checkpoint(dir));
    REQUIRE(all.size() == 2);
    CHECK(all[1].name == "z");
    CHECK(all[1].first_value == "NaN");
}
