// The training loop of `hymix train` (issue 8): seeded random windows from the training split, gradient
// accumulation, global-norm clipping, AdamW with a warmup + decay schedule, held-out bits/byte (the protocol of
// ../shared/models/README.md), a progress line on a terminal, the loss curve as CSV and SVG, and checkpoints that
// resume to the identical loss curve (for the same thread count). A checkpoint is a directory
// `checkpoint-<step>/` holding the model in its Hugging Face layout (loadable by auto_model and the tool) and
// trainer_state.safetensors (AdamW moments, step, the data sampler's generator state, the options); it is written
// under a temporary name, flushed and renamed, and only then does the `latest` file (itself replaced atomically)
// point at it, so a run killed at any moment leaves the previous checkpoint intact.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hymix/core/error.hpp"
#include "hymix/io/safetensors_reader.hpp"
#include "hymix/io/safetensors_writer.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "hymix/text/score.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/data.hpp"
#include "hymix/train/model_grad.hpp"
#include "hymix/train/optimizer.hpp"
#include "hymix/train/options.hpp"
#include "hymix/train/plot.hpp"

namespace hymix::train {

/// One row of the loss curve.
struct loss_row {
    std::int64_t step = 0, tokens = 0;
    double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, seconds = 0, eval_bpb = NAN;
};

/// What a finished (or stopped) run reports.
struct train_result {
    std::int64_t steps_done = 0, tokens = 0;
    double seconds = 0, final_loss = NAN, heldout_bpb = NAN, tokens_per_s = 0;
    std::filesystem::path checkpoint;
    bool resumed = false;
    std::int64_t resumed_from = 0;  ///< the step of the checkpoint a resumed run started from
    bool interrupted = false;       ///< train_options::interrupt stopped the run
};

/// A stack as a causal_lm (text/score.hpp) on a given backend, for held-out evaluation during training.
template <class Model, class B>
struct stack_lm {
    struct info_type {
        std::int64_t vocab_size = 0;
    };
    using cache = typename Model::cache_type;
    const Model* m;
    const B* be;
    info_type info_{};
    stack_lm(const Model& model, const B& backend) : m(&model), be(&backend), info_{model.config().vocab_size} {}
    cache make_cache(std::int64_t n) const { return m->make_cache(n); }
    void forward(cache& c, const seq_batch& b, std::span<const std::int32_t> t, tensor_view<float, 2> logits) const {
        m->forward(*be, c, b, t, logits);
    }
    const info_type& info() const { return info_; }
};

namespace detail {
inline void fsync_path(const std::filesystem::path& p) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    if (fd >= 0) {
        (void)::fsync(fd);
        ::close(fd);
    }
}
inline void write_text_atomic(const std::filesystem::path& path, const std::string& text) {
    const auto tmp = path.string() + ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc | std::ios::binary);
        if (!f) throw io_error("cannot write '" + tmp + "'");
        f << text;
        if (!f.flush()) throw io_error("error writing '" + tmp + "'");
    }
    fsync_path(tmp);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw io_error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
    fsync_path(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}
/// "checkpoint-<step>" or ".checkpoint-<step>.tmp": the folders train_model writes.
inline bool is_checkpoint_name(const std::string& f) {
    std::string_view v = f;
    const bool tmp = v.size() > 5 && v.front() == '.' && v.substr(v.size() - 4) == ".tmp";
    if (tmp) v = v.substr(1, v.size() - 5);
    if (v.rfind("checkpoint-", 0) != 0 || v.size() == 11) return false;
    return std::all_of(v.begin() + 11, v.end(), [](char c) { return c >= '0' && c <= '9'; });
}
/// The names of the checkpoint folders (is_checkpoint_name) in `dir`; none where it cannot be read.
inline std::vector<std::string> checkpoint_folders(const std::filesystem::path& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (auto f = it->path().filename().string(); is_checkpoint_name(f)) out.push_back(std::move(f));
    return out;
}
inline std::string fmt_duration(double s) {
    if (!std::isfinite(s) || s < 0) s = 0;
    const auto t = static_cast<long long>(s + 0.5);
    char b[32];
    if (t >= 3600) std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    else std::snprintf(b, sizeof b, "%02lld:%02lld", t / 60, t % 60);
    return b;
}
}  // namespace detail

/// The path of `out_dir`'s latest checkpoint directory (an HF-layout model directory). Throws io_error when none.
inline std::filesystem::path latest_checkpoint(const std::filesystem::path& out_dir) {
    std::ifstream lf(out_dir / "latest");
    std::string name;
    if (!(lf >> name)) throw io_error("no checkpoint in '" + out_dir.string() + "' (file 'latest' missing)");
    return out_dir / name;
}

/// Held-out evaluation with gate statistics: bits/byte over text[offset, offset + n_bytes) in whole windows of
/// `window` bytes (s < n − L, the protocol of shared/models/README.md), each a fresh sequence, and for every gated
/// layer the fraction of scored positions where it fired. Throws config_error when no whole window fits.
struct heldout_stats {
    double bits_per_byte = 0;
    std::int64_t scored = 0;
    std::vector<std::int64_t> gated_layers;  // layer index of each gated block
    std::vector<double> fire_rate;           // per gated block
    std::vector<std::vector<float>> scores;  // per gated block: every position's score (entropy), when kept
};
template <class Model, backend B>
heldout_stats evaluate_heldout(const B& be, const Model& m, std::span<const std::uint8_t> text, std::int64_t offset, std::int64_t n_bytes,
                               std::int64_t window, std::int64_t batch = 8, bool keep_scores = false) {
    if (window < 1 || n_bytes <= window || offset < 0 || offset + n_bytes > static_cast<std::int64_t>(text.size()))
        throw config_error("evaluate_heldout: no whole window of " + std::to_string(window) + " bytes fits in " + std::to_string(n_bytes) +
                           " bytes at offset " + std::to_string(offset));
    std::vector<std::int64_t> starts;
    for (std::int64_t s = 0; s < n_bytes - window; s += window) starts.push_back(s);
    heldout_stats r;
    double nats = 0;
    std::vector<std::int64_t> fired, rows;
    const std::int64_t V = m.config().vocab_size;
    for (std::size_t i0 = 0; i0 < starts.size(); i0 += static_cast<std::size_t>(batch)) {
        const auto nb = static_cast<std::int64_t>(std::min<std::size_t>(static_cast<std::size_t>(batch), starts.size() - i0));
        std::vector<std::int32_t> tok(static_cast<std::size_t>(nb * window));
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t t = 0; t < window; ++t)
                tok[static_cast<std::size_t>(b * window + t)] = text[static_cast<std::size_t>(offset + starts[i0 + static_cast<std::size_t>(b)] + t)];
        auto cache = m.make_cache(nb);
        tensor<float> logits({nb * window, V});
        m.forward(be, cache, seq_batch::dense(nb, window), tok, logits.template view<2>());
        for (std::int64_t b = 0; b < nb; ++b)
            for (std::int64_t t = 0; t < window; ++t) {
                const auto target = text[static_cast<std::size_t>(offset + starts[i0 + static_cast<std::size_t>(b)] + t + 1)];
                nats += cross_entropy(std::span<const float>(&logits[(b * window + t) * V], static_cast<std::size_t>(V)), target);
            }
        r.scored += nb * window;
        const auto& st = cache.stats();
        if (fired.empty()) {
            fired.assign(st.size(), 0);
            rows.assign(st.size(), 0);
            r.scores.resize(keep_scores ? st.size() : 0);
            for (const auto& x : st) r.gated_layers.push_back(x.layer);
        }
        for (std::size_t k = 0; k < st.size() && k < fired.size(); ++k) {
            fired[k] += st[k].fired;
            rows[k] += st[k].rows;
            if (keep_scores) r.scores[k].insert(r.scores[k].end(), st[k].score.begin(), st[k].score.end());
        }
    }
    r.bits_per_byte = nats / static_cast<double>(r.scored) / std::log(2.0);
    for (std::size_t k = 0; k < fired.size(); ++k) r.fire_rate.push_back(rows[k] ? static_cast<double>(fired[k]) / static_cast<double>(rows[k]) : 0.0);
    return r;
}

/// How a model is trained beyond the options: which parameters are frozen, how many leading layers run forward only
/// (they must hold only frozen parameters), and how the model is written into a checkpoint directory.
template <class Model>
struct train_setup {
    std::function<bool(const std::string&)> frozen = [](const std::string&) { return false; };
    std::int64_t frozen_prefix = 0;
    std::function<void(Model&, const std::filesystem::path&)> save;  ///< writes the model into a (new) directory
    /// The per-token side input of micro-batch `micro` of optimizer step `step` (Oryx: the block-random modes), written
    /// into `out` ([n_rows] bytes); empty function: none. It must depend only on its arguments, so that a resumed run
    /// draws what the uninterrupted one drew.
    std::function<void(const seq_batch& batch, std::int64_t step, std::int64_t micro, std::vector<unsigned char>& out)> side;
    /// Where the batches come from: micro-batch `micro` (of n_seq windows of the options' seq_len) of optimizer step
    /// `step` (a synthetic task, e.g. train/recall.hpp); empty function: random windows of the corpus' training split.
    /// It must depend only on its arguments, so that a resumed run trains on what the uninterrupted one did.
    std::function<token_batch(std::int64_t step, std::int64_t micro, std::int64_t n_seq)> batches;
};

/// Trains `m` (in place) on `corpus` on backend `be`, writing into `out_dir`. With `resume`, the run continues from
/// `out_dir`'s latest checkpoint (whose weights must already be in `m`: load them from latest_checkpoint(out_dir)
/// first) and checks the fixed options. Throws config_error (options, or a resume with other fixed options),
/// io_error / format_error (checkpoint files), nonfinite_error (a NaN/Inf loss or gradient).
template <class Model, backend B>
train_result train_model(const B& be, Model& m, const byte_corpus& corpus, const train_options& opt, const train_setup<Model>& setup,
                         const std::filesystem::path& out_dir, bool resume, std::ostream* log = nullptr) {
    namespace fs = std::filesystem;
    opt.validate();
    fs::create_directories(out_dir);
    // Checkpoint folders already in out_dir when a fresh run starts belong to someone else: saves never remove them.
    std::set<std::string> foreign;
    if (!resume)
        for (auto& f : detail::checkpoint_folders(out_dir)) foreign.insert(std::move(f));
    Model g = gradient_model(m, setup.frozen_prefix);  // the frozen prefix gets no gradient tensors
    auto ps = parameters(m, g, setup.frozen);           // (config_error when a parameter there is not frozen)
    if (!setup.save) throw config_error("train_model: no save function in the setup");
    adamw opt_state(ps, opt.adamw);
    window_sampler sampler(corpus, opt.seq_len, opt.seed);
    std::vector<loss_row> rows;
    train_result res;
    const auto schedule = opt.schedule();
    std::int64_t resumed_tokens = 0, resumed_acc_n = 0;
    double resumed_seconds = 0, resumed_loss_acc = 0, resumed_gn_acc = 0;

    if (resume) {
        const fs::path ck = latest_checkpoint(out_dir);
        const safetensors::file rd(ck / "trainer_state.safetensors");
        const auto& meta = rd.metadata();
        auto get = [&](const char* k) -> std::string {
            auto it = meta.find(k);
            if (it == meta.end()) throw format_error((ck / "trainer_state.safetensors").string() + ": metadata '" + k + "' missing");
            return it->second;
        };
        const auto fixed = nlohmann::json::parse(get("options"));
        if (fixed != opt.fixed())
            throw config_error("train --resume: the checkpoint was trained with " + fixed.dump() + ", this run asks for " +
                               opt.fixed().dump() + " (these options must match)");
        opt_state.set_step(std::stoll(get("step")));
        sampler.set_state(get("sampler"));
        for (std::size_t i = 0; i < ps.size(); ++i) {
            auto load = [&](const std::string& n, tensor<float>& dst) {
                auto t = rd.to_tensor<float>(n);
                if (t.shape() != dst.shape())
                    throw shape_error(ck.string() + ": '" + n + "' has shape " + shape_string(t.shape()) + ", expected " +
                                      shape_string(dst.shape()));
                dst = std::move(t);
            };
            if (ps[i].frozen) continue;  // none kept (a checkpoint written before that holds zeros for it: ignored)
            load(ps[i].name + ".exp_avg", opt_state.exp_avg(i));
            load(ps[i].name + ".exp_avg_sq", opt_state.exp_avg_sq(i));
        }
        // The loss curve up to the checkpoint (fields parsed one by one: "nan" is a value, not the end of a row).
        std::ifstream cf(out_dir / "loss.csv");
        std::string line;
        std::getline(cf, line);
        while (std::getline(cf, line)) {
            std::vector<std::string> f;
            std::istringstream is(line);
            for (std::string x; std::getline(is, x, ',');) f.push_back(x);
            if (f.size() < 7) continue;
            auto num = [](const std::string& x) { return x.empty() ? NAN : std::strtod(x.c_str(), nullptr); };
            loss_row r;
            r.step = std::strtoll(f[0].c_str(), nullptr, 10);
            r.tokens = std::strtoll(f[1].c_str(), nullptr, 10);
            r.loss = num(f[2]);
            r.lr = num(f[3]);
            r.grad_norm = num(f[4]);
            r.tokens_per_s = num(f[5]);
            r.seconds = num(f[6]);
            r.eval_bpb = f.size() > 7 ? num(f[7]) : NAN;
            if (r.step <= opt_state.step()) rows.push_back(r);
        }
        // Tokens and seconds so far: the checkpoint's own (older checkpoints: the curve's last row).
        if (auto it = meta.find("tokens"); it != meta.end()) resumed_tokens = std::stoll(it->second);
        else if (!rows.empty()) resumed_tokens = rows.back().tokens;
        if (auto it = meta.find("seconds"); it != meta.end()) resumed_seconds = std::stod(it->second);
        else if (!rows.empty()) resumed_seconds = rows.back().seconds;
        // The log interval in progress at the checkpoint: continued, and the row the stopped call wrote for it (at the
        // checkpoint's step) dropped, so the curve gets the rows of an uninterrupted run.
        if (auto it = meta.find("log_interval"); it != meta.end()) {
            std::istringstream li(it->second);
            long long n = 0;
            if (!(li >> n >> resumed_loss_acc >> resumed_gn_acc) || n < 0)
                throw format_error((ck / "trainer_state.safetensors").string() + ": metadata 'log_interval' is '" + it->second +
                                   "', expected a step count and two sums");
            resumed_acc_n = n;
            if (resumed_acc_n > 0 && !rows.empty() && rows.back().step == opt_state.step()) rows.pop_back();
        }
        res.resumed_from = opt_state.step();
        res.resumed = true;
    }

    const std::int64_t micro = opt.batch / opt.accum;
    activations<Model> acts;
    acts.frozen_prefix = setup.frozen_prefix;
    const auto t0 = std::chrono::steady_clock::now();
    const double t_prev = resumed_seconds;
    std::int64_t tokens = resumed_tokens;
    const bool tty = opt.progress && ::isatty(2);
    double loss_acc = resumed_loss_acc, gn_acc = resumed_gn_acc;
    std::int64_t acc_n = resumed_acc_n;
    auto elapsed = [&] { return t_prev + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    double run_tokens = 0;

    auto evaluate = [&]() -> double {
        const std::int64_t avail = corpus.n_heldout();
        const std::int64_t n = std::min(opt.eval_bytes, avail);
        if (n <= opt.eval_window) return NAN;
        stack_lm<Model, B> lm(m, be);
        const auto r = score_bits_per_byte(lm, std::span<const std::uint8_t>(corpus.bytes), corpus.train_end, n, opt.eval_window, 8);
        return r.bits_per_byte;
    };

    auto write_curve = [&] {
        std::string csv = "step,tokens,loss,lr,grad_norm,tokens_per_s,seconds,heldout_bpb\n";
        plot_series loss{"train loss (bits/byte)", {}, "", false}, ev{"held-out bits/byte", {}, "", true};
        for (const auto& r : rows) {
            char b[256];
            std::snprintf(b, sizeof b, "%lld,%lld,%.6f,%.6g,%.6g,%.1f,%.2f,", static_cast<long long>(r.step),
                          static_cast<long long>(r.tokens), r.loss, r.lr, r.grad_norm, r.tokens_per_s, r.seconds);
            csv += b;
            if (std::isfinite(r.eval_bpb)) {
                std::snprintf(b, sizeof b, "%.6f", r.eval_bpb);
                csv += b;
                ev.points.emplace_back(static_cast<double>(r.step), r.eval_bpb);
            }
            csv += "\n";
            loss.points.emplace_back(static_cast<double>(r.step), r.loss / std::log(2.0));
        }
        detail::write_text_atomic(out_dir / "loss.csv", csv);
        plot_spec p{"training loss", "step", "bits/byte", {loss}, 720, 420};
        if (!ev.points.empty()) p.series.push_back(ev);
        write_svg(out_dir / "loss.svg", p);
    };

    auto save = [&](std::int64_t step, double seconds) {
        const std::string name = "checkpoint-" + std::to_string(step);
        const fs::path tmp = out_dir / ("." + name + ".tmp"), dst = out_dir / name;
        fs::remove_all(tmp);
        setup.save(m, tmp);
        safetensors::writer w;
        for (std::size_t i = 0; i < ps.size(); ++i) {
            if (ps[i].frozen) continue;  // no moments (adamw)
            w.add(ps[i].name + ".exp_avg", opt_state.exp_avg(i));
            w.add(ps[i].name + ".exp_avg_sq", opt_state.exp_avg_sq(i));
        }
        w.set_metadata("step", std::to_string(step));
        w.set_metadata("sampler", sampler.state());
        w.set_metadata("options", opt.fixed().dump());
        w.set_metadata("tokens", std::to_string(tokens));
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.3f", seconds);
        w.set_metadata("seconds", secs);
        // The log interval in progress (steps since the last regular row, their loss and gradient-norm sums), so a
        // resumed run logs the rows an uninterrupted one would.
        char part[96];
        std::snprintf(part, sizeof part, "%lld %.17g %.17g", static_cast<long long>(acc_n), loss_acc, gn_acc);
        w.set_metadata("log_interval", part);
        w.write(tmp / "trainer_state.safetensors");
        detail::fsync_path(tmp);
        write_curve();  // before `latest` moves: a resumed run reads the rows up to its checkpoint from it
        fs::remove_all(dst);
        fs::rename(tmp, dst);
        detail::fsync_path(out_dir);
        detail::write_text_atomic(out_dir / "latest", name + "\n");
        // Only the newest checkpoint of the run stays: the previous one goes, and so does any a crashed call of this
        // run left (one between `latest` moving and this clean-up, an unfinished .checkpoint-<step>.tmp). Folders that
        // were in out_dir when a fresh run started are not the run's and stay, as does every other file. Best effort:
        // the new checkpoint is already safe, so a folder that cannot be removed costs a note, not the run.
        for (const auto& f : detail::checkpoint_folders(out_dir)) {
            if (f == name || foreign.count(f)) continue;
            std::error_code rc;
            fs::remove_all(out_dir / f, rc);
            if (rc && log) *log << "note: could not remove the old checkpoint '" << (out_dir / f).string() << "': " << rc.message() << "\n";
        }
        res.checkpoint = dst;
    };

    std::int64_t step = opt_state.step();
    const std::int64_t first_step = step;
    std::vector<unsigned char> side;
    // --minutes counts this call's training (a resumed run gets that much more), so that a budget can be spread over
    // calls of a fixed length; the curve's seconds keep counting the whole run.
    const double budget = opt.minutes > 0 ? t_prev + opt.minutes * 60.0 : INFINITY;
    auto interrupted = [&] { return opt.interrupt && opt.interrupt->load(std::memory_order_relaxed); };
    while (step < opt.steps && elapsed() < budget && (opt.stop_after <= 0 || step < first_step + opt.stop_after)) {
        if (interrupted()) {  // only a run the flag stopped counts as interrupted
            res.interrupted = true;
            break;
        }
        zero_grads(ps);
        double loss = 0;
        for (std::int64_t k = 0; k < opt.accum; ++k) {
            const auto tb = setup.batches ? setup.batches(step, k, micro) : sampler.next(micro);
            if (tb.n_seq != micro || tb.seq_len != opt.seq_len || tb.inputs.size() != tb.targets.size() ||
                static_cast<std::int64_t>(tb.inputs.size()) != tb.n_tokens())
                throw shape_error("train: a batch of " + std::to_string(tb.n_seq) + " x " + std::to_string(tb.seq_len) + " (" +
                                  std::to_string(tb.inputs.size()) + " inputs, " + std::to_string(tb.targets.size()) +
                                  " targets) where " + std::to_string(micro) + " x " + std::to_string(opt.seq_len) + " was asked");
            side.clear();
            if (setup.side) setup.side(tb.batch(), step, k, side);
            const auto bl = loss_and_grad(be, m, g, acts, tb.batch(), tb.inputs, tb.targets,
                                          1.0f / static_cast<float>(tb.n_tokens() * opt.accum), std::span<const unsigned char>(side));
            loss += bl.mean() / static_cast<double>(opt.accum);
            tokens += tb.n_tokens();
            run_tokens += static_cast<double>(tb.n_tokens());
        }
        const double gn = clip_grad_norm(ps, opt.clip);
        const double lr = schedule(step);
        opt_state.update(ps, lr);
        m.weights_changed();
        ++step;
        loss_acc += loss;
        gn_acc += gn;
        ++acc_n;
        const bool last = step == opt.steps;
        const bool do_eval = opt.eval_every > 0 && step % opt.eval_every == 0;
        if (step % opt.log_every == 0 || last || do_eval) {
            loss_row r;
            r.step = step;
            r.tokens = tokens;
            r.loss = loss_acc / static_cast<double>(acc_n);
            r.lr = lr;
            r.grad_norm = gn_acc / static_cast<double>(acc_n);
            r.seconds = elapsed();
            r.tokens_per_s = run_tokens / std::max(1e-9, r.seconds - t_prev);
            if (do_eval) r.eval_bpb = evaluate();
            rows.push_back(r);
            loss_acc = gn_acc = 0;
            acc_n = 0;
            if (tty) {
                const double frac_steps = static_cast<double>(step) / static_cast<double>(opt.steps);
                const double frac_time = std::isfinite(budget) ? (r.seconds - t_prev) / (budget - t_prev) : 0.0;
                const double frac = std::min(1.0, std::max(frac_steps, frac_time));
                const double per_step = (r.seconds - t_prev) / static_cast<double>(std::max<std::int64_t>(1, step - first_step));
                const double eta = std::min(per_step * static_cast<double>(opt.steps - step), budget - r.seconds);
                const int w = 24, filled = static_cast<int>(frac * w);
                std::fprintf(stderr, "\r\033[K step %lld/%lld [%s%s] loss %.4f (%.3f bits/byte) | %.0f tok/s | ETA %s",
                             static_cast<long long>(step), static_cast<long long>(opt.steps), std::string(static_cast<std::size_t>(filled), '=').c_str(),
                             std::string(static_cast<std::size_t>(w - filled), ' ').c_str(), r.loss, r.loss / std::log(2.0), r.tokens_per_s,
                             detail::fmt_duration(eta).c_str());
                std::fflush(stderr);
            } else if (log) {
                char b[200];
                std::snprintf(b, sizeof b, "step %lld loss %.4f lr %.3g grad_norm %.3g %.0f tok/s%s\n", static_cast<long long>(step), r.loss,
                              lr, r.grad_norm, r.tokens_per_s, std::isfinite(r.eval_bpb) ? (" held-out " + std::to_string(r.eval_bpb) + " bits/byte").c_str() : "");
                *log << b << std::flush;
            }
        }
        if (opt.checkpoint_every > 0 && step % opt.checkpoint_every == 0 && !last) save(step, elapsed());
    }
    if (tty) std::fprintf(stderr, "\n");
    res.steps_done = step;
    res.tokens = tokens;
    res.seconds = elapsed();
    res.tokens_per_s = run_tokens / std::max(1e-9, res.seconds - t_prev);
    // The steps since the last logged row (a call that ends off a log boundary) make a row of their own: their mean
    // loss, not the previous row's. A call that trained no step adds no row.
    if (acc_n > 0) {
        loss_row r;
        r.step = step;
        r.tokens = tokens;
        r.loss = loss_acc / static_cast<double>(acc_n);
        r.lr = schedule(step - 1);
        r.grad_norm = gn_acc / static_cast<double>(acc_n);
        r.seconds = res.seconds;
        r.tokens_per_s = res.tokens_per_s;
        rows.push_back(r);
    }
    res.final_loss = rows.empty() ? NAN : rows.back().loss;
    res.heldout_bpb = res.interrupted ? NAN : evaluate();  // an interrupted call saves at once
    if (!rows.empty() && rows.back().step == step) rows.back().eval_bpb = res.heldout_bpb;
    save(step, res.seconds);
    return res;
}

/// The setup of a byte LM in its Hugging Face layout (nothing frozen; checkpoints loadable by auto_model).
template <class Model>
train_setup<Model> hf_setup(nlohmann::json config) {
    train_setup<Model> s;
    s.save = [config = std::move(config)](Model& m, const std::filesystem::path& dir) { save_hf(m, config, dir, dtype::f32); };
    return s;
}

/// The setup of an Oryx byte LM (models/oryx_lm.hpp): saved in hymix's Oryx layout, trained in block-random mode
/// (spec.md §6.5): every micro-batch draws fresh modes, one per block of `block_size` tokens of each window with
/// P(attention) = p_attention, shared by all layers, from a seed that mixes `seed`, the step and the micro-batch.
template <class Model>
train_setup<Model> oryx_setup(nlohmann::json config, std::int64_t block_size, double p_attention, std::uint64_t seed) {
    train_setup<Model> s = hf_setup<Model>(std::move(config));
    s.side = [=](const seq_batch& b, std::int64_t step, std::int64_t micro, std::vector<unsigned char>& out) {
        const std::uint64_t draw_seed = seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(step) * 1000003ULL + static_cast<std::uint64_t>(micro);
        out = modes_for(block_random{block_size, p_attention, draw_seed}, b, call_phase::prefill);
    };
    return s;
}

}  // namespace hymix::train
