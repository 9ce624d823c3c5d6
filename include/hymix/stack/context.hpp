// What a block may read of the stack around it, and where it reports: the backend, the validated batch (live
// rows computed once), the LM head (embedding when tied) and final norm (AMOR's entropy gate evaluates the head on
// the block's own input, spec.md §5.2), per-token side inputs (gate decisions or Oryx modes given by the caller),
// the activation workspace, and per-token statistics returned to the caller (fire counts, entropies).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hymix/core/linear_weight.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/kernels/norm.hpp"
#include "hymix/stack/cache.hpp"

namespace hymix {

/// The context handed to every block of one forward call on backend B.
template <class B>
struct block_context {
    const B& be;
    const validated_batch& batch;
    const linear_weight& head;               // [V, d] LM head (the embedding when tied), f32, 16-bit or i8 with row scales
    const float* final_norm = nullptr;       // [d]
    float norm_eps = 1e-5f;                  // stack norm eps
    kernels::rms_flavor norm_flavor = kernels::rms_flavor::plain;
    std::span<const unsigned char> side;     // [n_rows] per-token side input from the caller, or empty
    stack_workspace& ws;
    std::vector<block_stats>* stats = nullptr;  // gated blocks append one entry per call
    std::int64_t layer = 0;                  // index of the block being run
};

}  // namespace hymix
