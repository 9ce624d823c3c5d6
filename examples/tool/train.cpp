// `hymix train`: trains a byte-level language model from scratch (hymix/train/): a Mamba-2, Gated DeltaNet,
// attention or hybrid stack in the Hugging Face layout of its family, or an Oryx stack (block-random modes, hymix's
// Oryx layout), on a text file's training split, with a
// progress line, the loss curve (CSV + SVG) and resumable checkpoints in --out; the result loads with
// `hymix generate/score --model OUT/checkpoint-<step>` (OUT/latest names it) and with auto_model.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/schedule/mode_schedule.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/trainer.hpp"
#include "tool.hpp"

namespace tool {

namespace {

template <class Model>
int train_stack(const train_command_options& o, Model m, const nlohmann::json& config, const hymix::train::byte_corpus& corpus,
                bool resume, const hymix::train::train_setup<Model>& setup) {
    hymix::cpu_backend be(o.threads);
    std::int64_t n_params = 0;
    m.for_each_param([&](const std::string&, hymix::tensor<float>& t) { n_params += t.numel(); });
    console::note("train: {} stack, {} layers, d_model {}, {} parameters; {} bytes of training text, {} held out; {} threads",
                  o.spec.stack, o.spec.n_layers, o.spec.d_model, n_params, corpus.n_train(), corpus.n_heldout(), be.num_threads());
    const auto r = train_interruptible("train", o.train, [&](const hymix::train::train_options& t) {
        return hymix::train::train_model(be, m, corpus, t, setup, o.out, resume, &std::cerr);
    });
    fmt::print("trained {} steps ({} tokens) in {:.1f} s: {:.0f} tokens/s; final train loss {}; held-out bits/byte {}\n", r.steps_done,
               r.tokens, r.seconds, r.tokens_per_s,
               std::isfinite(r.final_loss) ? fmt::format("{:.4f} nats ({:.4f} bits/byte)", r.final_loss, r.final_loss / std::log(2.0))
                                           : std::string("- (no step trained)"),
               std::isfinite(r.heldout_bpb) ? fmt::format("{:.4f}", r.heldout_bpb) : std::string(r.interrupted ? "- (interrupted)" : "-"));
    fmt::print("checkpoint: {}  (loss curve: {}, {})\n", r.checkpoint.string(), (o.out / "loss.csv").string(),
               (o.out / "loss.svg").string());
    if (r.interrupted) {
        console::note("train: interrupted at step {}: checkpoint written; --resume continues the run", r.steps_done);
        return exit_interrupted;
    }
    if (!o.export_bf16.empty()) {
        hymix::train::save_hf(m, config, o.export_bf16, hymix::dtype::bf16);
        fmt::print("bf16 export: {}\n", o.export_bf16.string());
    }
    return exit_ok;
}

/// Block-random modes varied per step from the run's seed: the spec's block size and P(attention) for a new run; for a
/// resumed one those the run was started with (config.json's training_schedule), so that it draws what the
/// uninterrupted run drew.
hymix::train::train_setup<hymix::models::oryx_lm_stack> oryx_setup(const train_command_options& o, const nlohmann::json& config,
                                                                   bool resume) {
    std::int64_t block = o.spec.oryx_block_size;
    double p = o.spec.oryx_p_attention;
    if (resume) {
        const auto spec = config.value("training_schedule", std::string());
        const auto s = hymix::parse_mode_schedule(spec);  // config_error naming the spec when it is not one
        const auto* br = std::get_if<hymix::block_random>(&s);
        if (!br) throw hymix::config_error("the run's config.json has training_schedule \"" + spec + "\", not a block_random schedule");
        block = br->block_size;
        p = br->p_attention;
    }
    console::note("train: Oryx block-random mode: blocks of {} tokens, P(attention) {}{}", block, p,
                  resume ? " (the run's own: --block-size and --p-attention are not read on --resume)" : "");
    return hymix::train::oryx_setup<hymix::models::oryx_lm_stack>(config, block, p, o.train.seed);
}

}  // namespace

int run_train(const train_command_options& o) {
    namespace fs = std::filesystem;
    namespace tr = hymix::train;
    const auto corpus = tr::byte_corpus::load(o.text);
    const bool resume = o.resume && fs::exists(o.out / "latest");
    if (o.resume && !resume) console::note("train: --resume given but '{}' holds no checkpoint: starting fresh", o.out.string());
    if (!o.resume && fs::exists(o.out / "latest"))
        throw usage_error(fmt::format("'{}' already holds a training run (file 'latest'): pass --resume to continue it, or "
                                      "choose another --out",
                                      o.out.string()));
    if (resume) {
        const auto ck = tr::latest_checkpoint(o.out);
        hymix::models::checkpoint_reader rd(ck);
        const auto config = rd.config();
        console::note("train: resuming from {}", ck.string());
        const auto mt = config.value("model_type", "");
        if (mt == "mamba2") return train_stack(o, hymix::models::load_hf_mamba2(rd), config, corpus, true, tr::hf_setup<hymix::models::hf_mamba2_stack>(config));
        if (mt == "oryx") return train_stack(o, hymix::models::load_oryx_lm(rd), config, corpus, true, oryx_setup(o, config, true));
        return train_stack(o, hymix::models::load_hf_qwen3_5(rd), config, corpus, true, tr::hf_setup<hymix::models::qwen3_5_hybrid_stack>(config));
    }
    const auto config = tr::hf_config(o.spec);
    if (o.spec.is_mamba2())
        return train_stack(o, tr::random_mamba2_lm(o.spec, o.train.seed), config, corpus, false, tr::hf_setup<hymix::models::hf_mamba2_stack>(config));
    if (o.spec.is_oryx()) return train_stack(o, tr::random_oryx_lm(o.spec, o.train.seed), config, corpus, false, oryx_setup(o, config, false));
    return train_stack(o, tr::random_qwen3_5_lm(o.spec, o.train.seed), config, corpus, false, tr::hf_setup<hymix::models::qwen3_5_hybrid_stack>(config));
}

}  // namespace tool
