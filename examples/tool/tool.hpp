// Declarations shared by the `hymix` tool's files: exit codes, the options of each command, console output that
// keeps errors on a fresh line, model loading, and the commands themselves.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include <filesystem>

#include "hymix/text/generate.hpp"
#include "hymix/train/options.hpp"
#include "hymix/text/score.hpp"

namespace tool {

/// The tool's exit statuses (README "Exit codes" and the --help footer list the same).
enum exit_code : int {
    exit_ok = 0,             // success (also --help, --version)
    exit_usage = 1,          // the command line is wrong: unknown command or option, bad or missing value
    exit_bad_input = 2,      // an input cannot be used: model directory, config.json, weights, text or input file
    exit_nonfinite = 3,      // NaN / Inf in the weights (see --allow-nonfinite) or in a result
    exit_out_of_memory = 4,  // the model, batch or window does not fit in memory
    exit_internal = 5,       // any other failure (a bug: please report it)
    exit_interrupted = 130,  // train / amor-train stopped by SIGINT or SIGTERM, after writing a checkpoint
};

/// The exit-code table as printed by --help.
std::string exit_code_help();

/// For the training commands, while it lives: SIGINT and SIGTERM set flag() (for train_options::interrupt), so the run
/// stops after the step in hand and writes its checkpoint. The first signal gives both back their default action, so a
/// second one ends the process at once. The destructor restores the dispositions found.
class training_interrupt {
public:
    training_interrupt();
    ~training_interrupt();
    training_interrupt(const training_interrupt&) = delete;
    training_interrupt& operator=(const training_interrupt&) = delete;
    const std::atomic<bool>* flag() const;

private:
    void (*prev_int_)(int);   // the dispositions to restore
    void (*prev_term_)(int);
};

/// A command-line mistake found after parsing (exit_usage).
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Console output: the generated text goes to stdout, everything else to stderr. Tracks whether either stream
/// is in the middle of a line, so that notes and errors always start on a fresh line.
namespace console {
void text(std::string_view bytes);    // stdout, flushed (streamed generation)
void status(std::string_view line);   // stderr line redrawn in place on a terminal (progress); not ended
void clear_status();                  // erases the status line (the cursor stays at its start)
void end_lines();                     // ends an open stdout or stderr line
bool stderr_is_terminal();
template <class... A>
void note(fmt::format_string<A...> f, A&&... a) {  // one stderr line, starting on a fresh line
    end_lines();
    fmt::print(stderr, f, std::forward<A>(a)...);
    std::fputc('\n', stderr);
}
}  // namespace console

/// Calls `train(options)` (a train_model call) with Ctrl-C / SIGTERM stopping it after the step in hand with its
/// checkpoint (training_interrupt, only while it trains), ends the console lines it left open, and says when a resumed
/// run already held its steps. `command` names the command in that note.
template <class Train>
auto train_interruptible(const char* command, hymix::train::train_options options, Train&& train) {
    const auto r = [&] {
        const training_interrupt signals;
        options.interrupt = signals.flag();
        return train(options);
    }();
    console::end_lines();
    if (r.resumed && r.steps_done == r.resumed_from && r.steps_done >= options.steps)
        console::note("{}: the run already holds its {} steps (--steps {}): nothing trained", command, r.steps_done, options.steps);
    return r;
}

struct common_options {
    std::string model;             // checkpoint directory; empty = $HYMIX_MODEL
    int threads = 0;               // 0 = every core
    std::string backend = "cpu";   // cpu | ref (the fp64 reference backend: exact, slow)
    bool allow_nonfinite = false;  // load weights holding NaN / Inf (with a warning)
    std::string amor;              // an AMOR file (models/amor.hpp) to add to the backbone in --model; empty = none
    std::string router;            // a router file for the --amor blocks (models/amor_router.hpp); empty = exact gates
    std::string modes;             // Oryx: a mode schedule (schedule/mode_schedule.hpp parse_mode_schedule); empty = default
    std::string weights = "f32";   // projection weights' storage after loading: f32 | bf16 | f16 | i8 (model::store_weights_as)
    std::string kv_cache = "f32";  // KV cache storage of the attention-like layers: f32 | bf16 | f16 (model::set_kv_dtype)
    std::string profile_ops;       // CSV of the time per op (backend/op_profile.hpp) written after the command; empty = none
};

struct generate_options {
    std::string prompt, prompt_file;
    std::optional<std::uint64_t> seed;       // none = random (printed)
    std::optional<std::int64_t> ctx_size;    // none = max_position_embeddings of config.json (if any)
    bool ignore_eos = false;
    hymix::generation_options gen;
};

struct score_options {
    std::string text;
    std::optional<std::int64_t> offset, bytes;  // none = whole file (the held-out range for the KJV)
    hymix::score_options score;
};

struct logits_options {
    std::string input, output;
};

/// `hymix train`: what to build, how to train it, where to write.
struct train_command_options {
    hymix::train::byte_lm_spec spec;
    hymix::train::train_options train;
    std::string text;
    std::filesystem::path out = "hymix-train";
    std::filesystem::path export_bf16;  // empty: no bf16 export
    bool resume = false;
    int threads = 0;
};

/// `hymix amor-train`: AMOR blocks on a frozen backbone (--model), spec.md §5.
struct amor_train_options {
    std::int64_t blocks = 3, heads = 4, head_dim = 64;
    std::string residual = "classic";
    float kappa = 0.2f, momentum = 0.99f, gate_offset = 0.03f;
    std::string offset_mode = "adaptive";
    bool always_on = false;
    hymix::train::train_options train;
    std::string text;
    std::filesystem::path out = "hymix-amor";
    bool resume = false;
};

int run_info(const common_options&);
int run_amor_train(const common_options&, const amor_train_options&);

/// `hymix amor-trace`: one self-contained HTML page of an AMOR model's entropies and gate decisions over a text slice.
struct amor_trace_options {
    std::string text, out = "amor-trace.html";
    std::optional<std::int64_t> offset;  // none: the held-out offset for the KJV, else 0
    std::int64_t bytes = 2048;
};
int run_amor_trace(const common_options&, const amor_trace_options&);
int run_train(const train_command_options&);
int run_generate(const common_options&, generate_options);
int run_score(const common_options&, const score_options&);
int run_logits(const common_options&, const logits_options&);

/// An output path given by `option` (empty: none) whose folder must exist and which must not be a directory, checked
/// before minutes of work (usage_error otherwise).
void require_writable(const std::filesystem::path& p, const char* option);

/// Reads a whole file named by option `what` (io_error naming both when it is missing, a directory or unreadable).
std::string read_file(const std::string& path, std::string_view what);

}  // namespace tool
