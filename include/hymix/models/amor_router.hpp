// The router file of an AMOR model (spec.md §5.6): one fitted entropy router per AMOR block, kept beside the AMOR
// file it was fitted for. Safetensors with `amor_blocks.{i}.router.{fc1.weight [hidden, d], fc1.bias [hidden],
// fc2.weight [1, hidden], fc2.bias [1], skip.weight [d]}`, metadata `format` = "hymix-amor-router" and `config`
// (JSON: n_amor_blocks, d_model, hidden, plus whatever the fitting recorded). `attach_entropy_routers` sets them on
// a loaded stack's entropy_ema gates, in block order; the gates then fire on Ĥ > τ at inference.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/gate/entropy_ema.hpp"
#include "hymix/gate/entropy_router.hpp"
#include "hymix/io/json.hpp"
#include "hymix/io/safetensors_reader.hpp"
#include "hymix/io/safetensors_writer.hpp"

namespace hymix::models {

/// Calls f(gate) for every entropy_ema gate of stack m, in layer order.
template <class S, class F>
void for_each_entropy_gate(S& m, F&& f) {
    for (std::int64_t l = 0; l < m.n_layers(); ++l)
        std::visit([&](auto& blk) {
            if constexpr (requires { blk.gate(); }) {
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(blk.gate())>, entropy_ema>) f(blk.gate());
            }
        }, m.layer_at(l));
}

/// Writes `routers` (block i's router at index i; all of one d and hidden) to `path`, atomically; `info` is merged
/// into the config entry (e.g. the fit's errors, `vocab_size` of the head the routers stand in for, and the AMOR file
/// they were fitted for). Throws value_error for an empty list, a null entry or routers of different sizes, io_error
/// when the file cannot be written.
inline void save_entropy_routers(const std::vector<std::shared_ptr<const entropy_router>>& routers, const std::filesystem::path& path,
                                 nlohmann::json info = nlohmann::json::object()) {
    if (routers.empty()) throw value_error("save_entropy_routers: no routers to write");
    for (std::size_t i = 0; i < routers.size(); ++i)
        if (!routers[i]) throw value_error("save_entropy_routers: router " + std::to_string(i) + " is null (a file holds one router per block)");
    const std::int64_t d = routers.front()->d_model(), hid = routers.front()->hidden();
    safetensors::writer w;
    for (std::size_t i = 0; i < routers.size(); ++i) {
        const auto& r = *routers[i];
        if (r.d_model() != d || r.hidden() != hid)
            throw value_error("save_entropy_routers: router " + std::to_string(i) + " is [" + std::to_string(r.hidden()) + ", " +
                              std::to_string(r.d_model()) + "], router 0 is [" + std::to_string(hid) + ", " + std::to_string(d) + "]");
        const std::string p = "amor_blocks." + std::to_string(i) + ".router.";
        w.add(p + "fc1.weight", r.weights().fc1_weight);
        w.add(p + "fc1.bias", r.weights().fc1_bias);
        w.add(p + "fc2.weight", r.weights().fc2_weight);
        w.add(p + "fc2.bias", r.weights().fc2_bias);
        w.add(p + "skip.weight", r.weights().skip_weight);
    }
    info["n_amor_blocks"] = routers.size();
    info["d_model"] = d;
    info["hidden"] = hid;
    w.set_metadata("config", info.dump());
    w.set_metadata("format", "hymix-amor-router");
    w.write(path);
}

/// A router file's contents: one router per block and the file's config entry.
struct router_file {
    std::vector<std::shared_ptr<const entropy_router>> routers;
    nlohmann::json config;
    /// The vocabulary of the head the routers stand in for (0 when the file does not say).
    std::int64_t vocab_size() const { return config.value("vocab_size", std::int64_t{0}); }
};

/// Reads a router file. Throws io_error / format_error (not a router file, a missing tensor), shape_error (a tensor
/// of the wrong shape, naming file, tensor, expected and found), nonfinite_error (a NaN / Inf weight).
inline router_file read_entropy_routers(const std::filesystem::path& path) {
    const safetensors::file f(path);
    const auto fmt = f.metadata().find("format");
    const auto cfg = f.metadata().find("config");
    if (fmt == f.metadata().end() || fmt->second != "hymix-amor-router" || cfg == f.metadata().end())
        throw format_error(path.string() + ": not an AMOR router file (metadata 'format' is not 'hymix-amor-router' or 'config' is missing)");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(cfg->second);
    } catch (const nlohmann::json::exception& e) {
        throw format_error(path.string() + ": the 'config' metadata entry is not JSON: " + e.what());
    }
    const io::config_keys k(j, path.string() + " (config)");
    const std::int64_t n = k.positive("n_amor_blocks"), d = k.positive("d_model"), hid = k.positive("hidden");
    std::vector<std::shared_ptr<const entropy_router>> out;
    for (std::int64_t i = 0; i < n; ++i) {
        const std::string p = "amor_blocks." + std::to_string(i) + ".router.";
        auto take = [&](const std::string& name, std::vector<std::int64_t> shape) {
            if (!f.contains(p + name))
                throw format_error(path.string() + ": missing tensor '" + p + name + "' (expected shape " + shape_string(shape) + ")");
            auto t = f.to_f32(p + name);
            if (t.shape() != shape)
                throw shape_error(path.string() + ": tensor '" + p + name + "' has shape " + shape_string(t.shape()) + ", expected " + shape_string(shape));
            return t;
        };
        entropy_router_weights w{take("fc1.weight", {hid, d}), take("fc1.bias", {hid}), take("fc2.weight", {1, hid}), take("fc2.bias", {1}),
                                 take("skip.weight", {d})};
        try {
            out.push_back(std::make_shared<const entropy_router>(std::move(w)));
        } catch (const nonfinite_error& e) {
            throw nonfinite_error(path.string() + ": block " + std::to_string(i) + ": " + e.what());
        }
    }
    return {std::move(out), std::move(j)};
}
/// The routers of a router file (read_entropy_routers without the config).
inline std::vector<std::shared_ptr<const entropy_router>> load_entropy_routers(const std::filesystem::path& path) {
    return read_entropy_routers(path).routers;
}

/// Sets routers[i] on the i-th entropy_ema gate of m (null entries: that gate keeps the exact entropy). Throws
/// config_error when the counts or d_model differ, when the routers were fitted for a head of another vocabulary
/// (`vocab_size` > 0 and not the model's), or when a gate is always on (it computes no entropy for a router to stand
/// in for); nothing is changed then.
template <class S>
void attach_entropy_routers(S& m, const std::vector<std::shared_ptr<const entropy_router>>& routers, const std::string& origin = "routers",
                            std::int64_t vocab_size = 0) {
    if (vocab_size > 0 && vocab_size != m.config().vocab_size)
        throw config_error(origin + ": routers fitted for a head of vocabulary " + std::to_string(vocab_size) + ", the model's has " +
                           std::to_string(m.config().vocab_size));
    std::int64_t gates = 0;
    bool always = false;
    for_each_entropy_gate(m, [&](entropy_ema& g) { ++gates, always = always || g.config().always_on; });
    if (always && !routers.empty())
        throw config_error(origin + ": the model's gates are always on (every token attends): there is no entropy for a router to estimate");
    if (gates != static_cast<std::int64_t>(routers.size()))
        throw config_error(origin + ": " + std::to_string(routers.size()) + " router(s) for a model with " + std::to_string(gates) + " entropy gate(s)");
    for (const auto& r : routers)
        if (r && r->d_model() != m.config().d_model)
            throw config_error(origin + ": routers for d_model " + std::to_string(r->d_model()) + ", the model has d_model " +
                               std::to_string(m.config().d_model));
    std::size_t i = 0;
    for_each_entropy_gate(m, [&](entropy_ema& g) { g.set_router(routers[i++]); });
}

}  // namespace hymix::models
