// The setting the entropy-gate tests share: n = 6 rows of d = 4 (two sequences of 2 and 3 tokens padded to 3, so
// row 2 is padding) under a random head of V = 50 rows, and the block_context a gate's decide() reads it from.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/stack/context.hpp"
#include "support/random.hpp"

namespace hymix::test {

struct padded_gate_fixture {
    static constexpr std::int64_t n = 6, d = 4, V = 50;
    std::vector<float> hv, ev;  // the rows ĥ [n, d] and the head [V, d]
    cpu_backend be{1};
    std::vector<std::int64_t> lens{2, 3};
    seq_batch sb = seq_batch::padded(3, lens);
    validated_batch vb{sb, 2};
    stack_workspace ws;
    linear_weight head = tensor<float>({V, d});
    block_context<cpu_backend> ctx{be, vb, head, nullptr, 1e-5f, kernels::rms_flavor::plain, {}, ws, nullptr, 0};
    std::vector<unsigned char> fire = std::vector<unsigned char>(static_cast<std::size_t>(n));

    /// Rows uniform in [−3, 3] from `seed_h`, head uniform in [−1, 1] from `seed_head`.
    padded_gate_fixture(unsigned seed_h, unsigned seed_head)
        : hv(uniform(static_cast<std::size_t>(n * d), -3.f, 3.f, seed_h)), ev(uniform(static_cast<std::size_t>(V * d), -1.f, 1.f, seed_head)) {
        std::copy(ev.begin(), ev.end(), head.data());
    }
    padded_gate_fixture(const padded_gate_fixture&) = delete;  // ctx refers to the members
    padded_gate_fixture& operator=(const padded_gate_fixture&) = delete;

    tensor_view<const float, 2> h() const { return tensor_view<const float, 2>(hv.data(), {n, d}); }
};

}  // namespace hymix::test
