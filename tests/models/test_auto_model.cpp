// auto_model on the shared checkpoints (skipped when absent): model_info, a bits/byte smoke check on held-out KJV
// text, f16 and sharded checkpoints, and bad checkpoints (unsupported model_type, missing / extra / mis-shaped tensor).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "hymix/io/safetensors.hpp"
#include "hymix/models/auto_model.hpp"
#include "support/random.hpp"
#include "support/shared.hpp"

using namespace hymix;
using test::rel_error;

namespace {

std::filesystem::path model_dir(const char* name) { return test::shared_dir() / "models" / name; }

std::string read_text(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
}

void write_text(const std::filesystem::path& p, const std::string& s) {
    std::ofstream f(p, std::ios::binary);
    f << s;
}

/// A fresh scratch directory holding `src`'s config.json (optionally edited).
std::filesystem::path scratch_dir(const std::string& name, const std::filesystem::path& src, std::string config = {}) {
    const auto d = test::tmp_dir() / name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    write_text(d / "config.json", config.empty() ? read_text(src / "config.json") : config);
    return d;
}

std::string message_of(const std::filesystem::path& dir) {
    try {
        (void)auto_model::load(dir, 1);
    } catch (const error& e) {
        return e.what();
    }
    return "<no error>";
}

std::vector<float> logits_of(const auto_model& m, std::span<const std::int32_t> ids) {
    auto c = m.make_cache(1);
    const auto T = static_cast<std::int64_t>(ids.size()), V = m.info().vocab_size;
    std::vector<float> lg(static_cast<std::size_t>(T * V));
    m.forward(c, seq_batch::dense(1, T), ids, tensor_view<float, 2>(lg.data(), {T, V}));
    return lg;
}

std::vector<std::int32_t> reference_ids(const std::filesystem::path& dir) {
    safetensors::file f(dir / "reference.safetensors");
    const auto t = f.to_tensor<std::int64_t>("input_ids");
    return std::vector<std::int32_t>(t.data(), t.data() + t.numel());
}

}  // namespace

TEST_CASE("auto_model: model_info of the shared checkpoints") {
    HYMIX_REQUIRE_SHARED("models/kjv-hybrid-byte/config.json");
    const auto a = auto_model::load(model_dir("kjv-mamba2-byte"), 1);
    CHECK(a.info().architecture == "Mamba2ForCausalLM");
    CHECK(a.info().model_type == "mamba2");
    CHECK(a.info().n_params == 2723472);
    CHECK(a.info().n_layers == 6);
    CHECK(a.info().d_model == 256);
    CHECK(a.info().vocab_size == 256);
    CHECK(a.info().schedule == "MMMMMM");
    CHECK(a.info().layer_kinds == std::vector<std::string>(6, "mamba2"));
    CHECK(!a.info().tie_embeddings);  // the shared checkpoints keep a separate lm_head
    const auto g = auto_model::load(model_dir("kjv-gdn-byte"), 1);
    CHECK(g.info().n_params == 4490928);
    CHECK(g.info().schedule == "GGGGGG");
    const auto h = auto_model::load(model_dir("kjv-hybrid-byte"), 1);
    CHECK(h.info().architecture == "Qwen3_5ForCausalLM");
    CHECK(h.info().n_params == 4349728);
    CHECK(h.info().schedule == "GGAGGA");
    CHECK(h.info().layer_kinds[2] == "attention");
    CHECK(h.info().layer_kinds[0] == "gated_deltanet");
    // A cache belongs to the model that made it.
    auto ca = a.make_cache(1);
    std::vector<float> lg(256);
    const std::int32_t t = 5;
    CHECK_THROWS_AS(h.forward(ca, seq_batch::dense(1, 1), std::span(&t, 1), tensor_view<float, 2>(lg.data(), {1, 256})), value_error);
    const std::int32_t bad = 256;
    CHECK_THROWS_AS(a.forward(ca, seq_batch::dense(1, 1), std::span(&bad, 1), tensor_view<float, 2>(lg.data(), {1, 256})), value_error);
    // An owning tensor is accepted where a view is expected, and one token is std::span(&t, 1).
    auto cg = g.make_cache(1);
    tensor<float> last({1, 256}), all({1, 256});
    g.forward_last(cg, seq_batch::dense(1, 1), std::span(&t, 1), last);
    g.forward(cg, seq_batch::dense(1, 1), std::span(&t, 1), all);
    CHECK(std::any_of(last.span().begin(), last.span().end(), [](float x) { return x != 0.0f; }));
    tensor<float> flat({256});
    CHECK_THROWS_WITH_AS(g.forward_last(cg, seq_batch::dense(1, 1), std::span(&t, 1), flat),
                         "view of rank 2 requested for a tensor of shape [256]", shape_error);
}

TEST_CASE("auto_model: bits/byte on the first 8192 held-out bytes, window 512, is in a sane range") {
    HYMIX_REQUIRE_SHARED("data/kjv.txt");
    const std::string text = read_text(test::shared_dir() / "data" / "kjv.txt");
    REQUIRE(text.size() > 4083327 + 8192 + 1);
    const std::string held = text.substr(4083327, 8192 + 1);
    constexpr std::int64_t L = 512, N = 8192;
    for (const char* name : {"kjv-mamba2-byte", "kjv-gdn-byte", "kjv-hybrid-byte"}) {
        HYMIX_REQUIRE_SHARED(std::filesystem::path("models") / name / "config.json");
        const auto m = auto_model::load(model_dir(name), 2);
        const auto V = m.info().vocab_size;
        auto c = m.make_cache(1);
        std::vector<float> lg(static_cast<std::size_t>(L * V));
        std::vector<std::int32_t> ids(L);
        double nats = 0;
        std::int64_t scored = 0;
        for (std::int64_t s = 0; s < N - L; s += L) {
            for (std::int64_t i = 0; i < L; ++i) ids[i] = static_cast<unsigned char>(held[s + i]);
            m.reset_slot(c, 0);
            m.forward(c, seq_batch::dense(1, L), ids, tensor_view<float, 2>(lg.data(), {L, V}));
            for (std::int64_t i = 0; i < L; ++i) {
                const float* row = lg.data() + i * V;
                double mx = row[0];
                for (std::int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
                double se = 0;
                for (std::int64_t v = 0; v < V; ++v) se += std::exp(double(row[v]) - mx);
                const int target = static_cast<unsigned char>(held[s + i + 1]);
                nats += mx + std::log(se) - row[target];
                ++scored;
            }
        }
        const double bpb = nats / double(scored) / std::log(2.0);
        MESSAGE(std::string(name) << ": bits/byte over " << scored << " bytes = " << bpb);
        CHECK(bpb > 1.0);
        CHECK(bpb < 2.5);
    }
}

TEST_CASE("auto_model: f16 weights and a sharded checkpoint load") {
    HYMIX_REQUIRE_SHARED("models/kjv-hybrid-byte/model.safetensors");
    const auto src = model_dir("kjv-hybrid-byte");
    const auto ids = reference_ids(src);
    const auto base = logits_of(auto_model::load(src, 2), ids);
    safetensors::file f(src / "model.safetensors");

    // f16 copy: converted to fp32 at load, logits close to the fp32 model's.
    const auto d16 = scratch_dir("ckpt_f16", src);
    safetensors::writer w16;
    for (const auto& t : f.tensors()) {
        const auto x = f.to_f32(t.name);
        std::vector<f16> h(static_cast<std::size_t>(x.numel()));
        convert(x.data(), h.data(), h.size());
        w16.add<f16>(t.name, t.shape, h);
    }
    w16.write(d16 / "model.safetensors");
    const auto l16 = logits_of(auto_model::load(d16, 2), ids);
    const double e16 = rel_error(l16, base);
    MESSAGE("f16 weights: logits rel err vs fp32 " << e16);
    CHECK(e16 < 1e-3);
    CHECK(e16 > 0);

    // Two shards and an index: identical logits.
    const auto ds = scratch_dir("ckpt_sharded", src);
    safetensors::writer a, b;
    std::string map;
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
        const auto& t = f.tensors()[i];
        const char* shard = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
        (i % 2 ? b : a).add(t.name, f.to_f32(t.name));
        map += std::string(map.empty() ? "" : ",\n") + "    \"" + t.name + "\": \"" + shard + "\"";
    }
    a.write(ds / "model-00001-of-00002.safetensors");
    b.write(ds / "model-00002-of-00002.safetensors");
    write_text(ds / "model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {\n" + map + "\n}}\n");
    const auto ls = logits_of(auto_model::load(ds, 2), ids);
    CHECK(ls == base);
}

TEST_CASE("auto_model: a multimodal-style Qwen3.5 checkpoint (text_config, model.language_model. prefix)") {
    HYMIX_REQUIRE_SHARED("models/kjv-gdn-byte/model.safetensors");
    const auto src = model_dir("kjv-gdn-byte");
    const auto ids = reference_ids(src);
    const auto base = logits_of(auto_model::load(src, 2), ids);
    // config.json: the text model's keys moved under text_config, model_type qwen3_5.
    auto j = io::read_json_file(src / "config.json");
    io::json top = {{"model_type", "qwen3_5"}, {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                    {"tie_word_embeddings", false}, {"text_config", j}};
    const auto d = scratch_dir("ckpt_multimodal", src, top.dump(2));
    safetensors::file f(src / "model.safetensors");
    safetensors::writer w;
    for (const auto& t : f.tensors()) {
        std::string n = t.name;
        if (n.rfind("model.", 0) == 0) n = "model.language_model." + n.substr(6);
        w.add(n, f.to_f32(t.name));
    }
    w.add("model.visual.patch_embed.proj.weight", tensor<float>({4, 3}));  // the vision tower is not loaded
    w.write(d / "model.safetensors");
    const auto m = auto_model::load(d, 2);
    CHECK(m.info().model_type == "qwen3_5");
    CHECK(m.info().architecture == "Qwen3_5ForConditionalGeneration");
    CHECK(m.info().n_params == 4490928);
    CHECK(logits_of(m, ids) == base);
}

TEST_CASE("auto_model: bad checkpoints throw with the tensor name, expected and found shape") {
    HYMIX_REQUIRE_SHARED("models/kjv-mamba2-byte/model.safetensors");
    const auto src = model_dir("kjv-mamba2-byte");
    safetensors::file f(src / "model.safetensors");
    auto rewrite = [&](const std::string& dir, auto&& edit) {
        const auto d = scratch_dir(dir, src);
        safetensors::writer w;
        for (const auto& t : f.tensors()) edit(w, t.name, f.to_f32(t.name));
        w.write(d / "model.safetensors");
        return d;
    };

    // Unsupported model_type.
    std::string cfg = read_text(src / "config.json");
    const auto at = cfg.find("\"mamba2\"");
    REQUIRE(at != std::string::npos);
    cfg.replace(at, 8, "\"llama\"");
    const auto dl = scratch_dir("ckpt_llama", src, cfg);
    std::filesystem::copy_file(src / "model.safetensors", dl / "model.safetensors");
    const auto ml = message_of(dl);
    CHECK(ml.find("unsupported model_type 'llama'") != std::string::npos);

    // Missing tensor.
    const auto dm = rewrite("ckpt_missing", [](safetensors::writer& w, const std::string& n, const tensor<float>& t) {
        if (n != "backbone.layers.3.mixer.D") w.add(n, t);
    });
    const auto mm = message_of(dm);
    CHECK(mm.find("missing tensor 'backbone.layers.3.mixer.D'") != std::string::npos);
    CHECK(mm.find("[8]") != std::string::npos);
    CHECK(mm.find("model.safetensors") != std::string::npos);

    // Wrong shape.
    const auto dw = rewrite("ckpt_shape", [](safetensors::writer& w, const std::string& n, const tensor<float>& t) {
        if (n == "backbone.layers.2.mixer.dt_bias")
            w.add(n, tensor<float>({9}));
        else
            w.add(n, t);
    });
    const auto mw = message_of(dw);
    CHECK(mw.find("'backbone.layers.2.mixer.dt_bias': expected shape [8], found [9]") != std::string::npos);

    // Extra tensor.
    const auto de = rewrite("ckpt_extra", [](safetensors::writer& w, const std::string& n, const tensor<float>& t) {
        w.add(n, t);
        if (n == "backbone.norm_f.weight") w.add("backbone.layers.0.mixer.extra_bias", tensor<float>({4}));
    });
    const auto me = message_of(de);
    CHECK(me.find("unexpected tensor 'backbone.layers.0.mixer.extra_bias' with shape [4]") != std::string::npos);

    // No weights at all.
    const auto dn = scratch_dir("ckpt_noweights", src);
    CHECK(message_of(dn).find("no model.safetensors") != std::string::npos);
}

TEST_CASE("auto_model: non-finite weights are refused at load, naming the tensor, unless allowed") {
    // The repository's embedded default model (no ../shared needed), with one +Inf planted in its first tensor.
    const auto src = std::filesystem::path(HYMIX_TEST_DATA) / ".." / ".." / "models" / "kjv-tiny-hybrid";
    REQUIRE(std::filesystem::exists(src / "model.safetensors"));
    safetensors::file f(src / "model.safetensors");
    const auto d = scratch_dir("ckpt_inf", src);
    std::string planted;
    {
        safetensors::writer w;
        for (const auto& t : f.tensors()) {
            auto v = f.to_f32(t.name);
            if (planted.empty() && v.numel() > 3) {
                v[3] = std::numeric_limits<float>::infinity();
                planted = t.name;
            }
            w.add(t.name, v);
        }
        w.write(d / "model.safetensors");
    }
    REQUIRE(!planted.empty());
    try {
        (void)auto_model::load(d, 1);
        FAIL("a checkpoint holding +Inf loaded");
    } catch (const nonfinite_error& e) {
        const std::string m = e.what();
        CHECK(m.find("'" + planted + "'") != std::string::npos);
        CHECK(m.find("+Inf") != std::string::npos);
    }
    const auto m = auto_model::load(d, 1, nonfinite_weights::allow);
    CHECK(m.info().vocab_size == 256);
    CHECK_NOTHROW((void)auto_model::load(src, 1));
}
