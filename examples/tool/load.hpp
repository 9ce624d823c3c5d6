// Loading a checkpoint for the `hymix` tool: the model directory from --model or $HYMIX_MODEL (with clear
// messages for a missing path or a file), the non-finite weight check, timing and the system line on stderr.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>

#include "hymix/io/json.hpp"
#include "hymix/models/auto_model.hpp"
#include "tool.hpp"

namespace tool {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// Items per second, finite even for a duration too short to measure.
inline double per_second(std::int64_t n, double seconds) { return static_cast<double>(n) / std::max(seconds, 1e-9); }

/// A loaded checkpoint on backend Model::backend_type (hymix::auto_model: CPU; hymix::reference_auto_model: fp64).
template <class Model>
struct basic_loaded_model {
    std::filesystem::path dir;
    hymix::io::json config;  // config.json (the text model's part for a multimodal-style config)
    Model model;
};

/// The checkpoint directory: --model, else $HYMIX_MODEL. Throws usage_error when neither is given, io_error
/// when the path does not exist or is not a directory.
std::filesystem::path resolve_model_dir(const std::string& arg);

/// Names every tensor holding NaN / Inf in the checkpoint of `dir` and in the AMOR file `amor` (none when empty) in a
/// warning on stderr: what --allow-nonfinite loads anyway.
void warn_nonfinite_weights(const std::filesystem::path& dir, const std::string& amor);

/// The inputs of the AMOR measuring commands (amor-sweep, amor-router): the backbone checkpoint of --model and the
/// configuration of the --amor file, checked against each other (config_error naming both files), and both free of
/// NaN / Inf (nonfinite_error naming the tensor) unless --allow-nonfinite (then each such tensor is named in a warning).
struct amor_inputs {
    std::filesystem::path dir;
    hymix::models::checkpoint_reader reader;
    std::string model_type;
    hymix::models::amor_config amor;
};
amor_inputs open_amor_inputs(const common_options& c);

/// Loads the model (refusing non-finite weights unless allowed) on the CPU or the reference backend and prints the
/// load and system lines on stderr.
basic_loaded_model<hymix::auto_model> load_cpu_model(const common_options& o);
basic_loaded_model<hymix::reference_auto_model> load_reference_model(const common_options& o);

/// The --profile-ops target, checked before the work (io_error, exit 2): a directory, a missing parent directory, an
/// unwritable place, or an existing regular file that is not a profile CSV written earlier (its first line is not
/// op_profile's CSV header: the model's files, a text, a prompt, an input) are refused. Devices and pipes
/// (/dev/null, /dev/stdout) are written as they are.
void check_profile_target(const std::string& path);

/// Writes an op profile as CSV (op_profile::write_csv) to `path`, after checking it again (the command may have
/// created a file there, such as logits' --output, which is then kept and io_error thrown), and its largest shares
/// by op to stderr. The file is written in place (no rename: a link, its permissions and a device stay what they
/// are); a command that fails before this leaves it untouched.
void write_op_profile(const std::string& path, const hymix::op_profile& p, double wall_seconds);

/// Loads the model on the backend --backend names and returns f(model). With --profile-ops (cpu backend only: a
/// usage_error otherwise), the model's ops are timed while f runs and the profile is written when it returns.
template <class F>
int with_model(const common_options& o, F&& f) {
    if (o.backend == "ref") {
        if (!o.profile_ops.empty())
            throw usage_error("--profile-ops times the cpu backend's ops: --backend ref has none to time");
        auto m = load_reference_model(o);
        return f(m);
    }
    if (o.profile_ops.empty()) {
        auto m = load_cpu_model(o);
        return f(m);
    }
    check_profile_target(o.profile_ops);
    hymix::op_profile prof;  // before the model: it must outlive the backend that points at it
    auto m = load_cpu_model(o);
    m.model.set_op_profile(&prof);
    const auto t0 = clock_type::now();
    const int rc = f(m);
    m.model.set_op_profile(nullptr);
    write_op_profile(o.profile_ops, prof, seconds_since(t0));
    return rc;
}

/// An integer setting of config.json (null, absent or not an integer: none).
std::optional<std::int64_t> config_int(const hymix::io::json& cfg, const char* key);

/// End-of-sequence token ids of config.json's eos_token_id (a number or a list; none when null or absent).
std::vector<std::int32_t> config_eos(const hymix::io::json& cfg);

}  // namespace tool
