// `hymix amor-router`: fits AMOR's optional entropy routers (spec.md §5.6) for a trained AMOR file. The model runs
// inference (frozen τ, exact gates) over random windows of the text's training split while every entropy gate records
// (ĥ, H) of a seeded fraction of its positions; one router per block is fitted to them (train/router_fit.hpp); the
// held-out part is then scored twice with the same windows, exact gates and routed gates, and the per-block decision
// agreement and R² of Ĥ (on the exact pass's own block inputs), fire rates and bits/byte of both passes are reported.
// The routers go to one file (models/amor_router.hpp) that `--router FILE` hands to generate / score / logits /
// amor-trace.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/amor.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/models/check_weights.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/train/data.hpp"
#include "hymix/train/router_fit.hpp"
#include "hymix/train/trainer.hpp"
#include "amor_router.hpp"
#include "load.hpp"
#include "tool.hpp"

namespace tool {

namespace {

struct block_result {
    std::int64_t layer = 0, samples = 0;
    double train_mse = 0, fit_heldout_mse = 0, fit_r2 = 0;  // the fit's own split of the recorded samples
    // On the held-out text: τ, fire rates of the exact and the routed pass, and on the exact pass's block inputs ĥ the
    // fraction of positions where Ĥ > τ agrees with H > τ and the R² of Ĥ against H.
    double tau = 0, fire_exact = 0, fire_router = 0, agreement = 0, r2 = 0, mse = 0, h_std = 0;
};

/// Below this standard deviation of the exact entropy H (normalised, in [0, 1]) an R² of Ĥ says nothing: it divides
/// the error by a near-zero variance.
constexpr double min_h_std = 1e-3;

template <class S, class Backbone>
int fit_routers(const common_options& c, const amor_router_options& o, Backbone bb, const std::filesystem::path& backbone_dir,
                const hymix::train::byte_corpus& corpus) {
    hymix::cpu_backend be(c.threads);
    S m = hymix::models::load_amor<S>(std::move(bb), c.amor);
    std::vector<std::shared_ptr<hymix::router_samples>> taps;
    std::vector<float> taus;
    hymix::models::for_each_entropy_gate(m, [&](hymix::entropy_ema& g) {
        auto t = std::make_shared<hymix::router_samples>();
        t->max_rows = o.samples;
        t->keep = o.keep;
        t->rng.seed(o.seed + 1000 * taps.size());
        g.set_sample_tap(t);
        taps.push_back(std::move(t));
        taus.push_back(g.threshold());
    });
    const std::size_t nb = taps.size();
    console::note("amor-router: {} entropy gates; recording {} positions per block ({:.0f}% of positions kept) from {}-byte windows of the "
                  "training split of '{}'; {} threads",
                  nb, o.samples, 100 * o.keep, o.window, o.text, be.num_threads());
    // 1. Samples from the training split.
    hymix::train::window_sampler sampler(corpus, o.window, o.seed);
    const std::int64_t V = m.config().vocab_size, d = m.config().d_model;
    auto all_full = [&] { return std::all_of(taps.begin(), taps.end(), [](const auto& t) { return t->full(); }); };
    std::int64_t tokens = 0;
    const bool tty = console::stderr_is_terminal();
    int logged_quarter = 0;
    while (!all_full()) {
        const auto b = sampler.next(8);
        auto cache = m.make_cache(b.n_seq);
        hymix::tensor<float> logits({b.n_seq, V});  // the gates see every position; only the last logits are formed
        m.forward_last(be, cache, hymix::seq_batch::dense(b.n_seq, b.seq_len), b.inputs, logits.view<2>());
        tokens += b.n_seq * b.seq_len;
        const auto line = fmt::format("amor-router: recorded {} / {} rows per block ({} tokens run)", taps.front()->rows(), o.samples, tokens);
        if (tty) console::status(line);
        else if (const int q = static_cast<int>(4 * taps.front()->rows() / std::max<std::int64_t>(1, o.samples)); q > logged_quarter && q < 4) {
            logged_quarter = q;  // a log (not a terminal) hears of the recording at each quarter
            console::note("{}", line);
        }
    }
    if (tty) console::clear_status();
    console::note("amor-router: recorded {} rows per block from {} tokens", o.samples, tokens);
    hymix::models::for_each_entropy_gate(m, [](hymix::entropy_ema& g) { g.set_sample_tap(nullptr); });
    // 2. One router per block.
    std::vector<block_result> res(nb);
    std::vector<std::shared_ptr<const hymix::entropy_router>> routers;
    for (std::size_t k = 0; k < nb; ++k) {
        hymix::train::router_fit_options fo;
        fo.hidden = o.hidden;
        fo.epochs = o.epochs;
        fo.batch = o.batch;
        fo.lr = o.lr;
        fo.seed = o.seed + k;
        fo.progress = [&](std::int64_t e, double tr, double ho) {
            const auto line = fmt::format("amor-router: block {} epoch {}/{}: train MSE {:.3e}, held-out MSE {:.3e}", k, e, o.epochs, tr, ho);
            if (tty && e < o.epochs) console::status(line);
            else if (tty || e == o.epochs) console::note("{}", line);
        };
        auto r = hymix::train::fit_entropy_router(be, *taps[k], fo);
        res[k].samples = taps[k]->rows();
        res[k].train_mse = r.train_mse;
        res[k].fit_heldout_mse = r.heldout_mse;
        // nan where there is no held-out share or H barely varies over it (see min_h_std)
        res[k].fit_r2 = r.heldout_var > min_h_std * min_h_std ? 1 - r.heldout_mse / r.heldout_var : std::nan("");
        res[k].tau = taus[k];
        routers.push_back(std::make_shared<const hymix::entropy_router>(std::move(r.router)));
        taps[k].reset();
    }
    // 3. Held-out: exact gates (recording every position's ĥ and H), then routed gates, on the same windows.
    const std::span<const std::uint8_t> text(corpus.bytes);
    const std::int64_t n = std::min<std::int64_t>(o.eval_bytes, corpus.n_heldout());
    std::vector<std::shared_ptr<hymix::router_samples>> held(nb);
    {
        std::size_t k = 0;
        hymix::models::for_each_entropy_gate(m, [&](hymix::entropy_ema& g) {
            held[k] = std::make_shared<hymix::router_samples>();
            held[k]->max_rows = std::min(n, o.samples);  // memory as the recording's; keep 1: the first positions
            g.set_sample_tap(held[k++]);
        });
    }
    const auto exact = hymix::train::evaluate_heldout(be, m, text, corpus.train_end, n, o.window, 8);
    hymix::models::for_each_entropy_gate(m, [](hymix::entropy_ema& g) { g.set_sample_tap(nullptr); });
    hymix::models::attach_entropy_routers(m, routers, o.out.string());
    const auto routed = hymix::train::evaluate_heldout(be, m, text, corpus.train_end, n, o.window, 8);
    for (std::size_t k = 0; k < nb; ++k) {
        const auto& He = held[k]->H;
        std::vector<float> Hr(He.size());
        routers[k]->predict(be, hymix::tensor_view<const float, 2>(held[k]->h.data(), {held[k]->rows(), d}), Hr);
        res[k].layer = exact.gated_layers.at(k);
        res[k].fire_exact = exact.fire_rate.at(k);
        res[k].fire_router = routed.fire_rate.at(k);
        std::int64_t agree = 0;
        double mean = 0, se = 0, var = 0;
        for (std::size_t i = 0; i < He.size(); ++i) {
            agree += (He[i] > res[k].tau) == (Hr[i] > res[k].tau);
            mean += He[i];
        }
        mean /= static_cast<double>(std::max<std::size_t>(1, He.size()));
        for (std::size_t i = 0; i < He.size(); ++i) se += (Hr[i] - He[i]) * (Hr[i] - He[i]), var += (He[i] - mean) * (He[i] - mean);
        res[k].agreement = static_cast<double>(agree) / static_cast<double>(std::max<std::size_t>(1, He.size()));
        // R² is undefined where H barely varies (an untrained or random model, whose head output is near uniform
        // everywhere): it is reported as nan there, with the reason, and the MSE stands for the fit.
        res[k].h_std = He.size() > 1 ? std::sqrt(var / static_cast<double>(He.size() - 1)) : 0;
        res[k].mse = se / static_cast<double>(std::max<std::size_t>(1, He.size()));
        res[k].r2 = res[k].h_std > min_h_std ? 1 - se / var : std::nan("");
        held[k].reset();
    }
    // 4. Report and write.
    const double head_flops = 2.0 * static_cast<double>(d * V), router_flops = 2.0 * static_cast<double>(routers.front()->macs_per_row());
    fmt::print("held-out bytes [{}, {}) of '{}', window {}: bits/byte exact gates {:.5f}, routed gates {:.5f} ({:+.5f})\n", corpus.train_end,
               corpus.train_end + n, o.text, o.window, exact.bits_per_byte, routed.bits_per_byte, routed.bits_per_byte - exact.bits_per_byte);
    fmt::print("gate cost per position and block: head {:.0f} FLOPs (2·d·V, d {} V {}), router {:.0f} FLOPs: the router is {:.2f}× the head's "
               "work ({})\n",
               head_flops, d, V, router_flops, router_flops / head_flops,
               router_flops < head_flops ? "it pays" : "it does not pay at this vocabulary: keep the exact gate");
    fmt::print("per block: the fit on its held-out share of the recorded positions; on the held-out text, τ, the fire rates of the exact "
               "and the routed pass, and Ĥ against H on the exact pass's block inputs (decision agreement, R²)\n");
    fmt::print("{:>5} {:>5} {:>8} {:>10} {:>8} {:>8} {:>10} {:>11} {:>9} {:>8}\n", "block", "layer", "samples", "fit MSE", "fit R²", "τ",
               "fire exact", "fire router", "agreement", "R² text");
    for (std::size_t k = 0; k < nb; ++k) {
        const auto& r = res[k];
        fmt::print("{:>5} {:>5} {:>8} {:>10.3e} {:>8.4f} {:>8.4f} {:>10.4f} {:>11.4f} {:>9.4f} {:>8.4f}\n", k, r.layer, r.samples,
                   r.fit_heldout_mse, r.fit_r2, r.tau, r.fire_exact, r.fire_router, r.agreement, r.r2);
    }
    for (std::size_t k = 0; k < nb; ++k)
        if (std::isnan(res[k].r2))
            fmt::print("block {}: H is nearly constant on the held-out text (std {:.2e} < {:.0e}: an untrained or random model?), so R² is "
                       "undefined; Ĥ's MSE against H there is {:.3e}\n",
                       k, res[k].h_std, min_h_std, res[k].mse);
    nlohmann::json info = {{"fitted_for", std::filesystem::path(c.amor).filename().string()},
                           {"backbone", backbone_dir.filename().string()},
                           {"samples_per_block", o.samples},
                           {"epochs", o.epochs},
                           {"seed", o.seed},
                           {"vocab_size", V},
                           {"heldout_bits_per_byte_exact", exact.bits_per_byte},
                           {"heldout_bits_per_byte_routed", routed.bits_per_byte}};
    hymix::models::save_entropy_routers(routers, o.out, info);
    fmt::print("wrote {}\n", o.out.string());
    if (!o.csv.empty()) {
        std::string csv = "block,layer,samples,fit_heldout_mse,fit_r2,tau,fire_rate_exact,fire_rate_router,decision_agreement,r2_heldout_text,"
                          "bits_per_byte_exact,bits_per_byte_routed,window\n";
        for (std::size_t k = 0; k < nb; ++k) {
            const auto& r = res[k];
            csv += fmt::format("{},{},{},{:.6e},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{}\n", k, r.layer, r.samples, r.fit_heldout_mse,
                               r.fit_r2, r.tau, r.fire_exact, r.fire_router, r.agreement, r.r2, exact.bits_per_byte, routed.bits_per_byte, o.window);
        }
        hymix::train::detail::write_text_atomic(o.csv, csv);
        fmt::print("wrote {}\n", o.csv.string());
    }
    return exit_ok;
}

}  // namespace

int run_amor_router(const common_options& c, const amor_router_options& o) {
    if (c.backend != "cpu") throw usage_error("amor-router runs on the cpu backend only (--backend " + c.backend + ")");
    if (c.amor.empty()) throw usage_error("amor-router needs --amor FILE (the trained AMOR blocks) and the backbone as --model");
    if (o.text.empty()) throw usage_error("amor-router needs --text FILE (windows of its training split; its last 5% is held out)");
    // Outputs checked before minutes of work: a folder that exists, not a directory, not one of the inputs.
    for (const auto& [p, what] : {std::pair{o.out, "--out"}, std::pair{o.csv, "--csv"}}) {
        if (p.empty()) continue;
        require_writable(p, what);
        std::error_code ec;
        for (const auto& [in, in_what] : {std::pair{std::filesystem::path(c.amor), "--amor"}, std::pair{std::filesystem::path(o.text), "--text"}})
            if (std::filesystem::equivalent(p, in, ec))
                throw usage_error(fmt::format("{} '{}' would overwrite the {} file", what, p.string(), in_what));
    }
    {
        std::error_code ec;
        if (!o.csv.empty() && (o.csv == o.out || std::filesystem::equivalent(o.csv, o.out, ec)))
            throw usage_error("--csv and --out name the same file");
    }
    auto in = open_amor_inputs(c);
    auto& rd = in.reader;
    if (in.amor.always_on) throw usage_error(c.amor + " holds always-on blocks: they have no entropy gate for a router to stand in for");
    const auto corpus = hymix::train::byte_corpus::load(o.text);
    // A text too short for the window is a bad input (exit 2, as amor-train and train report it); an --eval-bytes that
    // leaves no whole window is a command-line mistake (exit 1).
    if (corpus.n_train() < o.window + 1)
        throw hymix::value_error(fmt::format("amor-router: the training split of '{}' has {} bytes; a --window of {} needs more", o.text,
                                             corpus.n_train(), o.window));
    if (corpus.n_heldout() <= o.window)
        throw hymix::value_error(fmt::format("amor-router: the held-out range of '{}' (its last 5%) has {} byte(s); a --window of {} needs more",
                                             o.text, corpus.n_heldout(), o.window));
    amor_router_options opt = o;
    if (opt.samples == 0) opt.samples = std::min(default_router_samples, corpus.n_train());
    if (opt.samples > corpus.n_train())
        throw usage_error(fmt::format("amor-router: --samples {} exceeds the {} positions of the training split of '{}'", opt.samples,
                                      corpus.n_train(), o.text));
    if (std::min<std::int64_t>(o.eval_bytes, corpus.n_heldout()) <= o.window)
        throw usage_error(fmt::format("amor-router: the held-out range has {} byte(s) (the last 5% of '{}', at most --eval-bytes {}); a --window "
                                      "of {} needs more",
                                      std::min<std::int64_t>(o.eval_bytes, corpus.n_heldout()), o.text, o.eval_bytes, o.window));
    if (in.model_type == "mamba2")
        return fit_routers<hymix::models::amor_mamba2_stack<>>(c, opt, hymix::models::load_hf_mamba2<hymix::models::hf_mamba2_stack>(rd), in.dir, corpus);
    return fit_routers<hymix::models::amor_gdn_stack<>>(c, opt, hymix::models::load_hf_qwen3_5<hymix::models::qwen3_5_gdn_stack>(rd), in.dir, corpus);
}

}  // namespace tool
