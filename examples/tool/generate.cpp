// `hymix generate`: prefill the prompt in chunks of --ubatch tokens, then stream sampled bytes to stdout until
// -n tokens, a stop string, an end-of-sequence token or the context limit; timings and the seed on stderr.
#include "load.hpp"
#include "tool.hpp"

namespace tool {

int run_generate(const common_options& c, generate_options o) {
    const auto t_start = clock_type::now();
    if (!o.prompt_file.empty()) {
        o.prompt = read_file(o.prompt_file, "--file");
        if (o.prompt.empty()) throw hymix::value_error("--file: the prompt file '" + o.prompt_file + "' is empty");
    }
    if (o.prompt.empty()) throw usage_error("generate: give a non-empty --prompt TEXT or --file FILE");

    return with_model(c, [&](auto& m) -> int {
        const hymix::byte_tokenizer tok;
        const auto V = m.model.info().vocab_size;
        if (tok.vocab_size() != V)
            throw hymix::config_error(fmt::format("{}: the byte tokenizer has {} tokens but the model's vocabulary has {}",
                                                  (m.dir / "config.json").string(), tok.vocab_size(), V));
        const auto ids = tok.encode(o.prompt);
        const auto T = static_cast<std::int64_t>(ids.size());

        auto& g = o.gen;
        std::string ctx_from = "--ctx-size";
        if (o.ctx_size) {
            g.context_limit = *o.ctx_size;
        } else if (const auto mpe = config_int(m.config, "max_position_embeddings"); mpe && *mpe > 0) {
            g.context_limit = *mpe;
            ctx_from = "max_position_embeddings of config.json";
        }
        if (g.context_limit > 0 && T > g.context_limit)
            throw usage_error(fmt::format("the prompt has {} tokens, more than the context limit of {} ({}); pass "
                                          "--ctx-size N to raise the limit, or --ctx-size 0 for none",
                                          T, g.context_limit, ctx_from));
        if (!o.ignore_eos) g.eos = config_eos(m.config);
        if (g.sampling.temperature > 0) {
            g.sampling.seed = o.seed ? *o.seed : hymix::random_seed();
            console::note("seed: {}{}", g.sampling.seed, o.seed ? "" : " (random; pass --seed to repeat this run)");
        }

        // Prefill progress on a terminal for prompts of several chunks; the prompt is echoed once it is processed.
        const bool show_progress = console::stderr_is_terminal() && T > g.ubatch;
        auto on_chunk = [&](std::int64_t done, std::int64_t total) {
            if (show_progress && done < total) console::status(fmt::format("prefill {}/{} tokens", done, total));
            if (done == total) {
                if (show_progress) console::clear_status();
                console::text(o.prompt);
            }
        };
        const auto r = hymix::generate(m.model, tok, ids, g, [](std::string_view bytes) { console::text(bytes); }, on_chunk);
        console::text("\n");

        console::note("prefill: {} tokens in {:.3f} s ({:.1f} tokens/s, chunks of {})", r.prompt_tokens, r.prefill_seconds,
                      per_second(r.prompt_tokens, r.prefill_seconds), g.ubatch);
        if (r.generated > 1)  // the first token comes from the prefill's logits: decode runs generated - 1 steps
            console::note("decode:  {} tokens in {:.3f} s ({:.1f} tokens/s)", r.generated - 1, r.decode_seconds,
                          per_second(r.generated - 1, r.decode_seconds));
        std::string why = hymix::stop_reason_name(r.reason);
        if (r.reason == hymix::stop_reason::token_limit) why += fmt::format(" (-n {})", g.max_new);
        if (r.reason == hymix::stop_reason::context_limit) why += fmt::format(" ({} tokens, {})", g.context_limit, ctx_from);
        console::note("stopped: {} after {} generated tokens; total {:.2f} s", why, r.generated, seconds_since(t_start));
        return exit_ok;
    });
}

}  // namespace tool
