// Model loading for the `hymix` tool (the one file that instantiates every compiled stack through
// auto_model::load, for the CPU and the reference backend): refuses non-finite weights unless --allow-nonfinite, then prints load time and the system line.
#include <optional>
#include <string>

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/version.h>

#include "hymix/models/check_weights.hpp"
#include "load.hpp"

namespace tool {

namespace {
template <class Model>
basic_loaded_model<Model> load_on(const common_options& o) {
    const auto dir = resolve_model_dir(o.model);
    std::optional<hymix::any_mode_schedule> modes;  // parsed first: a mistyped --schedule fails before a long load
    if (!o.modes.empty()) {
        try {
            modes = hymix::parse_mode_schedule(o.modes);
        } catch (const hymix::config_error& e) {
            throw usage_error(std::string("--schedule: ") + e.what());
        }
    }
    if (!o.router.empty() && o.amor.empty()) throw usage_error("--router needs the AMOR blocks it was fitted for (--amor FILE)");
    const auto t0 = clock_type::now();
    using hymix::nonfinite_weights;
    const auto nonfinite = o.allow_nonfinite ? nonfinite_weights::allow : nonfinite_weights::refuse;
    if (o.allow_nonfinite) warn_nonfinite_weights(dir, o.amor);
    auto cfg = hymix::io::read_json_file(dir / "config.json");
    auto load = [&] {
        try {
            return o.amor.empty() ? Model::load(dir, o.threads, nonfinite) : Model::load(dir, o.amor, o.threads, nonfinite);
        } catch (const hymix::nonfinite_error& e) {
            throw hymix::nonfinite_error(std::string(e.what()) + "; pass --allow-nonfinite to load it anyway");
        }
    };
    basic_loaded_model<Model> m{dir, std::move(cfg), load()};
    if (modes) {
        if (!m.model.info().per_token_modes)
            throw usage_error("--schedule: " + dir.string() + " is a " + m.model.info().architecture +
                              " model, which has no per-token read-out modes (schedules choose the read-out of Oryx models)");
        m.model.set_mode_schedule(*modes);
    }
    if (!o.router.empty()) m.model.use_entropy_routers(o.router);
    if (o.weights != "f32") m.model.store_weights_as(hymix::parse_weight_dtype(o.weights));
    if (o.kv_cache != "f32") m.model.set_kv_dtype(hymix::parse_weight_dtype(o.kv_cache));
    const double load_s = seconds_since(t0);
    const auto& i = m.model.info();
    const auto& be = m.model.backend();
    console::note("load: {} ({}, {} parameters, {} layers {}; {} projection weights, {:.1f} MB{}) in {:.2f} s", dir.string(),
                  i.architecture, i.n_params, i.n_layers, i.schedule, o.weights, static_cast<double>(m.model.weight_bytes()) / 1e6,
                  o.kv_cache == "f32" ? std::string() : fmt::format("; {} KV cache", o.kv_cache), load_s);
    if (!o.modes.empty()) console::note("modes: {} (per-token read-out schedule)", o.modes);
    if (!o.router.empty()) console::note("gates: fitted entropy routers from {} (spec.md §5.6)", o.router);
    console::note("system: backend {} | {} of {} threads | SIMD {} ({} fp32 lanes) | oneTBB {} | hymix {}", be.name, be.num_threads(),
                  tbb::info::default_concurrency(), be.arch_name(), be.simd_width(), TBB_VERSION_STRING, HYMIX_TOOL_VERSION);
    return m;
}
}  // namespace

void warn_nonfinite_weights(const std::filesystem::path& dir, const std::string& amor) {
    for (const auto& bad : hymix::models::find_nonfinite_weights(hymix::safetensors::open_checkpoint(dir)))
        console::note("hymix: warning: {} (loaded anyway: --allow-nonfinite)", bad.describe());
    if (!amor.empty())
        for (const auto& bad : hymix::models::find_nonfinite_weights(hymix::safetensors::file(amor)))
            console::note("hymix: warning: {} (loaded anyway: --allow-nonfinite)", bad.describe());
}

amor_inputs open_amor_inputs(const common_options& c) {
    auto dir = resolve_model_dir(c.model);
    hymix::models::checkpoint_reader rd(dir);
    auto mt = rd.config().value("model_type", "");
    hymix::models::amor_backbone_kind(rd.config(), rd.config_path());  // not a hybrid
    auto trained = hymix::models::read_amor_config(c.amor);
    hymix::models::require_amor_backbone(trained, mt, c.amor, rd.config_path());
    const std::string hint = "; pass --allow-nonfinite to load it anyway";
    if (c.allow_nonfinite) {
        warn_nonfinite_weights(dir, c.amor);
    } else {
        hymix::models::require_finite_weights(rd.weights(), hint);
        hymix::models::require_finite_weights(hymix::safetensors::file(c.amor), hint);
    }
    return {std::move(dir), std::move(rd), std::move(mt), std::move(trained)};
}

basic_loaded_model<hymix::auto_model> load_cpu_model(const common_options& o) { return load_on<hymix::auto_model>(o); }
basic_loaded_model<hymix::reference_auto_model> load_reference_model(const common_options& o) {
    return load_on<hymix::reference_auto_model>(o);
}

}  // namespace tool
