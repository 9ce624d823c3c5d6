// A minimal trainable mixer for testing blocks, stacks and the training loop on their own: a causal
// previous-token mix y_t = W x_t + U x_{t−1} (x_{−1} = the slot's state) with plain host loops, implementing the
// mixer contract and the training interface (forward_train / backward / weights_mut / for_each) of real mixers.
#pragma once

#include <cstdint>
#include <random>
#include <string_view>

#include "hymix/backend/concepts.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/schedule/layer_kind.hpp"

namespace hymix::test {

struct toy_config {
    std::int64_t d_model = 0;
    void validate() const {
        if (d_model <= 0) throw config_error("toy_config: d_model must be positive");
    }
};

struct toy_weights {
    tensor<float> W, U;  // [d, d] each
    template <class F>
    void for_each(F&& f) {
        f(std::string_view("W"), W);
        f(std::string_view("U"), U);
    }
    toy_weights zeros_like() const {
        toy_weights z{tensor<float>(W.shape()), tensor<float>(U.shape())};
        return z;
    }
    static toy_weights random(const toy_config& c, std::uint64_t seed) {
        std::mt19937_64 g(seed);
        std::uniform_real_distribution<float> u(-0.5f, 0.5f);
        toy_weights w{tensor<float>({c.d_model, c.d_model}), tensor<float>({c.d_model, c.d_model})};
        for (auto& v : w.W.span()) v = u(g);
        for (auto& v : w.U.span()) v = u(g);
        return w;
    }
};

struct toy_state {
    tensor<float> last;  // [S, d]
    std::int64_t n_slots() const { return last.rank() ? last.dim(0) : 0; }
    void reset_slot(std::int64_t i) { std::fill_n(last.data() + i * last.dim(1), last.dim(1), 0.0f); }
    void copy_slot(std::int64_t a, std::int64_t b) { std::copy_n(last.data() + a * last.dim(1), last.dim(1), last.data() + b * last.dim(1)); }
};

class toy_mixer {
public:
    using config_type = toy_config;
    using weights_type = toy_weights;
    using state_type = toy_state;
    struct train_cache {};
    static constexpr kind_info kind{layer_kind('T', "toy"), {}};

    toy_mixer(toy_config c, toy_weights w) : c_(c), w_(std::move(w)) { c_.validate(); }
    const toy_config& config() const { return c_; }
    toy_weights& weights_mut() { return w_; }
    toy_state make_state(std::int64_t n) const { return toy_state{tensor<float>({n, c_.d_model})}; }

    template <class B, class Batch>
    void forward(const B&, toy_state& s, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        const seq_batch& b = batch;
        run(b, &s, x, y);
    }
    template <class B, class Batch>
    void step(const B& be, toy_state& s, const Batch& batch, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        forward(be, s, batch, x, y);
    }
    template <class B>
    void forward_train(const B&, const seq_batch& b, tensor_view<const float, 2> x, tensor_view<float, 2> y, train_cache&) const {
        run(b, nullptr, x, y);
    }
    template <class B>
    void backward(const B&, const seq_batch& b, const train_cache&, tensor_view<const float, 2> x, tensor_view<const float, 2> dy,
                  tensor_view<float, 2> dx, toy_weights& g) const {
        const std::int64_t d = c_.d_model;
        for (std::int64_t r = 0; r < dx.dim(0); ++r)
            for (std::int64_t k = 0; k < d; ++k) dx(r, k) = 0.0f;
        for (std::int64_t i = 0; i < b.n_seq(); ++i) {
            if (b.slots[i] < 0) continue;
            for (std::int64_t t = 0; t < b.lengths[i]; ++t) {
                const std::int64_t r = b.starts[i] + t;
                for (std::int64_t o = 0; o < d; ++o) {
                    const double gy = dy(r, o);
                    for (std::int64_t k = 0; k < d; ++k) {
                        dx(r, k) += static_cast<float>(gy * w_.W[o * d + k]);
                        g.W[o * d + k] += static_cast<float>(gy * x(r, k));
                        if (t > 0) {
                            dx(r - 1, k) += static_cast<float>(gy * w_.U[o * d + k]);
                            g.U[o * d + k] += static_cast<float>(gy * x(r - 1, k));
                        }
                    }
                }
            }
        }
    }

private:
    void run(const seq_batch& b, toy_state* s, tensor_view<const float, 2> x, tensor_view<float, 2> y) const {
        const std::int64_t d = c_.d_model;
        for (std::int64_t r = 0; r < y.dim(0); ++r)
            for (std::int64_t k = 0; k < d; ++k) y(r, k) = 0.0f;
        for (std::int64_t i = 0; i < b.n_seq(); ++i) {
            const std::int64_t slot = b.slots[i];
            if (slot < 0) continue;
            std::vector<float> prev(static_cast<std::size_t>(d), 0.0f);
            if (s) std::copy_n(s->last.data() + slot * d, d, prev.data());
            for (std::int64_t t = 0; t < b.lengths[i]; ++t) {
                const std::int64_t r = b.starts[i] + t;
                for (std::int64_t o = 0; o < d; ++o) {
                    double acc = 0;
                    for (std::int64_t k = 0; k < d; ++k) acc += double(w_.W[o * d + k]) * x(r, k) + double(w_.U[o * d + k]) * prev[k];
                    y(r, o) = static_cast<float>(acc);
                }
                for (std::int64_t k = 0; k < d; ++k) prev[k] = x(r, k);
            }
            if (s && b.lengths[i] > 0) std::copy_n(prev.data(), d, s->last.data() + slot * d);
        }
    }
    toy_config c_;
    toy_weights w_;
};

}  // namespace hymix::test
