// Pieces of the `hymix` tool that every command uses: console output, reading files named by options, the
// model directory, config.json settings and the exit-code table.
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <unistd.h>

#include "load.hpp"
#include "tool.hpp"

namespace fs = std::filesystem;

namespace tool {

std::string exit_code_help() {
    return "Exit status:\n"
           "  0  success\n"
           "  1  the command line is wrong (unknown command or option, bad or missing value,\n"
           "     a prompt longer than the context limit)\n"
           "  2  an input cannot be used (model directory, config.json, weights, text, prompt or input file)\n"
           "  3  NaN or Inf in the weights (see --allow-nonfinite) or in a result (logits, bits/byte)\n"
           "  4  out of memory\n"
           "  5  any other failure (a bug: please report it)\n"
           "  130  train / amor-train stopped by Ctrl-C (SIGINT) or SIGTERM, after writing a checkpoint (--resume continues)\n";
}

namespace {
std::atomic<bool> training_interrupted{false};
extern "C" void on_training_signal(int) {
    training_interrupted.store(true);
    std::signal(SIGINT, SIG_DFL);  // a second signal, of either kind, ends the process
    std::signal(SIGTERM, SIG_DFL);
}
}  // namespace

training_interrupt::training_interrupt()
    : prev_int_((training_interrupted.store(false), std::signal(SIGINT, on_training_signal))),
      prev_term_(std::signal(SIGTERM, on_training_signal)) {}

training_interrupt::~training_interrupt() {
    std::signal(SIGINT, prev_int_ == SIG_ERR ? SIG_DFL : prev_int_);
    std::signal(SIGTERM, prev_term_ == SIG_ERR ? SIG_DFL : prev_term_);
}

const std::atomic<bool>* training_interrupt::flag() const { return &training_interrupted; }

namespace console {
namespace {
bool stdout_open = false;  // stdout holds a partial line
bool stderr_open = false;  // stderr holds a partial (status) line
}  // namespace

void text(std::string_view bytes) {
    if (bytes.empty()) return;
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
    stdout_open = bytes.back() != '\n';
}

bool stderr_is_terminal() { return ::isatty(fileno(stderr)) != 0; }

void status(std::string_view line) {
    std::fputc('\r', stderr);
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fputs("\033[K", stderr);  // clear what a longer previous line left
    std::fflush(stderr);
    stderr_open = true;
}

void clear_status() {
    if (!stderr_open) return;
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    stderr_open = false;
}

void end_lines() {
    if (stdout_open) {
        std::fputc('\n', stdout);
        std::fflush(stdout);
        stdout_open = false;
    }
    if (stderr_open) {
        std::fputc('\n', stderr);
        stderr_open = false;
    }
}
}  // namespace console

void require_writable(const std::filesystem::path& p, const char* option) {
    if (p.empty()) return;
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) throw usage_error(fmt::format("{} '{}' is a directory; give a file name", option, p.string()));
    const auto parent = p.parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
        throw usage_error(fmt::format("{} '{}': the folder '{}' does not exist", option, p.string(), parent.string()));
}

std::string read_file(const std::string& path, std::string_view what) {
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) throw hymix::io_error(std::string(what) + ": '" + path + "' does not exist");
    if (fs::is_directory(st)) throw hymix::io_error(std::string(what) + ": '" + path + "' is a directory, expected a file");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw hymix::io_error(std::string(what) + ": cannot open '" + path + "'");
    std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    if (f.bad()) throw hymix::io_error(std::string(what) + ": error reading '" + path + "'");
    return s;
}

fs::path resolve_model_dir(const std::string& arg) {
    std::string dir = arg, from = "--model";
    if (dir.empty())
        if (const char* env = std::getenv("HYMIX_MODEL")) dir = env, from = "$HYMIX_MODEL";
    if (dir.empty())
        throw usage_error(
            "no model given. Pass --model DIR (or set HYMIX_MODEL) where DIR is a Hugging Face checkpoint directory "
            "holding config.json and model.safetensors, e.g. --model models/kjv-tiny-hybrid (in the repository) "
            "(Mamba2ForCausalLM, Qwen3_5ForCausalLM text models and hymix's Oryx models are supported).");
    std::error_code ec;
    const auto st = fs::status(dir, ec);
    if (!fs::exists(st)) throw hymix::io_error(from + ": model directory '" + dir + "' does not exist");
    if (!fs::is_directory(st)) {
        std::string m = from + ": '" + dir + "' is a file, not a directory; pass the checkpoint directory that holds "
                        "config.json and model.safetensors";
        const fs::path p(dir);
        if (p.filename() == "config.json" || p.extension() == ".safetensors" || p.filename() == "model.safetensors.index.json")
            m += " (here: --model '" + (p.has_parent_path() ? p.parent_path().string() : std::string(".")) + "')";
        throw hymix::io_error(m);
    }
    return dir;
}

namespace {
/// The object holding the text model's settings: `text_config` when present (multimodal-style configs).
const hymix::io::json& text_part(const hymix::io::json& cfg) {
    if (cfg.is_object() && cfg.contains("text_config") && cfg["text_config"].is_object()) return cfg["text_config"];
    return cfg;
}
}  // namespace

std::optional<std::int64_t> config_int(const hymix::io::json& cfg, const char* key) {
    for (const auto* j : {&text_part(cfg), &cfg})
        if (j->is_object() && j->contains(key) && (*j)[key].is_number_integer()) return (*j)[key].get<std::int64_t>();
    return std::nullopt;
}

std::vector<std::int32_t> config_eos(const hymix::io::json& cfg) {
    std::vector<std::int32_t> ids;
    for (const auto* j : {&text_part(cfg), &cfg}) {
        if (!j->is_object() || !j->contains("eos_token_id")) continue;
        const auto& e = (*j)["eos_token_id"];
        if (e.is_number_integer()) ids.push_back(e.get<std::int32_t>());
        if (e.is_array())
            for (const auto& v : e)
                if (v.is_number_integer()) ids.push_back(v.get<std::int32_t>());
        if (!ids.empty()) break;
    }
    return ids;
}

}  // namespace tool

namespace tool {

namespace {
/// Whether an existing regular file is a profile CSV written earlier: its first line is op_profile's header.
bool is_profile_csv(const fs::path& p) {
    std::ifstream f(p);
    std::string line;
    return f && std::getline(f, line) && line == "op,shapes,calls,seconds,fraction";
}

std::string why(int err) { return err ? std::string(": ") + std::strerror(err) : std::string(); }

void check_profile_path(const std::string& path, bool before) {
    const std::string what = "--profile-ops: '" + path + "' ";
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (fs::is_directory(st)) throw hymix::io_error(what + "is a directory (give a file name)");
    if (fs::is_regular_file(st)) {
        if (!is_profile_csv(path))
            throw hymix::io_error(what + (before ? "exists and is not a profile CSV: refusing to overwrite it"
                                                 : "was written by the command itself (not a profile CSV): kept as it is; no profile written"));
        if (::access(path.c_str(), W_OK) != 0) throw hymix::io_error(what + "cannot be written" + why(errno));
        return;
    }
    if (fs::exists(st)) {  // a device or a pipe: written as it is
        if (::access(path.c_str(), W_OK) != 0) throw hymix::io_error(what + "cannot be written" + why(errno));
        return;
    }
    const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
    if (!fs::is_directory(parent, ec)) throw hymix::io_error(what + "cannot be written: no directory '" + parent.string() + "'");
    if (::access(parent.c_str(), W_OK) != 0) throw hymix::io_error(what + "cannot be written in '" + parent.string() + "'" + why(errno));
}
}  // namespace

void check_profile_target(const std::string& path) { check_profile_path(path, true); }

void write_op_profile(const std::string& path, const hymix::op_profile& p, double wall_seconds) {
    check_profile_path(path, false);
    {
        std::ofstream out(path);
        if (!out) throw hymix::io_error("--profile-ops: cannot write '" + path + "'" + why(errno));
        p.write_csv(out);
        if (!out.flush()) throw hymix::io_error("--profile-ops: cannot write '" + path + "'" + why(errno));
    }
    const double inside = p.total_seconds();
    if (p.entries().empty()) {
        console::note("ops: none ran (nothing to profile); an empty profile in {}", path);
        return;
    }
    std::string top;
    int shown = 0;
    for (const auto& e : p.by_op()) {
        if (shown++ == 6) break;
        top += fmt::format("{}{} {:.1f}%", top.empty() ? "" : ", ", e.op, inside > 0 ? 100.0 * e.seconds / inside : 0.0);
    }
    console::note("ops: {:.3f} s inside ops of {:.3f} s (loading not counted); largest shares: {}; per op and shape in {}", inside,
                  wall_seconds, top, path);
}

}  // namespace tool
