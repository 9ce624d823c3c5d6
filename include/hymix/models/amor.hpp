// Post-hoc AMOR models (spec.md §5): a pretrained recurrent backbone checkpoint (HF Mamba-2, or a Qwen3.5 Gated
// DeltaNet stack) followed by K entropy-gated attention blocks, stored as one AMOR file — safetensors with the
// spec.md §5.8 tensor names and its configuration as JSON in the `config` metadata entry — next to the unchanged
// backbone directory. Dataflow: embedding → backbone layers → AMOR block 0 (its norm is the backbone's final norm,
// `norm_f`) → blocks 1… (their own plain norms) → final_norm (plain, eps 1e-6) → the backbone's LM head (tied or
// separate, as the checkpoint has it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/gate/entropy_ema.hpp"
#include "hymix/io/safetensors_reader.hpp"
#include "hymix/io/safetensors_writer.hpp"
#include "hymix/models/checkpoint.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"
#include "hymix/stack/amor_block.hpp"

namespace hymix::models {

/// The AMOR file's configuration (spec.md §5.8 release keys, plus hymix's gate choice).
struct amor_config {
    std::string backbone = "mamba2";  ///< "mamba2" (HF Mamba-2 backbone) or "gdn" (Qwen3.5 GDN backbone)
    std::int64_t n_amor_blocks = 3;
    std::string residual_mode = "classic";  ///< classic | h
    std::int64_t d_model = 0, n_heads = 4, head_dim = 64, vocab_size = 0;
    float norm_eps = 1e-6f;        ///< AMOR's own norms (pre-norms of blocks ≥ 1, final_norm)
    float init_alpha = 0.0f;       ///< raw_α at initialisation
    entropy_ema_config gate{};     ///< κ (offset_k), μ, initial statistics, offset mode, gate_offset
    bool always_on = false;        ///< every token attends (the always-on comparison at equal parameters)
    double rope_theta = 10000.0;

    nlohmann::json to_json() const {
        return {{"backbone", backbone}, {"n_amor_blocks", n_amor_blocks}, {"residual_mode", residual_mode}, {"d_model", d_model},
                {"n_heads", n_heads}, {"head_dim", head_dim}, {"vocab_size", vocab_size}, {"norm_eps", norm_eps},
                {"init_alpha", init_alpha}, {"init_threshold", gate.init_threshold}, {"init_std", gate.init_std},
                {"gate_offset", gate.gate_offset}, {"offset_mode", gate.offset_mode == amor_offset_mode::adaptive ? "adaptive" : "fixed"},
                {"offset_k", gate.kappa}, {"ema_momentum", gate.momentum}, {"attention_mode", always_on ? "always" : "true_sparse"},
                {"rope_theta", rope_theta}};
    }
    /// Reads the keys above; `origin` names the file in errors (config_error naming the key).
    static amor_config from_json(const nlohmann::json& j, const std::string& origin) {
        const io::config_keys k(j, origin);
        amor_config c;
        c.backbone = k.require<std::string>("backbone");
        if (c.backbone != "mamba2" && c.backbone != "gdn") k.fail("backbone", "must be mamba2 or gdn");
        c.n_amor_blocks = k.positive("n_amor_blocks");
        c.residual_mode = k.get<std::string>("residual_mode", "classic");
        if (c.residual_mode != "classic" && c.residual_mode != "h") k.fail("residual_mode", "must be classic or h");
        c.d_model = k.positive("d_model");
        c.n_heads = k.positive("n_heads");
        c.head_dim = k.positive("head_dim", 64);
        c.vocab_size = k.positive("vocab_size");
        c.norm_eps = k.finite_positive_f32("norm_eps", 1e-6);
        c.init_alpha = static_cast<float>(k.get<double>("init_alpha", 0.0));
        c.gate.init_threshold = static_cast<float>(k.get<double>("init_threshold", 0.3));
        c.gate.init_std = static_cast<float>(k.get<double>("init_std", 0.1));
        c.gate.gate_offset = static_cast<float>(k.get<double>("gate_offset", 0.03));
        const auto om = k.get<std::string>("offset_mode", "adaptive");
        if (om != "adaptive" && om != "fixed") k.fail("offset_mode", "must be adaptive or fixed");
        c.gate.offset_mode = om == "adaptive" ? amor_offset_mode::adaptive : amor_offset_mode::fixed;
        c.gate.kappa = static_cast<float>(k.get<double>("offset_k", 0.2));
        c.gate.momentum = static_cast<float>(k.get<double>("ema_momentum", 0.99));
        const auto am = k.get<std::string>("attention_mode", "true_sparse");
        if (am != "true_sparse" && am != "full_with_mask" && am != "always") k.fail("attention_mode", "must be true_sparse, full_with_mask or always");
        c.always_on = am == "always";
        c.rope_theta = k.get<double>("rope_theta", 10000.0);
        if (c.n_heads * c.head_dim != c.d_model)
            throw config_error(origin + ": n_heads × head_dim = " + std::to_string(c.n_heads * c.head_dim) + " differs from d_model " +
                               std::to_string(c.d_model) + " (AMOR attention is d → d)");
        return c;
    }
    /// The blocks' attention: MHA, RoPE rotate-half over the full head, base rope_theta, no qk-norm, no output gate.
    attention_config attention() const {
        attention_config a;
        a.d_model = d_model;
        a.n_heads = n_heads;
        a.n_kv_heads = n_heads;
        a.head_dim = head_dim;
        a.rope.mode = rope_mode::rotate_half;
        a.rope.theta = rope_theta;
        a.rope.partial_rotary_factor = 1.0;
        return a;
    }
};

/// The AMOR backbone kind of a checkpoint's config.json (`config`, read from `config_path`): "mamba2" for model_type
/// mamba2, "gdn" for a Qwen3.5 text model whose every layer is linear_attention (AMOR's blocks add attention on
/// top of a purely recurrent backbone). The layer kinds are those the Qwen3.5 loader derives: `layer_types`, or the
/// `full_attention_interval` rule where it is absent. Throws config_error naming the file for any other model_type
/// and for a hybrid (naming the first full_attention layer and what makes it one), and the loader's config_error for
/// a malformed Qwen3.5 config.
inline std::string amor_backbone_kind(const nlohmann::json& config, const std::string& config_path) {
    const std::string mt = config.is_object() && config.contains("model_type") && config["model_type"].is_string()
                               ? config["model_type"].get<std::string>()
                               : std::string();
    if (mt == "mamba2") return "mamba2";
    if (mt != "qwen3_5_text" && mt != "qwen3_5")
        throw config_error(config_path + ": model_type '" + mt + "' cannot carry AMOR blocks (a Mamba-2 'mamba2' or an all-GDN Qwen3.5 "
                           "'qwen3_5_text' backbone can)");
    const auto c = read_hf_qwen3_5_config(config, config_path);
    for (std::size_t i = 0; i < c.kinds.size(); ++i)
        if (c.kinds[i] != layer_kind::gated_deltanet)
            throw config_error(config_path + ": " + qwen3_5_kind_source(qwen3_5_text_keys(config, config_path), static_cast<std::int64_t>(i)) +
                               ": AMOR blocks train on a backbone with no attention layers (Mamba-2, or Qwen3.5 with every layer "
                               "linear_attention); this one is a hybrid");
    return "gdn";
}

/// Checks that the AMOR file at `amor_path` (configuration `c`) was made for a backbone whose config.json (at
/// `config_path`) has `model_type`: "mamba2" for a Mamba-2 file, "qwen3_5_text" / "qwen3_5" for a GDN file. Throws
/// config_error naming both files and both kinds.
inline void require_amor_backbone(const amor_config& c, const std::string& model_type, const std::string& amor_path,
                                  const std::string& config_path) {
    const bool mamba2 = model_type == "mamba2", qwen = model_type == "qwen3_5_text" || model_type == "qwen3_5";
    if ((c.backbone == "mamba2" && !mamba2) || (c.backbone == "gdn" && !qwen) || (c.backbone != "mamba2" && c.backbone != "gdn"))
        throw config_error(amor_path + ": an AMOR file for a " + c.backbone + " backbone, but " + config_path + " has model_type '" +
                           model_type + "'");
}

/// The AMOR stack over a Mamba-2 backbone and over a Qwen3.5 GDN backbone, with gate G.
template <class G = entropy_ema>
using amor_mamba2_stack = model<any_of<layer_kind::mamba2, amor_kind>, plain_rms_norm, no_mlp, bind<layer_kind::mamba2, mamba2>,
                                bind<amor_kind, amor_block<G>>>;
template <class G = entropy_ema>
using amor_gdn_stack = model<any_of<layer_kind::gated_deltanet, amor_kind>, zero_centered_rms_norm, swiglu_mlp,
                             bind<layer_kind::gated_deltanet, gated_deltanet>, bind<amor_kind, amor_block<G>>>;

namespace detail {
template <class G>
G make_gate(const amor_config& c) {
    if constexpr (std::is_same_v<G, entropy_ema>) {
        auto gc = c.gate;
        gc.always_on = c.always_on;
        return entropy_ema(gc);
    } else {
        return G{};
    }
}

/// Moves the backbone's layers into an AMOR stack of type S and appends the AMOR blocks built by `block(i)`.
template <class S, class Backbone, class MakeBlock>
S assemble(Backbone&& bb, const amor_config& c, tensor<float> final_norm, MakeBlock&& block) {
    stack_config sc = bb.config();
    stack_weights w;
    w.embedding = std::move(bb.weights_mut().embedding);
    w.lm_head = std::move(bb.weights_mut().lm_head);
    w.final_norm = std::move(final_norm);
    std::vector<typename S::block_variant> blocks;
    for (std::int64_t l = 0; l < bb.n_layers(); ++l)
        blocks.emplace_back(std::in_place_index<0>, std::move(std::get<0>(bb.layer_at(l))));
    for (std::int64_t i = 0; i < c.n_amor_blocks; ++i) blocks.emplace_back(std::in_place_index<1>, block(i));
    return S(sc, std::move(w), std::move(blocks), final_norm_options{c.norm_eps, kernels::rms_flavor::plain});
}
}  // namespace detail

/// A fresh (untrained) AMOR stack on `bb` (spec.md §5.3): W_q, W_k, W_v ~ N(0, 0.02), W_o = 0 (the stack adds exactly
/// 0 at step 0), raw_α = init_alpha, pre-norms and final_norm ones; block 0's norm is a copy of the backbone's final
/// norm (weights, eps and flavour: the classic mode replaces the stream by it). Throws config_error on size mismatches.
template <class S, class Backbone>
S make_amor(Backbone bb, amor_config c, std::uint64_t seed) {
    const std::int64_t d = bb.config().d_model;
    c.d_model = d;
    c.vocab_size = bb.config().vocab_size;
    const auto ac = c.attention();
    ac.validate();
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd(0.f, 0.02f);
    tensor<float> norm_f = bb.weights().final_norm;
    const float norm_f_eps = bb.final_eps();
    const auto norm_f_flavor = bb.final_flavor();
    tensor<float> ones({d});
    ones.fill(1.0f);
    return detail::assemble<S>(std::move(bb), c, ones, [&](std::int64_t i) {
        attention_weights w;
        for (auto* t : {&w.q_proj, &w.k_proj, &w.v_proj}) {
            *t = tensor<float>({d, d});
            for (auto& v : t->span()) v = nd(g);
        }
        w.o_proj = tensor<float>({d, d});
        tensor<float> ra({d});
        ra.fill(c.init_alpha);
        const bool first = i == 0;
        const auto residual = first && c.residual_mode == "classic" ? amor_residual::replace : amor_residual::add;
        using Blk = std::variant_alternative_t<1, typename S::block_variant>;
        using G = typename Blk::gate_type;
        return Blk(first ? norm_f : ones, first ? norm_f_eps : c.norm_eps, attention(ac, std::move(w)), std::move(ra),
                   detail::make_gate<G>(c), residual, first ? norm_f_flavor : kernels::rms_flavor::plain);
    });
}

/// Writes the AMOR part of `m` (its layers from `first_amor_layer` on, norm_f, final_norm) to `path` with the spec.md §5.8
/// names, the gate buffers and `c` as the `config` metadata entry; atomically. Throws io_error, and config_error (writing
/// nothing) where a block's projections are stored as bf16, f16 or i8.
template <class S>
void save_amor(S& m, std::int64_t first_amor_layer, amor_config c, const std::filesystem::path& path) {
    c.d_model = m.config().d_model;
    c.vocab_size = m.config().vocab_size;
    c.n_amor_blocks = m.n_layers() - first_amor_layer;
    safetensors::writer w;
    for (std::int64_t l = first_amor_layer; l < m.n_layers(); ++l) {
        auto& blk = std::get<1>(m.layer_at(l));
        const std::int64_t i = l - first_amor_layer;
        const std::string p = "amor_blocks." + std::to_string(i) + ".";
        const auto& aw = blk.mixer().weights();
        const auto f32 = [&](const linear_weight& t, const char* name) -> const tensor<float>& {
            if (!t.is_f32())
                throw config_error("save_amor: layer " + std::to_string(l) + "'s " + name + " is stored as " + weight_dtype_name(t.storage()) +
                                   " for inference; AMOR files hold fp32 weights (store_weights_as(dtype::f32) first)");
            return t.f32();
        };
        w.add(p + "q_proj.weight", f32(aw.q_proj, "q_proj"));
        w.add(p + "kv_proj.k_proj.weight", f32(aw.k_proj, "k_proj"));
        w.add(p + "kv_proj.v_proj.weight", f32(aw.v_proj, "v_proj"));
        w.add(p + "out_proj.weight", f32(aw.o_proj, "o_proj"));
        w.add(p + "raw_alpha", blk.raw_alpha());
        if constexpr (requires { blk.gate().running_threshold(); }) {
            const float mt = blk.gate().running_threshold(), st = blk.gate().running_std();
            w.add(p + "gate.running_threshold", std::vector<std::int64_t>{}, std::span<const float>(&mt, 1));
            w.add(p + "gate.running_std", std::vector<std::int64_t>{}, std::span<const float>(&st, 1));
        }
        w.add(i == 0 ? std::string("norm_f.weight") : "amor_pre_norms." + std::to_string(i) + ".weight", blk.norm());
    }
    w.add("final_norm.weight", m.weights().final_norm);
    w.set_metadata("config", c.to_json().dump());
    w.set_metadata("format", "hymix-amor");
    w.write(path);
}

/// The configuration stored in an AMOR file. Throws io_error / format_error / config_error.
inline amor_config read_amor_config(const std::filesystem::path& path) {
    const safetensors::file f(path);
    if (const auto fm = f.metadata().find("format"); fm != f.metadata().end() && fm->second == "hymix-amor-router")
        throw format_error(path.string() + ": an AMOR router file (hymix amor-router), not an AMOR file: pass it as --router, with the AMOR "
                                           "file it was fitted for as --amor");
    const auto it = f.metadata().find("config");
    if (it == f.metadata().end()) throw format_error(path.string() + ": no 'config' metadata entry (not an AMOR file)");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
        throw format_error(path.string() + ": the 'config' metadata entry is not JSON: " + e.what());
    }
    return amor_config::from_json(j, path.string() + " (config)");
}

/// Loads an AMOR file onto the backbone stack `bb` (moved in): a stack of type S. Throws format_error for a missing
/// tensor, shape_error for one of the wrong shape (naming both), config_error when the file does not fit the backbone.
template <class S, class Backbone>
S load_amor(Backbone bb, const std::filesystem::path& path) {
    const auto c = read_amor_config(path);
    const safetensors::file f(path);
    const std::int64_t d = bb.config().d_model;
    if (c.d_model != d || c.vocab_size != bb.config().vocab_size)
        throw config_error(path.string() + ": AMOR file for d_model " + std::to_string(c.d_model) + ", vocab " + std::to_string(c.vocab_size) +
                           "; the backbone has d_model " + std::to_string(d) + ", vocab " + std::to_string(bb.config().vocab_size));
    auto take = [&](const std::string& n, std::vector<std::int64_t> shape) {
        if (!f.contains(n)) throw format_error(path.string() + ": missing tensor '" + n + "' (expected shape " + shape_string(shape) + ")");
        auto t = f.to_f32(n);
        if (t.shape() != shape)
            throw shape_error(path.string() + ": tensor '" + n + "' has shape " + shape_string(t.shape()) + ", expected " + shape_string(shape));
        return t;
    };
    const float norm_f_eps = bb.final_eps();
    const auto norm_f_flavor = bb.final_flavor();
    const auto ac = c.attention();
    auto final_norm = take("final_norm.weight", {d});
    return detail::assemble<S>(std::move(bb), c, std::move(final_norm), [&](std::int64_t i) {
        const std::string p = "amor_blocks." + std::to_string(i) + ".";
        attention_weights w;
        w.q_proj = take(p + "q_proj.weight", {d, d});
        w.k_proj = take(p + "kv_proj.k_proj.weight", {d, d});
        w.v_proj = take(p + "kv_proj.v_proj.weight", {d, d});
        w.o_proj = take(p + "out_proj.weight", {d, d});
        auto ra = take(p + "raw_alpha", {d});
        auto norm = take(i == 0 ? std::string("norm_f.weight") : "amor_pre_norms." + std::to_string(i) + ".weight", {d});
        using Blk = std::variant_alternative_t<1, typename S::block_variant>;
        using G = typename Blk::gate_type;
        G gate = detail::make_gate<G>(c);
        if constexpr (std::is_same_v<G, entropy_ema>) {
            const auto m = take(p + "gate.running_threshold", {}), s = take(p + "gate.running_std", {});
            gate.set_statistics(m[0], s[0]);
        }
        const bool first = i == 0;
        const auto residual = first && c.residual_mode == "classic" ? amor_residual::replace : amor_residual::add;
        return Blk(std::move(norm), first ? norm_f_eps : c.norm_eps, attention(ac, std::move(w)), std::move(ra), std::move(gate), residual,
                   first ? norm_f_flavor : kernels::rms_flavor::plain);
    });
}

}  // namespace hymix::models
