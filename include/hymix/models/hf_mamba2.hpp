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
/// Throws config_error for a different model_type, a missing key, a value out of range, or settings hymix does
/// not implement (rms_norm false, hidden_act other than silu, d_ssm < d_inner); every message names `origin`,
/// the JSON key and the value found (or the default used for an absent key).
inline hf_mamba2_config read_hf_mamba2_config(const io::json& top, const std::string& origin) {
    const io::config_keys j(top, origin);
    const auto mt = j.get<std::string>("model_type", "mamba2");
    if (mt != "mamba2") j.fail("model_type", "not mamba2");
    hf_mamba2_config c;
    auto& m = c.mixer;
    m.d_model = j.positive("hidden_size");
    m.n_heads = j.positive("num_heads");
    m.head_dim = j.positive("head_dim", 64);
    m.d_state = j.positive("state_size", 128);
    m.n_groups = j.positive("n_groups", 8);
    m.d_conv = j.positive("conv_kernel", 4);
    // The checkpoint's chunk_size (256) set the reference kernels' cost; it changes only the rounding here, so the
    // backend runs at its own chunk length (mamba2_config::chunk_size 0). The key is still checked when present.
    if (j.has("chunk_size")) (void)j.positive("chunk_size");
    m.expand = j.positive("expand", 2);
    m.conv_bias = j.get<bool>("use_conv_bias", true);
    m.proj_bias = j.get<bool>("use_bias", false);
    m.norm_eps = j.finite_positive_f32("layer_norm_epsilon", 1e-5);
    m.norm_group_size = m.n_heads * m.head_dim;  // HF eager path: one norm over all of d_inner
    if (j.has("time_step_limit")) {
        const auto lim = j.require<std::vector<double>>("time_step_limit");
        if (lim.size() != 2) j.fail("time_step_limit", "must hold 2 numbers [lo, hi], found " + std::to_string(lim.size()));
        if (!(lim[0] >= 0.0 && lim[1] >= lim[0])) j.fail("time_step_limit", "must satisfy 0 <= lo <= hi (hi may be Infinity)");
        m.dt_limit.lo = static_cast<float>(lim[0]);
        m.dt_limit.hi = static_cast<float>(lim[1]);
    }
    if (!j.get<bool>("rms_norm", true)) j.fail("rms_norm", "a Mamba-2 without the gated norm is not supported by hymix");
    const auto act = j.get<std::string>("hidden_act", "silu");
    if (act != "silu" && act != "swish") j.fail("hidden_act", "not supported (expected silu)", "\"silu\"");
    if (m.n_heads % m.n_groups != 0)
        j.fail("num_heads", "not a multiple of " + j.describe("n_groups", "8") + " (heads are split evenly over the B/C groups)");
    if (m.expand * m.d_model != m.n_heads * m.head_dim)
        throw config_error(origin + ": " + j.describe("expand", "2") + " × " + j.describe("hidden_size") + " = " +
                           std::to_string(m.expand * m.d_model) + " differs from " + j.describe("num_heads") + " × " +
                           j.describe("head_dim", "64") + " = " + std::to_string(m.n_heads * m.head_dim) +
                           " (d_ssm < d_inner is not supported)");
    c.stack.d_model = m.d_model;
    c.stack.vocab_size = j.positive("vocab_size");
    c.stack.norm_eps = m.norm_eps;
    c.stack.tie_embeddings = j.get<bool>("tie_word_embeddings", false);
    c.n_layers = j.positive("num_hidden_layers");
    detail::validate_from_config(origin, [&] {
        m.validate();
        c.stack.validate();
    });
    return c;
}

/// Loads the layers and head of an HF Mamba-2 checkpoint opened in `rd` into `Stack` (default hf_mamba2_stack).
/// Throws as read_hf_mamba2_config, plus format_error / shape_error naming a missing, extra or mis-shaped tensor.
template <class Stack = hf_mamba2_stack>
Stack load_hf_mamba2(checkpoint_reader& rd) {
    const auto c = read_hf_mamba2_config(rd.config(), rd.config_path());
    const io::config_keys j(rd.config(), rd.config_path());
    const auto& m = c.mixer;
    const std::int64_t d = m.d_model, V = c.stack.vocab_size, H = m.n_heads, di = m.d_inner(), cd = m.conv_dim();
    detail::validate_from_config(rd.config_path(),
                                 [&] { Stack::schedule_type::check(schedule_kinds<every_layer<layer_kind::mamba2>>(c.n_layers)); });
    // Each configurable extent with the keys it comes from, so that a tensor contradicting config.json names both.
    const expected_dim dd(d, j.describe("hidden_size")), dV(V, j.describe("vocab_size")), dH(H, j.describe("num_heads"));
    const std::string heads = j.describe("num_heads") + " × " + j.describe("head_dim", "64");
    const expected_dim ddi(di, heads);
    const expected_dim dcd(cd, heads + " + 2 × " + j.describe("n_groups", "8") + " × " + j.describe("state_size", "128"));
    const expected_dim dnp(m.d_in_proj(), "2 × " + heads + " + 2 × " + j.describe("n_groups", "8") + " × " +
                                             j.describe("state_size", "128") + " + " + j.describe("num_heads"));
    const expected_dim dK(m.d_conv, j.describe("conv_kernel", "4"));
    rd.check_layer_count("backbone.layers.", c.n_layers, j.describe("num_hidden_layers"));
    stack_weights w;
    // HF uses backbone.embeddings (plural); state-spaces exports use backbone.embedding.
    const std::string emb = rd.contains("backbone.embeddings.weight") || !rd.contains("backbone.embedding.weight")
                                ? "backbone.embeddings.weight"
                                : "backbone.embedding.weight";
    w.embedding = rd.take(emb, {dV, dd});
    w.final_norm = rd.take("backbone.norm_f.weight", {dd});
    w.lm_head = rd.take_lm_head(c.stack.tie_embeddings, j.describe("tie_word_embeddings", "false"), w.embedding.f32(), {dV, dd}, emb);
    const std::string conv_bias = j.describe("use_conv_bias", "true"), proj_bias = j.describe("use_bias", "false");
    std::vector<typename Stack::layer> layers;
    layers.reserve(static_cast<std::size_t>(c.n_layers));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "backbone.layers." + std::to_string(i) + ".";
        const std::string q = p + "mixer.";
        mamba2_weights mw;
        mw.in_proj = rd.take(q + "in_proj.weight", {dnp, dd});
        mw.in_proj_bias = rd.take_if(m.proj_bias, proj_bias, q + "in_proj.bias", {dnp});
        mw.conv1d_weight = rd.take_conv(q + "conv1d.weight", dcd, dK);
        mw.conv1d_bias = rd.take_if(m.conv_bias, conv_bias, q + "conv1d.bias", {dcd});
        mw.dt_bias = rd.take(q + "dt_bias", {dH});
        mw.A_log = rd.take(q + "A_log", {dH});
        mw.D = rd.take(q + "D", {dH});
        mw.norm_weight = rd.take(q + "norm.weight", {ddi});
        mw.out_proj = rd.take(q + "out_proj.weight", {dd, ddi});
        mw.out_proj_bias = rd.take_if(m.proj_bias, proj_bias, q + "out_proj.bias", {dd});
        auto norm = rd.take(p + "norm.weight", {dd});
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
