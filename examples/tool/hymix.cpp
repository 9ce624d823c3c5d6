// hymix — run Hugging Face Mamba-2 / Qwen3.5 (GDN, GDN+attention) checkpoints and hymix's Oryx models from the
// command line (--schedule: an Oryx model's per-token read-out on generate, score and logits).
//   hymix info     --model DIR
//   hymix generate --model DIR --prompt TEXT | -f FILE  [-n N --temperature T --top-k K --top-p P --min-p P ...]
//   hymix score    --model DIR --text FILE [--offset O --bytes N --window L --full-windows --schedule S]
//   hymix logits   --model DIR --input IN.safetensors --output OUT.safetensors
//   hymix train    --stack mamba2|gdn|attention|hybrid|oryx-gdn|oryx-mamba2 --text FILE [--d-model D --layers L
//                  --minutes M --block-size B --p-attention P ...]
//   hymix amor-train --model BACKBONE --text FILE [--blocks K --kappa κ --steps N ...]
//   hymix amor-trace --model BACKBONE --amor FILE --text FILE [--offset O --bytes N --out PAGE.html]
//   hymix amor-sweep --model BACKBONE --amor FILE --text FILE [--kappa K,K,... --window L,L --csv F --svg F]
//   hymix amor-router --model BACKBONE --amor FILE --text FILE [--out ROUTERS.safetensors --samples N --epochs E ...]
// This file defines the command line and maps failures to exit codes (tool.hpp); each command lives in its own
// file. Tokens are bytes (the shared KJV checkpoints); the tokenizer is the replaceable hymix::byte_tokenizer.
#include <cstdio>
#include <initializer_list>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/version.h>
#include <xsimd/xsimd.hpp>

#include "cli.hpp"
#include "hymix/core/finite.hpp"
#include "amor_router.hpp"
#include "amor_sweep.hpp"
#include "tool.hpp"

namespace {

std::string version_text() {
    return fmt::format("hymix {} (SIMD {}, oneTBB {}, {} {})", HYMIX_TOOL_VERSION, xsimd::default_arch::name(),
                       TBB_VERSION_STRING,
#if defined(__clang__)
                       "clang", __clang_version__
#elif defined(__GNUC__)
                       "g++", __VERSION__
#else
                       "compiler", "unknown"
#endif
    );
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
    return s;
}

/// Extra arguments left after parsing a command, in the order given; unknown options are named as such.
std::string extras_message(const std::vector<std::string>& extra, const std::string& command) {
    std::vector<std::string> options;
    for (const auto& a : extra)
        if (a.size() > 1 && a[0] == '-') options.push_back(a);
    std::string m = fmt::format("unexpected argument{}: {}", extra.size() > 1 ? "s" : "", join(extra));
    if (!options.empty())
        m += fmt::format(" ({} {} not {} option of '{}')", join(options), options.size() > 1 ? "are" : "is",
                         options.size() > 1 ? "options" : "an", command);
    return m;
}

/// The first comma-separated list among `options` (given as "--opt V" or "--opt=V") with an empty item ("1,,2", "1,"):
/// CLI11 drops empty items, so the list would silently lose one. Empty when there is none.
std::string empty_list_item(int argc, char** argv, std::initializer_list<std::string_view> options) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        for (const auto o : options) {
            std::string_view v;
            if (a == o && i + 1 < argc) v = argv[i + 1];
            else if (a.size() > o.size() && a.substr(0, o.size()) == o && a[o.size()] == '=') v = a.substr(o.size() + 1);
            else continue;
            if (v.empty() || v.front() == ',' || v.back() == ',' || v.find(",,") != std::string_view::npos)
                return fmt::format("{}: '{}' has an empty item (expected values separated by single commas)", o, v);
        }
    }
    return {};
}

/// CLI11's message for an option given more than once ("--x: At Most 1 required but received 2"), said plainly.
std::string parse_message(const CLI::ParseError& e) {
    const std::string w = e.what();
    const auto at = w.find(": At Most 1 required but received ");
    if (at == std::string::npos) return w;
    return fmt::format("{} is given {} times; it takes one value", w.substr(0, at), w.substr(at + 34));
}

using tool::cli::decimal;
using tool::cli::whole;

int fail(int code, const std::string& message) {
    tool::console::end_lines();
    fmt::print(stderr, "hymix: error: {}\n", message);
    return code;
}

/// Every option of every command, and the values they set.
struct command_line {
    CLI::App app{"hymix: run hybrid recurrent/attention language models (Hugging Face checkpoints) on the CPU"};
    CLI::App *info = nullptr, *gen = nullptr, *score = nullptr, *logits = nullptr, *train = nullptr, *amor_train = nullptr, *amor_trace = nullptr, *amor_sweep = nullptr,
             *amor_router = nullptr;
    tool::common_options common;
    tool::generate_options generate;
    tool::score_options scoring;
    tool::logits_options logit_files;
    tool::train_command_options training;
    std::string lr_decay = "cosine", export_bf16, out_dir = "hymix-train";
    tool::amor_train_options amor;
    std::string amor_lr_decay = "constant", amor_out = "hymix-amor";
    tool::amor_trace_options trace;
    tool::amor_sweep_options sweep;
    tool::amor_router_options router;
    std::int64_t trace_offset = 0;
    CLI::Option* trace_offset_opt = nullptr;
    // Values whose absence means something (random seed, context from config.json, range from the text).
    std::uint64_t seed = 0;
    std::int64_t ctx_size = 0, offset = 0, n_bytes = 0;
    CLI::Option *seed_opt = nullptr, *ctx_opt = nullptr, *offset_opt = nullptr, *bytes_opt = nullptr;
    const int cores = tbb::info::default_concurrency();

    command_line() {
        app.require_subcommand(0, 1);
        app.set_version_flag("--version", version_text(), "print the version, SIMD architecture and compiler, then exit");
        app.footer(tool::exit_code_help());
        app.option_defaults()->always_capture_default();
        app.allow_extras();  // an unknown command is reported by main
        info = command("info", "architecture, parameter count and layer schedule");
        define_generate();
        define_score();
        logits = command("logits", "logits for input_ids [B, T] (int64) -> logits [B, T, V] (f32) safetensors");
        logits->add_option("--input", logit_files.input, "safetensors file with input_ids")->required();
        logits->add_option("--output", logit_files.output, "safetensors file to write")->required();
        mode_schedule_option(logits);
        define_train();
        define_amor_train();
    }

    void define_amor_train() {
        amor_train = command("amor-train", "train AMOR's entropy-gated attention blocks on a frozen backbone (--model; spec.md §5)",
                             /*inference=*/false);
        auto& a = amor;
        auto& o = a.train;
        // The setup of the AMOR paper's post-hoc runs (issue 9): 1550 steps of 32 × 512 bytes, AdamW 1e-3, betas (0.9,
        // 0.95), weight decay 0.1, clip 1, 100 warmup steps then constant.
        o.steps = 1550;
        o.batch = 32;
        o.seq_len = 512;
        o.adamw = {1e-3, 0.9, 0.95, 1e-8, 0.1};
        o.warmup = 100;
        o.decay = hymix::train::lr_decay::constant;
        amor_train->add_option("--text", a.text, "training text (bytes); the first 95% train, the rest is held out")->required();
        amor_train->add_option("--out,-o", amor_out, "run directory: checkpoints (amor.safetensors), loss.csv, loss.svg");
        amor_train->add_flag("--resume", a.resume, "continue the run in --out from its latest checkpoint");
        amor_train->add_option("--blocks", a.blocks, "AMOR blocks, 1 to 64")->check(whole(1, 64));
        amor_train->add_option("--heads", a.heads, "attention heads per block (heads × head-dim = d_model)")->check(whole(1, 1024));
        amor_train->add_option("--head-dim", a.head_dim, "attention head width")->check(whole(1, 1024));
        amor_train->add_option("--residual", a.residual, "classic (block 0 replaces the stream by norm_f(h)) | h")
            ->check(CLI::IsMember({"classic", "h"}));
        amor_train->add_option("--kappa", a.kappa, "τ = m̄ + κ·s̄ (adaptive offset mode)")->check(decimal(-100, 100));
        amor_train->add_option("--momentum", a.momentum, "EMA momentum μ of the gate statistics, [0, 1)")->check(decimal(0, 0.999999));
        amor_train->add_option("--offset-mode", a.offset_mode, "adaptive (τ = m̄ + κ·s̄) | fixed (τ = m̄ + gate-offset)")
            ->check(CLI::IsMember({"adaptive", "fixed"}));
        amor_train->add_option("--gate-offset", a.gate_offset, "fixed offset mode: τ = m̄ + this")->check(decimal(-1, 1));
        amor_train->add_flag("--always-on", a.always_on, "every token attends (the always-on comparison, same parameters)");
        training_options(amor_train, o, amor_lr_decay);

        amor_trace = command("amor-trace", "an HTML page of an AMOR model's per-byte entropies and gate decisions (needs --amor)");
        amor_trace->add_option("--text", trace.text, "text file")->required();
        trace_offset_opt = amor_trace->add_option("--offset", trace_offset, "first byte traced")
                               ->check(whole(0, std::int64_t{1} << 50))
                               ->default_str("the held-out offset 4083327 for the KJV, else 0");
        amor_trace->add_option("--bytes", trace.bytes, "bytes traced (one sequence), 2 to 1048576")->check(whole(2, 1 << 20));
        amor_trace->add_option("--out,-o", trace.out, "HTML file to write");

        amor_sweep = command("amor-sweep",
                             "held-out bits/byte and fire rates of an AMOR model as κ is swept at inference (needs --amor), beside the "
                             "backbone alone and the blocks always on",
                             /*inference=*/false);
        amor_sweep->add_option("--text", sweep.text, "text (bytes); the held-out part is the last 5%, as in training (required unless --from-csv)");
        amor_sweep->add_option("--kappa", sweep.kappas, "values of κ in τ = m̄ + κ·s̄ (the trained statistics m̄, s̄ are kept)")
            ->delimiter(',')
            ->allow_extra_args(false)  // one comma-separated list per --kappa (so an empty item cannot hide in a later word)
            ->check(decimal(-100, 100));
        amor_sweep->add_option("--window", sweep.windows, "window lengths of the held-out protocol (shared/models/README.md)")
            ->delimiter(',')
            ->allow_extra_args(false)
            ->check(whole(2, 1 << 20));
        amor_sweep->add_option("--eval-bytes", sweep.eval_bytes, "held-out bytes scored (from the start of the held-out part)")
            ->check(whole(3, std::int64_t{1} << 40));
        amor_sweep->add_option("--csv", sweep.csv, "CSV file to write (one row per variant and window)");
        amor_sweep->add_option("--svg", sweep.svg, "SVG plot to write: bits/byte against the mean fire rate, one line per window");
        auto* calibrate = amor_sweep
                              ->add_option("--calibrate", sweep.calibrate,
                                           "before sweeping, set each gate's statistics m̄, s̄ to the lower median and std of its entropy at "
                                           "this many positions (rounded up to whole windows) of the training split, every block firing "
                                           "(for blocks trained always on, whose statistics never moved: κ then gates them); default: off, "
                                           "the file's statistics")
                              ->check(whole(2, std::int64_t{1} << 24));
        amor_sweep->add_option("--calibrate-window", sweep.calibrate_window, "window length of the calibration (batches of up to 8 windows)")
            ->check(whole(2, 1 << 20))
            ->needs(calibrate);
        amor_sweep->add_option("--seed", sweep.seed, "seed of the calibration's window draw")->check(tool::cli::seed_value())->needs(calibrate);
        amor_sweep->add_option("--from-csv", sweep.from_csv, "re-draw the --svg plot of a finished sweep from its --csv file (no model is loaded)");

        amor_router = command("amor-router",
                              "fit one entropy router per AMOR block (spec.md §5.6: Ĥ from the block's input, no LM-head pass) on "
                              "positions of the text's training split; report its held-out decisions beside the exact gates' (needs --amor)",
                              /*inference=*/false);
        auto& r = router;
        amor_router->add_option("--text", r.text, "text (bytes): positions are recorded from its first 95%, the last 5% is held out")->required();
        amor_router->add_option("--out,-o", r.out, "router file to write (give it to generate / score / logits / amor-trace as --router)");
        amor_router->add_option("--csv", r.csv, "CSV file to write: one row per block (fit, fire rates, decision agreement, bits/byte)");
        amor_router->add_option("--samples", r.samples, "positions recorded per block (the default drops to the training split's size on a shorter text; more is refused)")->default_str("65536")->check(whole(2, std::int64_t{1} << 26));
        amor_router->add_option("--keep", r.keep, "fraction of positions recorded (spreads the samples over more windows)")
            ->check(decimal(1e-4, 1));
        amor_router->add_option("--window", r.window, "bytes per window (recording and held-out scoring)")->check(whole(2, 1 << 20));
        amor_router->add_option("--hidden", r.hidden, "router width (W₁ [hidden, d_model])")->check(whole(1, 1 << 16));
        amor_router->add_option("--epochs", r.epochs, "passes over the recorded positions")->check(whole(1, 10000));
        amor_router->add_option("--batch", r.batch, "positions per AdamW step")->check(whole(1, 1 << 20));
        amor_router->add_option("--lr", r.lr, "peak learning rate (cosine decay to a tenth)")->check(decimal(1e-8, 1));
        amor_router->add_option("--seed", r.seed, "seed of the windows, the recorded positions and the fit");
        amor_router->add_option("--eval-bytes", r.eval_bytes, "held-out bytes scored (from the start of the held-out part)")
            ->check(whole(3, std::int64_t{1} << 40));
    }

    /// The options of the training loop, shared by train and amor-train.
    static void training_options(CLI::App* app, hymix::train::train_options& o, std::string& lr_decay) {
        auto* train = app;
        train->add_option("--steps", o.steps, "optimizer steps (the schedule's length), 1 to 1e9")->check(whole(1, 1'000'000'000));
        train->add_option("--stop-after", o.stop_after, "end this run (with a checkpoint) after N steps; --resume continues it")
            ->check(whole(0, 1'000'000'000));
        train->add_option("--minutes", o.minutes, "stop after this many minutes of training in this call, with a checkpoint (--resume gives a run that much more; 0 = no limit)")->check(decimal(0, 1e6));
        train->add_option("--batch", o.batch, "windows per step, 1 to 65536")->check(whole(1, 65536));
        train->add_option("--seq-len", o.seq_len, "bytes per window, 1 to 1048576")->check(whole(1, 1 << 20));
        train->add_option("--accum", o.accum, "micro-batches per step (gradient accumulation; divides --batch)")->check(whole(1, 65536));
        train->add_option("--lr", o.adamw.lr, "peak learning rate, (0, 10]")->check(decimal(0, 10, true));
        train->add_option("--warmup", o.warmup, "linear warmup steps, 0 to 1e9")->check(whole(0, 1'000'000'000));
        train->add_option("--schedule", lr_decay, "after warmup: constant | linear | cosine")
            ->check(CLI::IsMember({"constant", "linear", "cosine"}));
        train->add_option("--min-lr-ratio", o.min_lr_ratio, "final / peak learning rate of linear and cosine decay, [0, 1]")->check(decimal(0, 1));
        train->add_option("--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay on matrices, [0, 10]")->check(decimal(0, 10));
        train->add_option("--beta1", o.adamw.beta1, "AdamW beta1, [0, 1)")->check(decimal(0, 0.999999));
        train->add_option("--beta2", o.adamw.beta2, "AdamW beta2, [0, 1)")->check(decimal(0, 0.999999));
        train->add_option("--clip", o.clip, "clip the global gradient norm to this (0 = off)")->check(decimal(0, 1e6));
        train->add_option("--seed", o.seed, "seed of the initial weights and of the data order")->check(tool::cli::seed_value());
        train->add_option("--log-every", o.log_every, "steps between loss-curve rows, 1 to 1e6")->check(whole(1, 1'000'000));
        train->add_option("--eval-every", o.eval_every, "steps between held-out evaluations (0 = at the end only)")->check(whole(0, 1'000'000'000));
        train->add_option("--eval-bytes", o.eval_bytes, "held-out bytes scored per evaluation (windows of 512)")->check(whole(2, std::int64_t{1} << 40));
        train->add_option("--checkpoint-every", o.checkpoint_every, "steps between checkpoints (0 = at the end only)")->check(whole(0, 1'000'000'000));
    }

    void define_train() {
        train = app.add_subcommand("train", "train a byte-level language model from scratch on a text file");
        train->footer(tool::exit_code_help());
        train->allow_extras();
        train->set_config("--config", "", "read options from a TOML/INI file: one 'long-option-name = value' per line");
        auto& s = training.spec;
        auto& o = training.train;
        train->add_option("--text", training.text, "training text (bytes); the first 95% train, the rest is held out")->required();
        train->add_option("--out,-o", out_dir, "run directory: checkpoints, loss.csv, loss.svg");
        train->add_flag("--resume", training.resume, "continue the run in --out from its latest checkpoint");
        train->add_option("--threads,-t", training.threads, fmt::format("worker threads, 0 to {} (0 = all cores)", cores))
            ->check(whole(0, cores, fmt::format("0 = all {} cores", cores)));
        train->add_option("--stack", s.stack,
                          "mamba2 | gdn | attention | hybrid (GDN with attention on every --attention-every-th layer) | oryx-gdn | "
                          "oryx-mamba2 (Oryx multi-mixer layers trained in block-random mode)")
            ->check(CLI::IsMember({"mamba2", "gdn", "attention", "hybrid", "oryx-gdn", "oryx-mamba2"}));
        train->add_option("--d-model", s.d_model, "model width, 8 to 65536")->check(whole(8, 65536));
        train->add_option("--layers", s.n_layers, "layers, 1 to 1024")->check(whole(1, 1024));
        train->add_option("--head-dim", s.head_dim, "head width (Mamba-2 P, GDN d_k = d_v, attention and Oryx d_h), 1 to 1024")->check(whole(1, 1024));
        train->add_option("--d-state", s.d_state, "Mamba-2 state size N, 1 to 1024")->check(whole(1, 1024));
        train->add_option("--linear-heads", s.linear_heads, "GDN heads (Oryx: the heads of both read-outs), 1 to 1024")->check(whole(1, 1024));
        train->add_option("--attn-heads", s.attn_heads, "attention query heads, 1 to 1024")->check(whole(1, 1024));
        train->add_option("--attn-kv-heads", s.attn_kv_heads, "attention key/value heads, 1 to 1024")->check(whole(1, 1024));
        train->add_option("--d-ff", s.d_ff, "SwiGLU width (GDN / attention / hybrid / Oryx stacks), 1 to 1048576")->check(whole(1, 1 << 20));
        train->add_option("--attention-every", s.attention_every, "hybrid: layer i is attention iff (i + 1) % N == 0")->check(whole(1, 1024));
        train->add_flag("--tie-embeddings", s.tie_embeddings, "LM head = embedding matrix");
        train->add_option("--block-size", s.oryx_block_size, "Oryx: tokens per block of one random read-out mode, 1 to 1048576")
            ->check(whole(1, 1 << 20));
        train->add_option("--p-attention", s.oryx_p_attention, "Oryx: probability that a block is read out by attention, [0, 1]")
            ->check(decimal(0, 1));
        training_options(train, o, lr_decay);
        train->add_option("--export-bf16", export_bf16, "also write the final model with bf16 weights to this directory");
    }

    /// --schedule: the read-out mode of every token of an Oryx model (spec.md §6.6).
    void mode_schedule_option(CLI::App* c) {
        c->add_option("--schedule", common.modes,
                      "Oryx models: each token's read-out, all_linear | all_attention | linear_prefill_attention_decode | "
                      "periodic:EVERY[:BLOCK[:OFFSET]] | block_random[:P[:BLOCK[:SEED]]] (default: the config's default_mode)");
    }

    /// A command with the options every command has; `inference` adds --weights (training needs fp32 weights, so a
    /// training command has no such option and refuses it as an unexpected argument).
    CLI::App* command(const char* name, const char* what, bool inference = true) {
        auto* c = app.add_subcommand(name, what);
        c->footer(tool::exit_code_help());
        c->allow_extras();  // reported by main in the order given
        c->add_option("--model,-m", common.model, "checkpoint directory (config.json + model.safetensors)")
            ->default_str("$HYMIX_MODEL");
        c->add_option("--threads,-t", common.threads, fmt::format("worker threads, 0 to {} (0 = all cores)", cores))
            ->check(whole(0, cores, fmt::format("0 = all {} cores", cores)))
            ->default_str(fmt::format("0 (all {} cores)", cores));
        c->add_option("--backend", common.backend,
                      "cpu (oneTBB threads, SIMD kernels) or ref (the fp64 reference backend every backend is tested against; slow)")
            ->check(CLI::IsMember({"cpu", "ref"}))
            ->capture_default_str();
        if (inference)
            c->add_option("--weights", common.weights,
                          "storage of the projection weights (mixers, MLPs, embedding, LM head): f32, or for inference bf16 / f16 "
                          "(half the bytes per decode step; exactly the f32 model on weights rounded to that type) or i8 (a quarter: "
                          "8-bit integers with one scale per row; bits/byte cost on the shared checkpoints in docs/quantization.md)")
                ->check(CLI::IsMember({"f32", "bf16", "f16", "i8"}))
                ->capture_default_str();
        if (inference)
            c->add_option("--kv-cache", common.kv_cache,
                          "storage of the attention layers' KV cache: f32, or bf16 / f16 (half the bytes a long-context decode step "
                          "reads; keys and values rounded once when cached, all arithmetic fp32)")
                ->check(CLI::IsMember({"f32", "bf16", "f16"}))
                ->capture_default_str();
        c->add_option("--amor", common.amor,
                      "AMOR file (entropy-gated attention blocks trained on the --model backbone; spec.md §5) to run on top of it");
        if (inference)
            c->add_option("--router", common.router,
                          "router file of the --amor blocks (hymix amor-router; spec.md §5.6): the gates fire on a small regressor's "
                          "estimate of the head entropy instead of the LM head pass (pays once the vocabulary exceeds the router width + 1: "
                          "about 513 with amor-router's default --hidden 512)");
        if (inference)
            c->add_option("--profile-ops", common.profile_ops,
                          "write the time spent in each op (per op and argument shapes: calls, seconds, share) to this CSV file "
                          "after the command, and the largest shares to stderr (cpu backend)");
        c->add_flag("--allow-nonfinite", common.allow_nonfinite,
                    "load weights holding NaN / Inf (each such tensor is named in a warning); logits writes non-finite "
                    "results");
        return c;
    }

    void define_generate() {
        gen = command("generate", "stream bytes generated from a prompt");
        mode_schedule_option(gen);
        auto& g = generate.gen;
        auto& sp = g.sampling;
        sp.temperature = 0.8f;
        auto* prompt = gen->add_option("--prompt,-p", generate.prompt, "prompt text");
        gen->add_option("--file,-f,--prompt-file", generate.prompt_file, "file holding the prompt (bytes as they are)")
            ->excludes(prompt);
        gen->add_option("--n-predict,-n,--max-new", g.max_new,
                        "tokens to generate, -1 to 1e9 (-1 = until a stop string, EOS or the context limit; 0 = prefill only)")
            ->check(whole(-1, 1'000'000'000, "-1 = no limit, 0 = prefill only"));
        gen->add_option("--temperature,--temp", sp.temperature, "sampling temperature, 0 to 1000 (0 = greedy)")
            ->check(decimal(0, 1000));
        gen->add_option("--top-k", sp.top_k, "keep the k most likely tokens, 0 to 1e9 (0 = all)")
            ->check(whole(0, 1'000'000'000, "0 = off"));
        gen->add_option("--top-p", sp.top_p, "nucleus sampling: keep the most likely tokens up to this mass, (0, 1] (1 = off)")
            ->check(decimal(0, 1, true));
        gen->add_option("--min-p", sp.min_p, "keep tokens at least this fraction as likely as the most likely one, [0, 1] (0 = off)")
            ->check(decimal(0, 1));
        gen->add_option("--repeat-penalty", sp.repeat_penalty,
                        "divide positive / multiply negative logits of the last --repeat-last-n tokens by this, (0, 1000] (1 = off)")
            ->check(decimal(0, 1000, true));
        gen->add_option("--repeat-last-n", sp.repeat_last_n, "tokens the repetition penalty looks back at, -1 to 1e9 (-1 = all)")
            ->check(whole(-1, 1'000'000'000, "-1 = all"));
        seed_opt = gen->add_option("--seed,-s", seed, "random seed, 0 to 2^64 - 1")
                       ->check(tool::cli::seed_value())
                       ->default_str("random, printed");
        gen->add_option("--stop", g.stop,
                        "stop once the generated text contains this string (repeatable; it is printed; C escapes \\n \\r \\t \\\\ \\xHH are "
                        "resolved)")
            ->transform(CLI::Validator(
                [](std::string& v) {
                    std::string out;
                    if (auto err = tool::cli::unescape(v, out); !err.empty()) return err;
                    if (out.empty()) return std::string("stop strings must not be empty");
                    v = out;
                    return std::string();
                },
                ""))
            ->default_str("none");
        gen->add_option("--ubatch,-u", g.ubatch, "prompt tokens per forward call, 1 to 1048576 (the prefill chunk: bounds activation memory)")
            ->check(whole(1, 1 << 20));
        ctx_opt = gen->add_option("--ctx-size,-c", ctx_size, "context limit in tokens, prompt + generated, 0 to 1e9 (0 = no limit)")
                      ->check(whole(0, 1'000'000'000, "0 = no limit"))
                      ->default_str("max_position_embeddings of config.json, else none");
        gen->add_flag("--ignore-eos", generate.ignore_eos, "do not stop at the end-of-sequence token(s) of config.json");
    }

    void define_score() {
        score = command("score", "bits per byte of a text file, with a running estimate and its standard error");
        score->add_option("--text", scoring.text, "text file")->required();
        mode_schedule_option(score);
        offset_opt = score->add_option("--offset", offset, "first byte of the scored range, 0 to 2^50")
                         ->check(whole(0, std::int64_t{1} << 50))
                         ->default_str("0; the held-out offset 4083327 for the KJV of shared/data");
        bytes_opt = score->add_option("--bytes", n_bytes, "length of the scored range, 2 to 2^50")
                        ->check(whole(2, std::int64_t{1} << 50))
                        ->default_str("to the end of the text");
        score->add_option("--window", scoring.score.window, "window length L, 1 to 16777216: each window is a fresh sequence")
            ->check(whole(1, 1 << 24));
        score->add_option("--batch", scoring.score.batch, "windows per forward call, 1 to 4096 (memory grows with batch x window)")
            ->check(whole(1, 4096));
        score->add_flag("--full-windows", scoring.score.full_windows_only,
                        "score whole windows only (s < n - L), the protocol of shared/models/README.md; by default the "
                        "last window is shortened so every byte but the first is scored");
    }

    /// The command given (nullptr when none was), after parsing.
    CLI::App* chosen() const {
        for (auto* c : {info, gen, score, logits, train, amor_train, amor_trace, amor_sweep, amor_router})
            if (c->parsed()) return c;
        return nullptr;
    }

    /// Copies the options whose absence means something into the commands' optional fields.
    void settle() {
        if (seed_opt->count() > 0) generate.seed = seed;
        if (ctx_opt->count() > 0) generate.ctx_size = ctx_size;
        if (offset_opt->count() > 0) scoring.offset = offset;
        if (bytes_opt->count() > 0) scoring.bytes = n_bytes;
        training.train.decay = hymix::train::parse_lr_decay(lr_decay);
        training.out = out_dir;
        training.export_bf16 = export_bf16;
        amor.train.decay = hymix::train::parse_lr_decay(amor_lr_decay);
        amor.out = amor_out;
        if (trace_offset_opt->count() > 0) trace.offset = trace_offset;
    }
};

}  // namespace

int main(int argc, char** argv) {
    command_line cl;
    try {
        cl.app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help, --version
        return cl.app.exit(e);
    } catch (const CLI::ParseError& e) {
        const auto* c = cl.chosen();
        return fail(tool::exit_usage, fmt::format("{} (see hymix {}--help)", parse_message(e), c ? c->get_name() + " " : ""));
    }
    auto* cmd = cl.chosen();
    if (cmd && cmd == cl.amor_sweep)
        if (const auto m = empty_list_item(argc, argv, {"--kappa", "--window"}); !m.empty())
            return fail(tool::exit_usage, m + " (see hymix amor-sweep --help)");
    const auto& stray = cl.app.remaining();
    if (!cmd)
        return fail(tool::exit_usage,
                    stray.empty() ? "no command given (commands: info, generate, score, logits, train, amor-train, amor-trace, amor-sweep, amor-router; see hymix --help)"
                                  : "unknown command '" + stray.front() + "' (commands: info, generate, score, logits, train, amor-train, amor-trace, amor-sweep, amor-router; see hymix --help)");
    if (!cmd->remaining().empty() || !stray.empty()) {
        auto extra = cmd->remaining();
        extra.insert(extra.end(), stray.begin(), stray.end());
        return fail(tool::exit_usage, extras_message(extra, cmd->get_name()) + " (see hymix " + cmd->get_name() + " --help)");
    }
    cl.settle();

    try {
        if (cmd == cl.info) return tool::run_info(cl.common);
        if (cmd == cl.gen) return tool::run_generate(cl.common, cl.generate);
        if (cmd == cl.score) return tool::run_score(cl.common, cl.scoring);
        if (cmd == cl.train) return tool::run_train(cl.training);
        if (cmd == cl.amor_train) return tool::run_amor_train(cl.common, cl.amor);
        if (cmd == cl.amor_trace) return tool::run_amor_trace(cl.common, cl.trace);
        if (cmd == cl.amor_sweep) return tool::run_amor_sweep(cl.common, cl.sweep);
        if (cmd == cl.amor_router) return tool::run_amor_router(cl.common, cl.router);
        return tool::run_logits(cl.common, cl.logit_files);
    } catch (const tool::usage_error& e) {
        return fail(tool::exit_usage, e.what());
    } catch (const hymix::nonfinite_error& e) {
        return fail(tool::exit_nonfinite, e.what());
    } catch (const hymix::error& e) {
        return fail(tool::exit_bad_input, e.what());
    } catch (const std::bad_alloc&) {
        return fail(tool::exit_out_of_memory, "out of memory (the model, batch, window or --ubatch is too large for this machine)");
    } catch (const std::exception& e) {
        return fail(tool::exit_internal, std::string(e.what()) + " (an internal error: please report it)");
    }
}
