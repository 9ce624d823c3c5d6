// Whole-model throughput on the shared checkpoints (../shared/models): prefill and decode tokens/s at batch 1 and 8,
// and decode cost per token against context length (flat for recurrent stacks, growing linearly with the
// attention layers' KV cache for the hybrid). FLOPs count 2 per weight per token (projections only; in prefill
// the LM head's only for the last position, whose logits forward_last returns; an untied embedding is a lookup, no
// FLOPs) plus, for attention layers, 4·H·d_h per cached token (H and d_h from config.json); bytes count the fp32
// weights read once per call, less an untied embedding (a step reads only its B rows).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/models/auto_model.hpp"
#include "peak.hpp"

namespace {

std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("HYMIX_SHARED")) return env;
    return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "shared";  // <repo>/../shared
}

/// A loaded checkpoint and what its counts need beyond model_info (the attention layers' sizes, read from its
/// config.json: HF keys).
struct loaded_model {
    hymix::auto_model m;
    double lookup_params = 0;  // the embedding's V·d when it is not the LM head (model_info::tie_embeddings false), else 0
    double attn_flops = 0;     // attention FLOPs per new token per cached token: 4 · n_attention_layers · num_attention_heads · head_dim
    /// Parameters that cost 2 FLOPs per token and whose bytes a call reads: all but a lookup-only embedding.
    double dense_params() const noexcept { return double(m.info().n_params) - lookup_params; }
};

/// Loaded once per process; null when the checkpoint is absent.
const loaded_model* get_model(const std::string& name) {
    static std::map<std::string, std::unique_ptr<loaded_model>> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second.get();
    const auto dir = shared_dir() / "models" / name;
    std::unique_ptr<loaded_model> m;
    if (std::filesystem::exists(dir / "config.json")) {
        m = std::make_unique<loaded_model>(loaded_model{hymix::auto_model::load(dir)});
        std::ifstream f(dir / "config.json");
        const auto j = nlohmann::json::parse(f);
        const auto& info = m->m.info();
        if (!info.tie_embeddings) m->lookup_params = double(info.vocab_size) * double(info.d_model);
        // QKᵀ and PV, a multiply-add counted as 2: 4 · H · d_h per cached token and attention layer.
        if (const auto n_attn = std::count(info.layer_kinds.begin(), info.layer_kinds.end(), "attention"); n_attn > 0)
            m->attn_flops = 4.0 * double(n_attn) * j.at("num_attention_heads").get<double>() * j.at("head_dim").get<double>();
    }
    return (cache[name] = std::move(m)).get();
}

std::vector<std::int32_t> random_bytes(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 g(seed);
    std::uniform_int_distribution<int> d(32, 126);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

void prefill(benchmark::State& st, std::string name, std::int64_t batch) {
    const auto* lm = get_model(name);
    if (!lm) {
        st.SkipWithError("checkpoint not found: set HYMIX_SHARED to the shared/ directory");
        return;
    }
    const hymix::auto_model* m = &lm->m;
    constexpr std::int64_t T = 512;
    const auto V = m->info().vocab_size;
    auto c = m->make_cache(batch);
    const auto toks = random_bytes(static_cast<std::size_t>(batch * T), 1);
    std::vector<float> logits(static_cast<std::size_t>(batch * V));
    const auto b = hymix::seq_batch::dense(batch, T);
    for (auto _ : st) {
        for (std::int64_t s = 0; s < batch; ++s) m->reset_slot(c, s);
        m->forward_last(c, b, toks, hymix::tensor_view<float, 2>(logits.data(), {batch, V}));
        benchmark::DoNotOptimize(logits.data());
    }
    const double tokens = double(batch * T);
    // forward_last runs the LM head [V, d] for each sequence's last position only.
    const double head = double(V) * double(m->info().d_model);
    const double flops = tokens * 2.0 * lm->dense_params() - (tokens - double(batch)) * 2.0 * head +
                         batch * lm->attn_flops * (T / 2.0) * T;
    hymix::bench::report(st, tokens, flops, 4.0 * lm->dense_params(), m->backend().num_threads());
}

void decode(benchmark::State& st, std::string name, std::int64_t batch, std::int64_t context) {
    const auto* lm = get_model(name);
    if (!lm) {
        st.SkipWithError("checkpoint not found: set HYMIX_SHARED to the shared/ directory");
        return;
    }
    const hymix::auto_model* m = &lm->m;
    const auto V = m->info().vocab_size;
    auto c = m->make_cache(batch);
    // Prefill `context` tokens per slot in chunks of 2048 (chunking never changes results, only peak memory).
    const auto ctx = random_bytes(static_cast<std::size_t>(context), 2);
    std::vector<float> last(static_cast<std::size_t>(batch * V));
    for (std::int64_t s = 0; s < batch; ++s)
        for (std::int64_t p = 0; p < context; p += 2048) {
            const std::int64_t len = std::min<std::int64_t>(2048, context - p);
            hymix::seq_batch b;
            b.add(0, len, s);
            b.n_rows = len;
            m->forward_last(c, b, std::span(ctx).subspan(static_cast<std::size_t>(p), static_cast<std::size_t>(len)),
                            hymix::tensor_view<float, 2>(last.data(), {1, V}));
        }
    std::vector<std::int64_t> slots(static_cast<std::size_t>(batch));
    for (std::int64_t s = 0; s < batch; ++s) slots[static_cast<std::size_t>(s)] = s;
    const auto step = hymix::seq_batch::decode(slots);
    std::vector<std::int32_t> toks(static_cast<std::size_t>(batch), 101);
    // One untimed step: a KV cache filled to a power of two grows (once) on the next token.
    m->forward(c, step, toks, hymix::tensor_view<float, 2>(last.data(), {batch, V}));
    std::int64_t steps = 0;
    for (auto _ : st) {
        m->forward(c, step, toks, hymix::tensor_view<float, 2>(last.data(), {batch, V}));
        benchmark::DoNotOptimize(last.data());
        ++steps;
    }
    st.counters["context"] = double(context);
    st.counters["s/token"] = benchmark::Counter(double(batch) * double(steps), benchmark::Counter::kIsRate |
                                                                                     benchmark::Counter::kInvert);
    const double flops = double(batch) * (2.0 * lm->dense_params() + lm->attn_flops * double(context));
    hymix::bench::report(st, double(batch), flops, 4.0 * lm->dense_params(), m->backend().num_threads());
}

const bool registered = [] {
    for (const char* name : {"kjv-mamba2-byte", "kjv-gdn-byte", "kjv-hybrid-byte"}) {
        for (std::int64_t b : {1, 8}) {
            benchmark::RegisterBenchmark(("prefill/" + std::string(name) + "/batch:" + std::to_string(b) + "/T:512").c_str(),
                                         prefill, std::string(name), b)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
            benchmark::RegisterBenchmark(("decode/" + std::string(name) + "/batch:" + std::to_string(b) + "/context:64").c_str(),
                                         decode, std::string(name), b, std::int64_t{64})
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
        }
    }
    // Decode cost per token against context length, batch 1.
    for (std::int64_t ctx : {1024, 4096, 16384, 32768})
        benchmark::RegisterBenchmark(("decode_vs_context/kjv-hybrid-byte/context:" + std::to_string(ctx)).c_str(), decode,
                                     std::string("kjv-hybrid-byte"), std::int64_t{1}, ctx)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
    for (const char* name : {"kjv-mamba2-byte", "kjv-gdn-byte"})
        for (std::int64_t ctx : {1024, 32768})
            benchmark::RegisterBenchmark(("decode_vs_context/" + std::string(name) + "/context:" + std::to_string(ctx)).c_str(),
                                         decode, std::string(name), std::int64_t{1}, ctx)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
    return true;
}();

}  // namespace
