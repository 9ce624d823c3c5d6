// `hymix train`: trains a byte-level language model from scratch (hymix/train/): a Mamba-2, Gated DeltaNet,
// attention or hybrid stack in the Hugging Face layout of its family, on a text file's training split, with a
// progress line, the loss curve (CSV + SVG) and resumable checkpoints in --out; the result loads with
// `hymix generate/score --model OUT/checkpoint-<step>` (OUT/latest names it) and with auto_model.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "hymix/backend/cpu.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/trainer.hpp"
#include "tool.hpp"

namespace tool {

namespace {

template <class Model>
int train_stack(const train_command_options& o, Model m, const nlohmann::json& config, const hymix::train::byte_corpus& corpus,
                bool resume) {
    hymix::cpu_backend be(o.threads);
    std::int64_t n_params = 0;
    m.for_each_param([&](const std::string&, hymix::tensor<float>& t) { n_params += t.numel(); });
    console::note("train: {} stack, {} layers, d_model {}, {} parameters; {} bytes of training text, {} held out; {} threads",
                  o.spec.stack, o.spec.n_layers, o.spec.d_model, n_params, corpus.n_train(), corpus.n_heldout(), be.num_threads());
    const auto r = hymix::train::train_model(be, m, corpus, o.train, hymix::train::hf_setup<Model>(config), o.out, resume, &std::cerr);
    console::end_lines();
    fmt::print("trained {} steps ({} tokens) in {:.1f} s: {:.0f} tokens/s; final train loss {:.4f} nats ({:.4f} bits/byte); "
               "held-out bits/byte {:.4f}\n",
               r.steps_done, r.tokens, r.seconds, r.tokens_per_s, r.final_loss, r.final_loss / std::log(2.0), r.heldout_bpb);
    fmt::print("checkpoint: {}  (loss curve: {}, {})\n", r.checkpoint.string(), (o.out / "loss.csv").string(),
               (o.out / "loss.svg").string());
    if (!o.export_bf16.empty()) {
        hymix::train::save_hf(m, config, o.export_bf16, hymix::dtype::bf16);
        fmt::print("bf16 export: {}\n", o.export_bf16.string());
    }
    return exit_ok;
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
        if (config.value("model_type", "") == "mamba2") return train_stack(o, hymix::models::load_hf_mamba2(rd), config, corpus, true);
        return train_stack(o, hymix::models::load_hf_qwen3_5(rd), config, corpus, true);
    }
    const auto config = tr::hf_config(o.spec);
    if (o.spec.is_mamba2()) return train_stack(o, tr::random_mamba2_lm(o.spec, o.train.seed), config, corpus, false);
    return train_stack(o, tr::random_qwen3_5_lm(o.spec, o.train.seed), config, corpus, false);
}

}  // namespace tool
