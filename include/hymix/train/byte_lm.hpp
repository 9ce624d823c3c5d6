// Byte-level language models that hymix trains from scratch, in the Hugging Face layout of their family so that
// every trained model loads with auto_model and the `hymix` tool: `mamba2` → Mamba2ForCausalLM (spec.md §3.7),
// `gdn`, `attention` and `hybrid` → Qwen3_5ForCausalLM text models (§4.7; layer_types all linear_attention, all
// full_attention, or [linear, linear, full] repeated). The config.json is written first and read back with the
// loaders' own config readers, so a model built here and one loaded from its directory are the same type with the
// same configuration. Initialisation: each mixer's own (spec.md §3.5, §4.5), embeddings and MLP projections
// N(0, 0.02), neutral norm weights (ones for plain RMSNorm, zeros for the zero-centred flavour). `oryx-gdn` and
// `oryx-mamba2` have no Hugging Face family: they are written in hymix's Oryx layout (models/oryx_lm.hpp), which
// auto_model and the tool load as well.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/core/convert.hpp"
#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/io/json.hpp"
#include "hymix/io/safetensors_writer.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"
#include "hymix/models/oryx_lm.hpp"
#include "hymix/train/options.hpp"

namespace hymix::train {

/// The Oryx LM configuration of an `oryx-*` spec: H = linear_heads heads of head_dim, SwiGLU d_ff, block-random
/// training schedule recorded in the config (the run's seed varies the draw per step).
inline models::oryx_lm_config oryx_lm_config_of(const byte_lm_spec& s) {
    models::oryx_lm_config c;
    c.stack = stack_config{s.d_model, s.vocab_size, 1e-6f, s.tie_embeddings};
    c.mixer.d_model = s.d_model;
    c.mixer.n_heads = s.linear_heads;
    c.mixer.head_dim = s.head_dim;
    c.mixer.linear = s.stack == "oryx-mamba2" ? oryx_linear_kind::mamba2 : oryx_linear_kind::gdn;
    c.n_layers = s.n_layers;
    c.d_ff = s.d_ff;
    c.training_schedule = "block_random:" + std::to_string(s.oryx_p_attention) + ":" + std::to_string(s.oryx_block_size);
    return c;
}

/// The config.json of `s` in its family's Hugging Face form (an infinite bound is written {"__float__": "Infinity"},
/// as transformers writes it; read it back with io::parse_json).
inline nlohmann::json hf_config(const byte_lm_spec& s) {
    s.validate();
    nlohmann::json j;
    if (s.is_oryx()) return models::oryx_lm_json(oryx_lm_config_of(s));
    if (s.is_mamba2()) {
        j["architectures"] = {"Mamba2ForCausalLM"};
        j["model_type"] = "mamba2";
        j["hidden_size"] = s.d_model;
        j["num_heads"] = 2 * s.d_model / s.head_dim;
        j["head_dim"] = s.head_dim;
        j["expand"] = 2;
        j["state_size"] = s.d_state;
        j["n_groups"] = s.n_groups;
        j["conv_kernel"] = 4;
        j["chunk_size"] = s.chunk_size;
        j["num_hidden_layers"] = s.n_layers;
        j["vocab_size"] = s.vocab_size;
        j["layer_norm_epsilon"] = 1e-5;
        j["use_bias"] = false;
        j["use_conv_bias"] = true;
        j["hidden_act"] = "silu";
        j["rms_norm"] = true;
        j["residual_in_fp32"] = true;
        j["tie_word_embeddings"] = s.tie_embeddings;
        j["time_step_limit"] = {0.0, nlohmann::json{{"__float__", "Infinity"}}};
        j["pad_token_id"] = 0;
    } else {
        j["architectures"] = {"Qwen3_5ForCausalLM"};
        j["model_type"] = "qwen3_5_text";
        j["hidden_size"] = s.d_model;
        j["num_hidden_layers"] = s.n_layers;
        j["vocab_size"] = s.vocab_size;
        j["intermediate_size"] = s.d_ff;
        j["hidden_act"] = "silu";
        j["rms_norm_eps"] = 1e-6;
        j["layer_types"] = s.layer_types();
        j["linear_conv_kernel_dim"] = 4;
        j["linear_key_head_dim"] = s.head_dim;
        j["linear_value_head_dim"] = s.head_dim;
        j["linear_num_key_heads"] = s.linear_heads;
        j["linear_num_value_heads"] = s.linear_heads;
        j["num_attention_heads"] = s.attn_heads;
        j["num_key_value_heads"] = s.attn_kv_heads;
        j["head_dim"] = s.head_dim;
        j["attention_bias"] = false;
        j["partial_rotary_factor"] = 0.25;
        j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
        j["max_position_embeddings"] = 65536;
        j["tie_word_embeddings"] = s.tie_embeddings;
        j["pad_token_id"] = 0;
    }
    j["dtype"] = "float32";
    return j;
}

/// The Hugging Face tensor name of a stack parameter named by model::for_each_param ("embedding",
/// "layers.3.mixer.in_proj.weight", "layers.3.mlp.up_proj", "final_norm", ...). `kind` is the layer's kind.
inline std::string hf_tensor_name(bool mamba2_family, const std::string& name, layer_kind kind) {
    if (name == "embedding") return mamba2_family ? "backbone.embeddings.weight" : "model.embed_tokens.weight";
    if (name == "final_norm") return mamba2_family ? "backbone.norm_f.weight" : "model.norm.weight";
    if (name == "lm_head") return "lm_head.weight";
    if (name.rfind("layers.", 0) != 0) throw value_error("hf_tensor_name: unknown parameter '" + name + "'");
    const auto dot = name.find('.', 7);
    const std::string layer = name.substr(0, dot), rest = name.substr(dot + 1);
    const std::string base = (mamba2_family ? "backbone." : "model.") + layer + ".";
    if (mamba2_family) {
        if (rest == "norm") return base + "norm.weight";
        if (rest.rfind("mixer.", 0) == 0) return base + rest;
    } else {
        if (rest == "norm") return base + "input_layernorm.weight";
        if (rest == "mlp_norm") return base + "post_attention_layernorm.weight";
        if (rest.rfind("mlp.", 0) == 0) return base + rest + ".weight";
        if (rest.rfind("mixer.", 0) == 0)
            return base + (kind == layer_kind::attention ? "self_attn." : "linear_attn.") + rest.substr(6);
    }
    throw value_error("hf_tensor_name: no Hugging Face name for '" + name + "'");
}

/// Writes `m`'s weights as `dir`/model.safetensors in its family's layout (Oryx: models/oryx_lm.hpp) (conv weights as [C, 1, K]) with
/// element type `type` (f32, bf16 or f16), and `config` as `dir`/config.json. Both files are written atomically;
/// `dir` is created. Throws io_error, dtype_error for another element type.
template <class Model>
void save_hf(Model& m, const nlohmann::json& config, const std::filesystem::path& dir, dtype type = dtype::f32) {
    if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16)
        throw dtype_error("save_hf: weights are written as F32, BF16 or F16, not " + std::string(dtype_name(type)));
    if constexpr (requires { m.weight_dtype(); })
        if (std::string name; m.weight_dtype(&name) != dtype::f32)
            throw config_error("save_hf: the model keeps its projection weights as " + std::string(weight_dtype_name(m.weight_dtype())) +
                               " ('" + name + "'); save needs them as f32 (store_weights_as(dtype::f32); `type` still sets the file's element type)");
    std::filesystem::create_directories(dir);
    const bool mamba2_family = config.value("model_type", "") == "mamba2", oryx_family = config.value("model_type", "") == "oryx";
    const auto& kinds = m.layer_kinds();
    safetensors::writer w;
    m.for_each_param([&](const std::string& name, tensor<float>& t) {
        layer_kind kind = layer_kind::mamba2;
        if (name.rfind("layers.", 0) == 0) kind = kinds.at(std::stoul(name.substr(7)));
        const std::string hf = oryx_family ? models::oryx_tensor_name(name) : hf_tensor_name(mamba2_family, name, kind);
        auto shape = t.shape();
        if (hf.ends_with("conv1d.weight") && shape.size() == 2)
            shape = {shape[0], 1, shape[1]};
        const std::size_t n = static_cast<std::size_t>(t.numel());
        if (type == dtype::f32) {
            w.add(hf, dtype::f32, shape, std::as_bytes(t.span()));
        } else if (type == dtype::bf16) {
            std::vector<bf16> b(n);
            convert(t.data(), b.data(), n);
            w.add(hf, dtype::bf16, shape, std::as_bytes(std::span<const bf16>(b)));
        } else {
            std::vector<f16> b(n);
            convert(t.data(), b.data(), n);
            w.add(hf, dtype::f16, shape, std::as_bytes(std::span<const f16>(b)));
        }
    });
    w.set_metadata("format", "pt");
    w.write(dir / "model.safetensors");
    nlohmann::json cfg = config;
    cfg["dtype"] = type == dtype::f32 ? "float32" : type == dtype::bf16 ? "bfloat16" : "float16";
    const auto tmp = dir / "config.json.tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        if (!f) throw io_error("cannot write '" + tmp.string() + "'");
        f << cfg.dump(2) << "\n";
        if (!f.flush()) throw io_error("error writing '" + tmp.string() + "'");
    }
    std::filesystem::rename(tmp, dir / "config.json");
}

namespace detail {
inline tensor<float> normal_tensor(std::vector<std::int64_t> shape, double std, std::mt19937_64& g) {
    tensor<float> t(std::move(shape));
    std::normal_distribution<double> d(0.0, std);
    for (auto& v : t.span()) v = static_cast<float>(d(g));
    return t;
}
inline tensor<float> filled(std::int64_t n, float v) {
    tensor<float> t({n});
    t.fill(v);
    return t;
}
}  // namespace detail

/// A freshly initialised Mamba-2 byte LM for `s` (s.stack == "mamba2"), configured from hf_config(s).
inline models::hf_mamba2_stack random_mamba2_lm(const byte_lm_spec& s, std::uint64_t seed) {
    const auto c = models::read_hf_mamba2_config(io::parse_json(hf_config(s).dump(), "byte_lm_spec"), "byte_lm_spec");
    std::mt19937_64 g(seed);
    stack_weights w;
    w.embedding = detail::normal_tensor({c.stack.vocab_size, c.stack.d_model}, 0.02, g);
    w.final_norm = detail::filled(c.stack.d_model, 1.0f);
    if (!c.stack.tie_embeddings) w.lm_head = detail::normal_tensor({c.stack.vocab_size, c.stack.d_model}, 0.02, g);
    std::vector<models::hf_mamba2_stack::layer> layers;
    for (std::int64_t l = 0; l < c.n_layers; ++l)
        layers.emplace_back(detail::filled(c.stack.d_model, 1.0f), mamba2(c.mixer, mamba2_weights::random(c.mixer, seed + 1 + static_cast<std::uint64_t>(l))));
    return models::hf_mamba2_stack(c.stack, std::move(w), std::move(layers));
}

/// A freshly initialised Qwen3.5-layout byte LM (gdn, attention or hybrid) as `Stack`.
template <class Stack = models::qwen3_5_hybrid_stack>
Stack random_qwen3_5_lm(const byte_lm_spec& s, std::uint64_t seed) {
    const auto c = models::read_hf_qwen3_5_config(io::parse_json(hf_config(s).dump(), "byte_lm_spec"), "byte_lm_spec");
    std::mt19937_64 g(seed);
    const std::int64_t d = c.stack.d_model, V = c.stack.vocab_size;
    stack_weights w;
    w.embedding = detail::normal_tensor({V, d}, 0.02, g);
    w.final_norm = detail::filled(d, 0.0f);  // zero-centred RMSNorm: weight 0 is the identity scale
    if (!c.stack.tie_embeddings) w.lm_head = detail::normal_tensor({V, d}, 0.02, g);
    std::vector<typename Stack::layer> layers;
    for (std::int64_t l = 0; l < c.n_layers; ++l) {
        const auto ls = seed + 1 + static_cast<std::uint64_t>(l);
        swiglu_weights mlp;
        mlp.gate_proj = detail::normal_tensor({c.d_ff, d}, 0.02, g);
        mlp.up_proj = detail::normal_tensor({c.d_ff, d}, 0.02, g);
        mlp.down_proj = detail::normal_tensor({d, c.d_ff}, 0.02, g);
        typename Stack::mixer_variant mixer = [&]() -> typename Stack::mixer_variant {
            if (c.kinds[static_cast<std::size_t>(l)] == layer_kind::attention) {
                if constexpr (std::is_constructible_v<typename Stack::mixer_variant, attention>)
                    return attention(c.attn, attention_weights::random(c.attn, ls));
                else
                    throw config_error("random_qwen3_5_lm: this stack type has no attention layers");
            }
            return gated_deltanet(c.gdn, gated_deltanet_weights::random(c.gdn, ls));
        }();
        layers.emplace_back(detail::filled(d, 0.0f), std::move(mixer), detail::filled(d, 0.0f), std::move(mlp));
    }
    return Stack(c.stack, std::move(w), std::move(layers));
}

/// A freshly initialised Oryx byte LM for an `oryx-*` spec, configured from hf_config(s).
inline models::oryx_lm_stack random_oryx_lm(const byte_lm_spec& s, std::uint64_t seed) {
    return models::random_oryx_lm(models::read_oryx_lm_config(io::parse_json(hf_config(s).dump(), "byte_lm_spec"), "byte_lm_spec"), seed);
}

}  // namespace hymix::train
