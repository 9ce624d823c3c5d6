// Reading a Hugging Face model directory for the model facades: config.json (with the Infinity/NaN spellings of
// spec.md §3.8) and the weights (model.safetensors or a sharded index), converted to fp32 tensors one name at a
// time with shape checks; every tensor of the checkpoint must be used exactly once (missing / extra → error).
// Where config.json and the tensors disagree, the error names both files and both values (a tensor extent and the
// config key it comes from); where transformers itself accepts the disagreement, one warning is given instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/core/warning.hpp"
#include "hymix/io/json.hpp"
#include "hymix/io/safetensors_index.hpp"
#include "hymix/kernels/swiglu.hpp"

namespace hymix::models {

/// One expected extent of a checkpoint tensor and, for messages, the config.json keys it comes from, e.g.
/// {256, "key 'vocab_size' = 256"} (`from` empty: not set by the config). Converts from a plain integer.
struct expected_dim {
    std::int64_t n;
    std::string from;
    expected_dim(std::int64_t n_) : n(n_) {}  // NOLINT(google-explicit-constructor): shapes are written {V, d}
    expected_dim(std::int64_t n_, std::string from_) : n(n_), from(std::move(from_)) {}
};

namespace detail {

/// Runs `check` (config structs' validate()) and prefixes any config_error with the config file, so that checks
/// the readers do not repeat key by key still name config.json.
template <class F>
void validate_from_config(const std::string& origin, F&& check) {
    try {
        check();
    } catch (const config_error& e) {
        throw config_error(origin + ": " + e.what());
    }
}

/// The layer index N of a tensor name "<prefix>N.<rest>", if it has that form.
inline std::optional<std::int64_t> layer_index(std::string_view name, std::string_view prefix) {
    if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
    std::int64_t n = 0;
    std::size_t i = prefix.size();
    if (i >= name.size() || name[i] < '0' || name[i] > '9') return std::nullopt;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
        if (n > 100'000'000) return std::nullopt;
        n = n * 10 + (name[i] - '0');
    }
    if (i >= name.size() || name[i] != '.') return std::nullopt;
    return n;
}

}  // namespace detail

/// A model directory opened for loading: the parsed config.json and the weights, with bookkeeping of which
/// tensors were taken so that `finish()` can reject tensors the model does not use.
class checkpoint_reader {
public:
    /// Opens `dir`/config.json and the weights. Throws io_error (missing directory / files) and format_error.
    explicit checkpoint_reader(const std::filesystem::path& dir)
        : dir_(dir),
          config_path_((dir / "config.json").string()),
          config_(io::read_json_file(dir / "config.json")),
          weights_(safetensors::open_checkpoint(dir)) {
        weights_name_ = std::filesystem::exists(dir / "model.safetensors.index.json")
                            ? (dir / "model.safetensors.index.json").string()
                            : (dir / "model.safetensors").string();
    }

    const std::filesystem::path& dir() const noexcept { return dir_; }
    const io::json& config() const noexcept { return config_; }
    /// "…/config.json", for error messages.
    const std::string& config_path() const noexcept { return config_path_; }
    /// "…/model.safetensors" (or the index), for error messages.
    const std::string& weights_path() const noexcept { return weights_name_; }
    bool contains(std::string_view name) const { return weights_.contains(name); }
    /// The opened weights (every shard).
    const safetensors::sharded_file& weights() const noexcept { return weights_; }

    /// The fp32 copy of tensor `name`, whose shape must equal `shape` (-1 matches any size). Throws format_error
    /// when the tensor is missing, shape_error on a shape mismatch, dtype_error for a non-float dtype; each names
    /// the tensor, the expected and found shape, and the file; for a mismatched extent that comes from config.json
    /// (expected_dim::from) also the config file, the key and its value.
    tensor<float> take(const std::string& name, std::initializer_list<expected_dim> shape) {
        return take(name, std::vector<expected_dim>(shape));
    }
    tensor<float> take(const std::string& name, const std::vector<std::int64_t>& shape) {
        return take(name, std::vector<expected_dim>(shape.begin(), shape.end()));
    }
    tensor<float> take(const std::string& name, const std::vector<expected_dim>& shape) {
        std::vector<std::int64_t> want;
        for (const auto& e : shape) want.push_back(e.n);
        if (!weights_.contains(name))
            throw format_error("checkpoint '" + weights_name_ + "': missing tensor '" + name + "' (expected shape " +
                               shape_string(want) + ")");
        const std::string_view key(name);  // a named view: a reference through a temporary argument trips GCC 13
        const auto& info = weights_.info(key);
        bool ok = info.shape.size() == shape.size();
        for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = want[i] < 0 || want[i] == info.shape[i];
        if (!ok) {
            std::string msg = "checkpoint '" + weights_name_ + "': tensor '" + name + "': expected shape " + shape_string(want) +
                              ", found " + shape_string(info.shape);
            if (info.shape.size() == shape.size())
                for (std::size_t i = 0; i < shape.size(); ++i)
                    if (want[i] >= 0 && want[i] != info.shape[i] && !shape[i].from.empty())
                        msg += "; axis " + std::to_string(i) + " (" + std::to_string(info.shape[i]) + " in the file) is " +
                               std::to_string(want[i]) + " by " + config_path_ + ": " + shape[i].from;
            throw shape_error(msg);
        }
        if (info.type != dtype::f32 && info.type != dtype::bf16 && info.type != dtype::f16 && info.type != dtype::f64)
            throw dtype_error("checkpoint '" + weights_name_ + "': tensor '" + name + "' has dtype " +
                              std::string(dtype_name(info.type)) + ", expected F32, BF16, F16 or F64");
        if (!used_.insert(name).second)
            throw format_error("checkpoint '" + weights_name_ + "': tensor '" + name + "' used twice");
        n_params_ += info.numel();
        return weights_.to_f32(name);
    }

    /// A tensor whose presence a config key decides (`flag`, described by `flag_text`, e.g. "key 'use_conv_bias' =
    /// true"). Wanted but absent: format_error naming both files and the key (transformers would start from random
    /// values). Not wanted but present: one warning, and the tensor is ignored (as transformers does). Returns an
    /// empty tensor when not wanted.
    tensor<float> take_if(bool flag, const std::string& flag_text, const std::string& name, std::initializer_list<expected_dim> shape) {
        if (flag) {
            if (!weights_.contains(name))
                throw format_error(config_path_ + ": " + flag_text + ", but checkpoint '" + weights_name_ + "' has no tensor '" +
                                   name + "'");
            return take(name, std::vector<expected_dim>(shape));
        }
        if (weights_.contains(name)) {
            warn_once(flag_text, config_path_ + ": " + flag_text + ", but checkpoint '" + weights_name_ + "' holds '" + name +
                      "' (and perhaps more such tensors); they are ignored, as transformers ignores them");
            used_.insert(name);
        }
        return {};
    }

    /// The LM head per `tie_word_embeddings` (`tie`, described by `tie_text`), given the embedding already taken.
    /// Untied without an 'lm_head.weight': format_error naming both files and the key. Tied with an 'lm_head.weight'
    /// in the file: accepted silently when it equals the embedding (a saved copy); otherwise one warning, and the
    /// embedding is used, as transformers does. Returns an empty tensor when tied.
    tensor<float> take_lm_head(bool tie, const std::string& tie_text, const tensor<float>& embedding, std::initializer_list<expected_dim> shape,
                               const std::string& embedding_name) {
        const std::string name = "lm_head.weight";
        if (!tie) {
            if (!weights_.contains(name))
                throw format_error(config_path_ + ": " + tie_text + " (the LM head is a tensor of its own), but checkpoint '" +
                                   weights_name_ + "' has no tensor '" + name + "'; if the head is the embedding '" +
                                   embedding_name + "', set \"tie_word_embeddings\": true");
            return take(name, std::vector<expected_dim>(shape));
        }
        if (weights_.contains(name)) {
            used_.insert(name);
            const auto head = weights_.to_f32(name);
            const bool same = head.shape() == embedding.shape() &&
                              std::equal(head.data(), head.data() + head.numel(), embedding.data());
            if (!same)
                warn_once(tie_text, config_path_ + ": " + tie_text + ", but checkpoint '" + weights_name_ + "' holds an '" + name +
                          "' of shape " + shape_string(head.shape()) + " that differs from the embedding '" + embedding_name +
                          "'; the embedding is used as the LM head, as transformers does");
        }
        return {};
    }

    /// Layers the tensor names hold under `prefix` (e.g. "model.layers."): one more than the highest index found
    /// (0 when none).
    std::int64_t layers_in_file(std::string_view prefix) const {
        std::int64_t n = 0;
        for (const auto& t : weights_.names())
            if (const auto i = detail::layer_index(t, prefix)) n = std::max(n, *i + 1);
        return n;
    }
    /// The first tensor name that starts with `prefix`, if any.
    std::optional<std::string> first_with_prefix(std::string_view prefix) const {
        for (const auto& t : weights_.names())
            if (std::string_view(t).substr(0, prefix.size()) == prefix) return t;
        return std::nullopt;
    }

    /// Compares the configured layer count `n_layers` (described by `count_text`) with the layers under `prefix`.
    /// Fewer layers in the file than configured: format_error naming both (a layer without tensors cannot run).
    /// More: one warning, and the extra layers' tensors are ignored (transformers loads the first n_layers).
    void check_layer_count(std::string_view prefix, std::int64_t n_layers, const std::string& count_text) {
        const std::int64_t in_file = layers_in_file(prefix);
        for (std::int64_t i = 0; i < n_layers; ++i)
            if (!first_with_prefix(std::string(prefix) + std::to_string(i) + "."))
                throw format_error(config_path_ + ": " + count_text + ", but checkpoint '" + weights_name_ +
                                   "' has no tensor of layer " + std::to_string(i) + " ('" + std::string(prefix) + std::to_string(i) +
                                   ".*'); it holds " + (in_file == 0 ? std::string("no layers") : "layers up to " + std::to_string(in_file - 1)));
        if (in_file > n_layers) {
            warn_once(count_text, config_path_ + ": " + count_text + ", but checkpoint '" + weights_name_ + "' holds " + std::to_string(in_file) +
                      " layers ('" + std::string(prefix) + std::to_string(in_file - 1) + ".*'); layers " + std::to_string(n_layers) +
                      " and above are ignored, as transformers ignores them");
            for (const auto& t : weights_.names())
                if (const auto i = detail::layer_index(t, prefix); i && *i >= n_layers) used_.insert(t);
        }
    }

    /// Gives warning `msg` through hymix::warn, once per reader and `topic` (e.g. the config key concerned).
    void warn_once(const std::string& topic, const std::string& msg) {
        if (warned_.insert(topic).second) warn(msg);
    }

    /// A SwiGLU MLP stored as `<prefix>mlp.{gate,up,down}_proj.weight` ([d_ff, d], [d_ff, d], [d, d_ff]; the
    /// Qwen / Llama naming).
    swiglu_weights take_swiglu(const std::string& prefix, expected_dim d_ff, expected_dim d) {
        swiglu_weights mlp;
        mlp.gate_proj = take(prefix + "mlp.gate_proj.weight", {d_ff, d});
        mlp.up_proj = take(prefix + "mlp.up_proj.weight", {d_ff, d});
        mlp.down_proj = take(prefix + "mlp.down_proj.weight", {d, d_ff});
        return mlp;
    }

    /// A depthwise conv weight stored [C, 1, K], returned as [C, K].
    tensor<float> take_conv(const std::string& name, expected_dim channels, expected_dim width) {
        auto t = take(name, {channels, 1, width});
        t.reshape({channels.n, width.n});
        return t;
    }

    /// Marks `name` as used without loading it (e.g. an lm_head duplicated from tied embeddings).
    void skip(const std::string& name) { used_.insert(name); }

    /// Throws format_error naming the first checkpoint tensor that was never taken (an extra tensor), except
    /// names for which `ignore(name)` is true.
    void finish(const std::function<bool(const std::string&)>& ignore = {}) const {
        for (const auto& n : weights_.names())
            if (!used_.count(n) && !(ignore && ignore(n)))
                throw format_error("checkpoint '" + weights_name_ + "': unexpected tensor '" + n + "' with shape " +
                                   shape_string(weights_.info(n).shape) + " (not part of the model)");
    }

    /// Number of parameters taken so far.
    std::int64_t n_params() const noexcept { return n_params_; }

private:
    std::filesystem::path dir_;
    std::string config_path_;
    io::json config_;
    safetensors::sharded_file weights_;
    std::string weights_name_;
    std::set<std::string> used_;
    std::set<std::string> warned_;
    std::int64_t n_params_ = 0;
};

/// `architectures[0]` of a config, or `fallback`.
inline std::string config_architecture(const io::json& cfg, const std::string& fallback) {
    if (cfg.is_object() && cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
        cfg["architectures"][0].is_string())
        return cfg["architectures"][0].get<std::string>();
    return fallback;
}

}  // namespace hymix::models
