// Oryx language models (spec.md §6): a stack of pre-norm blocks whose mixer is the Oryx multi-mixer layer
// (mixer/oryx.hpp) followed by a SwiGLU MLP, plain RMSNorms, an embedding and an LM head. There is no Hugging Face
// family for Oryx, so hymix defines the checkpoint: a config.json with model_type "oryx" (keys below) and a
// model.safetensors in the Qwen-style naming, the mixer's tensors under model.layers.N.mixer.* with the names of
// oryx_weights::for_each (conv weights stored [C, 1, K] as PyTorch's depthwise Conv1d). Loading checks every tensor
// against the config and names both on a mismatch. Training uses block-random modes (the trainer's side input);
// inference reads the mode of every token from a schedule (schedule/mode_schedule.hpp; auto_model::set_mode_schedule).
//
// config.json keys: model_type "oryx", architectures ["OryxForCausalLM"], hidden_size, num_hidden_layers, vocab_size,
// intermediate_size, num_heads, head_dim, conv_kernel (4), linear_mixer ("gated_deltanet" (or "gdn") | "mamba2"), rms_norm_eps
// (block and final norms, 1e-6), o_norm_eps (1e-5), l2_eps (1e-6), rope_theta (10000), gdn_chunk_size (64),
// ssd_chunk_size (128), default_mode ("attention" | "linear": the read-out when no schedule is given),
// tie_word_embeddings (false), and training_schedule (the block-random schedule it is trained with, e.g.
// "block_random:0.500000:128"; a resumed run reads it back).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/io/json.hpp"
#include "hymix/mixer/oryx.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/stack/model.hpp"

namespace hymix::models {

/// The compiled stack of an Oryx LM: every layer an Oryx block (plain pre-norms, SwiGLU MLP).
using oryx_lm_stack = model<every_layer<oryx::kind.kind>, plain_rms_norm, swiglu_mlp, bind<oryx::kind.kind, oryx>>;

/// What config.json says.
struct oryx_lm_config {
    stack_config stack;
    oryx_config mixer;
    std::int64_t n_layers = 0, d_ff = 0;
    std::string training_schedule;  // e.g. "block_random:0.500000:128" (P(attention), block size)
};

/// The config.json of `c` (see the file comment for the keys).
inline io::json oryx_lm_json(const oryx_lm_config& c) {
    io::json j;
    j["architectures"] = {"OryxForCausalLM"};
    j["model_type"] = "oryx";
    j["hidden_size"] = c.stack.d_model;
    j["num_hidden_layers"] = c.n_layers;
    j["vocab_size"] = c.stack.vocab_size;
    j["intermediate_size"] = c.d_ff;
    j["num_heads"] = c.mixer.n_heads;
    j["head_dim"] = c.mixer.head_dim;
    j["conv_kernel"] = c.mixer.d_conv;
    j["linear_mixer"] = c.mixer.is_gdn() ? "gated_deltanet" : "mamba2";
    j["rms_norm_eps"] = c.stack.norm_eps;
    j["o_norm_eps"] = c.mixer.norm_eps;
    j["l2_eps"] = c.mixer.l2_eps;
    j["rope_theta"] = c.mixer.rope_theta;
    j["gdn_chunk_size"] = c.mixer.gdn_chunk;
    j["ssd_chunk_size"] = c.mixer.ssd_chunk;
    j["default_mode"] = c.mixer.default_mode == token_mode::attention ? "attention" : "linear";
    j["tie_word_embeddings"] = c.stack.tie_embeddings;
    if (!c.training_schedule.empty()) j["training_schedule"] = c.training_schedule;
    j["dtype"] = "float32";
    return j;
}

/// Reads an Oryx config.json. Throws config_error naming `origin` and the key (missing, wrong type, out of range,
/// unknown linear_mixer / default_mode, a model_type other than "oryx").
inline oryx_lm_config read_oryx_lm_config(const io::json& top, const std::string& origin) {
    const io::config_keys j(top, origin);
    if (j.get<std::string>("model_type", "") != "oryx") j.fail("model_type", "not oryx");
    oryx_lm_config c;
    auto& m = c.mixer;
    m.d_model = j.positive("hidden_size");
    m.n_heads = j.positive("num_heads");
    m.head_dim = j.positive("head_dim");
    m.d_conv = j.positive("conv_kernel", 4);
    const auto lin = j.get<std::string>("linear_mixer", "gated_deltanet");
    if (lin == "gated_deltanet" || lin == "gdn")
        m.linear = oryx_linear_kind::gdn;
    else if (lin == "mamba2")
        m.linear = oryx_linear_kind::mamba2;
    else
        j.fail("linear_mixer", "must be \"gated_deltanet\" or \"mamba2\", found \"" + lin + "\"", "\"gated_deltanet\"");
    m.norm_eps = j.finite_positive_f32("o_norm_eps", 1e-5);
    m.l2_eps = j.finite_positive_f32("l2_eps", 1e-6);
    m.rope_theta = j.finite_positive("rope_theta", 1e4);
    m.gdn_chunk = j.positive("gdn_chunk_size", 64);
    m.ssd_chunk = j.positive("ssd_chunk_size", 128);
    const auto dm = j.get<std::string>("default_mode", "attention");
    if (dm == "attention")
        m.default_mode = token_mode::attention;
    else if (dm == "linear")
        m.default_mode = token_mode::linear;
    else
        j.fail("default_mode", "must be \"attention\" or \"linear\", found \"" + dm + "\"", "\"attention\"");
    c.stack.d_model = m.d_model;
    c.stack.vocab_size = j.positive("vocab_size");
    c.stack.norm_eps = j.finite_positive_f32("rms_norm_eps", 1e-6);
    c.stack.tie_embeddings = j.get<bool>("tie_word_embeddings", false);
    c.n_layers = j.positive("num_hidden_layers");
    c.d_ff = j.positive("intermediate_size");
    c.training_schedule = j.get<std::string>("training_schedule", "");
    detail::validate_from_config(origin, [&] { m.validate(); });
    return c;
}

/// The checkpoint name of a stack parameter named by model::for_each_param ("embedding", "layers.3.norm",
/// "layers.3.mixer.k_proj.weight", "layers.3.mlp_norm", "layers.3.mlp.up_proj", "final_norm", "lm_head").
/// Throws value_error on another name.
inline std::string oryx_tensor_name(const std::string& name) {
    if (name == "embedding") return "model.embed_tokens.weight";
    if (name == "final_norm") return "model.norm.weight";
    if (name == "lm_head") return "lm_head.weight";
    if (name.rfind("layers.", 0) == 0) {
        const auto dot = name.find('.', 7);
        if (dot != std::string::npos) {
            const std::string base = "model." + name.substr(0, dot) + ".", rest = name.substr(dot + 1);
            if (rest == "norm") return base + "input_layernorm.weight";
            if (rest == "mlp_norm") return base + "post_attention_layernorm.weight";
            if (rest.rfind("mlp.", 0) == 0) return base + rest + ".weight";
            if (rest.rfind("mixer.", 0) == 0) return base + rest;
        }
    }
    throw value_error("oryx_tensor_name: no checkpoint name for '" + name + "'");
}

/// Loads an Oryx LM from an open checkpoint. Throws as read_oryx_lm_config, plus format_error / shape_error naming a
/// missing, extra or mis-shaped tensor (with the config keys its expected extent comes from).
inline oryx_lm_stack load_oryx_lm(checkpoint_reader& rd) {
    const auto c = read_oryx_lm_config(rd.config(), rd.config_path());
    const io::config_keys j(rd.config(), rd.config_path());
    const auto& m = c.mixer;
    const expected_dim dd(m.d_model, j.describe("hidden_size")), dV(c.stack.vocab_size, j.describe("vocab_size")),
        dH(m.n_heads, j.describe("num_heads")), dh(m.head_dim, j.describe("head_dim")),
        dHD(m.inner(), j.describe("num_heads") + " × " + j.describe("head_dim")), dK(m.d_conv, j.describe("conv_kernel", "4")),
        dF(c.d_ff, j.describe("intermediate_size"));
    rd.check_layer_count("model.layers.", c.n_layers, j.describe("num_hidden_layers"));
    stack_weights w;
    w.embedding = rd.take("model.embed_tokens.weight", {dV, dd});
    w.final_norm = rd.take("model.norm.weight", {dd});
    w.lm_head = rd.take_lm_head(c.stack.tie_embeddings, j.describe("tie_word_embeddings", "false"), w.embedding.f32(), {dV, dd},
                                "model.embed_tokens.weight");
    std::vector<oryx_lm_stack::layer> layers;
    layers.reserve(static_cast<std::size_t>(c.n_layers));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".", q = p + "mixer.";
        oryx_weights ow;
        ow.q_attn_proj = rd.take(q + "q_attn_proj.weight", {dHD, dd});
        ow.q_lin_proj = rd.take(q + "q_lin_proj.weight", {dHD, dd});
        ow.k_proj = rd.take(q + "k_proj.weight", {dHD, dd});
        ow.v_proj = rd.take(q + "v_proj.weight", {dHD, dd});
        ow.g_proj = rd.take(q + "g_proj.weight", {dHD, dd});
        ow.o_proj = rd.take(q + "o_proj.weight", {dd, dHD});
        ow.o_norm = rd.take(q + "o_norm.weight", {dh});
        ow.conv_q = rd.take_conv(q + "q_conv1d.weight", dHD, dK);
        ow.conv_k = rd.take_conv(q + "k_conv1d.weight", dHD, dK);
        ow.conv_v = rd.take_conv(q + "v_conv1d.weight", dHD, dK);
        if (m.is_gdn()) {
            ow.a_proj = rd.take(q + "a_proj.weight", {dH, dd});
            ow.b_proj = rd.take(q + "b_proj.weight", {dH, dd});
        } else {
            ow.dt_proj = rd.take(q + "dt_proj.weight", {dH, dd});
            ow.D = rd.take(q + "D", {dH});
        }
        ow.A_log = rd.take(q + "A_log", {dH});
        ow.dt_bias = rd.take(q + "dt_bias", {dH});
        auto norm = rd.take(p + "input_layernorm.weight", {dd});
        auto mlp_norm = rd.take(p + "post_attention_layernorm.weight", {dd});
        auto mlp = rd.take_swiglu(p, dF, dd);
        layers.emplace_back(std::move(norm), oryx_lm_stack::mixer_variant(std::in_place_type<oryx>, m, std::move(ow)), std::move(mlp_norm),
                            std::move(mlp));
    }
    rd.finish();
    return oryx_lm_stack(c.stack, std::move(w), std::move(layers));
}

/// Loads `dir` (config.json + model.safetensors) as an Oryx LM.
inline oryx_lm_stack load_oryx_lm(const std::filesystem::path& dir) {
    checkpoint_reader rd(dir);
    return load_oryx_lm(rd);
}

/// A freshly initialised Oryx LM: the mixers' own initialisation (oryx_weights::random, spec.md §6.3), embedding,
/// LM head and MLP projections N(0, 0.02), plain RMSNorm weights 1. Throws config_error on an invalid config.
inline oryx_lm_stack random_oryx_lm(const oryx_lm_config& c, std::uint64_t seed) {
    c.mixer.validate();
    std::mt19937_64 g(seed);
    const auto normal = [&](std::vector<std::int64_t> shape) {
        tensor<float> t(std::move(shape));
        std::normal_distribution<double> nd(0.0, 0.02);
        for (auto& v : t.span()) v = static_cast<float>(nd(g));
        return t;
    };
    const auto ones = [](std::int64_t n) {
        tensor<float> t({n});
        t.fill(1.0f);
        return t;
    };
    const std::int64_t d = c.stack.d_model, V = c.stack.vocab_size;
    stack_weights w;
    w.embedding = normal({V, d});
    w.final_norm = ones(d);
    if (!c.stack.tie_embeddings) w.lm_head = normal({V, d});
    std::vector<oryx_lm_stack::layer> layers;
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
        swiglu_weights mlp;
        mlp.gate_proj = normal({c.d_ff, d});
        mlp.up_proj = normal({c.d_ff, d});
        mlp.down_proj = normal({d, c.d_ff});
        layers.emplace_back(ones(d), oryx_lm_stack::mixer_variant(std::in_place_type<oryx>, c.mixer,
                                                                  oryx_weights::random(c.mixer, seed + 1 + static_cast<std::uint64_t>(l))),
                            ones(d), std::move(mlp));
    }
    return oryx_lm_stack(c.stack, std::move(w), std::move(layers));
}

}  // namespace hymix::models
