// Reading a Hugging Face model directory for the model facades: config.json (with the Infinity/NaN spellings of
// spec.md §3.8) and the weights (model.safetensors or a sharded index), converted to fp32 tensors one name at a
// time with shape checks; every tensor of the checkpoint must be used exactly once (missing / extra → error).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/io/json.hpp"
#include "hymix/io/safetensors.hpp"

namespace hymix::models {

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

    /// The fp32 copy of tensor `name`, whose shape must equal `shape` (-1 matches any size). Throws format_error
    /// when the tensor is missing, shape_error on a shape mismatch, dtype_error for a non-float dtype; each names
    /// the tensor, the expected and found shape, and the file.
    tensor<float> take(const std::string& name, const std::vector<std::int64_t>& shape) {
        if (!weights_.contains(name))
            throw format_error("checkpoint '" + weights_name_ + "': missing tensor '" + name + "' (expected shape " +
                               shape_string(shape) + ")");
        const auto& info = weights_.info(name);
        bool ok = info.shape.size() == shape.size();
        for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || shape[i] == info.shape[i];
        if (!ok)
            throw shape_error("checkpoint '" + weights_name_ + "': tensor '" + name + "': expected shape " + shape_string(shape) +
                              ", found " + shape_string(info.shape));
        if (info.type != dtype::f32 && info.type != dtype::bf16 && info.type != dtype::f16 && info.type != dtype::f64)
            throw dtype_error("checkpoint '" + weights_name_ + "': tensor '" + name + "' has dtype " +
                              std::string(dtype_name(info.type)) + ", expected F32, BF16, F16 or F64");
        if (!used_.insert(name).second)
            throw format_error("checkpoint '" + weights_name_ + "': tensor '" + name + "' used twice");
        n_params_ += info.numel();
        return weights_.to_f32(name);
    }

    /// A depthwise conv weight stored [C, 1, K], returned as [C, K].
    tensor<float> take_conv(const std::string& name, std::int64_t channels, std::int64_t width) {
        auto t = take(name, {channels, 1, width});
        t.reshape({channels, width});
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
