// config.json against the tensors of a checkpoint (models/checkpoint.hpp, hf_mamba2.hpp, hf_qwen3_5.hpp): sizes,
// tying, layer counts, layer kinds and vocab that contradict the files fail at load naming both files and both
// values, or — where transformers accepts them — warn once. Small random checkpoints written to a temp directory;
// no shared files needed.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "hymix/core/warning.hpp"
#include "hymix/io/safetensors.hpp"
#include "hymix/models/auto_model.hpp"
#include "support/shared.hpp"

using namespace hymix;

namespace {

using shapes = std::map<std::string, std::vector<std::int64_t>>;

// Tiny HF Mamba-2: d 32, 2 heads of 32 (expand 2), state 8, 1 group, conv 4, vocab 40, 2 layers.
const std::string mamba_config = R"({"model_type": "mamba2", "hidden_size": 32, "num_heads": 2, "head_dim": 32, "expand": 2,
  "state_size": 8, "n_groups": 1, "conv_kernel": 4, "chunk_size": 16, "vocab_size": 40, "num_hidden_layers": 2,
  "layer_norm_epsilon": 1e-5, "tie_word_embeddings": false)";

shapes mamba_tensors(int n_layers = 2) {
    const std::int64_t d = 32, V = 40, H = 2, di = 64, cd = di + 2 * 8, np = 2 * di + 2 * 8 + H;
    shapes s{{"backbone.embeddings.weight", {V, d}}, {"backbone.norm_f.weight", {d}}, {"lm_head.weight", {V, d}}};
    for (int i = 0; i < n_layers; ++i) {
        const std::string p = "backbone.layers." + std::to_string(i) + ".";
        s[p + "norm.weight"] = {d};
        s[p + "mixer.in_proj.weight"] = {np, d};
        s[p + "mixer.conv1d.weight"] = {cd, 1, 4};
        s[p + "mixer.conv1d.bias"] = {cd};
        s[p + "mixer.dt_bias"] = {H};
        s[p + "mixer.A_log"] = {H};
        s[p + "mixer.D"] = {H};
        s[p + "mixer.norm.weight"] = {di};
        s[p + "mixer.out_proj.weight"] = {d, di};
    }
    return s;
}

// Tiny Qwen3.5 text hybrid: d 32, layers [linear, full, linear], vocab 50, MLP 48, GDN 2 key heads × 8, 2 value
// heads × 8, attention 2 heads / 1 KV head of 16.
const std::string qwen_keys = R"("model_type": "qwen3_5_text", "hidden_size": 32, "num_hidden_layers": 3, "vocab_size": 50,
  "intermediate_size": 48, "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
  "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
  "partial_rotary_factor": 0.25)";
const std::string qwen_types = R"(, "layer_types": ["linear_attention", "full_attention", "linear_attention"])";

shapes qwen_tensors(const std::string& kinds = "GAG") {
    const std::int64_t d = 32, V = 50, F = 48, conv = 2 * 16 + 16, vd = 16, Hv = 2;
    shapes s{{"model.embed_tokens.weight", {V, d}}, {"model.norm.weight", {d}}, {"lm_head.weight", {V, d}}};
    for (std::size_t i = 0; i < kinds.size(); ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        s[p + "input_layernorm.weight"] = {d};
        s[p + "post_attention_layernorm.weight"] = {d};
        s[p + "mlp.gate_proj.weight"] = {F, d};
        s[p + "mlp.up_proj.weight"] = {F, d};
        s[p + "mlp.down_proj.weight"] = {d, F};
        if (kinds[i] == 'G') {
            const std::string q = p + "linear_attn.";
            s[q + "in_proj_qkv.weight"] = {conv, d};
            s[q + "in_proj_z.weight"] = {vd, d};
            s[q + "in_proj_b.weight"] = {Hv, d};
            s[q + "in_proj_a.weight"] = {Hv, d};
            s[q + "conv1d.weight"] = {conv, 1, 4};
            s[q + "dt_bias"] = {Hv};
            s[q + "A_log"] = {Hv};
            s[q + "norm.weight"] = {8};
            s[q + "out_proj.weight"] = {d, vd};
        } else {
            const std::string q = p + "self_attn.";
            s[q + "q_proj.weight"] = {2 * 2 * 16, d};
            s[q + "k_proj.weight"] = {16, d};
            s[q + "v_proj.weight"] = {16, d};
            s[q + "o_proj.weight"] = {d, 32};
            s[q + "q_norm.weight"] = {16};
            s[q + "k_norm.weight"] = {16};
        }
    }
    return s;
}

/// A fresh directory with config.json and model.safetensors holding random tensors of the given shapes.
std::filesystem::path write_checkpoint(const std::string& name, const std::string& config, const shapes& tensors,
                                       const std::map<std::string, tensor<float>>& fixed = {}) {
    const auto dir = test::tmp_dir() / ("cvt_" + name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config;
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    safetensors::writer w;
    for (const auto& [n, s] : tensors) {
        std::uint32_t seed = 2166136261u;  // FNV-1a of the name: a tensor's values do not depend on the others
        for (char ch : n) seed = (seed ^ static_cast<unsigned char>(ch)) * 16777619u;
        std::mt19937 g(seed);
        if (const auto it = fixed.find(n); it != fixed.end()) {
            w.add(n, it->second);
            continue;
        }
        tensor<float> t(s);
        for (auto& v : t.span()) v = u(g);
        if (n.find("norm") != std::string::npos || n.ends_with(".D")) t.fill(1.f);
        w.add(n, t);
    }
    w.write(dir / "model.safetensors");
    return dir;
}

/// The error message of loading `dir`, or "<loaded>".
std::string load_error(const std::filesystem::path& dir) {
    try {
        (void)auto_model::load(dir, 1);
    } catch (const error& e) {
        return e.what();
    }
    return "<loaded>";
}

/// Collects the warnings given while alive.
struct warning_log {
    std::vector<std::string> seen;
    warning_handler previous;
    warning_log() {
        previous = set_warning_handler([this](std::string_view m) { seen.emplace_back(m); });
    }
    ~warning_log() { set_warning_handler(previous); }
};

std::vector<float> logits(const auto_model& m) {
    const std::vector<std::int32_t> ids{1, 7, 3, 30, 2};
    auto c = m.make_cache(1);
    std::vector<float> out(static_cast<std::size_t>(5 * m.info().vocab_size));
    m.forward(c, seq_batch::dense(1, 5), ids, tensor_view<float, 2>(out.data(), {5, m.info().vocab_size}));
    return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("consistent tiny checkpoints load without warnings (the baseline of the cases below)") {
    warning_log log;
    const auto dm = write_checkpoint("mamba_ok", mamba_config + "}", mamba_tensors());
    CHECK(load_error(dm) == "<loaded>");
    const auto dq = write_checkpoint("qwen_ok", "{" + qwen_keys + qwen_types + "}", qwen_tensors());
    CHECK(load_error(dq) == "<loaded>");
    CHECK(auto_model::load(dq, 1).info().schedule == "GAG");
    CHECK(log.seen.empty());
}

TEST_CASE("sizes: a tensor extent that contradicts config.json names the tensor, both files and the key with its value") {
    const auto dv = write_checkpoint("vocab", mamba_config + R"(, "vocab_size": 48})", mamba_tensors());
    auto m = load_error(dv);
    CHECK(contains(m, "tensor 'backbone.embeddings.weight': expected shape [48, 32], found [40, 32]"));
    CHECK(contains(m, "axis 0 (40 in the file) is 48 by " + (dv / "config.json").string() + ": key 'vocab_size' = 48"));
    CHECK(contains(m, (dv / "model.safetensors").string()));

    const auto dh = write_checkpoint("qwen_heads", "{" + qwen_keys + qwen_types + R"(, "num_attention_heads": 4, "num_key_value_heads": 2})",
                                     qwen_tensors());
    m = load_error(dh);
    CHECK(contains(m, "tensor 'model.layers.1.self_attn.q_proj.weight': expected shape [128, 32], found [64, 32]"));
    CHECK(contains(m, "key 'num_attention_heads' = 4 × key 'head_dim' = 16"));

    const auto df = write_checkpoint("qwen_ff", "{" + qwen_keys + qwen_types + R"(, "intermediate_size": 64})", qwen_tensors());
    CHECK(contains(load_error(df), "is 64 by " + (df / "config.json").string() + ": key 'intermediate_size' = 64"));

    const auto dd = write_checkpoint("mamba_state", mamba_config + R"(, "state_size": 16})", mamba_tensors());
    m = load_error(dd);
    CHECK(contains(m, "tensor 'backbone.layers.0.mixer.in_proj.weight'"));
    CHECK(contains(m, "key 'state_size' = 16"));
}

TEST_CASE("tying: an untied config without lm_head.weight fails naming the key; a tied one with a different head warns once") {
    auto no_head = mamba_tensors();
    no_head.erase("lm_head.weight");
    const auto d1 = write_checkpoint("untied_nohead", mamba_config + "}", no_head);
    auto m = load_error(d1);
    CHECK(contains(m, (d1 / "config.json").string() + ": key 'tie_word_embeddings' = false"));
    CHECK(contains(m, "has no tensor 'lm_head.weight'"));
    CHECK(contains(m, (d1 / "model.safetensors").string()));
    // absent key: the default is named
    const std::string no_tie = "{" + qwen_keys + qwen_types + "}";
    auto q_no_head = qwen_tensors();
    q_no_head.erase("lm_head.weight");
    CHECK(contains(load_error(write_checkpoint("untied_default", no_tie, q_no_head)), "key 'tie_word_embeddings' (absent, default false)"));

    // Tied, and the file's lm_head equals the embedding: silent. Differs: one warning, the embedding is the head.
    const auto tied_cfg = "{" + qwen_keys + qwen_types + R"(, "tie_word_embeddings": true})";
    const auto base = write_checkpoint("tied_nohead", tied_cfg, q_no_head);
    safetensors::file bf(base / "model.safetensors");
    const auto emb = bf.to_f32("model.embed_tokens.weight");
    warning_log log;
    const auto same = write_checkpoint("tied_same", tied_cfg, qwen_tensors(), {{"lm_head.weight", emb}});
    CHECK(load_error(same) == "<loaded>");
    CHECK(log.seen.empty());
    const auto diff = write_checkpoint("tied_diff", tied_cfg, qwen_tensors());
    const auto m_diff = auto_model::load(diff, 1);
    CHECK(m_diff.info().tie_embeddings);  // model_info says which head the model uses
    REQUIRE(log.seen.size() == 1);
    CHECK(contains(log.seen[0], (diff / "config.json").string() + ": key 'tie_word_embeddings' = true"));
    CHECK(contains(log.seen[0], "differs from the embedding 'model.embed_tokens.weight'"));
    CHECK(logits(m_diff) == logits(auto_model::load(base, 1)));  // the embedding is the head
}

TEST_CASE("layer lists: fewer layers in the file fails, more warns once; a layer kind that contradicts the tensors fails") {
    const auto d_more_cfg = write_checkpoint("layers_missing", mamba_config + R"(, "num_hidden_layers": 3})", mamba_tensors(2));
    auto m = load_error(d_more_cfg);
    CHECK(contains(m, (d_more_cfg / "config.json").string() + ": key 'num_hidden_layers' = 3"));
    CHECK(contains(m, "has no tensor of layer 2 ('backbone.layers.2.*'); it holds layers up to 1"));

    warning_log log;
    const auto d_fewer = write_checkpoint("layers_extra", mamba_config + R"(, "num_hidden_layers": 1})", mamba_tensors(3));
    const auto fewer = auto_model::load(d_fewer, 1);
    CHECK(fewer.info().n_layers == 1);
    REQUIRE(log.seen.size() == 1);  // one warning, not one per ignored tensor
    CHECK(contains(log.seen[0], "key 'num_hidden_layers' = 1, but checkpoint"));
    CHECK(contains(log.seen[0], "holds 3 layers"));

    // layer_types says linear_attention where the file has an attention layer.
    const auto dk = write_checkpoint("kinds", "{" + qwen_keys + R"(, "layer_types": ["linear_attention", "linear_attention", "full_attention"]})",
                                     qwen_tensors("GAG"));
    m = load_error(dk);
    CHECK(contains(m, (dk / "config.json").string() + ": layer 1 is linear_attention (key 'layer_types[1]' = \"linear_attention\")"));
    CHECK(contains(m, "holds 'model.layers.1.self_attn."));
    CHECK(contains(m, (dk / "model.safetensors").string()));
    // The issue's case: a hybrid without layer_types (the default interval 4 makes every layer here linear).
    const auto dn = write_checkpoint("no_layer_types", "{" + qwen_keys + "}", qwen_tensors("GAG"));
    m = load_error(dn);
    CHECK(contains(m, "layer 1 is linear_attention (key 'layer_types' is absent, so key 'full_attention_interval' (absent, default 4) makes "
                      "layer 1 linear_attention)"));
    CHECK(!contains(m, "missing tensor"));
    // A compiled stack whose schedule cannot hold the configured kinds: the error names config.json too.
    const auto dq = write_checkpoint("qwen_gdn_only", "{" + qwen_keys + qwen_types + "}", qwen_tensors());
    try {
        (void)models::load_hf_qwen3_5<models::qwen3_5_gdn_stack>(dq);
        FAIL("a GDN-only stack accepted an attention layer");
    } catch (const config_error& e) {
        CHECK(contains(e.what(), (dq / "config.json").string() + ": "));
    }
}

TEST_CASE("optional tensors decided by a config key: wanted but absent fails naming the key; present but unwanted warns once") {
    auto no_bias = mamba_tensors();
    no_bias.erase("backbone.layers.0.mixer.conv1d.bias");
    no_bias.erase("backbone.layers.1.mixer.conv1d.bias");
    const auto d1 = write_checkpoint("bias_missing", mamba_config + "}", no_bias);
    const auto m = load_error(d1);
    CHECK(contains(m, (d1 / "config.json").string() + ": key 'use_conv_bias' (absent, default true), but checkpoint"));
    CHECK(contains(m, "has no tensor 'backbone.layers.0.mixer.conv1d.bias'"));
    warning_log log;
    const auto d2 = write_checkpoint("bias_unwanted", mamba_config + R"(, "use_conv_bias": false})", mamba_tensors());
    CHECK(load_error(d2) == "<loaded>");
    REQUIRE(log.seen.size() == 1);
    CHECK(contains(log.seen[0], "key 'use_conv_bias' = false, but checkpoint"));
}

TEST_CASE("config errors through a checkpoint directory name the full config.json path, the key and the value") {
    const auto d1 = write_checkpoint("eps_nan", "{" + qwen_keys + qwen_types + R"(, "rms_norm_eps": NaN})", qwen_tensors());
    CHECK(contains(load_error(d1), (d1 / "config.json").string() + ": key 'rms_norm_eps' = NaN: must be finite and > 0"));
    const auto d2 = write_checkpoint("heads_zero", "{" + qwen_keys + qwen_types + R"(, "num_attention_heads": 0})", qwen_tensors());
    CHECK(contains(load_error(d2), (d2 / "config.json").string() + ": key 'num_attention_heads' = 0: must be > 0"));
    const auto d3 = write_checkpoint("mamba_eps", mamba_config + R"(, "layer_norm_epsilon": Infinity})", mamba_tensors());
    CHECK(contains(load_error(d3), (d3 / "config.json").string() + ": key 'layer_norm_epsilon' = Infinity"));
}
