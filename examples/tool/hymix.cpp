// hymix — run Hugging Face Mamba-2 / Qwen3.5 (GDN, GDN+attention) checkpoints from the command line.
//   hymix info     --model DIR
//   hymix generate --model DIR --prompt TEXT | --prompt-file F  --max-new N [--temperature T --top-k K --top-p P --seed S]
//   hymix score    --model DIR --text FILE --offset O --bytes N --window L
//   hymix logits   --model DIR --input IN.safetensors --output OUT.safetensors
// Tokens are bytes (the shared KJV checkpoints); the tokenizer is the replaceable hymix::byte_tokenizer.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "hymix/io/safetensors.hpp"
#include "hymix/models/auto_model.hpp"
#include "hymix/text/sampler.hpp"
#include "hymix/text/score.hpp"
#include "hymix/text/tokenizer.hpp"

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

std::string read_file(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw hymix::io_error("cannot open '" + p.string() + "'");
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The checkpoint directory: --model, else $HYMIX_MODEL; otherwise explain what to pass.
fs::path resolve_model(const std::string& arg) {
    std::string dir = arg;
    if (dir.empty())
        if (const char* env = std::getenv("HYMIX_MODEL")) dir = env;
    if (dir.empty())
        throw hymix::config_error(
            "no model given. Pass --model DIR (or set HYMIX_MODEL) where DIR is a Hugging Face checkpoint directory "
            "holding config.json and model.safetensors, e.g. --model ../shared/models/kjv-hybrid-byte "
            "(Mamba2ForCausalLM and Qwen3_5ForCausalLM text models are supported).");
    if (!fs::is_directory(dir)) throw hymix::io_error("model directory '" + dir + "' does not exist");
    return dir;
}

void cmd_info(const fs::path& dir, int threads) {
    const auto m = hymix::auto_model::load(dir, threads);
    const auto& i = m.info();
    fmt::print("model        {}\n", dir.string());
    fmt::print("architecture {} (model_type {})\n", i.architecture, i.model_type);
    fmt::print("parameters   {}\n", i.n_params);
    fmt::print("layers       {}  d_model {}  vocab {}\n", i.n_layers, i.d_model, i.vocab_size);
    fmt::print("schedule     {}\n", i.schedule);
    for (std::size_t l = 0; l < i.layer_kinds.size(); ++l) fmt::print("  layer {:>2}: {}\n", l, i.layer_kinds[l]);
}

void cmd_generate(const fs::path& dir, int threads, const std::string& prompt, std::int64_t max_new,
                  const hymix::sampling_params& sp) {
    const auto model = hymix::auto_model::load(dir, threads);
    const hymix::byte_tokenizer tok;
    const auto V = model.info().vocab_size;
    if (tok.vocab_size() != V)
        throw hymix::config_error(fmt::format("the byte tokenizer has {} tokens but the model's vocabulary has {}",
                                              tok.vocab_size(), V));
    auto ids = tok.encode(prompt);
    if (ids.empty()) throw hymix::config_error("generate: the prompt is empty");
    hymix::sampler smp(sp);
    auto cache = model.make_cache(1);
    hymix::tensor<float> logits({1, V});
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);

    const auto t0 = clock_type::now();
    const std::int64_t T = static_cast<std::int64_t>(ids.size());
    model.forward_last(cache, hymix::seq_batch::dense(1, T), ids, logits.view<2>());
    const double prefill_s = seconds_since(t0);

    const auto t1 = clock_type::now();
    std::int64_t produced = 0;
    for (; produced < max_new; ++produced) {
        const std::int32_t next = smp.sample({logits.data(), static_cast<std::size_t>(V)});
        const std::string bytes = tok.decode(next);
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        std::fflush(stdout);
        if (produced + 1 == max_new) {
            ++produced;
            break;
        }
        const std::int32_t one[1] = {next};
        model.forward_last(cache, hymix::seq_batch::dense(1, 1), one, logits.view<2>());
    }
    const double decode_s = seconds_since(t1);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    fmt::print(stderr, "prefill: {} tokens in {:.3f} s ({:.1f} tokens/s)\n", T, prefill_s, T / prefill_s);
    if (produced > 1)
        fmt::print(stderr, "decode:  {} tokens in {:.3f} s ({:.1f} tokens/s)\n", produced - 1, decode_s,
                   (produced - 1) / decode_s);
}

void cmd_score(const fs::path& dir, int threads, const fs::path& text_path, std::int64_t offset, std::int64_t n_bytes,
               std::int64_t window, std::int64_t batch) {
    const auto model = hymix::auto_model::load(dir, threads);
    const std::string text = read_file(text_path);
    const bool tty = ::isatty(fileno(stderr)) != 0;
    auto progress = [&](std::int64_t done, std::int64_t total) {
        if (!tty) return;
        const int width = 40;
        const int fill = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
        fmt::print(stderr, "\r[{}{}] {}/{} windows", std::string(static_cast<std::size_t>(fill), '#'),
                   std::string(static_cast<std::size_t>(width - fill), ' '), done, total);
        if (done == total) fmt::print(stderr, "\n");
    };
    const auto r = hymix::score_bits_per_byte(
        model, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()), offset,
        n_bytes, window, batch, progress);
    fmt::print("model {}  text {}  offset {}  bytes {}  window {}\n", dir.filename().string(),
               text_path.filename().string(), offset, n_bytes, window);
    fmt::print("bits/byte {:.6f}  ({} windows, {} scored bytes, {:.1f} s, {:.0f} tokens/s)\n", r.bits_per_byte, r.windows,
               r.scored_bytes, r.seconds, static_cast<double>(r.scored_bytes) / r.seconds);
}

void cmd_logits(const fs::path& dir, int threads, const fs::path& in, const fs::path& out) {
    const auto model = hymix::auto_model::load(dir, threads);
    const hymix::safetensors::file f(in);
    const auto ids = f.to_tensor<std::int64_t>("input_ids");  // [B, T]; dtype_error unless I64
    if (ids.rank() != 2)
        throw hymix::shape_error(in.string() + ": input_ids must have shape [B, T], found " + hymix::shape_string(ids.shape()));
    const std::int64_t B = ids.dim(0), T = ids.dim(1), V = model.info().vocab_size;
    if (B < 1) throw hymix::shape_error(in.string() + ": input_ids has shape " + hymix::shape_string(ids.shape()) + ", expected B >= 1 rows");
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
    for (std::int64_t i = 0; i < B * T; ++i) {
        const std::int64_t v = ids[i];
        if (v < 0 || v >= V)
            throw hymix::value_error(fmt::format("{}: input_ids[{}] = {} is outside the vocabulary [0, {})", in.string(), i, v, V));
        tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
    }
    auto cache = model.make_cache(B);
    hymix::tensor<float> logits({B * T, V});
    model.forward(cache, hymix::seq_batch::dense(B, T), tokens, logits.view<2>());
    logits.reshape({B, T, V});
    hymix::safetensors::writer w;
    w.add("logits", logits);
    w.write(out);
    fmt::print("wrote logits [{}, {}, {}] to {}\n", B, T, V, out.string());
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"hymix: run hybrid recurrent/attention language models (Hugging Face checkpoints) on the CPU"};
    app.require_subcommand(1);
    std::string model_dir;
    int threads = 0;
    auto add_common = [&](CLI::App* c) {
        c->add_option("--model,-m", model_dir, "checkpoint directory (config.json + model.safetensors); default $HYMIX_MODEL");
        c->add_option("--threads,-t", threads, "worker threads (0 = all cores)")->check(CLI::NonNegativeNumber);
    };

    auto* info = app.add_subcommand("info", "architecture, parameter count and layer schedule");
    add_common(info);

    auto* gen = app.add_subcommand("generate", "stream bytes generated from a prompt");
    add_common(gen);
    std::string prompt, prompt_file;
    std::int64_t max_new = 128;
    hymix::sampling_params sp;
    sp.temperature = 0.8f;
    auto* p1 = gen->add_option("--prompt", prompt, "prompt text");
    auto* p2 = gen->add_option("--prompt-file", prompt_file, "file holding the prompt")->check(CLI::ExistingFile);
    p1->excludes(p2);
    gen->add_option("--max-new,-n", max_new, "bytes to generate (default 128)")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
    gen->add_option("--temperature", sp.temperature, "sampling temperature (0 = greedy; default 0.8)")->capture_default_str();
    gen->add_option("--top-k", sp.top_k, "keep the k most likely tokens (0 = all)");
    gen->add_option("--top-p", sp.top_p, "nucleus sampling mass (1 = off)");
    gen->add_option("--seed", sp.seed, "random seed");

    auto* score = app.add_subcommand("score", "bits per byte over a slice of a text file (protocol of shared/models/README.md)");
    add_common(score);
    std::string text_path;
    std::int64_t offset = 0, n_bytes = 131072, window = 512, batch = 8;
    score->add_option("--text", text_path, "text file")->required()->check(CLI::ExistingFile);
    score->add_option("--offset", offset, "first byte of the scored slice")->capture_default_str();
    score->add_option("--bytes", n_bytes, "length of the scored slice")->capture_default_str();
    score->add_option("--window", window, "window length L")->capture_default_str();
    score->add_option("--batch", batch, "windows per forward call")->capture_default_str();

    auto* lg = app.add_subcommand("logits", "logits for input_ids [B, T] (int64) -> logits [B, T, V] (f32) safetensors");
    add_common(lg);
    std::string in_path, out_path;
    lg->add_option("--input", in_path, "safetensors file with input_ids")->required()->check(CLI::ExistingFile);
    lg->add_option("--output", out_path, "safetensors file to write")->required();

    CLI11_PARSE(app, argc, argv);
    try {
        const fs::path dir = resolve_model(model_dir);
        if (*info) cmd_info(dir, threads);
        if (*gen) {
            if (!prompt_file.empty()) prompt = read_file(prompt_file);
            if (prompt.empty())
                throw hymix::config_error(prompt_file.empty() ? "generate: give a non-empty --prompt TEXT or --prompt-file F"
                                                              : "generate: the prompt file '" + prompt_file + "' is empty");
            cmd_generate(dir, threads, prompt, max_new, sp);
        }
        if (*score) cmd_score(dir, threads, text_path, offset, n_bytes, window, batch);
        if (*lg) cmd_logits(dir, threads, in_path, out_path);
    } catch (const hymix::error& e) {
        fmt::print(stderr, "hymix: error: {}\n", e.what());
        return 2;
    } catch (const std::bad_alloc&) {
        fmt::print(stderr, "hymix: error: out of memory (the model, batch or window is too large for this machine)\n");
        return 3;
    } catch (const std::exception& e) {
        fmt::print(stderr, "hymix: error: {}\n", e.what());
        return 3;
    }
    return 0;
}
