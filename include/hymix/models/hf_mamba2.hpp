// Hugging Face `Mamba2ForCausalLM` checkpoints (spec.md §3.6–3.8) mapped onto a compiled Mamba-2 stack:
// backbone.embeddings.weight, backbone.layers.{i}.norm.weight, backbone.layers.{i}.mixer.*, backbone.norm_f.weight,
// lm_head.weight (or tied). The gated output norm is full width (HF eager MambaRMSNormGated), as HF computes it.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/mixer/mamba2.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/stack/model.hpp"

namespace hymix::models {

/// The compiled stack for HF Mamba-2: every layer Mamba-2, plain RMSNorm, no MLP.
using hf_mamba2_stack = model<every_layer<layer_kind::mamba2>, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>>;

/// Model-level facts read from config.json.
struct hf_mamba2_config {
    stack_config stack;
    mamba2_config mixer;
    std::int64_t n_layers = 0;
};

/// Reads an HF Mamba-2 config.json object (`origin` names the file in errors). Accepts `time_step_limit` as
/// [lo, hi] with hi possibly Infinity in any spelling (the JSON reader maps them to ±inf), absent → (0, ∞).
/// Throws config_error for a different model_type, a missing key, or settings hymix does not implement
/// (rms_norm false, hidden_act other than silu, d_ssm < d_inner).
inline hf_mamba2_config read_hf_mamba2_config(const io::json& j, const std::string& origin) {
    const auto mt = io::get<std::string>(j, "model_type", "mamba2", origin);
    if (mt != "mamba2") throw config_error(origin + ": model_type '" + mt + "' is not mamba2");
    hf_mamba2_config c;
    auto& m = c.mixer;
    m.d_model = io::require<std::int64_t>(j, "hidden_size", origin);
    m.n_heads = io::require<std::int64_t>(j, "num_heads", origin);
    m.head_dim = io::get<std::int64_t>(j, "head_dim", 64, origin);
    m.d_state = io::get<std::int64_t>(j, "state_size", 128, origin);
    m.n_groups = io::get<std::int64_t>(j, "n_groups", 8, origin);
    m.d_conv = io::get<std::int64_t>(j, "conv_kernel", 4, origin);
    m.chunk_size = io::get<std::int64_t>(j, "chunk_size", 256, origin);
    m.expand = io::get<std::int64_t>(j, "expand", 2, origin);
    m.conv_bias = io::get<bool>(j, "use_conv_bias", true, origin);
    m.proj_bias = io::get<bool>(j, "use_bias", false, origin);
    m.norm_eps = io::get<float>(j, "layer_norm_epsilon", 1e-5f, origin);
    m.norm_group_size = m.n_heads * m.head_dim;  // HF eager path: one norm over all of d_inner
    if (io::has(j, "time_step_limit")) {
        const auto lim = io::require<std::vector<double>>(j, "time_step_limit", origin);
        if (lim.size() != 2)
            throw config_error(origin + ": time_step_limit must hold 2 numbers, found " + std::to_string(lim.size()));
        m.dt_limit.lo = static_cast<float>(lim[0]);
        m.dt_limit.hi = static_cast<float>(lim[1]);
    }
    if (!io::get<bool>(j, "rms_norm", true, origin))
        throw config_error(origin + ": rms_norm = false (no gated norm) is not supported by hymix's Mamba-2");
    const auto act = io::get<std::string>(j, "hidden_act", "silu", origin);
    if (act != "silu" && act != "swish")
        throw config_error(origin + ": hidden_act '" + act + "' is not supported (expected silu)");
    if (m.expand * m.d_model != m.n_heads * m.head_dim)
        throw config_error(origin + ": expand * hidden_size = " + std::to_string(m.expand * m.d_model) +
                           " differs from num_heads * head_dim = " + std::to_string(m.n_heads * m.head_dim) +
                           " (d_ssm < d_inner is not supported)");
    m.validate();
    c.stack.d_model = m.d_model;
    c.stack.vocab_size = io::require<std::int64_t>(j, "vocab_size", origin);
    c.stack.norm_eps = m.norm_eps;
    c.stack.tie_embeddings = io::get<bool>(j, "tie_word_embeddings", false, origin);
    c.n_layers = io::require<std::int64_t>(j, "num_hidden_layers", origin);
    if (c.n_layers <= 0) throw config_error(origin + ": num_hidden_layers must be positive, found " + std::to_string(c.n_layers));
    c.stack.validate();
    return c;
}

/// Loads the layers and head of an HF Mamba-2 checkpoint opened in `rd` into `Stack` (default hf_mamba2_stack).
/// Throws as read_hf_mamba2_config, plus format_error / shape_error naming a missing, extra or mis-shaped tensor.
template <class Stack = hf_mamba2_stack>
Stack load_hf_mamba2(checkpoint_reader& rd) {
    const auto c = read_hf_mamba2_config(rd.config(), rd.config_path());
    const auto& m = c.mixer;
    const std::int64_t d = m.d_model, V = c.stack.vocab_size, H = m.n_heads, di = m.d_inner(), cd = m.conv_dim();
    Stack::schedule_type::check(schedule_kinds<every_layer<layer_kind::mamba2>>(c.n_layers));
    stack_weights w;
    // HF uses backbone.embeddings (plural); state-spaces exports use backbone.embedding.
    const std::string emb = rd.contains("backbone.embeddings.weight") || !rd.contains("backbone.embedding.weight")
                                ? "backbone.embeddings.weight"
                                : "backbone.embedding.weight";
    w.embedding = rd.take(emb, {V, d});
    w.final_norm = rd.take("backbone.norm_f.weight", {d});
    if (!c.stack.tie_embeddings)
        w.lm_head = rd.take("lm_head.weight", {V, d});
    else if (rd.contains("lm_head.weight"))
        rd.skip("lm_head.weight");  // a saved copy of the tied embedding
    std::vector<typename Stack::layer> layers;
    layers.reserve(static_cast<std::size_t>(c.n_layers));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "backbone.layers." + std::to_string(i) + ".";
        const std::string q = p + "mixer.";
        mamba2_weights mw;
        mw.in_proj = rd.take(q + "in_proj.weight", {m.d_in_proj(), d});
        if (m.proj_bias) mw.in_proj_bias = rd.take(q + "in_proj.bias", {m.d_in_proj()});
        mw.conv1d_weight = rd.take_conv(q + "conv1d.weight", cd, m.d_conv);
        if (m.conv_bias) mw.conv1d_bias = rd.take(q + "conv1d.bias", {cd});
        mw.dt_bias = rd.take(q + "dt_bias", {H});
        mw.A_log = rd.take(q + "A_log", {H});
        mw.D = rd.take(q + "D", {H});
        mw.norm_weight = rd.take(q + "norm.weight", {di});
        mw.out_proj = rd.take(q + "out_proj.weight", {d, di});
        if (m.proj_bias) mw.out_proj_bias = rd.take(q + "out_proj.bias", {d});
        auto norm = rd.take(p + "norm.weight", {d});
        layers.emplace_back(std::move(norm), typename Stack::mixer_variant(std::in_place_type<mamba2>, m, std::move(mw)));
    }
    rd.finish();
    return Stack(c.stack, std::move(w), std::move(layers));
}

/// Loads `dir` (config.json + model.safetensors or a sharded index) as an HF Mamba-2 model.
template <class Stack = hf_mamba2_stack>
Stack load_hf_mamba2(const std::filesystem::path& dir) {
    checkpoint_reader rd(dir);
    return load_hf_mamba2<Stack>(rd);
}

}  // namespace hymix::models
