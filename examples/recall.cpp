// The recall benchmark of issue 10: trains byte-level stacks of one size on associative recall (train/recall.hpp:
// MQAR pairs followed by queries, and needles at random depths of the KJV text) and measures answer accuracy —
// single-mixer stacks as they are, Oryx stacks under mode schedules: all linear, all attention, attention only on
// the query tokens (a linear prefill then attention "decode" of the questions), and attention on random blocks of
// 64 tokens with probability f (the attention fraction). Training uses the ordinary trainer (checkpoints, loss
// curves, resume) with the recall batches in place of text windows; evaluation splits each sequence into its
// context (one prefill call, only the last logits kept) and its query region (a second call on the same cache).
//
//   example_recall TEXT OUT_DIR [key=value ...]
// keys (defaults): stacks=oryx-gdn,gdn,attention  minutes=3  steps=100000  threads=0 (all)  d_model=128  layers=2
//   heads=4  head_dim=32  d_ff=256  d_state=32  batch=32  seq_len=256  lr=3e-3  warmup=100  seed=1  block=32 (Oryx
//   training blocks)  p_attention=0.5  train_tasks=mqar:256:16,needle:256:4  warm_tasks=mqar:64:16 (stage 1: the first
//   warm_fraction=0.3 of the time trains on these, at their own seq_len; empty: no stage 1)  eval_tasks=mqar:64:16,mqar:256:16,
//   mqar:1024:32,needle:1024,needle:4096,needle:16384  eval_n=256 (sequences per task up to 2K bytes; a quarter up to 4K, a sixteenth beyond, at
//   least 16)  docs= (a directory:
//   also write recall_table.md, recall.csv and the plots recall_<stack>.svg there)
// TEXT is the haystack (its first 95% for training sequences, the rest for evaluation: the split of
// shared/models/README.md). OUT_DIR/<stack>/ holds each training run and its accuracies (recall.csv); OUT_DIR/recall.csv,
// recall_<stack>.svg (Oryx stacks) and recall_table.md gather the stacks of this call. A stack already finished in OUT_DIR/<stack> (a `done`
// file and its recall.csv) is neither trained nor evaluated again, so stacks can be trained by parallel calls (one
// stack each) and gathered by a last call naming them all; delete OUT_DIR/<stack> to redo one. Errors exit with 2.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/checkpoint.hpp"
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
    std::int64_t integer(const std::string& k, std::int64_t def) const { return static_cast<std::int64_t>(num(k, static_cast<double>(def))); }
};

/// One evaluation schedule: its name and the attention fraction it asks for (random blocks), or a fixed rule.
struct eval_schedule {
    std::string name;
    enum kind_t { none, all_linear, all_attention, queries, random_blocks } kind = none;
    double p = 0;  // random_blocks: P(attention) per block
};

constexpr std::int64_t eval_block = 64;

/// The mode of position t (1 = attention) of stream sequence idx of a task with query region [C, T).
unsigned char mode_at(const eval_schedule& s, std::uint64_t idx, std::int64_t t, std::int64_t C) {
    switch (s.kind) {
        case eval_schedule::all_attention: return 1;
        case eval_schedule::queries: return t >= C ? 1 : 0;
        case eval_schedule::random_blocks: {
            const auto h = tr::detail::splitmix64(idx * 0x100000001b3ULL ^ tr::detail::splitmix64(static_cast<std::uint64_t>(t / eval_block) + 7));
            return static_cast<double>(h >> 11) * 0x1.0p-53 < s.p ? 1 : 0;
        }
        default: return 0;
    }
}

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
    eval_result r;
    std::int64_t attn = 0;
    for (std::int64_t i0 = 0; i0 < n; i0 += per_call) {
        const std::int64_t nb = std::min(per_call, n - i0);
        const auto b = tr::make_recall_batch(task, hay, nb, seed, static_cast<std::uint64_t>(i0));
        std::vector<std::int32_t> ctx(static_cast<std::size_t>(nb * C)), qry(static_cast<std::size_t>(nb * R));
        std::vector<unsigned char> ctx_modes(ctx.size()), qry_modes(qry.size());
        for (std::int64_t q = 0; q < nb; ++q) {
            const auto idx = static_cast<std::uint64_t>(i0 + q);
            for (std::int64_t t = 0; t < T; ++t) {
                const auto tok = b.inputs[static_cast<std::size_t>(q * T + t)];
                const auto md = mode_at(s, idx, t, C);
                attn += md;
                if (t < C) {
                    ctx[static_cast<std::size_t>(q * C + t)] = tok;
                    ctx_modes[static_cast<std::size_t>(q * C + t)] = md;
                } else {
                    qry[static_cast<std::size_t>(q * R + t - C)] = tok;
                    qry_modes[static_cast<std::size_t>(q * R + t - C)] = md;
                }
            }
        }
        auto cache = m.make_cache(nb);
        hymix::tensor<float> last({nb, V}), logits({nb * R, V});
        const bool modes = s.kind != eval_schedule::none;
        m.forward_last(be, cache, hymix::seq_batch::dense(nb, C), ctx, last.view<2>(),
                       modes ? std::span<const unsigned char>(ctx_modes) : std::span<const unsigned char>());
        m.forward(be, cache, hymix::seq_batch::dense(nb, R), qry, logits.view<2>(), {},
                  modes ? std::span<const unsigned char>(qry_modes) : std::span<const unsigned char>());
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
void run_stack(const options& o, const std::string& stack, Model m, tr::train_setup<Model> setup,
               const tr::byte_corpus& corpus, const fs::path& out, std::vector<row>& rows) {
    const hymix::cpu_backend be(static_cast<int>(o.integer("threads", 0)));
    const fs::path dir = out / stack;
    tr::train_options t;
    t.steps = o.integer("steps", 100000);
    t.minutes = o.num("minutes", 3);
    t.batch = o.integer("batch", 32);
    t.seq_len = o.integer("seq_len", 256);
    t.adamw.lr = o.num("lr", 3e-3);
    t.warmup = o.integer("warmup", 100);
    t.decay = tr::lr_decay::constant;
    t.seed = static_cast<std::uint64_t>(o.integer("seed", 1));
    t.eval_bytes = 0;  // the held-out text's bits/byte says nothing here; accuracy is measured below
    t.log_every = 25;
    std::vector<tr::recall_task> train_tasks;
    for (const auto& f : split(o.get("train_tasks", "mqar:256:16,needle:256:4"), ',')) train_tasks.push_back(tr::parse_recall_task(f));
    for (const auto& k : train_tasks)
        if (k.seq_len != t.seq_len)
            throw hymix::config_error("train task " + k.describe() + " has seq_len " + std::to_string(k.seq_len) + ", training uses seq_len=" +
                                      std::to_string(t.seq_len));
    const tr::recall_haystack train_hay(std::span<const std::uint8_t>(corpus.bytes).first(static_cast<std::size_t>(corpus.train_end)));
    const tr::recall_haystack eval_hay(std::span<const std::uint8_t>(corpus.bytes).subspan(static_cast<std::size_t>(corpus.train_end)));
    setup.batches = [&, seed = t.seed](std::int64_t step, std::int64_t micro, std::int64_t n_seq) {
        const auto first = static_cast<std::uint64_t>((step * 64 + micro) * n_seq);
        return tr::make_recall_batch(std::span<const tr::recall_task>(train_tasks), train_hay, n_seq, seed, first);
    };
    std::int64_t n_params = 0;
    m.for_each_param([&](const std::string&, hymix::tensor<float>& w) { n_params += w.numel(); });
    double secs = 0;
    std::int64_t steps = 0;
    if (fs::exists(dir / "done") && fs::exists(dir / "recall.csv")) {
        const auto old = read_rows(dir / "recall.csv");
        rows.insert(rows.end(), old.begin(), old.end());
        std::fprintf(stderr, "== %s: trained and evaluated before (%s), %zu results reused\n", stack.c_str(), dir.string().c_str(), old.size());
        return;
    }
    if (fs::exists(dir / "done")) {
        std::ifstream f(dir / "done");
        f >> steps >> secs;
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
        // Stage 1 (a share of the time): short sequences of the warm-up tasks, no filler to wade through; then the
        // main tasks with a fresh optimizer, starting from stage 1's weights.
        std::vector<tr::recall_task> warm;
        for (const auto& f : split(o.get("warm_tasks", "mqar:64:16"), ',')) warm.push_back(tr::parse_recall_task(f));
        const double warm_fraction = o.num("warm_fraction", 0.3);
        if (!(warm_fraction >= 0 && warm_fraction < 1)) throw hymix::config_error("warm_fraction must lie in [0, 1)");
        if (!warm.empty() && warm_fraction > 0) {
            auto w = t;
            w.seq_len = warm[0].seq_len;
            w.minutes = t.minutes * warm_fraction;
            t.minutes -= w.minutes;
            auto ws = setup;
            ws.batches = [&, seed = t.seed + 1000](std::int64_t step, std::int64_t micro, std::int64_t n_seq) {
                return tr::make_recall_batch(std::span<const tr::recall_task>(warm), train_hay, n_seq, seed,
                                             static_cast<std::uint64_t>((step * 64 + micro) * n_seq));
            };
            std::fprintf(stderr, "== %s: stage 1, %.1f min on %s\n", stack.c_str(), w.minutes, o.get("warm_tasks", "mqar:64:16").c_str());
            const auto r1 = tr::train_model(be, m, corpus, w, ws, dir / "stage1", false, &std::cerr);
            steps += r1.steps_done;
            secs += r1.seconds;
            std::fprintf(stderr, "== %s: stage 1 done, %lld steps, answer loss %.4f nats; stage 2, %.1f min\n", stack.c_str(),
                         static_cast<long long>(r1.steps_done), r1.final_loss, t.minutes);
        }
        const auto r = tr::train_model(be, m, corpus, t, setup, dir, false, &std::cerr);
        steps += r.steps_done;
        secs += r.seconds;
        std::ofstream(dir / "done") << steps << " " << secs << "\n";
        std::fprintf(stderr, "== %s: %lld steps in %.0f s, final answer loss %.4f nats\n", stack.c_str(), static_cast<long long>(steps), secs, r.final_loss);
    }
    std::vector<eval_schedule> scheds;
    if (stack.rfind("oryx", 0) == 0) {
        scheds = {{"all_linear", eval_schedule::all_linear}, {"queries_attention", eval_schedule::queries},
                  {"all_attention", eval_schedule::all_attention}};
        for (const double p : {0.05, 0.1, 0.25, 0.5}) {
            char b[48];
            std::snprintf(b, sizeof b, "random_blocks:%g", p);
            scheds.push_back({b, eval_schedule::random_blocks, p});
        }
    } else {
        scheds = {{"default", eval_schedule::none}};
    }
    const auto n_eval = o.integer("eval_n", 256);
    std::vector<row> mine;
    for (const auto& f : split(o.get("eval_tasks", "mqar:64:16,mqar:256:16,mqar:1024:32,needle:1024,needle:4096,needle:16384"), ',')) {
        const auto task = tr::parse_recall_task(f);
        // Fewer sequences for long tasks (their attention costs T² each): n_eval up to 2K bytes, n_eval / 4 up to 4K,
        // n_eval / 16 beyond (at least 16).
        const std::int64_t n = task.seq_len <= 2048 ? n_eval : std::max<std::int64_t>(16, n_eval / (task.seq_len <= 4096 ? 4 : 16));
        for (const auto& s : scheds) {
            const auto e = evaluate(be, m, task, eval_hay, n, 1000003, s);
            row rw{stack, task.describe(), s.name, n_params, steps, secs, e.attention_fraction, e.score.accuracy(),
                   static_cast<double>(e.score.perfect) / static_cast<double>(e.score.sequences), e.score.answers};
            if (s.kind == eval_schedule::none) rw.fraction = stack == "attention" ? 1.0 : 0.0;
            mine.push_back(rw);
            std::fprintf(stderr, "   %-12s %-18s %-20s attention %.4f: accuracy %.4f (%lld answers, %.1f s)\n", stack.c_str(), rw.task.c_str(),
                         s.name.c_str(), rw.fraction, rw.accuracy, static_cast<long long>(rw.answers), e.seconds);
        }
    }
    write_rows(dir / "recall.csv", mine);
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
    const fs::path out = argv[2];
    fs::create_directories(out);
    std::vector<row> rows;
    const auto seed = static_cast<std::uint64_t>(o.integer("seed", 1));
    for (const auto& stack : split(o.get("stacks", "oryx-gdn,gdn,attention"), ',')) {
        tr::byte_lm_spec s;
        s.stack = stack;
        s.d_model = o.integer("d_model", 128);
        s.n_layers = o.integer("layers", 2);
        s.head_dim = o.integer("head_dim", 32);
        s.linear_heads = s.attn_heads = s.attn_kv_heads = o.integer("heads", 4);
        s.d_ff = o.integer("d_ff", 256);
        s.d_state = o.integer("d_state", 32);
        s.oryx_block_size = o.integer("block", 32);
        s.oryx_p_attention = o.num("p_attention", 0.5);
        const auto config = tr::hf_config(s);
        if (s.is_oryx())
            run_stack(o, stack, tr::random_oryx_lm(s, seed),
                      tr::oryx_setup<hymix::models::oryx_lm_stack>(config, s.oryx_block_size, s.oryx_p_attention, seed), corpus, out, rows);
        else if (s.is_mamba2())
            run_stack(o, stack, tr::random_mamba2_lm(s, seed), tr::hf_setup<hymix::models::hf_mamba2_stack>(config), corpus, out, rows);
        else
            run_stack(o, stack, tr::random_qwen3_5_lm(s, seed), tr::hf_setup<hymix::models::qwen3_5_hybrid_stack>(config), corpus, out,
                      rows);
    }
    write_rows(out / "recall.csv", rows);

    // One plot per Oryx stack: accuracy against the attention fraction, one curve per task over the random-block
    // schedules (all linear at 0, all attention at 1) and, in the same colour, the point of "attention on the query
    // tokens only".
    static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    std::vector<std::string> plots;
    for (const auto& r : rows)
        if (r.stack.rfind("oryx", 0) == 0 && std::find(plots.begin(), plots.end(), r.stack) == plots.end()) plots.push_back(r.stack);
    for (const auto& stack : plots) {
        tr::plot_spec p;
        p.title = stack + ": recall accuracy against the fraction of tokens in attention mode (Q: on the queries only)";
        p.x_label = "fraction of tokens in attention mode (random blocks of 64; 0 = all linear, 1 = all attention)";
        p.y_label = "answer accuracy";
        p.width = 960;
        p.height = 480;
        std::vector<std::string> order;
        std::map<std::string, tr::plot_series> curves, marks;
        for (const auto& r : rows) {
            if (r.stack != stack) continue;
            if (std::find(order.begin(), order.end(), r.task) == order.end()) order.push_back(r.task);
            const auto colour = colours[(std::find(order.begin(), order.end(), r.task) - order.begin()) % 8];
            auto& s = r.schedule == "queries_attention" ? marks[r.task] : curves[r.task];
            s.name = r.schedule == "queries_attention" ? "Q " + r.task : r.task;
            s.color = colour;
            s.markers = true;
            s.points.emplace_back(r.fraction, r.accuracy);
        }
        for (const auto& t : order) {
            std::sort(curves[t].points.begin(), curves[t].points.end());
            p.series.push_back(curves[t]);
        }
        for (const auto& t : order) p.series.push_back(marks[t]);
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
            else if (sched == "queries_attention") std::snprintf(b, sizeof b, "%.3f (%.2g%% attention)", it->accuracy, 100 * it->fraction);
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
