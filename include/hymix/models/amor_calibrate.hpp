// Post-hoc calibration of an AMOR stack's entropy gates (issue 9): the gate statistics m̄, s̄ of spec.md §5.2 measured
// on training text instead of learned by the EMA during training. Blocks trained always on (every token attends) never
// move their statistics, so κ means nothing for them; calibrated, the same blocks can be gated at inference
// (τ = m̄ + κ·s̄), which is "train with attention everywhere, pay for it only where the backbone is uncertain".
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/finite.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/gate/entropy_ema.hpp"
#include "hymix/gate/entropy_router.hpp"
#include "hymix/models/amor_router.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/train/data.hpp"

namespace hymix::models {

/// What one gate's calibration measured: the positions recorded and the statistics set.
struct gate_calibration {
    std::int64_t positions = 0;
    float running_threshold = 0, running_std = 0;  ///< m̄ (lower median of H) and s̄ (unbiased std of H)
};

/// Records the exact normalised entropy H at every position of ⌈positions / L⌉ windows of L = sampler.seq_len() bytes
/// (drawn by `sampler` from the training split, in batches of at most `batch` windows) at every entropy gate of stack
/// m: whole windows, so that early and late positions (short and long contexts) weigh as they do in the windows, with
/// every block firing on every token (the regime in
/// which always-on blocks were trained, so each block sees the inputs it was trained on); then sets each gate's m̄ and
/// s̄ from its own entropies (entropy_ema::calibrate), switches the gates to gating (always_on false) and leaves κ and
/// any sample tap as they were. `progress` (optional) hears the positions recorded so far after each batch. Throws
/// config_error if a gate has a router set (H must be exact) or the stack has no entropy gate, value_error for
/// positions < 2 or batch < 1, nonfinite_error naming the gate for a NaN or infinite entropy; on any throw every gate is
/// left as it was. Statistics of a gate in the fixed offset mode are set too (τ = m̄ + gate_offset).
template <class B, class S>
std::vector<gate_calibration> calibrate_entropy_gates(const B& be, S& m, train::window_sampler& sampler, std::int64_t positions,
                                                      std::int64_t batch = 8,
                                                      const std::function<void(std::int64_t)>& progress = {}) {
    if (positions < 2) throw value_error("calibrate_entropy_gates: positions must be at least 2, found " + std::to_string(positions));
    if (batch < 1) throw value_error("calibrate_entropy_gates: batch must be at least 1, found " + std::to_string(batch));
    struct saved {
        entropy_ema* gate;
        bool always_on;
        float m, s, kappa;
        std::shared_ptr<router_samples> tap;
    };
    std::vector<saved> gates;
    std::vector<std::shared_ptr<router_samples>> taps;
    for_each_entropy_gate(m, [&](entropy_ema& g) {
        if (g.router()) throw config_error("calibrate_entropy_gates: a gate has a fitted router set; calibration needs the exact entropy");
        gates.push_back({&g, g.config().always_on, g.running_threshold(), g.running_std(), g.config().kappa, g.sample_tap()});
    });
    if (gates.empty()) throw config_error("calibrate_entropy_gates: the stack has no entropy gate");
    // Every block fires while H is computed: τ below any entropy (H ≥ 0).
    auto restore = [&] {
        for (auto& g : gates) {
            g.gate->set_sample_tap(g.tap);
            g.gate->set_statistics(g.m, g.s);
            if (g.gate->config().offset_mode == amor_offset_mode::adaptive) g.gate->set_kappa(g.kappa);
            g.gate->set_always_on(g.always_on);
        }
    };
    const std::int64_t L = sampler.seq_len(), windows = (positions + L - 1) / L;
    try {
        for (auto& g : gates) {
            auto t = std::make_shared<router_samples>();
            t->max_rows = windows * L;
            t->record_inputs = false;
            g.gate->set_sample_tap(t);
            g.gate->set_always_on(false);
            if (g.gate->config().offset_mode == amor_offset_mode::adaptive)
                g.gate->set_statistics(-1.0f, 0.0f);  // τ = −1
            else
                g.gate->set_statistics(-1.0f - g.gate->config().gate_offset, 0.0f);  // τ = −1
            taps.push_back(std::move(t));
        }
        const std::int64_t V = m.config().vocab_size;
        for (std::int64_t done = 0; done < windows;) {
            const auto b = sampler.next(std::min(batch, windows - done));
            auto cache = m.make_cache(b.n_seq);
            tensor<float> logits({b.n_seq, V});  // the gates see every position; only the last logits are formed
            m.forward_last(be, cache, seq_batch::dense(b.n_seq, b.seq_len), b.inputs, logits.view<2>());
            done += b.n_seq;
            std::int64_t recorded = taps.front()->rows();
            for (const auto& t : taps) recorded = std::min(recorded, t->rows());
            if (recorded != done * L)
                throw config_error("calibrate_entropy_gates: a gate recorded " + std::to_string(recorded) + " entropies of " +
                                   std::to_string(done * L) + " positions (every gate must see every position)");
            if (progress) progress(recorded);
        }
    } catch (...) {
        restore();
        throw;
    }
    std::vector<gate_calibration> out;
    try {
        for (std::size_t i = 0; i < gates.size(); ++i) {
            auto& g = *gates[i].gate;
            try {
                g.calibrate(taps[i]->H);
            } catch (const nonfinite_error& e) {  // name the gate: its input holds NaN or Inf
                throw nonfinite_error("calibrate_entropy_gates: entropy gate " + std::to_string(i) + " (AMOR block " + std::to_string(i) +
                                      "): " + e.what() + " (its input holds NaN or Inf)");
            }
            g.set_sample_tap(gates[i].tap);
            if (g.config().offset_mode == amor_offset_mode::adaptive) g.set_kappa(gates[i].kappa);
            g.set_always_on(false);
            out.push_back({taps[i]->rows(), g.running_threshold(), g.running_std()});
        }
    } catch (...) {
        restore();
        throw;
    }
    return out;
}

}  // namespace hymix::models
