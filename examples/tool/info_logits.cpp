// `hymix info` (architecture, parameters, layer schedule) and `hymix logits` (input_ids [B, T] int64 in a
// safetensors file -> logits [B, T, V] f32, refused when not finite unless --allow-nonfinite).
#include "hymix/core/finite.hpp"
#include "hymix/io/safetensors.hpp"
#include "load.hpp"
#include "tool.hpp"

namespace tool {

int run_info(const common_options& c) {
    return with_model(c, [&](auto& m) -> int {
        const auto& i = m.model.info();
        fmt::print("model        {}\n", m.dir.string());
        fmt::print("architecture {} (model_type {})\n", i.architecture, i.model_type);
        fmt::print("parameters   {}\n", i.n_params);
        fmt::print("layers       {}  d_model {}  vocab {}\n", i.n_layers, i.d_model, i.vocab_size);
        fmt::print("schedule     {}\n", i.schedule);
        for (std::size_t l = 0; l < i.layer_kinds.size(); ++l) fmt::print("  layer {:>2}: {}\n", l, i.layer_kinds[l]);
        if (const auto mpe = config_int(m.config, "max_position_embeddings"))
            fmt::print("context      {} tokens (max_position_embeddings)\n", *mpe);
        return exit_ok;
    });
}

int run_logits(const common_options& c, const logits_options& o) {
    (void)read_file(o.input, "--input");  // the same messages as other inputs for a missing file or a directory
    const hymix::safetensors::file f(o.input);
    const auto ids = f.to_tensor<std::int64_t>("input_ids");  // [B, T]; dtype_error unless I64
    if (ids.rank() != 2)
        throw hymix::shape_error(o.input + ": input_ids must have shape [B, T], found " + hymix::shape_string(ids.shape()));
    const std::int64_t B = ids.dim(0), T = ids.dim(1);
    if (B < 1 || T < 1)
        throw hymix::shape_error(o.input + ": input_ids has shape " + hymix::shape_string(ids.shape()) +
                                 ", expected at least one row and one token");
    return with_model(c, [&](auto& m) -> int {
        const std::int64_t V = m.model.info().vocab_size;
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
        for (std::int64_t i = 0; i < B * T; ++i) {
            const std::int64_t v = ids[i];
            if (v < 0 || v >= V)
                throw hymix::value_error(fmt::format("{}: input_ids[{}, {}] = {} is outside the vocabulary [0, {})", o.input, i / T,
                                                     i % T, v, V));
            tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(v);
        }
        auto cache = m.model.make_cache(B);
        hymix::tensor<float> logits({B * T, V});
        m.model.forward(cache, hymix::seq_batch::dense(B, T), tokens, logits.view<2>(), hymix::call_phase::prefill);
        const auto bad = hymix::first_nonfinite(std::span<const float>(logits.data(), static_cast<std::size_t>(logits.numel())));
        if (bad >= 0) {
            const auto what = fmt::format("the logits hold {} at [{}, {}, {}]", hymix::nonfinite_name(logits[bad]), bad / (T * V),
                                          bad / V % T, bad % V);
            if (!c.allow_nonfinite) throw hymix::nonfinite_error(what + "; pass --allow-nonfinite to write them anyway");
            console::note("hymix: warning: {} (written anyway: --allow-nonfinite)", what);
        }
        logits.reshape({B, T, V});
        hymix::safetensors::writer w;
        w.add("logits", logits);
        w.write(o.output);
        fmt::print("wrote logits [{}, {}, {}] to {}\n", B, T, V, o.output);
        return exit_ok;
    });
}

}  // namespace tool
