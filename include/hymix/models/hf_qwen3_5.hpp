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

/// The object of a Qwen3.5 config.json that holds the text model's keys: `text_config` for model_type qwen3_5,
/// else the top level.
inline io::config_keys qwen3_5_text_keys(const io::json& top, const std::string& origin) {
    const io::config_keys t(top, origin);
    if (t.get<std::string>("model_type", "") == "qwen3_5") return t.object("text_config");
    return t;
}

/// Reads a Qwen3.5 config.json object. For model_type qwen3_5 the text model's keys are read from `text_config`.
/// `layer_types` gives the per-layer kinds; without it `full_attention_interval` (default 4) does.
/// rope_theta / partial_rotary_factor are read from `rope_parameters` first, then the top level (defaults 1e4 / 0.25).
/// Throws config_error for another model_type, a missing key, a value out of range or an unsupported setting
/// (hidden_act, attention_bias); every message names `origin`, the JSON key (e.g. 'text_config.rms_norm_eps') and
/// the value found (or the default used for an absent key).
inline hf_qwen3_5_config read_hf_qwen3_5_config(const io::json& top_json, const std::string& origin) {
    hf_qwen3_5_config c;
    const io::config_keys top(top_json, origin);
    c.model_type = top.require<std::string>("model_type");
    c.prefix = "model.";
    if (c.model_type == "qwen3_5") {
        c.prefix = "model.language_model.";
    } else if (c.model_type != "qwen3_5_text") {
        top.fail("model_type", "not a Qwen3.5 text model (qwen3_5_text or qwen3_5)");
    }
    const io::config_keys j = qwen3_5_text_keys(top_json, origin);
    const std::int64_t d = j.positive("hidden_size");
    const double eps = j.finite_positive_f32("rms_norm_eps", 1e-6);
    c.n_layers = j.positive("num_hidden_layers");
    c.d_ff = j.positive("intermediate_size");
    c.stack.d_model = d;
    c.stack.vocab_size = j.positive("vocab_size");
    c.stack.norm_eps = static_cast<float>(eps);
    c.stack.tie_embeddings = top.get<bool>("tie_word_embeddings", j.get<bool>("tie_word_embeddings", false));
    const auto act = j.get<std::string>("hidden_act", "silu");
    if (act != "silu" && act != "swish") j.fail("hidden_act", "not supported (expected silu)");
    if (j.get<bool>("attention_bias", false)) j.fail("attention_bias", "not supported (Qwen3.5 attention has no biases)");

    if (j.has("layer_types")) {
        const auto lt = j.require<std::vector<std::string>>("layer_types");
        if (static_cast<std::int64_t>(lt.size()) != c.n_layers)
            j.fail("layer_types", "lists " + std::to_string(lt.size()) + " layers, but " + j.describe("num_hidden_layers"));
        for (std::size_t i = 0; i < lt.size(); ++i) {
            if (lt[i] == "linear_attention") c.kinds.push_back(layer_kind::gated_deltanet);
            else if (lt[i] == "full_attention") c.kinds.push_back(layer_kind::attention);
            else
                throw config_error(origin + ": key '" + j.path("layer_types") + "[" + std::to_string(i) + "]' = \"" + lt[i] +
                                   "\": expected \"linear_attention\" or \"full_attention\"");
        }
    } else {
        const auto iv = j.positive("full_attention_interval", 4);
        for (std::int64_t i = 0; i < c.n_layers; ++i)
            c.kinds.push_back((i + 1) % iv == 0 ? layer_kind::attention : layer_kind::gated_deltanet);
    }

    auto& g = c.gdn;
    g.d_model = d;
    g.n_k_heads = j.positive("linear_num_key_heads", 16);
    g.n_v_heads = j.positive("linear_num_value_heads", 32);
    g.d_k = j.positive("linear_key_head_dim", 128);
    g.d_v = j.positive("linear_value_head_dim", 128);
    g.d_conv = j.positive("linear_conv_kernel_dim", 4);
    g.norm_eps = static_cast<float>(eps);
    if (g.n_v_heads % g.n_k_heads != 0)
        j.fail("linear_num_value_heads", "not a multiple of " + j.describe("linear_num_key_heads", "16"), "32");

    auto& a = c.attn;
    a.d_model = d;
    a.n_heads = j.positive("num_attention_heads", 16);
    a.n_kv_heads = j.positive("num_key_value_heads", 2);
    a.head_dim = j.positive("head_dim", 256);
    if (a.n_heads % a.n_kv_heads != 0)
        j.fail("num_attention_heads", "not a multiple of " + j.describe("num_key_value_heads", "2"), "16");
    a.output_gate = true;
    a.qk_norm.mode = qk_norm_mode::zero_centered;
    a.qk_norm.eps = eps;
    a.rope.mode = rope_mode::rotate_half;
    // rope_theta and partial_rotary_factor: rope_parameters first, then the top level of the text config.
    const io::json empty = io::json::object();
    const io::config_keys rp = j.has("rope_parameters") ? j.object("rope_parameters") : io::config_keys(empty, origin, j.path("rope_parameters"));
    const io::config_keys& theta_src = rp.has("rope_theta") ? rp : j;
    const io::config_keys& factor_src = rp.has("partial_rotary_factor") ? rp : j;
    a.rope.theta = theta_src.finite_positive("rope_theta", 1e4);
    a.rope.partial_rotary_factor = factor_src.get<double>("partial_rotary_factor", 0.25);
    if (!(a.rope.partial_rotary_factor > 0.0 && a.rope.partial_rotary_factor <= 1.0))
        factor_src.fail("partial_rotary_factor", "must lie in (0, 1]", "0.25");
    const auto d_rot = static_cast<std::int64_t>(static_cast<double>(a.head_dim) * a.rope.partial_rotary_factor);
    if (d_rot <= 0 || d_rot % 2 != 0)
        factor_src.fail("partial_rotary_factor", "int(" + j.describe("head_dim", "256") + " × factor) = " + std::to_string(d_rot) +
                                                     " rotary channels, which must be even and > 0", "0.25");
    if (rp.has("rope_type")) {
        const auto rt = rp.require<std::string>("rope_type");
        if (rt != "default") rp.fail("rope_type", "not supported (expected \"default\")");
    }
    detail::validate_from_config(origin, [&] {
        c.stack.validate();
        g.validate();
        a.validate();
    });
    return c;
}

/// What decides layer i's kind, for messages: "key 'layer_types'[2] = \"full_attention\"", or the interval rule.
inline std::string qwen3_5_kind_source(const io::config_keys& j, std::int64_t i) {
    if (j.has("layer_types")) {
        const auto it = j.value().find("layer_types");
        return "key '" + j.path("layer_types") + "[" + std::to_string(i) + "]' = " + io::json_text(it->at(static_cast<std::size_t>(i)));
    }
    return "key '" + j.path("layer_types") + "' is absent, so " + j.describe("full_attention_interval", "4") + " makes layer " +
           std::to_string(i) + " " + ((i + 1) % j.get<std::int64_t>("full_attention_interval", 4) == 0 ? "full_attention" : "linear_attention");
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
    const io::config_keys top(rd.config(), rd.config_path());
    const io::config_keys j = qwen3_5_text_keys(rd.config(), rd.config_path());
    const std::int64_t d = c.stack.d_model, V = c.stack.vocab_size, F = c.d_ff;
    const auto& g = c.gdn;
    const auto& a = c.attn;
    const std::string& P = c.prefix;
    // The layer list of config.json against the tensors: the count, then each layer's kind (its tensors say which).
    rd.check_layer_count(P + "layers.", c.n_layers, j.describe("num_hidden_layers"));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = P + "layers." + std::to_string(i) + ".";
        const bool gdn = c.kinds[static_cast<std::size_t>(i)] == layer_kind::gated_deltanet;
        const auto own = rd.first_with_prefix(p + (gdn ? "linear_attn." : "self_attn."));
        const auto other = rd.first_with_prefix(p + (gdn ? "self_attn." : "linear_attn."));
        if (!own && other)
            throw config_error(rd.config_path() + ": layer " + std::to_string(i) + " is " + (gdn ? "linear_attention" : "full_attention") +
                               " (" + qwen3_5_kind_source(j, i) + "), but checkpoint '" + rd.weights_path() + "' holds '" + *other +
                               "' (a " + (gdn ? "full_attention" : "linear_attention") + " layer) and no '" + p +
                               (gdn ? "linear_attn" : "self_attn") + ".*' tensor");
    }
    detail::validate_from_config(rd.config_path(), [&] { Stack::schedule_type::check(c.kinds); });  // names config.json
    // Each configurable extent with the keys it comes from, so that a tensor contradicting config.json names both.
    const expected_dim dd(d, j.describe("hidden_size")), dV(V, j.describe("vocab_size")), dF(F, j.describe("intermediate_size"));
    const std::string kd = j.describe("linear_num_key_heads", "16") + " × " + j.describe("linear_key_head_dim", "128");
    const std::string vd = j.describe("linear_num_value_heads", "32") + " × " + j.describe("linear_value_head_dim", "128");
    const expected_dim dconv(g.conv_dim(), "2 × " + kd + " + " + vd), dvalue(g.value_dim(), vd);
    const expected_dim dHv(g.n_v_heads, j.describe("linear_num_value_heads", "32")), ddv(g.d_v, j.describe("linear_value_head_dim", "128"));
    const expected_dim dK(g.d_conv, j.describe("linear_conv_kernel_dim", "4"));
    const std::string qh = j.describe("num_attention_heads", "16") + " × " + j.describe("head_dim", "256");
    const expected_dim dq(a.q_rows(), "2 × " + qh + " (query and output gate)"), dqo(a.n_heads * a.head_dim, qh);
    const expected_dim dkv(a.kv_rows(), j.describe("num_key_value_heads", "2") + " × " + j.describe("head_dim", "256"));
    const expected_dim dhd(a.head_dim, j.describe("head_dim", "256"));
    const bool tie_top = top.has("tie_word_embeddings") || !j.has("tie_word_embeddings");
    const std::string tie_text = (tie_top ? top : j).describe("tie_word_embeddings", "false");
    stack_weights w;
    w.embedding = rd.take(P + "embed_tokens.weight", {dV, dd});
    w.final_norm = rd.take(P + "norm.weight", {dd});
    w.lm_head = rd.take_lm_head(c.stack.tie_embeddings, tie_text, w.embedding.f32(), {dV, dd}, P + "embed_tokens.weight");
    std::vector<typename Stack::layer> layers;
    layers.reserve(static_cast<std::size_t>(c.n_layers));
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
        const std::string p = P + "layers." + std::to_string(i) + ".";
        auto norm = rd.take(p + "input_layernorm.weight", {dd});
        auto mlp_norm = rd.take(p + "post_attention_layernorm.weight", {dd});
        auto mlp = rd.take_swiglu(p, dF, dd);
        const layer_kind k = c.kinds[static_cast<std::size_t>(i)];
        if (k == layer_kind::gated_deltanet) {
            if constexpr (detail::variant_has<gated_deltanet, typename Stack::mixer_variant>::value) {
                const std::string q = p + "linear_attn.";
                gated_deltanet_weights gw;
                gw.in_proj_qkv = rd.take(q + "in_proj_qkv.weight", {dconv, dd});
                gw.in_proj_z = rd.take(q + "in_proj_z.weight", {dvalue, dd});
                gw.in_proj_b = rd.take(q + "in_proj_b.weight", {dHv, dd});
                gw.in_proj_a = rd.take(q + "in_proj_a.weight", {dHv, dd});
                gw.conv1d_weight = rd.take_conv(q + "conv1d.weight", dconv, dK);
                gw.dt_bias = rd.take(q + "dt_bias", {dHv});
                gw.A_log = rd.take(q + "A_log", {dHv});
                gw.norm_weight = rd.take(q + "norm.weight", {ddv});
                gw.out_proj = rd.take(q + "out_proj.weight", {dd, dvalue});
                layers.emplace_back(std::move(norm),
                                    typename Stack::mixer_variant(std::in_place_type<gated_deltanet>, g, std::move(gw)),
                                    std::move(mlp_norm), std::move(mlp));
                continue;
            }
        } else {
            if constexpr (detail::variant_has<attention, typename Stack::mixer_variant>::value) {
                const std::string q = p + "self_attn.";
                attention_weights aw;
                aw.q_proj = rd.take(q + "q_proj.weight", {dq, dd});
                aw.k_proj = rd.take(q + "k_proj.weight", {dkv, dd});
                aw.v_proj = rd.take(q + "v_proj.weight", {dkv, dd});
                aw.o_proj = rd.take(q + "o_proj.weight", {dd, dqo});
                aw.q_norm = rd.take(q + "q_norm.weight", {dhd});
                aw.k_norm = rd.take(q + "k_norm.weight", {dhd});
                layers.emplace_back(std::move(norm), typename Stack::mixer_variant(std::in_place_type<attention>, a, std::move(aw)),
                                    std::move(mlp_norm), std::move(mlp));
                continue;
            }
        }
        throw config_error(rd.config_path() + ": layer " + std::to_string(i) + " is '" + layer_kind_name(k) +
                           "' (" + qwen3_5_kind_source(j, i) + "), which the compiled stack has no mixer for");
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
