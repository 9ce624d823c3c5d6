// Options of the training engine, kept light (no kernels, no models) so that command-line front ends can hold
// them: what byte-level model to build (byte_lm_spec, see byte_lm.hpp) and how to train it (train_options, see
// trainer.hpp).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/core/error.hpp"
#include "hymix/train/optimizer.hpp"

namespace hymix::train {

/// What `hymix train` builds: the stack kind and its sizes (bytes: vocab 256).
struct byte_lm_spec {
    std::string stack = "mamba2";  ///< mamba2 | gdn | attention | hybrid | oryx-gdn | oryx-mamba2
    std::int64_t d_model = 256;
    std::int64_t n_layers = 6;
    std::int64_t vocab_size = 256;
    std::int64_t head_dim = 64;      ///< Mamba-2 P, GDN d_k = d_v, attention d_h
    std::int64_t d_state = 64;       ///< Mamba-2 N
    std::int64_t n_groups = 1;       ///< Mamba-2 G
    std::int64_t chunk_size = 64;    ///< config.json's Mamba-2 chunk_size, for other readers (transformers); hymix's
                                     ///< layers run at the backend's chunk length (it changes only the rounding)
    std::int64_t linear_heads = 4;   ///< GDN key = value heads; Oryx heads (both read-outs)
    std::int64_t attn_heads = 4;     ///< attention query heads
    std::int64_t attn_kv_heads = 2;  ///< attention KV heads (GQA)
    std::int64_t d_ff = 512;         ///< SwiGLU width (Qwen3.5 family)
    std::int64_t attention_every = 3;  ///< hybrid: layer i is attention iff (i + 1) % attention_every == 0
    bool tie_embeddings = false;
    std::int64_t oryx_block_size = 128;  ///< Oryx training: tokens per block of one random mode (spec.md §6.5 default)
    double oryx_p_attention = 0.5;      ///< Oryx training: probability that a block is in attention mode

    /// Throws config_error naming the field.
    void validate() const {
        if (stack != "mamba2" && stack != "gdn" && stack != "attention" && stack != "hybrid" && !is_oryx())
            throw config_error("byte_lm_spec: stack '" + stack + "' is not one of mamba2, gdn, attention, hybrid, oryx-gdn, oryx-mamba2");
        auto pos = [](std::int64_t v, const char* n) {
            if (v <= 0) throw config_error(std::string("byte_lm_spec: ") + n + " must be positive, found " + std::to_string(v));
        };
        pos(d_model, "d_model");
        pos(n_layers, "n_layers");
        pos(vocab_size, "vocab_size");
        pos(head_dim, "head_dim");
        pos(attention_every, "attention_every");
        pos(oryx_block_size, "oryx_block_size");
        if (!(oryx_p_attention >= 0.0 && oryx_p_attention <= 1.0))
            throw config_error("byte_lm_spec: oryx_p_attention must lie in [0, 1], found " + std::to_string(oryx_p_attention));
        if (is_oryx() && head_dim % 2 != 0)
            throw config_error("byte_lm_spec: an Oryx head_dim must be even (full-width RoPE), found " + std::to_string(head_dim));
        if (stack == "mamba2" && (2 * d_model) % head_dim != 0)
            throw config_error("byte_lm_spec: 2 · d_model = " + std::to_string(2 * d_model) + " is not a multiple of head_dim " +
                               std::to_string(head_dim));
    }
    bool is_mamba2() const { return stack == "mamba2"; }
    bool is_oryx() const { return stack == "oryx-gdn" || stack == "oryx-mamba2"; }
    /// Per-layer Qwen3.5 layer_types.
    std::vector<std::string> layer_types() const {
        std::vector<std::string> t;
        for (std::int64_t i = 0; i < n_layers; ++i) {
            const bool attn = stack == "attention" || (stack == "hybrid" && (i + 1) % attention_every == 0);
            t.push_back(attn ? "full_attention" : "linear_attention");
        }
        return t;
    }
};

/// Options of one training run (the fields a resumed run must share with the original are marked "fixed").
struct train_options {
    std::int64_t steps = 1000;       ///< optimizer steps (the schedule's length)
    double minutes = 0;              ///< wall-clock budget of this call (a resumed run trains this much more); 0 = none; the run stops after `steps` or this, first
    std::int64_t stop_after = 0;     ///< stop (with a checkpoint) after this many steps of this run; 0 = none
    std::int64_t batch = 32;         ///< windows per optimizer step (fixed)
    std::int64_t seq_len = 512;      ///< bytes per window (fixed)
    std::int64_t accum = 1;          ///< micro-batches per step; each holds batch / accum windows (fixed)
    adamw_config adamw{};            ///< lr, betas, eps, weight decay (fixed)
    std::int64_t warmup = 100;       ///< linear warmup steps (fixed)
    lr_decay decay = lr_decay::cosine;
    double min_lr_ratio = 0.1;       ///< min_lr = lr · ratio for linear / cosine decay
    double clip = 1.0;               ///< global gradient-norm clip (0 = none)
    std::uint64_t seed = 0;          ///< data order (fixed)
    std::int64_t log_every = 10;     ///< CSV rows and progress updates every this many steps
    std::int64_t eval_every = 0;     ///< held-out bits/byte every this many steps (0 = only at the end)
    std::int64_t eval_bytes = 131072;
    std::int64_t eval_window = 512;
    std::int64_t checkpoint_every = 0;  ///< steps between checkpoints (0 = only at the end)
    bool progress = true;            ///< draw a progress line on stderr when it is a terminal
    /// When set and it becomes true (a SIGINT / SIGTERM handler's flag, say), the run stops after the step in hand and
    /// writes its final row and checkpoint at once, without the held-out evaluation (train_result::interrupted says so).
    const std::atomic<bool>* interrupt = nullptr;

    lr_schedule schedule() const {
        return lr_schedule{adamw.lr, warmup, steps, decay, adamw.lr * min_lr_ratio};
    }
    /// The fields a resumed run must match, as JSON.
    nlohmann::json fixed() const {
        return {{"batch", batch}, {"seq_len", seq_len}, {"accum", accum}, {"lr", adamw.lr}, {"beta1", adamw.beta1},
                {"beta2", adamw.beta2}, {"eps", adamw.eps}, {"weight_decay", adamw.weight_decay}, {"warmup", warmup},
                {"seed", seed}, {"clip", clip}};
    }
    void validate() const {
        auto pos = [](std::int64_t v, const char* n) {
            if (v <= 0) throw config_error(std::string("train: ") + n + " must be positive, found " + std::to_string(v));
        };
        pos(steps, "steps");
        pos(batch, "batch");
        pos(seq_len, "seq_len");
        pos(accum, "accum");
        pos(log_every, "log_every");
        if (batch % accum != 0)
            throw config_error("train: batch " + std::to_string(batch) + " is not a multiple of accum " + std::to_string(accum));
        if (!(adamw.lr > 0) || !std::isfinite(adamw.lr)) throw config_error("train: lr must be positive, found " + std::to_string(adamw.lr));
        if (minutes < 0) throw config_error("train: minutes must be >= 0");
    }
};

}  // namespace hymix::train
