// Whole models at real size from a config.json, with random weights (random_stack: each mixer's own initialisation):
// prefill of 512 tokens, decode at batch 1 and 8 after a 512-token prompt, with the projection weights stored as
// f32, bf16, f16 or i8 with per-row scales (model::store_weights_as). This is the model-level table to set beside
// llama-bench.
//
// Configs: bench/configs/*.json (HF layouts: model_type mamba2 or qwen3_5_text / qwen3_5), or the files listed in
// HYMIX_BENCH_CONFIGS (comma-separated paths; point it at a downloaded checkpoint's config.json). The two shipped
// files carry the sizes of state-spaces/mamba2-780m (HF layout) and Qwen/Qwen3.5-0.8B's text model, typed in by hand
// without network access: compare them with the Hub's files before quoting a result as that model's. Threads: HYMIX_BENCH_THREADS (default: every core). Counted work: 2
// FLOPs per weight of the layers and final norm per token, 2 per LM head weight per token whose logits are computed
// (every token in decode; only the last in prefill, which returns the last position's logits), plus attention's
// 4·H·d_h per cached token; an untied embedding is a lookup (no FLOPs). Bytes: every parameter as stored, read once
// per call (decode is bound by them), less an untied embedding (a decode step reads B of its rows).
// A model is built once per (config, dtype) and kept while its benchmarks run; building 0.8B parameters takes
// seconds and 3.2 GB (f32).
//
// HYMIX_OP_PROFILE=DIR: after timing, each benchmark runs a few more calls with an op profile set on its backend
// (backend/op_profile.hpp) and writes DIR/<benchmark name>.csv: time per call of each op and argument shapes, its
// fraction of the calls' wall time, and the time outside ops; the op totals are also printed to stderr.
// HYMIX_FLUSH_SUBNORMALS=0: the backend keeps IEEE subnormal numbers instead of flushing them to zero (the default;
// backend/float_env.hpp), to measure what they cost.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "hymix/backend/op_profile.hpp"
#include "hymix/io/json.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"
#include "hymix/stack/random_stack.hpp"
#include "peak.hpp"

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> config_files() {
    std::vector<fs::path> out;
    if (const char* env = std::getenv("HYMIX_BENCH_CONFIGS")) {
        std::stringstream ss(env);
        std::string item;
        while (std::getline(ss, item, ','))
            if (!item.empty()) out.emplace_back(item);
        return out;
    }
    const auto dir = fs::path(__FILE__).parent_path() / "configs";
    if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".json") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

using any_model = std::variant<hymix::models::hf_mamba2_stack, hymix::models::qwen3_5_hybrid_stack>;

/// The stack of `config` with random weights (seed 0), stored as `d`.
any_model build(const fs::path& config, hymix::dtype d) {
    const auto j = hymix::io::read_json_file(config);
    const auto origin = config.string();
    const auto mt = j.value("model_type", std::string());
    auto make = [&]() -> any_model {
        if (mt == "mamba2") {
            const auto c = hymix::models::read_hf_mamba2_config(j, origin);
            return hymix::random_stack<hymix::models::hf_mamba2_stack>(c.stack, {.n_layers = c.n_layers}, {c.mixer}, 0);
        }
        const auto c = hymix::models::read_hf_qwen3_5_config(j, origin);
        return hymix::random_stack<hymix::models::qwen3_5_hybrid_stack>(c.stack, {.n_layers = c.n_layers, .d_ff = c.d_ff, .kinds = c.kinds},
                                                                        {c.gdn, c.attn}, 0);
    };
    any_model m = make();
    std::visit([&](auto& s) { s.store_weights_as(d); }, m);
    return m;
}

/// One model alive at a time: (config, dtype) → model.
template <class F>
void with_model(const fs::path& config, hymix::dtype d, F&& f) {
    static std::string key;
    static std::unique_ptr<any_model> model;
    const std::string k = config.string() + "/" + hymix::weight_dtype_name(d);
    if (k != key) {
        model.reset();
        model = std::make_unique<any_model>(build(config, d));
        key = k;
    }
    std::visit(f, *model);
}

struct model_counts {
    // body: parameters of the layers and the final norm; head: the LM head's (the embedding when tied);
    // attn_width: H·d_h of an attention layer
    double body = 0, head = 0, bytes = 0, attn_layers = 0, attn_width = 0;
};

template <class Stack>
model_counts counts(Stack& m) {
    model_counts c;
    const bool tied = m.config().tie_embeddings;
    m.for_each_param([&](const std::string& name, const auto& t) {
        const double n = static_cast<double>(t.numel());
        const bool lookup_only = name == "embedding" && !tied;
        if (name == "lm_head" || (name == "embedding" && tied))
            c.head += n;
        else if (!lookup_only)
            c.body += n;
        if (lookup_only) return;
        if constexpr (hymix::is_linear_weight_v<decltype(t)>)
            c.bytes += static_cast<double>(t.stored_bytes());
        else
            c.bytes += 4.0 * n;
    });
    for (std::int64_t l = 0; l < m.n_layers(); ++l)
        std::visit([&](const auto& blk) {
            using M = std::remove_cvref_t<decltype(blk.mixer())>;
            if constexpr (std::is_same_v<M, hymix::attention>) {
                c.attn_layers += 1;
                c.attn_width = static_cast<double>(blk.mixer().config().n_heads * blk.mixer().config().head_dim);
            }
        }, m.layer_at(l));
    return c;
}

std::vector<std::int32_t> random_tokens(std::size_t n, std::int64_t V, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<std::int64_t> d(0, V - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = static_cast<std::int32_t>(d(g));
    return v;
}

int threads() { return hymix::bench::first_thread_count(0); }

/// The backend every benchmark runs on: threads(), subnormals flushed (the default) unless HYMIX_FLUSH_SUBNORMALS=0.
std::unique_ptr<hymix::cpu_backend> make_backend() {
    auto be = std::make_unique<hymix::cpu_backend>(threads());
    const char* env = std::getenv("HYMIX_FLUSH_SUBNORMALS");
    be->set_flush_subnormals(!(env && std::string(env) == "0"));
    return be;
}

/// With HYMIX_OP_PROFILE set: runs `call` `reps` times with an op profile on `be` and writes the profile of one call
/// (seconds divided by reps) to $HYMIX_OP_PROFILE/<name with '/' as '_'>.csv. A no-op otherwise.
template <class F>
void profile_ops(hymix::cpu_backend& be, const std::string& name, int reps, F&& call) {
    const char* dir = std::getenv("HYMIX_OP_PROFILE");
    if (dir == nullptr || *dir == 0) return;
    static std::set<std::string> done;  // Google Benchmark calls a benchmark more than once: profile it once
    if (!done.insert(name).second) return;
    hymix::op_profile prof;
    be.set_op_profile(&prof);
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) call();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    be.set_op_profile(nullptr);
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '_');
    std::replace(file.begin(), file.end(), ':', '-');
    fs::create_directories(dir);
    std::ofstream os(fs::path(dir) / (file + ".csv"));
    if (!os) {
        std::cerr << name << ": cannot write " << (fs::path(dir) / (file + ".csv")).string() << '\n';
        return;
    }
    os << "op,shapes,calls_per_call,ms_per_call,fraction_of_wall\n";
    double inside = 0;
    for (const auto& e : prof.entries()) {
        const double ms = 1e3 * e.seconds / reps;
        inside += ms;
        os << e.op << ",\"" << e.shapes << "\"," << double(e.calls) / reps << ',' << ms << ',' << ms / (1e3 * wall) << '\n';
    }
    os << "(outside ops),\"\",0," << 1e3 * wall - inside << ',' << 1.0 - inside / (1e3 * wall) << '\n';
    std::cerr << name << ": " << 1e3 * wall << " ms per call with the profile on, " << reps << " calls; by op:";
    for (const auto& e : prof.by_op()) std::cerr << ' ' << e.op << ' ' << 1e3 * e.seconds / reps << " ms;";
    std::cerr << '\n';
}

constexpr std::int64_t T = 512;

void prefill(benchmark::State& st, std::string name, fs::path config, hymix::dtype d) {
    with_model(config, d, [&](auto& m) {
        const auto be_owner = make_backend();
        hymix::cpu_backend& be = *be_owner;
        const auto V = m.config().vocab_size;
        const auto mc = counts(m);
        auto c = m.make_cache(1);
        const auto toks = random_tokens(T, V, 1);
        hymix::tensor<float> logits({1, V});
        const auto b = hymix::seq_batch::dense(1, T);
        for (auto _ : st) {
            c.reset_slot(0);
            m.forward_last(be, c, b, toks, logits.view<2>());
            benchmark::DoNotOptimize(logits.data());
        }
        profile_ops(be, name, 3, [&] {
            c.reset_slot(0);
            m.forward_last(be, c, b, toks, logits.view<2>());
        });
        // The head runs for the last position only (forward_last).
        const double flops = double(T) * 2.0 * mc.body + 2.0 * mc.head + mc.attn_layers * 4.0 * mc.attn_width * double(T) * double(T) / 2.0;
        hymix::bench::report(st, double(T), flops, mc.bytes, be.num_threads());
        st.counters["weight_MB"] = mc.bytes / 1e6;
    });
}

void decode(benchmark::State& st, std::string name, fs::path config, hymix::dtype d, std::int64_t batch) {
    with_model(config, d, [&](auto& m) {
        const auto be_owner = make_backend();
        hymix::cpu_backend& be = *be_owner;
        const auto V = m.config().vocab_size;
        const auto mc = counts(m);
        auto c = m.make_cache(batch);
        const auto prompt = random_tokens(static_cast<std::size_t>(batch * T), V, 2);
        hymix::tensor<float> last({batch, V});
        m.forward_last(be, c, hymix::seq_batch::dense(batch, T), prompt, last.view<2>());
        std::vector<std::int64_t> slots(static_cast<std::size_t>(batch));
        for (std::int64_t s = 0; s < batch; ++s) slots[static_cast<std::size_t>(s)] = s;
        const auto step = hymix::seq_batch::decode(slots);
        const std::vector<std::int32_t> toks(static_cast<std::size_t>(batch), 7);
        m.forward(be, c, step, toks, last.view<2>());  // untimed: a KV cache at a power of two grows once here
        for (auto _ : st) {
            m.forward(be, c, step, toks, last.view<2>());
            benchmark::DoNotOptimize(last.data());
        }
        profile_ops(be, name, 20, [&] { m.forward(be, c, step, toks, last.view<2>()); });
        const double flops = double(batch) * (2.0 * (mc.body + mc.head) + mc.attn_layers * 4.0 * mc.attn_width * double(T));
        hymix::bench::report(st, double(batch), flops, mc.bytes, be.num_threads());
        st.counters["weight_MB"] = mc.bytes / 1e6;
    });
}

const bool registered = [] {
    for (const auto& cfg : config_files()) {
        const std::string name = cfg.stem().string();
        for (hymix::dtype d : {hymix::dtype::f32, hymix::dtype::bf16, hymix::dtype::f16, hymix::dtype::i8}) {
            const std::string dn = hymix::weight_dtype_name(d);
            const std::string pn = "prefill/" + name + "/" + dn + "/T:512";
            benchmark::RegisterBenchmark(pn.c_str(), prefill, pn, cfg, d)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
            for (std::int64_t b : {1, 8}) {
                const std::string dn_name = "decode/" + name + "/" + dn + "/batch:" + std::to_string(b) + "/context:512";
                benchmark::RegisterBenchmark(dn_name.c_str(), decode, dn_name, cfg, d, b)
                    ->Unit(benchmark::kMillisecond)
                    ->UseRealTime();
            }
        }
    }
    return true;
}();

}  // namespace
