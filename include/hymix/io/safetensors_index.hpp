// Sharded safetensors checkpoints: `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor name:
// shard file name}}, the Hugging Face layout), every shard opened and every entry checked against its shard, and
// the opening of a model directory's weights (the index, else model.safetensors).
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/io/json.hpp"
#include "hymix/io/safetensors_reader.hpp"

namespace hymix::safetensors {

/// A checkpoint split over several safetensors files, described by `model.safetensors.index.json`
/// ({"metadata": {...}, "weight_map": {tensor name: shard file name}}), or a single file seen the same way.
/// Every shard is opened (mapped) at construction and every weight_map entry is checked against its shard.
class sharded_file {
public:
    /// Opens the index and all the shards it names (relative to the index's directory).
    /// Throws io_error for a missing index or shard (naming both), format_error for a malformed index,
    /// a shard name that leaves the directory, or a weight_map entry absent from its shard.
    explicit sharded_file(const std::filesystem::path& index_path) : origin_(index_path.string()) {
        const std::string& origin = origin_;
        const auto j = io::read_json_file(index_path);
        if (!j.is_object())
            throw format_error(origin + ": index must be a JSON object, found " + io::detail::json_kind(j));
        const auto wm = j.find("weight_map");
        if (wm == j.end()) throw format_error(origin + ": index has no 'weight_map'");
        if (!wm->is_object())
            throw format_error(origin + ": 'weight_map' must be an object, found " + io::detail::json_kind(*wm));
        if (const auto md = j.find("metadata"); md != j.end()) index_metadata_ = *md;
        const auto dir = index_path.parent_path();
        std::map<std::string, std::size_t> shard_ids;
        for (const auto& [tensor_name, shard] : wm->items()) {
            if (!shard.is_string())
                throw format_error(origin + ": weight_map entry for '" + tensor_name + "' must be a file name, found " +
                                   detail::short_dump(shard));
            const auto& s = shard.get_ref<const std::string&>();
            const std::filesystem::path sp(s);
            if (s.empty() || sp.is_absolute() || std::any_of(sp.begin(), sp.end(), [](const auto& c) { return c.string() == ".."; }))
                throw format_error(origin + ": weight_map entry for '" + tensor_name + "' names shard '" + s +
                                   "', expected a file name relative to the index's directory");
            auto [it, inserted] = shard_ids.emplace(s, shards_.size());
            if (inserted) {
                try {
                    shards_.emplace_back(dir / sp);
                } catch (const io_error& e) {
                    throw io_error(origin + ": cannot open shard '" + s + "' (needed for '" + tensor_name +
                                   "'): " + e.what());
                }
            }
            const auto& f = shards_[it->second];
            if (!f.contains(tensor_name))
                throw format_error(origin + ": weight_map places '" + tensor_name + "' in shard '" + s +
                                   "', but that file has no such tensor");
            where_.emplace(tensor_name, it->second);
            names_.push_back(tensor_name);
        }
    }

    /// One file seen as a single-shard checkpoint.
    explicit sharded_file(file single) : origin_(single.origin()) {
        for (const auto& t : single.tensors()) {
            where_.emplace(t.name, 0);
            names_.push_back(t.name);
        }
        shards_.push_back(std::move(single));
    }

    /// Tensor names (from the index, sorted; for a single file, in file order).
    const std::vector<std::string>& names() const noexcept { return names_; }
    bool contains(std::string_view name) const { return where_.find(std::string(name)) != where_.end(); }
    const std::vector<file>& shards() const noexcept { return shards_; }
    /// The index path (or the single file's path).
    const std::string& origin() const noexcept { return origin_; }
    /// The index's "metadata" object (null when absent or for a single file).
    const nlohmann::json& index_metadata() const noexcept { return index_metadata_; }

    /// The shard holding `name`. Throws format_error naming the tensor when no shard holds it.
    const file& shard_of(std::string_view name) const {
        const auto it = where_.find(std::string(name));
        if (it == where_.end())
            throw format_error(origin_ + ": no tensor named '" + std::string(name) + "' in the checkpoint (" +
                               std::to_string(where_.size()) + " tensors in " + std::to_string(shards_.size()) +
                               " shard file(s))");
        return shards_[it->second];
    }
    const tensor_info& info(std::string_view name) const { return shard_of(name).info(name); }
    tensor<float> to_f32(std::string_view name) const { return shard_of(name).to_f32(name); }
    template <class T>
    tensor<T> to_tensor(std::string_view name) const {
        return shard_of(name).template to_tensor<T>(name);
    }
    template <class T, std::size_t R>
    tensor_view<const T, R> view(std::string_view name) const {
        return shard_of(name).template view<T, R>(name);
    }

private:
    std::string origin_;  // the index (or the single file)
    std::vector<file> shards_;
    std::unordered_map<std::string, std::size_t> where_;
    std::vector<std::string> names_;
    nlohmann::json index_metadata_;
};

/// Opens the weights of a Hugging Face model directory: `model.safetensors.index.json` when present,
/// else `model.safetensors`. Throws io_error naming the directory when neither exists.
inline sharded_file open_checkpoint(const std::filesystem::path& dir) {
    const auto index = dir / "model.safetensors.index.json";
    if (std::filesystem::exists(index)) return sharded_file(index);
    const auto single = dir / "model.safetensors";
    if (std::filesystem::exists(single)) return sharded_file(file(single));
    throw io_error("no model.safetensors or model.safetensors.index.json in '" + dir.string() + "'");
}

}  // namespace hymix::safetensors
