// Options of `hymix amor-router` (amor_router.cpp): fits one entropy router per AMOR block (spec.md §5.6) on (ĥ, H)
// recorded from a trained AMOR model over the training split, reports its held-out decisions beside the exact gates',
// and writes the router file that `--router` loads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "hymix/gate/entropy_router.hpp"
#include "tool.hpp"

namespace tool {

/// Positions recorded per block when --samples is not given (fewer where the training split has fewer).
inline constexpr std::int64_t default_router_samples = 65536;

struct amor_router_options {
    std::string text;
    std::filesystem::path out = "amor-router.safetensors", csv;
    std::int64_t samples = 0;      // recorded positions per block; 0: default_router_samples, or the split's positions if fewer
    double keep = 0.25;            // fraction of positions recorded (spreads the samples over more windows)
    std::int64_t window = 512;     // bytes per window, recording and held-out scoring
    std::int64_t hidden = hymix::entropy_router::default_hidden;
    std::int64_t epochs = 8, batch = 256;
    double lr = 1e-3;
    std::uint64_t seed = 0;
    std::int64_t eval_bytes = 131072;  // held-out bytes scored (from the start of the held-out part)
};
int run_amor_router(const common_options&, const amor_router_options&);

}  // namespace tool
