// Reading HF config.json for the model facades (no checkpoint files needed): Mamba-2 keys incl. time_step_limit
// in every spelling, Qwen3.5 layer_types / full_attention_interval / rope_parameters / text_config nesting, errors.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"

using namespace hymix;
using namespace hymix::models;

namespace {

const std::string mamba_base = R"({"model_type": "mamba2", "hidden_size": 64, "num_heads": 4, "head_dim": 32, "expand": 2,
  "state_size": 16, "n_groups": 1, "conv_kernel": 4, "vocab_size": 100, "num_hidden_layers": 3, "layer_norm_epsilon": 1e-5,
  "tie_word_embeddings": true)";

hf_mamba2_config mamba(const std::string& extra) {
    return read_hf_mamba2_config(io::parse_json(mamba_base + extra + "}", "config.json"), "config.json");
}

const std::string qwen_base = R"("hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 300, "intermediate_size": 96,
  "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
  "linear_value_head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16)";

hf_qwen3_5_config qwen(const std::string& json) { return read_hf_qwen3_5_config(io::parse_json(json, "config.json"), "config.json"); }

}  // namespace

TEST_CASE("HF Mamba-2 config: sizes, full-width gated norm, time_step_limit spellings") {
    const auto a = mamba("");
    CHECK(a.mixer.d_inner() == 128);
    CHECK(a.mixer.norm_group_size == 128);  // HF eager path: one norm over all of d_inner
    CHECK(a.mixer.dt_limit.lo == 0.f);
    CHECK(std::isinf(a.mixer.dt_limit.hi));
    CHECK(a.stack.tie_embeddings);
    CHECK(a.n_layers == 3);
    CHECK(a.stack.norm_eps == doctest::Approx(1e-5));
    const auto b = mamba(R"(, "time_step_limit": [0.0, Infinity])");
    CHECK(std::isinf(b.mixer.dt_limit.hi));
    const auto c = mamba(R"(, "time_step_limit": [0.0, {"__float__": "Infinity"}])");
    CHECK(std::isinf(c.mixer.dt_limit.hi));
    const auto d = mamba(R"(, "time_step_limit": [0.01, 0.1])");
    CHECK(d.mixer.dt_limit.lo == doctest::Approx(0.01));
    CHECK(d.mixer.dt_limit.hi == doctest::Approx(0.1));
    CHECK_THROWS_WITH_AS(mamba(R"(, "time_step_limit": [0.0])"), doctest::Contains("config.json: key 'time_step_limit' = [0.0]: must hold 2 numbers"), config_error);
    CHECK_THROWS_WITH_AS(mamba(R"(, "expand": 3)"), doctest::Contains("key 'expand' = 3 × key 'hidden_size' = 64 = 192 differs from key 'num_heads' = 4 × key 'head_dim' = 32 = 128"), config_error);
    CHECK_THROWS_WITH_AS(mamba(R"(, "hidden_act": "gelu")"), doctest::Contains("config.json: key 'hidden_act' = \"gelu\": not supported"), config_error);
    CHECK_THROWS_AS(read_hf_mamba2_config(io::parse_json(R"({"model_type": "mamba2", "hidden_size": 64})"), "config.json"),
                    config_error);
}

TEST_CASE("Qwen3.5 config: layer_types, full_attention_interval, rope_parameters first, text_config") {
    const auto a = qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base +
                        R"(, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
                           "rope_parameters": {"rope_theta": 5000.0, "partial_rotary_factor": 0.5}, "rope_theta": 7.0})");
    CHECK(schedule_string(a.kinds) == "GAGA");
    CHECK(a.prefix == "model.");
    CHECK(a.attn.rope.theta == 5000.0);
    CHECK(a.attn.rope.partial_rotary_factor == 0.5);
    CHECK(a.attn.output_gate);
    CHECK(a.attn.qk_norm.mode == qk_norm_mode::zero_centered);
    CHECK(a.gdn.value_dim() == 32);
    CHECK(a.gdn.norm_eps == doctest::Approx(1e-6));

    const auto b = qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base + R"(, "full_attention_interval": 2, "rope_theta": 7.0})");
    CHECK(schedule_string(b.kinds) == "GAGA");
    CHECK(b.attn.rope.theta == 7.0);
    CHECK(b.attn.rope.partial_rotary_factor == 0.25);
    const auto c = qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base + "}");
    CHECK(schedule_string(c.kinds) == "GGGA");  // default interval 4

    const auto d = qwen(R"({"model_type": "qwen3_5", "tie_word_embeddings": true, "text_config": {)" + qwen_base + "}}");
    CHECK(d.prefix == "model.language_model.");
    CHECK(d.stack.tie_embeddings);
    CHECK(d.stack.vocab_size == 300);

    CHECK_THROWS_WITH_AS(qwen(R"({"model_type": "qwen3_next", )" + qwen_base + "}"), doctest::Contains("config.json: key 'model_type' = \"qwen3_next\""),
                         config_error);
    CHECK_THROWS_WITH_AS(qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base + R"(, "layer_types": ["linear_attention"]})"),
                         doctest::Contains("key 'layer_types' = [\"linear_attention\"]: lists 1 layers, but key 'num_hidden_layers' = 4"), config_error);
    CHECK_THROWS_WITH_AS(
        qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base + R"(, "layer_types": ["linear_attention", "mlp", "full_attention", "linear_attention"]})"),
        doctest::Contains("config.json: key 'layer_types[1]' = \"mlp\""), config_error);
    CHECK_THROWS_WITH_AS(qwen(R"({"model_type": "qwen3_5_text", )" + qwen_base + R"(, "rope_parameters": {"rope_type": "yarn"}})"),
                         doctest::Contains("config.json: key 'rope_parameters.rope_type' = \"yarn\": not supported"), config_error);
    CHECK_THROWS_AS(qwen(R"({"model_type": "qwen3_5"})"), config_error);
}

TEST_CASE("config errors name config.json, the JSON key (with its path) and the value found") {
    struct bad {
        const char* json;  // appended to the base (a repeated key replaces the earlier value)
        const char* want;
    };
    const bad mamba_cases[] = {
        {R"(, "layer_norm_epsilon": NaN)", "config.json: key 'layer_norm_epsilon' = NaN: must be finite and > 0"},
        {R"(, "layer_norm_epsilon": 0)", "config.json: key 'layer_norm_epsilon' = 0: must be finite and > 0"},
        {R"(, "layer_norm_epsilon": -Infinity)", "key 'layer_norm_epsilon' = -Infinity"},
        {R"(, "layer_norm_epsilon": 1e-60)", "key 'layer_norm_epsilon' = 1e-60: must be finite and > 0 in 32-bit floating point"},
        {R"(, "num_heads": 0)", "config.json: key 'num_heads' = 0: must be > 0"},
        {R"(, "hidden_size": -64)", "config.json: key 'hidden_size' = -64: must be > 0"},
        {R"(, "head_dim": 0)", "key 'head_dim' = 0: must be > 0"},
        {R"(, "state_size": 0)", "key 'state_size' = 0: must be > 0"},
        {R"(, "n_groups": 0)", "key 'n_groups' = 0: must be > 0"},
        {R"(, "n_groups": 3)", "key 'num_heads' = 4: not a multiple of key 'n_groups' = 3"},
        {R"(, "conv_kernel": 0)", "key 'conv_kernel' = 0: must be > 0"},
        {R"(, "chunk_size": -1)", "key 'chunk_size' = -1: must be > 0"},
        {R"(, "expand": 0)", "key 'expand' = 0: must be > 0"},
        {R"(, "vocab_size": 0)", "key 'vocab_size' = 0: must be > 0"},
        {R"(, "num_hidden_layers": 0)", "key 'num_hidden_layers' = 0: must be > 0"},
        {R"(, "time_step_limit": [0.1, 0.01])", "key 'time_step_limit' = [0.1, 0.01]: must satisfy 0 <= lo <= hi"},
        {R"(, "time_step_limit": [NaN, 1.0])", "key 'time_step_limit' = [NaN, 1.0]"},
        {R"(, "rms_norm": false)", "key 'rms_norm' = false"},
        {R"(, "hidden_size": "64")", "config.json: key 'hidden_size': expected integer, found string \"64\""},
        {R"(, "num_heads": 2.5)", "config.json: key 'num_heads': expected integer"},
    };
    for (const auto& b : mamba_cases) {
        CAPTURE(b.json);
        CHECK_THROWS_WITH_AS(mamba(b.json), doctest::Contains(b.want), config_error);
    }
    const std::string q = R"({"model_type": "qwen3_5_text", )" + qwen_base;
    const bad qwen_cases[] = {
        {R"(, "rms_norm_eps": NaN})", "config.json: key 'rms_norm_eps' = NaN: must be finite and > 0"},
        {R"(, "rms_norm_eps": -1e-6})", "key 'rms_norm_eps' = -1e-06: must be finite and > 0"},
        {R"(, "rms_norm_eps": 1e300})", "key 'rms_norm_eps' = 1e+300: must be finite and > 0 in 32-bit floating point"},
        {R"(, "num_attention_heads": 0})", "config.json: key 'num_attention_heads' = 0: must be > 0"},
        {R"(, "num_key_value_heads": 3})", "key 'num_attention_heads' = 4: not a multiple of key 'num_key_value_heads' = 3"},
        {R"(, "linear_num_key_heads": 3})", "key 'linear_num_value_heads' = 4: not a multiple of key 'linear_num_key_heads' = 3"},
        {R"(, "head_dim": 0})", "key 'head_dim' = 0: must be > 0"},
        {R"(, "intermediate_size": 0})", "key 'intermediate_size' = 0: must be > 0"},
        {R"(, "vocab_size": -1})", "key 'vocab_size' = -1: must be > 0"},
        {R"(, "hidden_size": 0})", "key 'hidden_size' = 0: must be > 0"},
        {R"(, "num_hidden_layers": 0})", "key 'num_hidden_layers' = 0: must be > 0"},
        {R"(, "linear_conv_kernel_dim": 0})", "key 'linear_conv_kernel_dim' = 0: must be > 0"},
        {R"(, "linear_key_head_dim": 0})", "key 'linear_key_head_dim' = 0: must be > 0"},
        {R"(, "linear_value_head_dim": -2})", "key 'linear_value_head_dim' = -2: must be > 0"},
        {R"(, "full_attention_interval": 0})", "key 'full_attention_interval' = 0: must be > 0"},
        {R"(, "rope_theta": -1})", "config.json: key 'rope_theta' = -1: must be finite and > 0"},
        {R"(, "rope_parameters": {"rope_theta": Infinity}})", "config.json: key 'rope_parameters.rope_theta' = Infinity: must be finite"},
        {R"(, "partial_rotary_factor": 1.5})", "key 'partial_rotary_factor' = 1.5: must lie in (0, 1]"},
        {R"(, "rope_parameters": {"partial_rotary_factor": 0.1}})",
         "key 'rope_parameters.partial_rotary_factor' = 0.1: int(key 'head_dim' = 16 × factor) = 1 rotary channels"},
        {R"(, "attention_bias": true})", "key 'attention_bias' = true: not supported"},
        {R"(, "rope_parameters": 3})", "config.json: key 'rope_parameters' must be a JSON object, found integer 3"},
    };
    for (const auto& b : qwen_cases) {
        CAPTURE(b.json);
        CHECK_THROWS_WITH_AS(qwen(q + b.json), doctest::Contains(b.want), config_error);
    }
    // The same keys nested in text_config (model_type qwen3_5) are named with their path.
    const std::string mm = R"({"model_type": "qwen3_5", "text_config": {)" + qwen_base;
    CHECK_THROWS_WITH_AS(qwen(mm + R"(, "rms_norm_eps": NaN}})"), doctest::Contains("config.json: key 'text_config.rms_norm_eps' = NaN"),
                         config_error);
    CHECK_THROWS_WITH_AS(qwen(mm + R"(, "num_attention_heads": 0}})"),
                         doctest::Contains("config.json: key 'text_config.num_attention_heads' = 0: must be > 0"), config_error);
    CHECK_THROWS_WITH_AS(qwen(R"({"model_type": "qwen3_5", "text_config": {"hidden_size": 64}})"),
                         doctest::Contains("config.json: missing required key 'text_config.num_hidden_layers'"), config_error);
    CHECK_THROWS_WITH_AS(qwen(R"({"model_type": "qwen3_5", "text_config": []})"),
                         doctest::Contains("config.json: key 'text_config' must be a JSON object, found array"), config_error);
}
