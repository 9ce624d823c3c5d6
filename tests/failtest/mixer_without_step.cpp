// expect: (satisfaction of [^ ]*mixer<M|no member named 'step')
// Must not compile: a mixer type without `step` (decode) is used where hymix::mixer<M, hymix::cpu_backend>
// is required. The diagnostic must name the mixer concept.
// Built with -DHYMIX_FAILTEST_CONTROL the type gains `step` and the file must compile, which proves that
// the missing member is the only error.
#include <cstdint>

#include "hymix/backend/cpu.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/mixer/concepts.hpp"

namespace {

struct toy_config {};
struct toy_weights {};
struct toy_state {
    std::int64_t n_slots() const { return 1; }
    void reset_slot(std::int64_t) {}
    void copy_slot(std::int64_t, std::int64_t) {}
};

/// Copies x to y: a mixer in every respect except that it has no decode step.
class prefill_only_mixer {
public:
    using config_type = toy_config;
    using weights_type = toy_weights;
    using state_type = toy_state;

    const toy_config& config() const { return config_; }
    toy_state make_state(std::int64_t) const { return {}; }
    template <hymix::cpu_backend_type B>
    void forward(const B&, toy_state&, const hymix::seq_batch&, hymix::tensor_view<const float, 2> x,  // [n_rows, d]
                 hymix::tensor_view<float, 2> y) const {                                              // [n_rows, d]
        for (std::int64_t r = 0; r < x.dim(0); ++r)
            for (std::int64_t c = 0; c < x.dim(1); ++c) y(r, c) = x(r, c);
    }
#ifdef HYMIX_FAILTEST_CONTROL
    template <hymix::cpu_backend_type B>
    void step(const B& be, toy_state& s, const hymix::seq_batch& b, hymix::tensor_view<const float, 2> x,  // [n_seq, d]
              hymix::tensor_view<float, 2> y) const {                                                      // [n_seq, d]
        forward(be, s, b, x, y);
    }
#endif

private:
    toy_config config_;
};

/// Where a stack would run one decode step of a mixer layer.
template <class M>
    requires hymix::mixer<M, hymix::cpu_backend>
void decode_one(const M& m, const hymix::cpu_backend& be, typename M::state_type& s, const hymix::seq_batch& b,
                hymix::tensor_view<const float, 2> x, hymix::tensor_view<float, 2> y) {
    m.step(be, s, b, x, y);
}

}  // namespace

int main() {
    const hymix::cpu_backend be(1);
    const prefill_only_mixer m;
    auto s = m.make_state(1);
    const std::int64_t slot = 0;
    const auto batch = hymix::seq_batch::decode(std::span<const std::int64_t>(&slot, 1));
    hymix::tensor<float> x{1, 4}, y{1, 4};
    decode_one(m, be, s, batch, x.view<2>(), y.view<2>());
    return 0;
}
