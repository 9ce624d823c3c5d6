// `hymix amor-train`: post-hoc AMOR (spec.md §5) — K entropy-gated attention blocks trained dense-with-mask on a
// frozen backbone checkpoint (HF Mamba-2 or a Qwen3.5 GDN stack), with the training engine of `hymix train`
// (progress, loss.csv / loss.svg, resumable checkpoints). Each checkpoint directory holds amor.safetensors, which
// `hymix generate/score --model BACKBONE --amor FILE` and auto_model load. At the end the held-out bits/byte and the
// per-block fire rates at windows 512 and 2048 are printed.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/amor.hpp"
#include "hymix/models/amor_calibrate.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/models/check_weights.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/train/plot.hpp"
#include "hymix/train/trainer.hpp"
#include "load.hpp"
#include "amor_sweep.hpp"
#include "tool.hpp"

namespace tool {

namespace {

hymix::models::amor_config amor_config_of(const amor_train_options& o, const std::string& backbone) {
    hymix::models::amor_config c;
    c.backbone = backbone;
    c.n_amor_blocks = o.blocks;
    c.residual_mode = o.residual;
    c.n_heads = o.heads;
    c.head_dim = o.head_dim;
    c.gate.kappa = o.kappa;
    c.gate.momentum = o.momentum;
    c.gate.gate_offset = o.gate_offset;
    c.gate.offset_mode = o.offset_mode == "fixed" ? hymix::amor_offset_mode::fixed : hymix::amor_offset_mode::adaptive;
    c.always_on = o.always_on;
    return c;
}

/// The options of an AMOR run that a resumed call must repeat: the blocks' shape and their gate (amor_config keys).
nlohmann::json resume_fixed(const hymix::models::amor_config& c) {
    const auto j = c.to_json();
    nlohmann::json out;
    for (const char* k : {"backbone", "n_amor_blocks", "residual_mode", "n_heads", "head_dim", "offset_k", "ema_momentum", "gate_offset",
                          "offset_mode", "attention_mode"})
        out[k] = j.at(k);
    return out;
}

/// What identifies a backbone checkpoint wherever its folder lies: a 64-bit FNV-1a hash of its config.json's bytes (as
/// written: Python's bare Infinity / NaN included) and the size of its weights.
nlohmann::json backbone_identity(const std::filesystem::path& dir) {
    std::ifstream cf(dir / "config.json", std::ios::binary);
    if (!cf) throw hymix::io_error("cannot read '" + (dir / "config.json").string() + "'");
    std::uint64_t h = 14695981039346656037ull;
    for (char ch; cf.get(ch);) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    std::uintmax_t bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.is_regular_file() && e.path().extension() == ".safetensors" && e.path().filename().string().rfind("model", 0) == 0)
            bytes += e.file_size();
    return {{"config_fnv1a64", fmt::format("{:016x}", h)}, {"weights_bytes", bytes}};
}

/// Whether a parameter of the AMOR stack is trained: the AMOR layers (index >= n_backbone) and final_norm.
bool amor_trainable(const std::string& name, std::int64_t n_backbone) {
    if (name == "final_norm") return true;
    if (name.rfind("layers.", 0) != 0) return false;
    return std::stoll(name.substr(7)) >= n_backbone;
}

template <class S, class Backbone>
int train_amor(const common_options& c, const amor_train_options& o, Backbone bb, const std::string& backbone_kind,
               const hymix::train::byte_corpus& corpus, bool resume) {
    namespace fs = std::filesystem;
    const std::int64_t n_backbone = bb.n_layers();
    auto ac = amor_config_of(o, backbone_kind);
    const fs::path file = resume ? hymix::train::latest_checkpoint(o.out) / "amor.safetensors" : fs::path();
    if (resume) {
        const auto saved = hymix::models::read_amor_config(file);
        if (resume_fixed(saved) != resume_fixed(ac))
            throw hymix::config_error(fmt::format("amor-train --resume: {} was trained with {}, this call asks for {} (these options "
                                                  "must match: repeat the run's --blocks, --heads, --head-dim, --residual, --kappa, "
                                                  "--momentum, --gate-offset, --offset-mode and --always-on, and its backbone)",
                                                  file.string(), resume_fixed(saved).dump(), resume_fixed(ac).dump()));
        console::note("amor-train: resuming from {}", file.parent_path().string());
        ac = saved;
    }
    S m = resume ? hymix::models::load_amor<S>(std::move(bb), file) : hymix::models::make_amor<S>(std::move(bb), ac, o.train.seed);
    ac.d_model = m.config().d_model;
    ac.vocab_size = m.config().vocab_size;
    hymix::cpu_backend be(c.threads);
    std::int64_t trained = 0, total = 0;
    m.for_each_param([&](const std::string& n, hymix::tensor<float>& t) {
        total += t.numel();
        if (amor_trainable(n, n_backbone)) trained += t.numel();
    });
    console::note("amor-train: {} backbone layers (frozen) + {} AMOR blocks ({} heads × {}, {} mode, κ {}{}); {} of {} parameters "
                  "trained; {} threads",
                  n_backbone, ac.n_amor_blocks, ac.n_heads, ac.head_dim, ac.residual_mode, ac.gate.kappa, ac.always_on ? ", always on" : "",
                  trained, total, be.num_threads());
    hymix::train::train_setup<S> setup;
    setup.frozen = [n_backbone](const std::string& n) { return !amor_trainable(n, n_backbone); };
    setup.frozen_prefix = n_backbone;
    setup.save = [&](S& model, const fs::path& dir) {
        fs::create_directories(dir);
        hymix::models::save_amor(model, n_backbone, ac, dir / "amor.safetensors");
    };
    const auto r = train_interruptible("amor-train", o.train, [&](const hymix::train::train_options& t) {
        return hymix::train::train_model(be, m, corpus, t, setup, o.out, resume, &std::cerr);
    });
    fmt::print("trained {} steps ({} tokens) in {:.1f} s: {:.0f} tokens/s; final train loss {}\n", r.steps_done, r.tokens,
               r.seconds, r.tokens_per_s, std::isfinite(r.final_loss) ? fmt::format("{:.4f} nats", r.final_loss) : std::string("- (no step trained)"));
    if (r.interrupted) {
        console::note("amor-train: interrupted at step {}: checkpoint {} written; --resume continues the run", r.steps_done,
                      r.checkpoint.string());
        return exit_interrupted;
    }
    fmt::print("amor file: {}\n", (r.checkpoint / "amor.safetensors").string());
    const std::span<const std::uint8_t> text(corpus.bytes);
    for (std::int64_t L : {512, 2048}) {
        const std::int64_t n = std::min<std::int64_t>(o.train.eval_bytes, corpus.n_heldout());
        if (n <= L) continue;
        const auto e = hymix::train::evaluate_heldout(be, m, text, corpus.train_end, n, L);
        std::string rates;
        for (double f : e.fire_rate) rates += fmt::format(" {:.3f}", f);
        fmt::print("held-out window {}: bits/byte {:.5f}; fire rate per block:{}\n", L, e.bits_per_byte, rates);
    }
    return exit_ok;
}

}  // namespace

int run_amor_train(const common_options& c, const amor_train_options& o) {
    namespace fs = std::filesystem;
    const auto dir = resolve_model_dir(c.model);
    const auto corpus = hymix::train::byte_corpus::load(o.text);
    const bool resume = o.resume && fs::exists(o.out / "latest");
    if (o.resume && !resume) console::note("amor-train: --resume given but '{}' holds no checkpoint: starting fresh", o.out.string());
    if (!o.resume && fs::exists(o.out / "latest"))
        throw usage_error(fmt::format("'{}' already holds a training run: pass --resume to continue it, or choose another --out", o.out.string()));
    hymix::models::checkpoint_reader rd(dir);
    const auto kind = hymix::models::amor_backbone_kind(rd.config(), rd.config_path());  // before anything is written
    // The backbone a run was started on (backbone.json in --out): a resumed call must load the same one.
    const auto ident = backbone_identity(dir);
    const auto ident_file = o.out / "backbone.json";
    if (resume && fs::exists(ident_file)) {
        std::ifstream f(ident_file);
        const auto saved = nlohmann::json::parse(f, nullptr, false);
        if (saved.is_discarded()) throw hymix::format_error(ident_file.string() + ": not JSON");
        if (saved != ident)
            throw hymix::config_error(fmt::format("amor-train --resume: the run in '{}' was trained on another backbone than --model '{}' "
                                                  "({} differs: its config.json or the size of its weights): pass the run's own backbone",
                                                  o.out.string(), dir.string(), ident_file.string()));
    } else if (!resume) {
        fs::create_directories(o.out);
        std::ofstream(ident_file) << ident.dump(1) << "\n";
    }
    if (kind == "mamba2")
        return train_amor<hymix::models::amor_mamba2_stack<>>(c, o, hymix::models::load_hf_mamba2<hymix::models::hf_mamba2_stack>(rd), "mamba2",
                                                             corpus, resume);
    return train_amor<hymix::models::amor_gdn_stack<>>(c, o, hymix::models::load_hf_qwen3_5<hymix::models::qwen3_5_gdn_stack>(rd), "gdn", corpus,
                                                      resume);
}

namespace {

/// One row of a sweep: the model variant, the window and what the held-out protocol measured.
struct sweep_row {
    std::string variant;  // "backbone", "untrained", "kappa", "as_trained" (fixed offset mode) or "always_on"
    double kappa = 0;
    std::int64_t window = 0;
    hymix::train::heldout_stats r;
    double mean_fire() const {
        if (r.fire_rate.empty()) return variant == "backbone" ? 0.0 : 1.0;
        double s = 0;
        for (double f : r.fire_rate) s += f;
        return s / static_cast<double>(r.fire_rate.size());
    }
};

/// One point of a sweep's plot.
struct sweep_point {
    std::string variant;
    std::int64_t window = 0;
    double fire = 0, bits_per_byte = 0;
};

/// The sweep plot: per window, the AMOR blocks' bits/byte against their mean fire rate (the κ rows and always on: a
/// line with markers) beside the backbone alone (a flat line). The untrained stack is another model and is left out.
void write_sweep_svg(const std::vector<sweep_point>& pts, const std::string& what, const std::filesystem::path& svg) {
    hymix::train::plot_spec p;
    p.title = "AMOR, κ swept at inference: " + what;
    p.x_label = "fire rate (mean over blocks)";
    p.y_label = "held-out bits/byte";
    std::vector<std::int64_t> windows;
    for (const auto& q : pts)
        if (std::find(windows.begin(), windows.end(), q.window) == windows.end()) windows.push_back(q.window);
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};  // one per window: AMOR dots, backbone plain
    for (std::size_t w = 0; w < windows.size(); ++w) {
        const std::int64_t L = windows[w];
        const std::string color = colors[w % 4];
        hymix::train::plot_series amor{fmt::format("AMOR @{}", L), {}, color, true}, bb{fmt::format("backbone @{}", L), {}, color, false};
        for (const auto& q : pts) {
            if (q.window != L) continue;
            if (q.variant == "kappa" || q.variant == "as_trained" || q.variant == "always_on") amor.points.emplace_back(q.fire, q.bits_per_byte);
            if (q.variant == "backbone") bb.points = {{0.0, q.bits_per_byte}, {1.0, q.bits_per_byte}};
        }
        std::sort(amor.points.begin(), amor.points.end());
        p.series.push_back(std::move(amor));
        if (!bb.points.empty()) p.series.push_back(std::move(bb));
    }
    hymix::train::write_svg(svg, p);
}

/// `s` with bytes outside printable ASCII shown as '?', at most `n` of them (for messages quoting a file's line).
std::string printable(const std::string& s, std::size_t n = 120) {
    std::string o;
    for (char ch : s.substr(0, n)) o += (ch >= 32 && ch < 127) ? ch : '?';
    return o;
}

/// The points of a CSV written by `amor-sweep --csv` (variant,kappa,window,bits_per_byte,scored_bytes,fire_rate_mean,...):
/// every cell used must parse whole, bits/byte be finite and positive, the fire rate lie in [0, 1], the variant be one
/// amor-sweep writes. Blank lines are skipped. Throws io_error (unreadable) and format_error naming the file and line.
std::vector<sweep_point> read_sweep_csv(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw hymix::io_error("cannot open sweep CSV '" + path.string() + "'");
    std::vector<sweep_point> pts;
    std::string line;
    auto number = [](const std::string& cell, double& v) {
        char* end = nullptr;
        v = std::strtod(cell.c_str(), &end);
        return !cell.empty() && end == cell.c_str() + cell.size() && std::isfinite(v);
    };
    for (std::int64_t no = 1; std::getline(f, line); ++no) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const auto where = path.string() + ":" + std::to_string(no);
        if (no == 1) {
            if (line.rfind("variant,kappa,window,bits_per_byte,scored_bytes,fire_rate_mean", 0) != 0)
                throw hymix::format_error(where + ": not a CSV written by hymix amor-sweep --csv (header '" + printable(line, 80) + "')");
            continue;
        }
        if (line.empty()) continue;
        std::vector<std::string> cell;
        std::stringstream ss(line);
        for (std::string x; std::getline(ss, x, ',');) cell.push_back(x);
        double window = 0, bpb = 0, fire = 0;
        const bool known = cell.size() >= 6 && (cell[0] == "backbone" || cell[0] == "untrained" || cell[0] == "kappa" ||
                                                cell[0] == "as_trained" || cell[0] == "always_on");
        if (!known || !number(cell[2], window) || window < 1 || window != std::floor(window) || !number(cell[3], bpb) || !(bpb > 0) ||
            !number(cell[5], fire) || fire < 0 || fire > 1)
            throw hymix::format_error(where + ": expected a row variant,kappa,window,bits_per_byte,scored_bytes,fire_rate_mean,... with a "
                                      "known variant, a whole window, finite positive bits/byte and a fire rate in [0, 1]; found '" +
                                      printable(line) + "'");
        pts.push_back({cell[0], static_cast<std::int64_t>(window), fire, bpb});
    }
    if (pts.empty()) throw hymix::format_error(path.string() + ": no rows");
    return pts;
}

/// `bb` is the backbone, read once: the untrained stack is built on a copy of it and the trained one takes it;
/// `trained` is the AMOR file's configuration, already checked against the backbone's kind.
template <class S, class Backbone>
int sweep_amor(const common_options& c, const amor_sweep_options& o, Backbone bb, const hymix::models::amor_config& trained,
               const hymix::train::byte_corpus& corpus) {
    hymix::cpu_backend be(c.threads);
    const std::span<const std::uint8_t> text(corpus.bytes);
    const std::int64_t n = std::min<std::int64_t>(o.eval_bytes, corpus.n_heldout());
    for (std::int64_t L : o.windows)
        if (n <= L)
            throw usage_error(fmt::format("--window {}: the held-out range has {} byte(s) (the last 5% of '{}', at most --eval-bytes {}); a "
                                          "window needs more",
                                          L, n, o.text, o.eval_bytes));
    if (o.calibrate > 0 && corpus.n_train() <= o.calibrate_window)
        throw usage_error(fmt::format("--calibrate-window {}: the training split of '{}' has {} byte(s)", o.calibrate_window, o.text,
                                      corpus.n_train()));
    // κ moves τ = m̄ + κ·s̄ only for adaptive gates whose statistics were learned (an always-on run never moves them)
    // or calibrated here (--calibrate).
    const bool adaptive = trained.gate.offset_mode == hymix::amor_offset_mode::adaptive;
    if (o.calibrate > 0 && !adaptive)
        throw usage_error(fmt::format("amor-sweep --calibrate: the file's gates use the fixed offset mode (τ = m̄ + {}); κ applies in the "
                                      "adaptive mode only",
                                      trained.gate.gate_offset));
    const bool sweep_kappa = adaptive && (!trained.always_on || o.calibrate > 0);
    if (!sweep_kappa)
        console::note("amor-sweep: the file's blocks were trained {}: κ does not apply, so the rows are the backbone, the untrained "
                      "stack, {}and always on",
                      trained.always_on ? "always on (their gate statistics never moved)" : "with the fixed offset mode (τ = m̄ + gate_offset)",
                      trained.always_on ? "" : "the blocks as trained ");
    std::vector<sweep_row> rows;
    auto report = [&](sweep_row row) {
        std::string rates;
        for (double f : row.r.fire_rate) rates += fmt::format(" {:.4f}", f);
        fmt::print("{:<10} kappa {:>7} window {:>5}: bits/byte {:.5f}  fire rate mean {:.4f}{}{}\n", row.variant,
                   row.variant == "kappa" ? fmt::format("{:.3f}", row.kappa) : std::string("-"), row.window, row.r.bits_per_byte,
                   row.mean_fire(), rates.empty() ? "" : "  per block:", rates);
        std::fflush(stdout);
        rows.push_back(std::move(row));
    };
    auto eval = [&](const auto& model, std::int64_t L) { return hymix::train::evaluate_heldout(be, model, text, corpus.train_end, n, L); };
    {
        if (bb.config().d_model != trained.d_model || bb.config().vocab_size != trained.vocab_size)
            throw hymix::config_error(fmt::format("{}: AMOR blocks for d_model {} and vocab_size {}, but the backbone '{}' has d_model {} and "
                                                  "vocab_size {}",
                                                  c.amor, trained.d_model, trained.vocab_size, c.model, bb.config().d_model,
                                                  bb.config().vocab_size));
        console::note("amor-sweep: {} AMOR blocks (κ {} in training{}); held-out bytes [{}, {}) of '{}'; {} threads", trained.n_amor_blocks,
                      trained.gate.kappa, trained.always_on ? ", always on" : "", corpus.train_end, corpus.train_end + n, o.text,
                      be.num_threads());
        for (std::int64_t L : o.windows) report({"backbone", 0, L, eval(bb, L)});
        // The same blocks as initialised (W_o = 0: they add nothing, but the classic mode re-normalises the stream).
        const S fresh = hymix::models::make_amor<S>(Backbone(bb), trained, 0);
        for (std::int64_t L : o.windows) report({"untrained", 0, L, eval(fresh, L)});
    }
    S m = hymix::models::load_amor<S>(std::move(bb), c.amor);
    const auto for_gates = [&](auto&& f) { hymix::models::for_each_entropy_gate(m, f); };
    if (o.calibrate > 0) {
        const std::int64_t windows = (o.calibrate + o.calibrate_window - 1) / o.calibrate_window;
        console::note("amor-sweep: calibrating the gate statistics on {} positions per block ({} whole {}-byte windows of the training "
                      "split, seed {}, every block firing){}",
                      windows * o.calibrate_window, windows, o.calibrate_window, o.seed,
                      trained.always_on ? "" : "; they replace the statistics the blocks were trained with");
        std::vector<std::pair<float, float>> trained_stats;
        for_gates([&](hymix::entropy_ema& g) { trained_stats.emplace_back(g.running_threshold(), g.running_std()); });
        hymix::train::window_sampler sampler(corpus, o.calibrate_window, o.seed);
        const auto cal = hymix::models::calibrate_entropy_gates(be, m, sampler, o.calibrate, 8);
        for (std::size_t b = 0; b < cal.size(); ++b)
            fmt::print("calibrated block {}: m̄ {:.5f}  s̄ {:.5f}  ({} positions; the file's m̄ {:.5f}, s̄ {:.5f})\n", b, cal[b].running_threshold,
                       cal[b].running_std, cal[b].positions, trained_stats[b].first, trained_stats[b].second);
    }
    if (sweep_kappa) {
        for (float k : o.kappas) {
            for_gates([&](auto& g) { g.set_always_on(false), g.set_kappa(k); });
            for (std::int64_t L : o.windows) report({"kappa", k, L, eval(m, L)});
        }
    } else if (!trained.always_on) {
        for (std::int64_t L : o.windows) report({"as_trained", 0, L, eval(m, L)});
    }
    for_gates([&](auto& g) { g.set_always_on(true); });
    for (std::int64_t L : o.windows) report({"always_on", 0, L, eval(m, L)});

    if (!o.csv.empty()) {
        std::string csv = "variant,kappa,window,bits_per_byte,scored_bytes,fire_rate_mean";
        const std::size_t nb = static_cast<std::size_t>(trained.n_amor_blocks);
        for (std::size_t b = 0; b < nb; ++b) csv += fmt::format(",fire_rate_block{}", b);
        csv += "\n";
        for (const auto& r : rows) {
            csv += fmt::format("{},{},{},{:.6f},{},{:.6f}", r.variant, r.variant == "kappa" ? fmt::format("{:g}", r.kappa) : "", r.window,
                               r.r.bits_per_byte, r.r.scored, r.mean_fire());
            for (std::size_t b = 0; b < nb; ++b)
                csv += b < r.r.fire_rate.size() ? fmt::format(",{:.6f}", r.r.fire_rate[b]) : std::string(r.variant == "backbone" ? ",0" : ",1");
            csv += "\n";
        }
        hymix::train::detail::write_text_atomic(o.csv, csv);
        fmt::print("wrote {}\n", o.csv.string());
    }
    if (!o.svg.empty()) {
        std::vector<sweep_point> pts;
        for (const auto& r : rows) pts.push_back({r.variant, r.window, r.mean_fire(), r.r.bits_per_byte});
        write_sweep_svg(pts, std::filesystem::path(c.model).filename().string() + " + " + std::filesystem::path(c.amor).filename().string(), o.svg);
        fmt::print("wrote {}\n", o.svg.string());
    }
    return exit_ok;
}

/// `v` without repeated values, first occurrences kept in order.
template <class T>
std::vector<T> unique_in_order(const std::vector<T>& v) {
    std::vector<T> out;
    for (const T& x : v)
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    return out;
}

}  // namespace

int run_amor_sweep(const common_options& c, const amor_sweep_options& opt) {
    if (c.backend != "cpu") throw usage_error("amor-sweep runs on the cpu backend only (--backend " + c.backend + ")");
    require_writable(opt.svg, "--svg");
    if (!opt.from_csv.empty()) {  // re-draw a finished sweep
        if (opt.svg.empty()) throw usage_error("amor-sweep --from-csv draws a finished sweep: give the plot's path with --svg");
        if (opt.calibrate > 0) throw usage_error("amor-sweep: --calibrate and --from-csv cannot be combined (--from-csv only re-draws a finished sweep)");
        std::error_code ec;
        if (std::filesystem::equivalent(opt.svg, opt.from_csv, ec)) throw usage_error("--svg would overwrite the --from-csv file");
        write_sweep_svg(read_sweep_csv(opt.from_csv), opt.from_csv.filename().string(), opt.svg);
        fmt::print("wrote {}\n", opt.svg.string());
        return exit_ok;
    }
    if (c.amor.empty()) throw usage_error("amor-sweep needs --amor FILE (and the backbone as --model)");
    if (opt.text.empty()) throw usage_error("amor-sweep needs --text FILE (the held-out part is its last 5%)");
    if (opt.kappas.empty()) throw usage_error("amor-sweep: --kappa needs at least one value");
    require_writable(opt.csv, "--csv");
    amor_sweep_options o = opt;
    o.kappas = unique_in_order(o.kappas);
    o.windows = unique_in_order(o.windows);
    auto in = open_amor_inputs(c);
    auto& rd = in.reader;
    const auto& trained = in.amor;
    const auto corpus = hymix::train::byte_corpus::load(o.text);
    if (in.model_type == "mamba2")
        return sweep_amor<hymix::models::amor_mamba2_stack<>>(c, o, hymix::models::load_hf_mamba2<hymix::models::hf_mamba2_stack>(rd), trained,
                                                              corpus);
    return sweep_amor<hymix::models::amor_gdn_stack<>>(c, o, hymix::models::load_hf_qwen3_5<hymix::models::qwen3_5_gdn_stack>(rd), trained,
                                                       corpus);
}

}  // namespace tool

namespace tool {

namespace {

std::string html_escape_byte(unsigned char c) {
    switch (c) {
        case '&': return "&amp;";
        case '<': return "&lt;";
        case '>': return "&gt;";
        case '"': return "&quot;";
        case '\n': return "<br>";
        default: break;
    }
    if (c < 32 || c >= 127) return fmt::format("&#x{:x};", c < 32 ? 0x2400 + c : 0xfffd);
    return std::string(1, static_cast<char>(c));
}

/// White (H = 0) to red (H = 1).
std::string heat(double h) {
    h = std::clamp(h, 0.0, 1.0);
    const int g = static_cast<int>(255 - 200 * h);
    return fmt::format("rgb(255,{},{})", g, g);
}

std::string histogram_svg(const std::vector<float>& H, float tau, const std::string& title) {
    const int bins = 40, W = 360, Ht = 160, L = 36, B = 24;
    std::vector<int> count(bins, 0);
    for (float h : H) count[static_cast<std::size_t>(std::clamp(static_cast<int>(h * bins), 0, bins - 1))]++;
    const int mx = std::max(1, *std::max_element(count.begin(), count.end()));
    std::string s = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-size=\"11\" font-family=\"sans-serif\">", W, Ht);
    s += fmt::format("<text x=\"{}\" y=\"12\">{}</text>", L, title);
    const double bw = static_cast<double>(W - L - 8) / bins;
    for (int b = 0; b < bins; ++b) {
        const double h = static_cast<double>(count[static_cast<std::size_t>(b)]) / mx * (Ht - B - 20);
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#6a8fc7\"/>", L + b * bw, Ht - B - h, bw - 1, h);
    }
    const double tx = L + std::clamp(static_cast<double>(tau), 0.0, 1.0) * (W - L - 8);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"18\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"2\"/>", tx, tx, Ht - B);
    s += fmt::format("<text x=\"{:.1f}\" y=\"28\" fill=\"#c00\">τ = {:.3f}</text>", tx + 3, tau);
    for (double t : {0.0, 0.25, 0.5, 0.75, 1.0})
        s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>", L + t * (W - L - 8), Ht - 8, t);
    s += fmt::format("<text x=\"2\" y=\"{}\">{}</text></svg>", Ht - B, 0);
    return s;
}

}  // namespace

int run_amor_trace(const common_options& c, const amor_trace_options& o) {
    if (c.amor.empty()) throw usage_error("amor-trace needs --amor FILE (and the backbone as --model)");
    if (!c.profile_ops.empty())
        throw usage_error("amor-trace does not profile its ops: time the same model and text with score --profile-ops");
    const std::string text = read_file(o.text, "--text");
    const auto size = static_cast<std::int64_t>(text.size());
    const std::int64_t offset = o.offset.value_or(size == 4'298'239 ? 4'083'327 : 0);
    if (offset >= size) throw usage_error(fmt::format("--offset {} is past the end of '{}' ({} bytes)", offset, o.text, size));
    const std::int64_t n = std::min<std::int64_t>(o.bytes, size - offset);
    if (n < 2) throw usage_error("amor-trace: at least 2 bytes are needed");
    auto m = load_cpu_model(c);
    auto cache = m.model.make_cache(1);
    std::vector<std::int32_t> tok(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) tok[static_cast<std::size_t>(i)] = static_cast<unsigned char>(text[static_cast<std::size_t>(offset + i)]);
    hymix::tensor<float> logits({n, m.model.info().vocab_size});
    m.model.forward(cache, hymix::seq_batch::dense(1, n), tok, logits.view<2>());
    const auto stats = m.model.stats(cache);
    if (stats.empty()) throw usage_error("amor-trace: the model has no gated blocks");
    // The page.
    std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>AMOR trace</title><style>"
                       "body{font-family:sans-serif;margin:24px;max-width:1100px}"
                       ".t{font-family:monospace;font-size:15px;line-height:2.1;white-space:normal;word-break:break-all}"
                       ".t span{position:relative;display:inline-block;min-width:0.6em;padding-bottom:"
                     + std::to_string(3 * stats.size()) +
                       "px}.t i{position:absolute;left:0;right:0;height:2px}table{border-collapse:collapse}"
                       "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}</style></head><body>\n";
    page += fmt::format("<h1>AMOR trace</h1><p>model {} + {}; text {} bytes [{}, {}). Background: {} of block 0 "
                        "(white 0 → red 1). Bars under a byte: the blocks that fired there.</p>\n",
                        m.dir.filename().string(), std::filesystem::path(c.amor).filename().string(),
                        std::filesystem::path(o.text).filename().string(), offset, offset + n,
                        c.router.empty() ? std::string("normalised entropy H")
                                         : "the fitted router's estimate Ĥ of the normalised entropy (" +
                                               std::filesystem::path(c.router).filename().string() + "; clamped to [0, 1] in colour)");
    static const char* colors[] = {"#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};
    page += "<table><tr><th>block</th><th>layer</th><th>fired</th><th>fire rate</th><th>τ</th><th>mean H</th></tr>\n";
    for (std::size_t b = 0; b < stats.size(); ++b) {
        const auto& s = stats[b];
        double mean = 0;
        for (float h : s.score) mean += h;
        mean /= std::max<std::size_t>(1, s.score.size());
        page += fmt::format("<tr><td style=\"color:{}\">{}</td><td>{}</td><td>{} / {}</td><td>{:.3f}</td><td>{:.4f}</td><td>{:.4f}</td></tr>\n",
                            colors[b % 6], b, s.layer, s.fired, s.rows, s.fire_rate(), s.threshold, mean);
    }
    page += "</table>\n<div class=\"t\">";
    const auto& h0 = stats[0].score;
    for (std::int64_t i = 0; i < n; ++i) {
        const auto iu = static_cast<std::size_t>(i);
        const double h = iu < h0.size() ? h0[iu] : 0.0;
        std::string marks, tip = fmt::format("byte {}: H =", offset + i);
        for (std::size_t b = 0; b < stats.size(); ++b) {
            const bool fired = iu < stats[b].score.size() && stats[b].score[iu] > stats[b].threshold;
            tip += fmt::format(" {:.3f}{}", iu < stats[b].score.size() ? stats[b].score[iu] : 0.0f, fired ? "*" : "");
            if (fired) marks += fmt::format("<i style=\"bottom:{}px;background:{}\"></i>", 3 * b, colors[b % 6]);
        }
        page += fmt::format("<span style=\"background:{}\" title=\"{}\">{}{}</span>", heat(h), tip,
                            html_escape_byte(static_cast<unsigned char>(text[static_cast<std::size_t>(offset + i)])), marks);
    }
    page += "</div>\n<h2>Entropy per block</h2><div>";
    for (std::size_t b = 0; b < stats.size(); ++b)
        page += histogram_svg(stats[b].score, stats[b].threshold, fmt::format("block {} (layer {}): fire rate {:.3f}", b, stats[b].layer, stats[b].fire_rate()));
    page += "</div></body></html>\n";
    const auto tmp = o.out + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f || !(f << page) || !f.flush()) throw hymix::io_error("cannot write '" + tmp + "'");
    }
    std::filesystem::rename(tmp, o.out);
    console::end_lines();
    std::string rates;
    for (const auto& s : stats) rates += fmt::format(" {:.3f}", s.fire_rate());
    fmt::print("wrote {} ({} bytes traced; fire rate per block:{})\n", o.out, n, rates);
    return exit_ok;
}

}  // namespace tool
