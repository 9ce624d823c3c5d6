// Acceptance checker for the `hymix` tool against the shared checkpoints' reference files
// (../shared/models/README.md). Used by the tool's ctest entries; exits non-zero with a message on mismatch.
//   check prompt REF.safetensors N OUT        write the first N bytes of gen_ids to OUT
//   check gen    REF.safetensors OUT_FILE     OUT_FILE must be gen_ids as bytes (tool output: prompt + bytes + '\n')
//   check logits REF.safetensors OURS.safetensors TOL   ‖ours − ref‖/‖ref‖ ≤ TOL over the whole tensor
//   check score  META.json WINDOW OUTPUT_FILE TOL      bits/byte printed by `hymix score` vs meta.json's value
//   check tiny   DIR                          write a tiny random Qwen3.5 hybrid checkpoint (GDN + attention layer,
//                                             byte vocabulary, max_position_embeddings 256) for the tool's own tests
//   check poison SRC DST TENSOR ROW VALUE     copy checkpoint SRC to DST with row ROW of TENSOR set to VALUE (inf, nan)
//   check ids    OUT.safetensors B T MAX      input_ids int64 [B, T] = (7 i + 3) mod MAX (the last one MAX when MAX > 256)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "hymix/io/json.hpp"
#include "hymix/io/safetensors.hpp"

namespace {

std::string slurp(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    if (!f) throw hymix::io_error("cannot open " + p);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int fail(const std::string& m) {
    std::fprintf(stderr, "FAIL: %s\n", m.c_str());
    return 1;
}

std::string gen_bytes(const std::string& ref, std::int64_t n = -1) {
    const hymix::safetensors::file f(ref);
    const auto ids = f.to_tensor<std::int64_t>("gen_ids");
    std::string s;
    for (std::int64_t i = 0; i < ids.numel() && (n < 0 || i < n); ++i) s.push_back(static_cast<char>(ids[i]));
    return s;
}

// The tiny checkpoint: hidden 32, layers [linear_attention, full_attention], GDN 2 k-heads / 2 v-heads x 16,
// attention 2 heads / 1 kv-head x 16 with output gate, SwiGLU 48, vocabulary 256 (bytes), untied LM head.
const char* tiny_config = R"({
  "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 32, "num_hidden_layers": 2,
  "layer_types": ["linear_attention", "full_attention"], "vocab_size": 256, "intermediate_size": 48,
  "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 16,
  "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
  "head_dim": 16, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
  "max_position_embeddings": 256, "tie_word_embeddings": false, "eos_token_id": null, "hidden_act": "silu"
}
)";

void write_tiny(const std::filesystem::path& dir) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << tiny_config;
    std::mt19937 rng(20240611);
    hymix::safetensors::writer w;
    auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float mean, float sd) {
        hymix::tensor<float> t(shape);
        std::normal_distribution<float> nd(mean, sd);
        for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = nd(rng);
        w.add(name, t);
    };
    const std::int64_t d = 32, V = 256, F = 48, cd = 2 * 2 * 16 + 2 * 16, vd = 2 * 16;
    add("model.embed_tokens.weight", {V, d}, 0, 1);
    add("model.norm.weight", {d}, 0, 0.1f);  // Qwen3.5 norms scale by (1 + w)
    add("lm_head.weight", {V, d}, 0, 0.2f);
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {d}, 0, 0.1f);
        add(p + "post_attention_layernorm.weight", {d}, 0, 0.1f);
        add(p + "mlp.gate_proj.weight", {F, d}, 0, 0.15f);
        add(p + "mlp.up_proj.weight", {F, d}, 0, 0.15f);
        add(p + "mlp.down_proj.weight", {d, F}, 0, 0.15f);
        if (l == 0) {
            const std::string q = p + "linear_attn.";
            add(q + "in_proj_qkv.weight", {cd, d}, 0, 0.15f);
            add(q + "in_proj_z.weight", {vd, d}, 0, 0.15f);
            add(q + "in_proj_b.weight", {2, d}, 0, 0.15f);
            add(q + "in_proj_a.weight", {2, d}, 0, 0.15f);
            add(q + "conv1d.weight", {cd, 1, 4}, 0, 0.3f);
            add(q + "dt_bias", {2}, 0, 0.5f);
            add(q + "A_log", {2}, 0.5f, 0.3f);
            add(q + "norm.weight", {16}, 1, 0.1f);
            add(q + "out_proj.weight", {d, vd}, 0, 0.15f);
        } else {
            const std::string q = p + "self_attn.";
            add(q + "q_proj.weight", {2 * 2 * 16, d}, 0, 0.15f);
            add(q + "k_proj.weight", {16, d}, 0, 0.15f);
            add(q + "v_proj.weight", {16, d}, 0, 0.15f);
            add(q + "o_proj.weight", {d, 2 * 16}, 0, 0.15f);
            add(q + "q_norm.weight", {16}, 0, 0.1f);
            add(q + "k_norm.weight", {16}, 0, 0.1f);
        }
    }
    w.write(dir / "model.safetensors");
}

void write_poisoned(const std::filesystem::path& src, const std::filesystem::path& dst, const std::string& tensor,
                    std::int64_t row, const std::string& value) {
    std::filesystem::create_directories(dst);
    std::filesystem::copy_file(src / "config.json", dst / "config.json", std::filesystem::copy_options::overwrite_existing);
    const hymix::safetensors::file f(src / "model.safetensors");
    const float v = value == "nan" ? std::numeric_limits<float>::quiet_NaN()
                    : value == "-inf" ? -std::numeric_limits<float>::infinity()
                    : value == "inf" ? std::numeric_limits<float>::infinity()
                                     : std::stof(value);
    hymix::safetensors::writer w;
    for (const auto& name : f.names()) {
        auto t = f.to_f32(name);
        if (name == tensor) {
            const std::int64_t cols = t.rank() > 1 ? t.numel() / t.dim(0) : 1;
            for (std::int64_t i = 0; i < cols; ++i) t[row * cols + i] = v;
        }
        w.add(name, t);
    }
    w.write(dst / "model.safetensors");
}

}  // namespace

int main(int argc, char** argv) try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "prompt" && argc == 5) {
        std::ofstream(argv[4], std::ios::binary) << gen_bytes(argv[2], std::stoll(argv[3]));
        return 0;
    }
    if (cmd == "gen" && argc == 4) {
        const std::string want = gen_bytes(argv[2]) + "\n";
        const std::string got = slurp(argv[3]);
        if (got != want) return fail("generated bytes differ from gen_ids:\n  want: " + want + "  got:  " + got);
        std::printf("greedy generation reproduces gen_ids (%zu bytes)\n", want.size() - 1);
        return 0;
    }
    if (cmd == "logits" && argc == 5) {
        const hymix::safetensors::file ref(argv[2]), ours(argv[3]);
        const auto a = ours.to_f32("logits");
        const auto ri = ref.info("logits");  // a copy: GCC 13 flags a reference bound through a temporary argument
        if (ri.shape != a.shape()) return fail("logits shape " + hymix::shape_string(a.shape()) + " != reference " + hymix::shape_string(ri.shape));
        const auto r = ri.type == hymix::dtype::f64 ? ref.to_tensor<double>("logits") : hymix::tensor<double>();
        const auto rf = ri.type == hymix::dtype::f64 ? hymix::tensor<float>() : ref.to_f32("logits");
        double num = 0, den = 0;
        for (std::int64_t i = 0; i < a.numel(); ++i) {
            const double want = ri.type == hymix::dtype::f64 ? r[i] : static_cast<double>(rf[i]);
            num += (a[i] - want) * (a[i] - want);
            den += want * want;
        }
        const double rel = std::sqrt(num / den), tol = std::stod(argv[4]);
        std::printf("logits relative error %.3e (tolerance %.1e)\n", rel, tol);
        return rel <= tol ? 0 : fail("logits relative error above tolerance");
    }
    if (cmd == "score" && argc == 6) {
        const auto meta = hymix::io::read_json_file(argv[2]);
        const std::string key = std::string("heldout_bpb_window") + argv[3] + "_first131072";
        const double want = hymix::io::require<double>(meta, key, argv[2]);
        const std::string out = slurp(argv[4]);
        std::smatch m;
        if (!std::regex_search(out, m, std::regex("bits/byte ([0-9.]+)"))) return fail("no 'bits/byte' in the tool output:\n" + out);
        const double got = std::stod(m[1]), tol = std::stod(argv[5]);
        std::printf("bits/byte %.6f, reference %.6f, |diff| %.2e (tolerance %.1e)\n", got, want, std::abs(got - want), tol);
        return std::abs(got - want) <= tol ? 0 : fail("bits/byte differs from the reference");
    }
    if (cmd == "tiny" && argc == 3) {
        write_tiny(argv[2]);
        return 0;
    }
    if (cmd == "ids" && argc == 6) {
        const std::int64_t B = std::stoll(argv[3]), T = std::stoll(argv[4]), mx = std::stoll(argv[5]);
        hymix::tensor<std::int64_t> ids({B, T});
        for (std::int64_t i = 0; i < B * T; ++i) ids[i] = (7 * i + 3) % std::min<std::int64_t>(mx, 256);
        if (mx > 256) ids[B * T - 1] = mx;
        hymix::safetensors::writer w;
        w.add("input_ids", ids);
        w.write(argv[2]);
        return 0;
    }
    if (cmd == "poison" && argc == 7) {
        write_poisoned(argv[2], argv[3], argv[4], std::stoll(argv[5]), argv[6]);
        return 0;
    }
    return fail("usage: check prompt|gen|logits|score|tiny|poison ...");
} catch (const std::exception& e) {
    return fail(e.what());
}
