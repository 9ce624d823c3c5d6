// Options of `hymix amor-sweep` (amor.cpp): a trained AMOR model's held-out bits/byte and per-block fire rates as
// the gates' κ moves at inference, beside the backbone alone and the same blocks always on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tool.hpp"

namespace tool {

/// `hymix amor-sweep`: held-out bits/byte and fire rates of a trained AMOR model as its gates' κ is swept at
/// inference, beside the backbone alone and the same blocks always on (CSV + SVG).
struct amor_sweep_options {
    std::string text;
    std::vector<float> kappas{-1.0f, -0.5f, 0.0f, 0.2f, 0.5f, 0.77f, 1.0f, 1.5f, 2.0f, 3.0f};
    std::vector<std::int64_t> windows{512, 2048};
    std::int64_t eval_bytes = 131072;
    std::filesystem::path csv, svg;
    std::filesystem::path from_csv;  // non-empty: only re-draw the plot of this finished sweep (no model is loaded)
    std::int64_t calibrate = 0;      // > 0: set the gate statistics from this many training positions per block first
    std::int64_t calibrate_window = 512;
    std::uint64_t seed = 1;          // the calibration's window draw
};
int run_amor_sweep(const common_options&, const amor_sweep_options&);

}  // namespace tool
