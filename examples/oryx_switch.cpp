// The mode-switch curve of an Oryx language model (issue 10; spec.md §6.4): how fast the loss reaches the level of
// the new read-out after the mode changes mid-sequence. Over held-out windows of a byte text it scores four per-token
// mode lists — all linear, all attention, linear then attention from position S, attention then linear from S — and
// writes the per-position loss (nats, averaged over windows) as CSV and an SVG plot, and prints each switched curve's
// mean gap to the target mode's curve over the 16 positions after the switch and over the rest of the window.
//
//   example_oryx_switch MODEL_DIR TEXT OUT_PREFIX [OFFSET WINDOWS WINDOW SWITCH]
//   (defaults: the KJV held-out offset 4083327, 64 windows of 256 bytes, switch at 128)
// writes OUT_PREFIX.csv and OUT_PREFIX.svg. Errors (missing files, a model that is not an Oryx LM, a text too short)
// are printed with their source and exit with status 2.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/oryx_lm.hpp"
#include "hymix/text/score.hpp"
#include "hymix/train/plot.hpp"

int main(int argc, char** argv) try {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s MODEL_DIR TEXT OUT_PREFIX [OFFSET WINDOWS WINDOW SWITCH]\n", argv[0]);
        return 1;
    }
    const std::filesystem::path model_dir = argv[1], text_path = argv[2];
    const std::string out = argv[3];
    const std::int64_t offset = argc > 4 ? std::stoll(argv[4]) : 4083327, n_win = argc > 5 ? std::stoll(argv[5]) : 64,
                       W = argc > 6 ? std::stoll(argv[6]) : 256, S = argc > 7 ? std::stoll(argv[7]) : 128;
    if (n_win < 1 || W < 2 || S < 1 || S >= W) throw hymix::value_error("need WINDOWS >= 1, WINDOW >= 2 and 0 < SWITCH < WINDOW");
    std::ifstream f(text_path, std::ios::binary);
    if (!f) throw hymix::io_error("cannot open text '" + text_path.string() + "'");
    const std::vector<char> text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (offset < 0 || offset + n_win * W + 1 > static_cast<std::int64_t>(text.size()))
        throw hymix::value_error("text '" + text_path.string() + "' (" + std::to_string(text.size()) + " bytes) is too short for " +
                                 std::to_string(n_win) + " windows of " + std::to_string(W) + " at offset " + std::to_string(offset));

    const auto m = hymix::models::load_oryx_lm(model_dir);
    const hymix::cpu_backend be;
    const std::int64_t V = m.config().vocab_size;
    // The four mode lists of one window (1 = attention), repeated for every window of the batch.
    const char* names[4] = {"all linear", "all attention", "linear -> attention", "attention -> linear"};
    std::vector<std::vector<double>> loss(4, std::vector<double>(static_cast<std::size_t>(W), 0.0));
    std::vector<std::int32_t> tok(static_cast<std::size_t>(n_win * W));
    for (std::int64_t b = 0; b < n_win; ++b)
        for (std::int64_t t = 0; t < W; ++t)
            tok[static_cast<std::size_t>(b * W + t)] = static_cast<unsigned char>(text[static_cast<std::size_t>(offset + b * W + t)]);
    hymix::tensor<float> logits({n_win * W, V});
    for (int c = 0; c < 4; ++c) {
        std::vector<unsigned char> modes(tok.size());
        for (std::int64_t b = 0; b < n_win; ++b)
            for (std::int64_t t = 0; t < W; ++t)
                modes[static_cast<std::size_t>(b * W + t)] = c == 1 || (c == 2 && t >= S) || (c == 3 && t < S) ? 1 : 0;
        auto cache = m.make_cache(n_win);
        m.forward(be, cache, hymix::seq_batch::dense(n_win, W), tok, logits.view<2>(), {}, std::span<const unsigned char>(modes));
        for (std::int64_t b = 0; b < n_win; ++b)
            for (std::int64_t t = 0; t < W; ++t) {
                const auto target = static_cast<std::int32_t>(static_cast<unsigned char>(text[static_cast<std::size_t>(offset + b * W + t + 1)]));
                loss[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)] +=
                    hymix::cross_entropy(std::span<const float>(&logits[(b * W + t) * V], static_cast<std::size_t>(V)), target) /
                    static_cast<double>(n_win);
            }
    }
    {
        std::ofstream csv(out + ".csv");
        csv << "position,all_linear,all_attention,linear_to_attention,attention_to_linear\n";
        for (std::int64_t t = 0; t < W; ++t) {
            csv << t;
            for (int c = 0; c < 4; ++c) csv << "," << loss[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)];
            csv << "\n";
        }
        if (!csv) throw hymix::io_error("cannot write '" + out + ".csv'");
    }
    // Curves smoothed over 16 positions (per-position losses over a few windows are noisy).
    const auto smooth = [&](int c, std::int64_t t) {
        double s = 0;
        std::int64_t n = 0;
        for (std::int64_t u = std::max<std::int64_t>(0, t - 7); u <= std::min(W - 1, t + 8); ++u, ++n) s += loss[static_cast<std::size_t>(c)][static_cast<std::size_t>(u)];
        return s / static_cast<double>(n);
    };
    hymix::train::plot_spec p;
    std::string name = model_dir.filename().string();  // a run's checkpoint-N: name the run
    if (name.rfind("checkpoint-", 0) == 0) name = model_dir.parent_path().filename().string() + "/" + name;
    p.title = "Oryx mode switch at position " + std::to_string(S) + " (" + name + ", " + std::to_string(n_win) + " windows)";
    p.x_label = "position";
    p.y_label = "loss (nats, 16-position mean)";
    for (int c = 0; c < 4; ++c) {
        hymix::train::plot_series s;
        s.name = names[c];
        for (std::int64_t t = 0; t < W; ++t) s.points.emplace_back(static_cast<double>(t), smooth(c, t));
        p.series.push_back(std::move(s));
    }
    hymix::train::write_svg(out + ".svg", p);
    // The gap to the target mode's curve right after the switch (first 16 positions) and over the rest of the window.
    const auto mean_gap = [&](int c, int target, std::int64_t t0, std::int64_t t1) {
        double g = 0;
        for (std::int64_t t = t0; t < t1; ++t)
            g += loss[static_cast<std::size_t>(c)][static_cast<std::size_t>(t)] - loss[static_cast<std::size_t>(target)][static_cast<std::size_t>(t)];
        return g / static_cast<double>(t1 - t0);
    };
    for (int c = 2; c < 4; ++c) {
        const int target = c == 2 ? 1 : 0;
        const std::int64_t e = std::min(W, S + 16);
        std::printf("%s: loss minus %s's, positions [%lld, %lld): %+.4f nats; [%lld, %lld): %+.4f nats\n", names[c], names[target],
                    static_cast<long long>(S), static_cast<long long>(e), mean_gap(c, target, S, e), static_cast<long long>(e),
                    static_cast<long long>(W), e < W ? mean_gap(c, target, e, W) : 0.0);
    }
    std::printf("wrote %s.csv and %s.svg\n", out.c_str(), out.c_str());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "oryx_switch: error: %s\n", e.what());
    return 2;
}
