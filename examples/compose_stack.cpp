// Composing a hybrid stack at compile time: Gated DeltaNet layers with a causal-attention layer every third
// layer (the Qwen3-Next / Qwen3.5 rule "(i + 1) % 3 == 0" here), zero-centred RMSNorm and SwiGLU MLPs.
// The weights are random (hymix::random_stack; a real checkpoint loads through hymix::auto_model, see examples/tool);
// the program prefills a prompt through a cache, decodes a few tokens one step at a time, and checks that the decode
// path gives the same logits as one prefill over the whole sequence.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/schedule/layer_schedule.hpp"
#include "hymix/mixer/attention.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/stack/model.hpp"
#include "hymix/stack/random_stack.hpp"

using namespace hymix;

// The stack type: schedule, norm policy, MLP policy, and which mixer implements each layer kind.
using hybrid_lm = model<interval_rule<3>, zero_centered_rms_norm, swiglu_mlp,
                        bind<layer_kind::gated_deltanet, gated_deltanet>, bind<layer_kind::attention, attention>>;

namespace {

constexpr std::int64_t d_model = 128, vocab = 256, d_ff = 256, n_layers = 6;

// Random weights, initialised as the Hugging Face models are (stack/random_stack.hpp). docs/building_stacks.md shows
// how to build the same stack from your own tensors (stack_config, stack_weights and one hybrid_lm::layer per layer).
hybrid_lm build(std::uint64_t seed) {
    gated_deltanet_config gdn;
    gdn.d_model = d_model;
    gdn.n_k_heads = 2;
    gdn.n_v_heads = 2;
    gdn.d_k = 32;
    gdn.d_v = 32;
    attention_config att;
    att.d_model = d_model;
    att.n_heads = 4;
    att.n_kv_heads = 2;  // GQA
    att.head_dim = 32;
    att.output_gate = true;
    att.qk_norm.mode = qk_norm_mode::zero_centered;
    att.rope.partial_rotary_factor = 0.25;

    const stack_config cfg{.d_model = d_model, .vocab_size = vocab, .norm_eps = 1e-6f, .tie_embeddings = true};
    // One mixer config per bound kind, in binding order; the schedule says which layer gets which.
    return random_stack<hybrid_lm>(cfg, {.n_layers = n_layers, .d_ff = d_ff}, {gdn, att}, seed);
}

}  // namespace

int main() {
    const cpu_backend be;  // all cores, best SIMD the build allows
    const hybrid_lm lm = build(42);
    const std::string text = "In the beginning God created the heaven and the earth.";
    std::vector<std::int32_t> ids(text.begin(), text.end());
    const auto T = static_cast<std::int64_t>(ids.size());
    const std::int64_t prompt = 40;

    // One prefill over the whole text.
    auto full_cache = lm.make_cache(1);
    tensor<float> full({T, vocab});
    lm.forward(be, full_cache, seq_batch::dense(1, T), ids, full);  // a tensor is accepted where a view is expected

    // Prefill the prompt, then decode the rest token by token through the same cache type.
    auto cache = lm.make_cache(1);
    tensor<float> last({1, vocab});
    lm.forward_last(be, cache, seq_batch::dense(1, prompt), std::span(ids).first(prompt), last);
    double max_diff = 0;
    for (std::int64_t t = prompt; t < T; ++t) {
        for (std::int64_t v = 0; v < vocab; ++v) max_diff = std::max(max_diff, double(std::abs(last[v] - full.view<2>()(t - 1, v))));
        lm.forward_last(be, cache, seq_batch::dense(1, 1), std::span(ids).subspan(t, 1), last);
    }
    std::printf("hybrid stack: %lld layers (schedule GGAGGA), d_model %lld, %d threads, SIMD %s\n", (long long)n_layers,
                (long long)d_model, be.num_threads(), cpu_backend::arch_name());
    std::printf("prefill of %lld tokens then %lld decode steps vs one prefill of %lld: max |Δlogit| = %.3g\n",
                (long long)prompt, (long long)(T - prompt), (long long)T, max_diff);
    return max_diff < 1e-3 ? 0 : 1;
}
