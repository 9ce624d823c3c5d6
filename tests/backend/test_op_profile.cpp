// The op profile of backend/op_profile.hpp: ops dispatched on a CPU backend with a profile set are counted and timed
// per op and argument shapes, nested ops count in their caller only, nothing is recorded without a profile, and a
// whole Gated DeltaNet layer's prefill shows each of its ops.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hymix/backend/cpu.hpp"
#include "hymix/backend/op_profile.hpp"
#include "hymix/mixer/gated_deltanet.hpp"
#include "hymix/ops/linear.hpp"
#include "support/random.hpp"

namespace hymix_test_ops {
struct outer_op {};
struct inner_op {};
}  // namespace hymix_test_ops

namespace hymix {
// A test op that runs another op from inside a parallel loop (as an op that dispatches ops on worker threads would).
template <class Arch>
struct op_impl<hymix_test_ops::inner_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>&, int* hits) { ++*hits; }
};
template <class Arch>
struct op_impl<hymix_test_ops::outer_op, basic_cpu_backend<Arch>> {
    static void run(const basic_cpu_backend<Arch>& be, std::vector<int>* hits) {
        be.parallel_for(static_cast<std::int64_t>(hits->size()), 1, [&](std::int64_t b, std::int64_t e) {
            for (std::int64_t i = b; i < e; ++i) dispatch<hymix_test_ops::inner_op>(be, &(*hits)[static_cast<std::size_t>(i)]);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
};
}  // namespace hymix

using namespace hymix;

namespace {

const op_profile::entry* find(const std::vector<op_profile::entry>& es, const std::string& op, const std::string& shapes = "") {
    for (const auto& e : es)
        if (e.op == op && (shapes.empty() || e.shapes == shapes)) return &e;
    return nullptr;
}

}  // namespace

TEST_CASE("op_name gives the tag's short name") {
    CHECK(op_name<ops::linear_op>() == "linear");
    CHECK(op_name<hymix_test_ops::outer_op>() == "outer");
}

TEST_CASE("ops are counted per op and shapes while a profile is set, and not otherwise") {
    cpu_backend be(2);
    const auto x = hymix::test::uniform(4 * 8, -1.f, 1.f, 1), w1 = hymix::test::uniform(6 * 8, -1.f, 1.f, 2),
               w2 = hymix::test::uniform(3 * 8, -1.f, 1.f, 3);
    std::vector<float> y(4 * 6);
    tensor_view<const float, 2> xv(x.data(), {4, 8}), w1v(w1.data(), {6, 8}), w2v(w2.data(), {3, 8});
    auto run = [&] {
        ops::linear(be, xv, w1v, nullptr, tensor_view<float, 2>(y.data(), {4, 6}));
        ops::linear(be, xv, w1v, nullptr, tensor_view<float, 2>(y.data(), {4, 6}));
        ops::linear(be, xv, w2v, nullptr, tensor_view<float, 2>(y.data(), {4, 3}));
    };
    run();  // no profile: nothing to record into
    op_profile p;
    be.set_op_profile(&p);
    REQUIRE(be.op_profiler() == &p);
    run();
    be.set_op_profile(nullptr);
    run();
    const auto es = p.entries();
    REQUIRE(es.size() == 2);
    const auto* a = find(es, "linear", "[4,8] [6,8] [4,6]");
    const auto* b = find(es, "linear", "[4,8] [3,8] [4,3]");
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(a->calls == 2);
    CHECK(b->calls == 1);
    CHECK(a->seconds > 0);
    CHECK(p.total_seconds() == doctest::Approx(a->seconds + b->seconds));
    const auto per_op = p.by_op();
    REQUIRE(per_op.size() == 1);
    CHECK(per_op[0].calls == 3);
    CHECK(per_op[0].shapes.empty());

    std::ostringstream csv;
    p.write_csv(csv);
    const std::string s = csv.str();
    CHECK(s.rfind("op,shapes,calls,seconds,fraction\n", 0) == 0);
    CHECK(s.find("linear,\"[4,8] [6,8] [4,6]\",2,") != std::string::npos);

    p.reset();
    CHECK(p.entries().empty());
    CHECK(p.total_seconds() == 0);

    op_profile by_op(false);  // grouped by op alone
    be.set_op_profile(&by_op);
    run();
    be.set_op_profile(nullptr);
    REQUIRE(by_op.entries().size() == 1);
    CHECK(by_op.entries()[0].calls == 3);
}

TEST_CASE("an op dispatched inside another op, on any thread, counts in its caller only") {
    cpu_backend be(2);
    op_profile p;
    be.set_op_profile(&p);
    std::vector<int> hits(64, 0);
    dispatch<hymix_test_ops::outer_op>(be, &hits);
    dispatch<hymix_test_ops::outer_op>(be, &hits);
    be.set_op_profile(nullptr);
    for (int h : hits) CHECK(h == 2);  // the inner op ran, untimed
    const auto es = p.entries();
    REQUIRE(es.size() == 1);
    CHECK(es[0].op == "outer");
    CHECK(es[0].calls == 2);
    CHECK(es[0].seconds >= 0.010);  // two 5 ms sleeps inside
}

TEST_CASE("a Gated DeltaNet prefill shows each of its ops, and they fit in the call's wall time") {
    gated_deltanet_config c;
    c.d_model = 64;
    c.n_k_heads = 2;
    c.n_v_heads = 4;
    c.d_k = 16;
    c.d_v = 16;
    c.d_conv = 4;
    const gated_deltanet m(c, gated_deltanet_weights::random(c, 5));
    auto st = m.make_state(1);
    const std::int64_t T = 100;
    const auto x = hymix::test::uniform(static_cast<std::size_t>(T * c.d_model), -1.f, 1.f, 6);
    std::vector<float> y(x.size());
    cpu_backend be(2);
    op_profile p(false);
    be.set_op_profile(&p);
    const auto t0 = std::chrono::steady_clock::now();
    m.forward(be, st, seq_batch::dense(1, T), tensor_view<const float, 2>(x.data(), {T, c.d_model}),
              tensor_view<float, 2>(y.data(), {T, c.d_model}));
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    be.set_op_profile(nullptr);
    const auto es = p.entries();
    std::set<std::string> names;
    for (const auto& e : es) names.insert(e.op);
    for (const char* op : {"linear", "causal_conv1d", "gdn_gates", "gated_delta_chunked", "gated_rms_norm"}) {
        INFO(op);
        CHECK(names.count(op) == 1);
    }
    const auto* lin = find(es, "linear");
    REQUIRE(lin != nullptr);
    CHECK(lin->calls == 5);  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj
    CHECK(p.total_seconds() > 0);
    CHECK(p.total_seconds() <= wall);
}
