// Hugging Face `Qwen3_5ForCausalLM` text checkpoints (spec.md §2, §4.7, §7) mapped onto a compiled stack of
// Gated DeltaNet (`linear_attn`) and gated attention (`self_attn`) layers, each followed by a SwiGLU MLP, with
// zero-centred RMSNorms. model_type qwen3_5_text, or qwen3_5 with `text_config` and the `model.language_model.` prefix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "hymix/core/tensor.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/stack/model.hpp"

namespace hymix::models {

/// Stack for Qwen3.5 checkpoints whose layers are all linear attention (GDN).
using qwen3_5_gdn_stack = model<every_layer<layer_kind::gated_deltanet>, zero_centered_rms_norm, swiglu_mlp,
                                bind<layer_kind::gated_deltanet, gated_deltanet>>;
/// Stack for any Qwen3.5 `layer_types` list (the run-time list decides each layer's kind).
using qwen3_5_hybrid_stack = model<any_of<layer_kind::gated_deltanet, layer_kind::attention>, zero_centered_rms_norm,
                                   swiglu_mlp, bind<layer_kind::gated_deltanet, gated_deltanet>,
                                   bind<layer_kind::attention, attention>>;
/// Stack for the Qwen3-Next/3.5 rule "attention iff (i+1) % Interval == 0", fixed at compile time.
template <std::int64_t Interval>
using qwen3_5_interval_stack = model<interval_rule<Interval>, zero_centered_rms_norm, swiglu_mlp,
                                     bind<layer_kind::gated_deltanet, gated_deltanet>, bind<layer_kind::attention, attention>>;

/// Model-level facts read from config.json.
struct hf_qwen3_5_config {
    stack_config stack;
    gated_deltanet_config gdn;
    attention_config attn;
    std::int64_t n_layers = 0;
    std::int64_t d_ff = 0;
    std::vector<layer_kind> kinds;  // per layer
    std::string model_type;         // as written in config.json
    std::string prefix;             // tensor-name prefix of the decoder: "model." or "model.language_model."
};

/// Reads a Qwen3.5 config.json object. For model_type qwen3_5 the text model's keys are read from `text_config`.
/// `layer_types` gives the per-layer kinds; without it `full_attention_interval` (default 4) does.
/// rope_theta / partial_rotary_factor are read from `rope_parameters` first, then the top level (defaults 1e4 / 0.25).
/// Throws config_error for another model_type, a missing key or an unsupported setting (hidden_act, attention_bias).
inline hf_qwen3_5_config read_hf_qwen3_5_config(const io::json& top, const std::string& origin) {
    hf_qwen3_5_config c;
    c.model_type = io::require<std::string>(top, "model_type", origin);
    const io::json* jp = &top;
    c.prefix = "model.";
    if (c.model_type == "qwen3_5") {
        jp = &io::require_object(top, "text_config", origin);
        c.prefix = "model.language_model.";
    } else if (c.model_type != "qwen3_5_text") {
        throw config_error(origin + ": model_type '" + c.model_type + "' is not a Qwen3.5 text model (qwen3_5_text or qwen3_5)");
    }
    const io::json& j = *jp;
    const std::int64_t d = io::require<std::int64_t>(j, "hidden_size", origin);
    const float eps = io::get<float>(j, "rms_norm_eps", 1e-6f, origin);
    c.n_layers = io::require<std::int64_t>(j, "num_hidden_layers", origin);
    if (c.n_layers <= 0) throw config_error(origin + ": num_hidden_layers must be positive, found " + std::to_string(c.n_layers));
    c.d_ff = io::require<std::int64_t>(j, "intermediate_size", origin);
    c.stack.d_model = d;
    c.stack.vocab_size = io::require<std::int64_t>(j, "vocab_size", origin);
    c.stack.norm_eps = eps;
    c.stack.tie_embeddings = io::get<bool>(top, "tie_word_embeddings", io::get<bool>(j, "tie_word_embeddings", false, origin), origin);
    c.stack.validate();
    const auto act = io::get<std::string>(j, "hidden_act", "silu", origin);
    if (act != "silu" && act != "swish") throw config_error(origin + ": hidden_act '" + act + "' is not supported (expected silu)");
    if (io::get<bool>(j, "attention_bias", false, origin))
        throw config_error(origin + ": attention_bias = true is not supported (Qwen3.5 attention has no biases)");

    if (io::has(j, "layer_types")) {
        const auto lt = io::require<std::vector<std::string>>(j, "layer_types", origin);
        if (static_cast<std::int64_t>(lt.size()) != c.n_layers)
            throw config_error(origin + ": layer_types lists " + std::to_string(lt.size()) + " layers, num_hidden_layers is " +
                               std::to_string(c.n_layers));
        c.kinds = kinds_from_layer_types(lt, layer_kind::gated_deltanet);
        for (std::size_t i = 0; i < c.kinds.size(); ++i)
            if (c.kinds[i] != layer_kind::gated_deltanet && c.kinds[i] != layer_kind::attention)
                throw config_error(origin + ": layer_types[" + std::to_string(i) + "] = '" + lt[i] +
                                   "' (expected linear_attention or full_attention)");
    } else {
        const auto iv = io::get<std::int64_t>(j, "full_attention_interval", 4, origin);
        if (iv <= 0) throw config_error(origin + ": full_attention_interval must be positive, found " + std::to_string(iv));
        for (std::int64_t i = 0; i < c.n_layers; ++i)
            c.kinds.push_back((i + 1) % iv == 0 ? layer_kind::attention : layer_kind::gated_deltanet);
    }

    auto& g = c.gdn;
    g.d_model = d;
    g.n_k_heads = io::get<std::int64_t>(j, "linear_num_key_heads", 16, origin);
    g.n_v_heads = io::get<std::int64_t>(j, "linear_num_value_heads", 32, origin);
    g.d_k = io::get<std::int64_t>(j, "linear_key_head_dim", 128, origin);
    g.d_v = io::get<std::int64_t>(j, "linear_value_head_dim", 128, origin);
    g.d_conv = io::get<std::int64_t>(j, "linear_conv_kernel_dim", 4, origin);
    g.norm_eps = eps;
    g.validate();

    auto& a = c.attn;
    a.d_model = d;
    a.n_heads = io::get<std::int64_t>(j, "num_attention_heads", 16, origin);
    a.n_kv_heads = io::get<std::int64_t>(j, "num_key_value_heads", 2, origin);
    a.head_dim = io::get<std::int64_t>(j, "head_dim", 256, origin);
    a.output_gate = true;
    a.qk_norm.mode = qk_norm_mode::zero_centered;
    a.qk_norm.eps = eps;
    a.rope.mode = rope_mode::rotate_half;
    const io::json empty = io::json::object();
    const io::json& rp = io::has(j, "rope_parameters") ? io::require_object(j, "rope_parameters", origin) : empty;
    a.rope.theta = io::get<double>(rp, "rope_theta", io::get<double>(j, "rope_theta", 1e4, origin), origin);
    a.rope.partial_rotary_factor =
        io::get<double>(rp, "partial_rotary_factor", io::get<double>(j, "partial_rotary_factor", 0.25, origin), origin);
    if (io::has(rp, "rope_type")) {
        const auto rt = io::require<std::string>(rp, "rope_type", origin);
        if (rt != "default")
            throw config_error(origin + ": rope_parameters.rope_type '" + rt + "' is not supported (expected default)");
    }
    a.validate();
    return c;
}

namespace detail {
template <class T, class V> struct variant_has;
template <class T, class... A> struct variant_has<T, std::variant<A...>> : std::bool_constant<(std::is_same_v<T, A> || ...)> {};
}  // namespace detail

/// Loads a Qwen3.5 text checkpoint opened in `rd` into `Stack` (default: the run-time-list hybrid stack).
/// The config's per-layer kinds are checked against Stack's schedule first (config_error naming the layer).
/// Throws as read_hf_qwen3_5_config, plus format_error / shape_error naming a missing, extra or mis-shaped tensor.
template <class Stack = qwen3_5_hybrid_stack>
Stack load_hf_qwen3_5(checkpoint_reader& rd) {
    const auto c = read_hf_qwen3_5_config(rd.config(), rd.config_path());
    Stack::schedule_type::check(c.kinds);
    const std::int64_t d = c.stack.d_model, V = c.stack.vocab_size, F = c.d_ff;
    const auto& g = c.gdn;
    const auto& a = c.attn;
    const std::string& P = c.prefix;
    stack_weights w;
    w.embedding = rd.take(P + "embed_tokens.weight", {V, d});
    w.final_norm = rd.take(P + "norm.weight", {d});
    if (!c.stack.tie_embeddings)
        w.lm_head = rd.take("lm_head.weight", {V, d});
    else if (rd.contains("lm_head.weight"))
        rd.skip("lm_head.weight");
    std::vector<typename Stack::layer> layers;
    layers.reserve(static_cast<std::size_t>(c.n_layers));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = P + "layers." + std::to_string(i) + ".";
        auto norm = rd.take(p + "input_layernorm.weight", {d});
        auto mlp_norm = rd.take(p + "post_attention_layernorm.weight", {d});
        swiglu_weights mlp;
        mlp.gate_proj = rd.take(p + "mlp.gate_proj.weight", {F, d});
        mlp.up_proj = rd.take(p + "mlp.up_proj.weight", {F, d});
        mlp.down_proj = rd.take(p + "mlp.down_proj.weight", {d, F});
        const layer_kind k = c.kinds[static_cast<std::size_t>(i)];
        if (k == layer_kind::gated_deltanet) {
            if constexpr (detail::variant_has<gated_deltanet, typename Stack::mixer_variant>::value) {
                const std::string q = p + "linear_attn.";
                gated_deltanet_weights gw;
                gw.in_proj_qkv = rd.take(q + "in_proj_qkv.weight", {g.conv_dim(), d});
                gw.in_proj_z = rd.take(q + "in_proj_z.weight", {g.value_dim(), d});
                gw.in_proj_b = rd.take(q + "in_proj_b.weight", {g.n_v_heads, d});
                gw.in_proj_a = rd.take(q + "in_proj_a.weight", {g.n_v_heads, d});
                gw.conv1d_weight = rd.take_conv(q + "conv1d.weight", g.conv_dim(), g.d_conv);
                gw.dt_bias = rd.take(q + "dt_bias", {g.n_v_heads});
                gw.A_log = rd.take(q + "A_log", {g.n_v_heads});
                gw.norm_weight = rd.take(q + "norm.weight", {g.d_v});
                gw.out_proj = rd.take(q + "out_proj.weight", {d, g.value_dim()});
                layers.emplace_back(std::move(norm),
                                    typename Stack::mixer_variant(std::in_place_type<gated_deltanet>, g, std::move(gw)),
                                    std::move(mlp_norm), std::move(mlp));
                continue;
            }
        } else {
            if constexpr (detail::variant_has<attention, typename Stack::mixer_variant>::value) {
                const std::string q = p + "self_attn.";
                attention_weights aw;
                aw.q_proj = rd.take(q + "q_proj.weight", {a.q_rows(), d});
                aw.k_proj = rd.take(q + "k_proj.weight", {a.kv_rows(), d});
                aw.v_proj = rd.take(q + "v_proj.weight", {a.kv_rows(), d});
                aw.o_proj = rd.take(q + "o_proj.weight", {d, a.n_heads * a.head_dim});
                aw.q_norm = rd.take(q + "q_norm.weight", {a.head_dim});
                aw.k_norm = rd.take(q + "k_norm.weight", {a.head_dim});
                layers.emplace_back(std::move(norm), typename Stack::mixer_variant(std::in_place_type<attention>, a, std::move(aw)),
                                    std::move(mlp_norm), std::move(mlp));
                continue;
            }
        }
        throw config_error(rd.config_path() + ": layer " + std::to_string(i) + " is '" + layer_kind_name(k) +
                           "', which the compiled stack has no mixer for");
    }
    // Multimodal checkpoints also carry the vision tower and multi-token-prediction heads: not part of the text model.
    const bool multimodal = c.model_type == "qwen3_5";
    rd.finish([&](const std::string& n) {
        return n.rfind("mtp.", 0) == 0 || (multimodal && n.rfind("model.language_model.", 0) != 0 && n != "lm_head.weight");
    });
    return Stack(c.stack, std::move(w), std::move(layers));
}

/// Loads `dir` (config.json + model.safetensors or a sharded index) as a Qwen3.5 text model.
template <class Stack = qwen3_5_hybrid_stack>
Stack load_hf_qwen3_5(const std::filesystem::path& dir) {
    checkpoint_reader rd(dir);
    return load_hf_qwen3_5<Stack>(rd);
}

}  // namespace hymix::models
