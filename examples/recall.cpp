// The recall benchmark of issue 10: trains byte-level stacks of one size on associative recall (train/recall.hpp:
// MQAR pairs followed by queries, and needles at random depths of the KJV text) and measures answer accuracy —
// single-mixer stacks as they are, Oryx stacks under the library's mode schedules (schedule/mode_schedule.hpp): all
// linear, all attention, linear_prefill_attention_decode (a linear prefill of the context, then attention "decode" of
// the questions), attention only at the asked keys (a mode_list per task), and block_random over blocks of 64 tokens
// with probability f (the attention fraction). Training uses the ordinary trainer (loss curves and
// checkpoints in OUT_DIR/<stack>/) with the recall batches in place of text windows; the loss is the mean over the
// answers, and the trainer scales gradients by 1 / (tokens in the batch), so gradient norms are smaller than for
// text by the share of answer positions (AdamW's updates do not depend on that scale). Evaluation splits each
// sequence into its context (one prefill call, only the last logits kept) and its query region (a second call on the
// same cache), and scores every stack on the same held-out sequences.
//
//   example_recall TEXT OUT_DIR [key=value ...]
// keys (defaults): stacks=oryx-gdn,gdn,attention  minutes=3  steps=100000  threads=0 (all)  d_model=128  layers=2
//   heads=4  head_dim=32  d_ff=256  d_state=32  batch=32  seq_len=256  lr=3e-3  warmup=100  seed=1  block=32 (Oryx
//   training blocks)  p_attention=0.5  train_tasks=mqar:256:16,needle:256:4  warm_tasks=mqar:64:16 (stage 1, at its
//   own seq_len; empty: no stage 1)  warm_fraction=0.3 (stage 1's share of minutes and of steps; minutes=0: no time
//   limit)  eval_tasks=mqar:64:16,mqar:256:16,mqar:1024:32,needle:1024,needle:4096,needle:16384  eval_n=256
//   (sequences per task up to 2K bytes; a quarter up to 4K, a sixteenth beyond, at least 16)  docs= (a directory:
//   also write recall_table.md, recall.csv and the plots recall_<stack>.svg there)
// TEXT is the haystack (ASCII; its first 95% for training sequences, the rest for evaluation: the split of
// shared/models/README.md). Every option is checked before anything trains. OUT_DIR/<stack>/ holds each training run
// and its accuracies (recall.csv); OUT_DIR/recall.csv, recall_<stack>.svg (Oryx stacks) and recall_table.md gather the
// stacks of this call. A stack finished in OUT_DIR/<stack> (its `done` file records the options) is neither trained
// nor evaluated again under the same options (evaluated again, from its checkpoint, when its accuracies came from
// another version of the evaluation: `eval_version`), and refused under others, so stacks can be trained by parallel
// calls (one stack each) and gathered by a last call naming them all; an interrupted stack is trained again from the
// start; delete OUT_DIR/<stack> to redo one. Errors exit with 2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/plot.hpp"
#include "hymix/train/recall.hpp"
#include "hymix/train/trainer.hpp"

namespace fs = std::filesystem;
namespace tr = hymix::train;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string f; std::getline(ss, f, sep);)
        if (!f.empty()) out.push_back(f);
    return out;
}

struct options {
    std::map<std::string, std::string> kv;
    std::string get(const std::string& k, const std::string& def) const {
        const auto it = kv.find(k);
        return it == kv.end() ? def : it->second;
    }
    double num(const std::string& k, double def) const {
        const auto it = kv.find(k);
        if (it == kv.end()) return def;
        try {
            std::size_t used = 0;
            const double v = std::stod(it->second, &used);
            if (used == it->second.size()) return v;
        } catch (const std::exception&) {
        }
        throw hymix::config_error("option " + k + "=" + it->second + ": not a number");
    }
    std::int64_t integer(const std::string& k, std::int64_t def) const {
        const double v = num(k, static_cast<double>(def));
        if (v != std::floor(v)) throw hymix::config_error("option " + k + "=" + get(k, "") + ": not a whole number");
        return static_cast<std::int64_t>(v);
    }
};

/// Every option after defaults, checked before anything is trained.
struct settings {
    std::vector<std::string> stacks;
    double minutes = 3, lr = 3e-3, warm_fraction = 0.3, p_attention = 0.5;
    std::int64_t steps = 100000, threads = 0, batch = 32, seq_len = 256, warmup = 100, eval_n = 256;
    std::int64_t d_model = 128, layers = 2, heads = 4, head_dim = 32, d_ff = 256, d_state = 32, block = 32;
    std::uint64_t seed = 1;
    std::vector<tr::recall_task> train_tasks, warm_tasks, eval_tasks;
    std::string train_spec, warm_spec, eval_spec;

    /// The options that decide what a stack learns and how it is scored (not stacks, threads or docs): a finished
    /// stack is reused only under the same ones.
    std::string fingerprint() const {
        std::ostringstream f;
        f << "minutes=" << minutes << " steps=" << steps << " batch=" << batch << " seq_len=" << seq_len << " lr=" << lr << " warmup=" << warmup
          << " seed=" << seed << " d_model=" << d_model << " layers=" << layers << " heads=" << heads << " head_dim=" << head_dim
          << " d_ff=" << d_ff << " d_state=" << d_state << " block=" << block << " p_attention=" << p_attention << " train_tasks=" << train_spec
          << " warm_tasks=" << warm_spec << " warm_fraction=" << warm_fraction << " eval_tasks=" << eval_spec << " eval_n=" << eval_n;
        return f.str();
    }
};

/// The version of the evaluation (its schedules, their random draws, the scoring): a stack's accuracies are reused
/// only when they were measured by the same version, else it is evaluated again from its checkpoint. 2: the library's
/// mode schedules and query_keys_attention (2026-12-07).
constexpr int eval_version = 2;

/// The evaluation sequences' stream seed: the same for every run, so every stack is scored on the same sequences.
constexpr std::uint64_t eval_seed = 1000003;
/// The training streams' seeds of a run seed (stage 2 and stage 1).
std::uint64_t train_stream(std::uint64_t seed) { return seed; }
std::uint64_t warm_stream(std::uint64_t seed) { return seed + 1000; }

std::vector<tr::recall_task> parse_tasks(const std::string& key, const std::string& spec) {
    std::vector<tr::recall_task> t;
    for (const auto& f : split(spec, ',')) {
        try {
            t.push_back(tr::parse_recall_task(f));
        } catch (const hymix::config_error& e) {
            throw hymix::config_error("option " + key + ": " + e.what());
        }
    }
    return t;
}

/// Reads and checks every option against the text: task lists, lengths that fit the training split and the held-out
/// part, stage settings, seeds. Throws config_error naming the option.
settings read_settings(const options& o, const tr::byte_corpus& corpus, const std::string& text_name) {
    settings s;
    s.stacks = split(o.get("stacks", "oryx-gdn,gdn,attention"), ',');
    if (s.stacks.empty()) throw hymix::config_error("option stacks: no stack named");
    s.minutes = o.num("minutes", s.minutes);
    s.steps = o.integer("steps", s.steps);
    s.threads = o.integer("threads", s.threads);
    s.batch = o.integer("batch", s.batch);
    s.seq_len = o.integer("seq_len", s.seq_len);
    s.lr = o.num("lr", s.lr);
    s.warmup = o.integer("warmup", s.warmup);
    s.seed = static_cast<std::uint64_t>(o.integer("seed", 1));
    s.eval_n = o.integer("eval_n", s.eval_n);
    s.d_model = o.integer("d_model", s.d_model);
    s.layers = o.integer("layers", s.layers);
    s.heads = o.integer("heads", s.heads);
    s.head_dim = o.integer("head_dim", s.head_dim);
    s.d_ff = o.integer("d_ff", s.d_ff);
    s.d_state = o.integer("d_state", s.d_state);
    s.block = o.integer("block", s.block);
    s.p_attention = o.num("p_attention", s.p_attention);
    s.warm_fraction = o.num("warm_fraction", s.warm_fraction);
    s.train_spec = o.get("train_tasks", "mqar:256:16,needle:256:4");
    s.warm_spec = o.get("warm_tasks", "mqar:64:16");
    s.eval_spec = o.get("eval_tasks", "mqar:64:16,mqar:256:16,mqar:1024:32,needle:1024,needle:4096,needle:16384");
    s.train_tasks = parse_tasks("train_tasks", s.train_spec);
    s.warm_tasks = parse_tasks("warm_tasks", s.warm_spec);
    s.eval_tasks = parse_tasks("eval_tasks", s.eval_spec);
    if (s.threads < 0) throw hymix::config_error("option threads: must be >= 0 (0: every core), found " + std::to_string(s.threads));
    if (s.eval_n < 1) throw hymix::config_error("option eval_n: must be >= 1, found " + std::to_string(s.eval_n));
    if (!(s.minutes >= 0)) throw hymix::config_error("option minutes: must be >= 0");
    if (!(s.warm_fraction >= 0 && s.warm_fraction < 1))
        throw hymix::config_error("option warm_fraction: must lie in [0, 1), found " + o.get("warm_fraction", ""));
    if (s.train_tasks.empty()) throw hymix::config_error("option train_tasks: no task");
    if (s.eval_tasks.empty()) throw hymix::config_error("option eval_tasks: no task");
    for (const auto& k : s.train_tasks)
        if (k.seq_len != s.seq_len)
            throw hymix::config_error("option train_tasks: " + k.describe() + " has seq_len " + std::to_string(k.seq_len) + ", training uses seq_len=" +
                                      std::to_string(s.seq_len));
    for (const auto& k : s.warm_tasks)
        if (k.seq_len != s.warm_tasks[0].seq_len)
            throw hymix::config_error("option warm_tasks: the tasks must share one seq_len: " + s.warm_tasks[0].describe() + " and " + k.describe());
    if (train_stream(s.seed) == eval_seed || warm_stream(s.seed) == eval_seed)
        throw hymix::config_error("option seed: " + std::to_string(s.seed) + " would train on the evaluation sequences; choose another");
    const auto fits = [&](const std::vector<tr::recall_task>& ts, std::int64_t avail, const char* key, const char* part) {
        for (const auto& k : ts)
            if (k.context_len() > avail)
                throw hymix::config_error(std::string("option ") + key + ": " + k.describe() + " needs " + std::to_string(k.context_len()) +
                                          " bytes of haystack, the " + part + " of '" + text_name + "' has " + std::to_string(avail));
    };
    fits(s.train_tasks, corpus.n_train(), "train_tasks", "training split (first 95%)");
    fits(s.warm_tasks, corpus.n_train(), "warm_tasks", "training split (first 95%)");
    fits(s.eval_tasks, corpus.n_heldout(), "eval_tasks", "held-out part (last 5%)");
    try {
        (void)tr::recall_haystack(std::span<const std::uint8_t>(corpus.bytes));
    } catch (const hymix::value_error& e) {
        throw hymix::value_error("text '" + text_name + "': " + e.what());
    }
    return s;
}

/// One evaluation schedule of an Oryx stack: its name and the library schedule it runs for a task
/// (hymix/schedule/mode_schedule.hpp); a single-mixer stack has none (no side input). The context goes in as one
/// prefill call and the query region as a second call in the decode phase (it is what the model generates against),
/// both through modes_for with the sequences' stream indices as ids and the positions counted from each sequence's
/// start, so a schedule sees one sequence of T tokens split into two calls.
struct eval_schedule {
    std::string name;
    std::function<hymix::dynamic_mode_schedule(const tr::recall_task&)> for_task;  // empty: no side input
};

/// Attention only at the asked keys of `task` (positions C, C + 2, ..., T − 1: those whose next byte is scored), a
/// list of T modes. It places attention with knowledge of where the answers are read.
hymix::dynamic_mode_schedule query_keys_modes(const tr::recall_task& task) {
    const std::int64_t T = task.seq_len, C = task.context_len();
    std::vector<hymix::token_mode> l(static_cast<std::size_t>(T), hymix::token_mode::linear);
    for (std::int64_t t = C; t < T; t += 2) l[static_cast<std::size_t>(t)] = hymix::token_mode::attention;
    return {hymix::mode_list{{std::move(l)}, std::nullopt}};
}

/// The same schedule for every task.
std::function<hymix::dynamic_mode_schedule(const tr::recall_task&)> fixed(hymix::any_mode_schedule s) {
    return [s](const tr::recall_task&) { return hymix::dynamic_mode_schedule{s}; };
}

/// Blocks of the random-block evaluation schedules, and their draws' seed (fixed: every stack sees the same blocks).
constexpr std::int64_t eval_block = 64;
constexpr std::uint64_t eval_block_seed = 20261206;

struct eval_result {
    tr::recall_score score;
    double attention_fraction = 0;  // of the input tokens
    double seconds = 0;
};

/// Accuracy of `m` on n sequences of `task` (stream seed `seed`) under schedule s.
template <class Model>
eval_result evaluate(const hymix::cpu_backend& be, const Model& m, const tr::recall_task& task, const tr::recall_haystack& hay,
                     std::int64_t n, std::uint64_t seed, const eval_schedule& s) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t T = task.seq_len, C = task.context_len(), R = T - C, V = m.config().vocab_size;
    const std::int64_t per_call = std::max<std::int64_t>(1, std::min<std::int64_t>(n, 65536 / T));
    const bool modes = static_cast<bool>(s.for_task);
    const auto sched = modes ? s.for_task(task) : hymix::dynamic_mode_schedule{hymix::all_linear{}};
    eval_result r;
    std::int64_t attn = 0;
    for (std::int64_t i0 = 0; i0 < n; i0 += per_call) {
        const std::int64_t nb = std::min(per_call, n - i0);
        const auto b = tr::make_recall_batch(task, hay, nb, seed, static_cast<std::uint64_t>(i0));
        std::vector<std::int32_t> ctx(static_cast<std::size_t>(nb * C)), qry(static_cast<std::size_t>(nb * R));
        for (std::int64_t q = 0; q < nb; ++q)
            for (std::int64_t t = 0; t < T; ++t) {
                const auto tok = b.inputs[static_cast<std::size_t>(q * T + t)];
                if (t < C) ctx[static_cast<std::size_t>(q * C + t)] = tok;
                else qry[static_cast<std::size_t>(q * R + t - C)] = tok;
            }
        const auto ctx_batch = hymix::seq_batch::dense(nb, C), qry_batch = hymix::seq_batch::dense(nb, R);
        std::vector<std::uint64_t> ids(static_cast<std::size_t>(nb));
        for (std::int64_t q = 0; q < nb; ++q) ids[static_cast<std::size_t>(q)] = static_cast<std::uint64_t>(i0 + q);
        const std::vector<std::int64_t> past(static_cast<std::size_t>(nb), C);
        std::vector<unsigned char> ctx_modes, qry_modes;
        if (modes) {
            ctx_modes = hymix::modes_for(sched, ctx_batch, hymix::call_phase::prefill, {}, ids);
            qry_modes = hymix::modes_for(sched, qry_batch, hymix::call_phase::decode, past, ids);
            for (const auto md : ctx_modes) attn += md;
            for (const auto md : qry_modes) attn += md;
        }
        auto cache = m.make_cache(nb);
        hymix::tensor<float> last({nb, V}), logits({nb * R, V});
        m.forward_last(be, cache, ctx_batch, ctx, last.view<2>(), ctx_modes);
        m.forward(be, cache, qry_batch, qry, logits.view<2>(), {}, qry_modes);
        std::vector<std::int32_t> pred(static_cast<std::size_t>(nb * T), -1);
        for (std::int64_t q = 0; q < nb; ++q)
            for (std::int64_t t = C; t < T; ++t) {
                const float* row = &logits[(q * R + t - C) * V];
                pred[static_cast<std::size_t>(q * T + t)] = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
            }
        r.score += tr::score_recall(b, pred);
    }
    r.attention_fraction = static_cast<double>(attn) / static_cast<double>(n * T);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

struct row {
    std::string stack, task, schedule;
    std::int64_t params = 0, steps = 0;
    double train_seconds = 0, fraction = 0, accuracy = 0, perfect = 0;
    std::int64_t answers = 0;
};

constexpr const char* csv_header = "stack,parameters,train_steps,train_seconds,task,schedule,attention_fraction,answers,accuracy,all_correct_fraction";

void write_rows(const fs::path& p, const std::vector<row>& rows) {
    std::ofstream csv(p);
    csv << csv_header << "\n";
    for (const auto& r : rows)
        csv << r.stack << "," << r.params << "," << r.steps << "," << r.train_seconds << "," << r.task << "," << r.schedule << "," << r.fraction
            << "," << r.answers << "," << r.accuracy << "," << r.perfect << "\n";
    if (!csv) throw hymix::io_error("cannot write '" + p.string() + "'");
}

std::vector<row> read_rows(const fs::path& p) {
    std::ifstream f(p);
    std::string line;
    if (!std::getline(f, line) || line != csv_header) throw hymix::format_error("'" + p.string() + "' is not a recall result file");
    std::vector<row> rows;
    while (std::getline(f, line)) {
        const auto c = split(line, ',');
        if (c.size() != 10) throw hymix::format_error("'" + p.string() + "': a row of " + std::to_string(c.size()) + " fields: " + line);
        rows.push_back({c[0], c[4], c[5], std::stoll(c[1]), std::stoll(c[2]), std::stod(c[3]), std::stod(c[6]), std::stod(c[8]), std::stod(c[9]),
                        std::stoll(c[7])});
    }
    return rows;
}

template <class Model>
void run_stack(const settings& cfg, const std::string& stack, Model m, tr::train_setup<Model> setup, const tr::byte_corpus& corpus,
               const fs::path& out, std::vector<row>& rows) {
    const hymix::cpu_backend be(static_cast<int>(cfg.threads));
    const fs::path dir = out / stack;
    tr::train_options t;
    t.steps = cfg.steps;
    t.minutes = cfg.minutes;
    t.batch = cfg.batch;
    t.seq_len = cfg.seq_len;
    t.adamw.lr = cfg.lr;
    t.warmup = cfg.warmup;
    t.decay = tr::lr_decay::constant;
    t.seed = cfg.seed;
    t.eval_bytes = 0;  // the held-out text's bits/byte says nothing here; accuracy is measured below
    t.log_every = 25;
    const tr::recall_haystack train_hay(std::span<const std::uint8_t>(corpus.bytes).first(static_cast<std::size_t>(corpus.train_end)));
    const tr::recall_haystack eval_hay(std::span<const std::uint8_t>(corpus.bytes).subspan(static_cast<std::size_t>(corpus.train_end)));
    // Sequence indices of a step (accum is 1 here, so micro is 0): the batch's sequences follow each other in the stream.
    setup.batches = [&, seed = train_stream(cfg.seed)](std::int64_t step, std::int64_t micro, std::int64_t n_seq) {
        const auto first = static_cast<std::uint64_t>((step * 64 + micro) * n_seq);
        return tr::make_recall_batch(std::span<const tr::recall_task>(cfg.train_tasks), train_hay, n_seq, seed, first);
    };
    std::int64_t n_params = 0;
    m.for_each_param([&](const std::string&, hymix::tensor<float>& w) { n_params += w.numel(); });
    double secs = 0;
    std::int64_t steps = 0;
    const auto fp = cfg.fingerprint();
    if (fs::exists(dir / "done")) {
        std::ifstream f(dir / "done");
        std::string line, old_fp;
        std::getline(f, line);
        std::getline(f, old_fp);
        if (old_fp != fp)
            throw hymix::config_error("'" + dir.string() + "' holds a run with other options (" + (old_fp.empty() ? "none recorded" : old_fp) +
                                      ") than this call's (" + fp + "): delete it or choose another OUT_DIR");
        std::istringstream(line) >> steps >> secs;
        if (fs::exists(dir / "recall.csv")) {
            std::string version;
            std::getline(std::ifstream(dir / "eval_version"), version);
            if (version == std::to_string(eval_version)) {
                const auto old = read_rows(dir / "recall.csv");
                rows.insert(rows.end(), old.begin(), old.end());
                std::fprintf(stderr, "== %s: trained and evaluated before (%s), %zu results reused\n", stack.c_str(), dir.string().c_str(),
                             old.size());
                return;
            }
            std::fprintf(stderr, "== %s: evaluated by another version of the evaluation (%s, this one is %d): evaluating again\n", stack.c_str(),
                         version.empty() ? "none recorded" : version.c_str(), eval_version);
        }
        hymix::models::checkpoint_reader rd(tr::latest_checkpoint(dir));
        if constexpr (std::is_same_v<Model, hymix::models::oryx_lm_stack>) m = hymix::models::load_oryx_lm(rd);
        else if constexpr (std::is_same_v<Model, hymix::models::hf_mamba2_stack>) m = hymix::models::load_hf_mamba2(rd);
        else m = hymix::models::load_hf_qwen3_5(rd);
        std::fprintf(stderr, "== %s: trained before (%lld steps, %.0f s), evaluating %s\n", stack.c_str(), static_cast<long long>(steps), secs,
                     tr::latest_checkpoint(dir).string().c_str());
    } else {
        fs::remove_all(dir);
        std::fprintf(stderr, "== %s: %lld parameters, training %.1f min on %d threads\n", stack.c_str(), static_cast<long long>(n_params),
                     t.minutes, be.num_threads());
        // Stage 1 (warm_fraction of the time and of the steps): short sequences of the warm-up tasks, no filler to wade
        // through; then the main tasks with a fresh optimizer, starting from stage 1's weights.
        if (!cfg.warm_tasks.empty() && cfg.warm_fraction > 0) {
            auto w = t;
            w.seq_len = cfg.warm_tasks[0].seq_len;
            w.minutes = t.minutes * cfg.warm_fraction;
            t.minutes -= w.minutes;
            w.steps = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(t.steps) * cfg.warm_fraction));
            t.steps = std::max<std::int64_t>(1, t.steps - w.steps);
            auto ws = setup;
            ws.batches = [&, seed = warm_stream(cfg.seed)](std::int64_t step, std::int64_t micro, std::int64_t n_seq) {
                return tr::make_recall_batch(std::span<const tr::recall_task>(cfg.warm_tasks), train_hay, n_seq, seed,
                                             static_cast<std::uint64_t>((step * 64 + micro) * n_seq));
            };
            std::fprintf(stderr, "== %s: stage 1, %.1f min on %s\n", stack.c_str(), w.minutes, cfg.warm_spec.c_str());
            const auto r1 = tr::train_model(be, m, corpus, w, ws, dir / "stage1", false, &std::cerr);
            steps += r1.steps_done;
            secs += r1.seconds;
            std::fprintf(stderr, "== %s: stage 1 done, %lld steps, answer loss %.4f nats; stage 2, %.1f min\n", stack.c_str(),
                         static_cast<long long>(r1.steps_done), r1.final_loss, t.minutes);
        }
        const auto r = tr::train_model(be, m, corpus, t, setup, dir, false, &std::cerr);
        steps += r.steps_done;
        secs += r.seconds;
        std::ofstream(dir / "done") << steps << " " << secs << "\n" << fp << "\n";
        std::fprintf(stderr, "== %s: %lld steps in %.0f s, final answer loss %.4f nats\n", stack.c_str(), static_cast<long long>(steps), secs, r.final_loss);
    }
    std::vector<eval_schedule> scheds;
    if (stack.rfind("oryx", 0) == 0) {
        scheds = {{"all_linear", fixed(hymix::all_linear{})},
                  {"queries_attention", fixed(hymix::linear_prefill_attention_decode{})},
                  {"query_keys_attention", query_keys_modes},
                  {"all_attention", fixed(hymix::all_attention{})}};
        for (const double p : {0.05, 0.1, 0.25, 0.5}) {
            char b[48];
            std::snprintf(b, sizeof b, "random_blocks:%g", p);
            scheds.push_back({b, fixed(hymix::block_random{eval_block, p, eval_block_seed})});
        }
    } else {
        scheds = {{"default", {}}};
    }
    const auto n_eval = cfg.eval_n;
    std::vector<row> mine;
    for (const auto& task : cfg.eval_tasks) {
        // Fewer sequences for long tasks (their attention costs T² each): n_eval up to 2K bytes, n_eval / 4 up to 4K,
        // n_eval / 16 beyond (at least 16).
        const std::int64_t n = task.seq_len <= 2048 ? n_eval : std::max<std::int64_t>(16, n_eval / (task.seq_len <= 4096 ? 4 : 16));
        for (const auto& s : scheds) {
            const auto e = evaluate(be, m, task, eval_hay, n, eval_seed, s);
            row rw{stack, task.describe(), s.name, n_params, steps, secs, e.attention_fraction, e.score.accuracy(),
                   static_cast<double>(e.score.perfect) / static_cast<double>(e.score.sequences), e.score.answers};
            if (!s.for_task) rw.fraction = stack == "attention" ? 1.0 : 0.0;
            mine.push_back(rw);
            std::fprintf(stderr, "   %-12s %-18s %-20s attention %.4f: accuracy %.4f (%lld answers, %.1f s)\n", stack.c_str(), rw.task.c_str(),
                         s.name.c_str(), rw.fraction, rw.accuracy, static_cast<long long>(rw.answers), e.seconds);
        }
    }
    write_rows(dir / "recall.csv", mine);
    std::ofstream(dir / "eval_version") << eval_version << "\n";
    rows.insert(rows.end(), mine.begin(), mine.end());
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s TEXT OUT_DIR [key=value ...] (see the top of examples/recall.cpp)\n", argv[0]);
        return 1;
    }
    options o;
    for (int i = 3; i < argc; ++i) {
        const std::string a = argv[i];
        const auto eq = a.find('=');
        if (eq == std::string::npos) throw hymix::config_error("argument '" + a + "' is not key=value");
        o.kv[a.substr(0, eq)] = a.substr(eq + 1);
    }
    static const char* known[] = {"stacks", "minutes", "steps", "threads", "d_model", "layers", "heads", "head_dim", "d_ff", "d_state",
                                  "batch", "seq_len", "lr", "warmup", "seed", "block", "p_attention", "train_tasks", "eval_tasks",
                                  "eval_n", "docs", "warm_tasks", "warm_fraction"};
    for (const auto& [k, v] : o.kv)
        if (std::find_if(std::begin(known), std::end(known), [&](const char* s) { return k == s; }) == std::end(known))
            throw hymix::config_error("unknown option '" + k + "'");
    const auto corpus = tr::byte_corpus::load(argv[1]);
    const settings cfg = read_settings(o, corpus, argv[1]);
    const fs::path out = argv[2];
    fs::create_directories(out);
    std::vector<row> rows;
    const auto spec_of = [&](const std::string& stack) {
        tr::byte_lm_spec s;
        s.stack = stack;
        s.d_model = cfg.d_model;
        s.n_layers = cfg.layers;
        s.head_dim = cfg.head_dim;
        s.linear_heads = s.attn_heads = s.attn_kv_heads = cfg.heads;
        s.d_ff = cfg.d_ff;
        s.d_state = cfg.d_state;
        s.oryx_block_size = cfg.block;
        s.oryx_p_attention = cfg.p_attention;
        (void)tr::hf_config(s);  // checks the spec and the sizes (config_error naming the field)
        return s;
    };
    for (const auto& stack : cfg.stacks) (void)spec_of(stack);  // every stack's size is valid before any trains
    for (const auto& stack : cfg.stacks) {
        const auto s = spec_of(stack);
        const auto config = tr::hf_config(s);
        if (s.is_oryx())
            run_stack(cfg, stack, tr::random_oryx_lm(s, cfg.seed),
                      tr::oryx_setup<hymix::models::oryx_lm_stack>(config, s.oryx_block_size, s.oryx_p_attention, cfg.seed), corpus, out, rows);
        else if (s.is_mamba2())
            run_stack(cfg, stack, tr::random_mamba2_lm(s, cfg.seed), tr::hf_setup<hymix::models::hf_mamba2_stack>(config), corpus, out, rows);
        else
            run_stack(cfg, stack, tr::random_qwen3_5_lm(s, cfg.seed), tr::hf_setup<hymix::models::qwen3_5_hybrid_stack>(config), corpus, out,
                      rows);
    }
    write_rows(out / "recall.csv", rows);

    // One plot per Oryx stack: accuracy against the attention fraction, one curve per task over the random-block
    // schedules (all linear at 0, all attention at 1) and, in the same colour, the points of "attention on the query
    // tokens" (Q) and "attention at the asked keys only" (K; with one query, as in the needle tasks, the two coincide).
    static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    std::vector<std::string> plots;
    for (const auto& r : rows)
        if (r.stack.rfind("oryx", 0) == 0 && std::find(plots.begin(), plots.end(), r.stack) == plots.end()) plots.push_back(r.stack);
    for (const auto& stack : plots) {
        tr::plot_spec p;
        p.title = stack + ": recall accuracy against the fraction of tokens in attention mode (Q: on the queries only, K: on the asked keys only)";
        p.x_label = "fraction of tokens in attention mode (random blocks of 64; 0 = all linear, 1 = all attention)";
        p.y_label = "answer accuracy";
        p.width = 960;
        p.height = 480;
        std::vector<std::string> order;
        std::map<std::string, tr::plot_series> curves, marks, key_marks;
        for (const auto& r : rows) {
            if (r.stack != stack) continue;
            if (std::find(order.begin(), order.end(), r.task) == order.end()) order.push_back(r.task);
            const auto colour = colours[(std::find(order.begin(), order.end(), r.task) - order.begin()) % 8];
            const bool q = r.schedule == "queries_attention", k = r.schedule == "query_keys_attention";
            auto& s = q ? marks[r.task] : k ? key_marks[r.task] : curves[r.task];
            s.name = q ? "Q " + r.task : k ? "K " + r.task : r.task;
            s.color = colour;
            s.markers = true;
            s.points.emplace_back(r.fraction, r.accuracy);
        }
        for (const auto& t : order) {
            std::sort(curves[t].points.begin(), curves[t].points.end());
            p.series.push_back(curves[t]);
        }
        for (const auto& t : order) p.series.push_back(marks[t]);
        for (const auto& t : order) p.series.push_back(key_marks[t]);
        tr::write_svg(out / ("recall_" + stack + ".svg"), p);
    }

    // The table: one row per (stack, schedule), one column per task.
    std::ostringstream md;
    std::vector<std::string> tasks;
    std::vector<std::pair<std::string, std::string>> lines;
    for (const auto& r : rows) {
        if (std::find(tasks.begin(), tasks.end(), r.task) == tasks.end()) tasks.push_back(r.task);
        const std::pair<std::string, std::string> l{r.stack, r.schedule};
        if (std::find(lines.begin(), lines.end(), l) == lines.end()) lines.push_back(l);
    }
    md << "| stack | schedule |";
    for (const auto& t : tasks) md << " " << t << " |";
    md << "\n|---|---|";
    for (std::size_t i = 0; i < tasks.size(); ++i) md << "---|";
    md << "\n";
    for (const auto& [stack, sched] : lines) {
        md << "| " << stack << " | " << sched << " |";
        for (const auto& t : tasks) {
            const auto it = std::find_if(rows.begin(), rows.end(), [&](const row& r) { return r.task == t && r.stack == stack && r.schedule == sched; });
            char b[64];
            if (it == rows.end()) std::snprintf(b, sizeof b, "–");
            else if (sched == "queries_attention" || sched == "query_keys_attention") std::snprintf(b, sizeof b, "%.3f (%.2g%% attention)", it->accuracy, 100 * it->fraction);
            else std::snprintf(b, sizeof b, "%.3f", it->accuracy);
            md << " " << b << " |";
        }
        md << "\n";
    }
    {
        std::ofstream f(out / "recall_table.md");
        f << md.str();
    }
    const auto docs = o.get("docs", "");
    if (!docs.empty()) {
        fs::create_directories(docs);
        fs::copy_file(out / "recall.csv", fs::path(docs) / "recall.csv", fs::copy_options::overwrite_existing);
        for (const auto& stack : plots)
            fs::copy_file(out / ("recall_" + stack + ".svg"), fs::path(docs) / ("recall_" + stack + ".svg"), fs::copy_options::overwrite_existing);
        fs::copy_file(out / "recall_table.md", fs::path(docs) / "recall_table.md", fs::copy_options::overwrite_existing);
    }
    std::printf("%s", md.str().c_str());
    std::printf("wrote %s, %s and %zu plots (recall_<stack>.svg)\n", (out / "recall.csv").string().c_str(),
                (out / "recall_table.md").string().c_str(), plots.size());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "recall: error: %s\n", e.what());
    return 2;
}
