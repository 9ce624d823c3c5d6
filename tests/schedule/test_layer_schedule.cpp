// Fixed-schedule gates (spec.md §7): compile-time kinds per layer and checks of run-time layer lists.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "hymix/schedule/layer_schedule.hpp"

using namespace hymix;
using K = layer_kind;

namespace {
std::string check_message(auto check) {
    try {
        check();
    } catch (const config_error& e) {
        return e.what();
    }
    return "<no error>";
}
}  // namespace

TEST_CASE("static schedules give each layer's kind at compile time") {
    static_assert(every_layer<K::mamba2>::kind_at(17) == K::mamba2);
    static_assert(periodic<8, 4>::kind_at(4) == K::attention && periodic<8, 4>::kind_at(12) == K::attention);
    static_assert(periodic<8, 4>::kind_at(5) == K::mamba2 && periodic<8, 4>::kind_at(0) == K::mamba2);
    static_assert(interval_rule<4>::kind_at(3) == K::attention && interval_rule<4>::kind_at(7) == K::attention);
    static_assert(interval_rule<4>::kind_at(0) == K::gated_deltanet && interval_rule<4>::kind_at(4) == K::gated_deltanet);
    using nem = pattern<"M-M*-">;
    static_assert(nem::layer_count == 5);
    static_assert(nem::kind_at(0) == K::mamba2 && nem::kind_at(1) == K::mlp && nem::kind_at(3) == K::attention);
    static_assert(nem::allows(K::mlp) && !nem::allows(K::gated_deltanet));
    static_assert(pattern<"GGAGGA">::kind_at(2) == K::attention && pattern<"GGAGGA">::kind_at(4) == K::gated_deltanet);
    static_assert(!every_layer<K::mamba2>::allows(K::attention));

    // Jamba: attention at layers 4, 12, 20, 28 of 32.
    auto j = schedule_kinds<periodic<8, 4>>(32);
    std::vector<int> attn;
    for (int i = 0; i < 32; ++i)
        if (j[i] == K::attention) attn.push_back(i);
    CHECK(attn == std::vector<int>{4, 12, 20, 28});
    CHECK(schedule_string(schedule_kinds<interval_rule<3>>(6)) == "GGAGGA");
    CHECK(schedule_string(schedule_kinds<pattern<"M-M*-">>(5)) == "M-MA-");
    CHECK_THROWS_AS(schedule_kinds<pattern<"M-M*-">>(4), config_error);
}

TEST_CASE("run-time lists from config.json are parsed and checked") {
    const std::vector<std::string> qwen{"linear_attention", "linear_attention", "full_attention",
                                        "linear_attention", "linear_attention", "full_attention"};
    const auto kinds = kinds_from_layer_types(qwen, K::gated_deltanet);
    CHECK(schedule_string(kinds) == "GGAGGA");
    CHECK_NOTHROW(interval_rule<3>::check(kinds));
    CHECK_NOTHROW(pattern<"GGAGGA">::check(kinds));
    CHECK_NOTHROW((any_of<K::gated_deltanet, K::attention>::check(kinds)));

    // First mismatching layer, expected and found kinds are named.
    const auto m = check_message([&] { interval_rule<4>::check(kinds); });
    CHECK(m.find("layer 2") != std::string::npos);
    CHECK(m.find("expected 'gated_deltanet'") != std::string::npos);
    CHECK(m.find("'attention'") != std::string::npos);
    const auto e = check_message([&] { every_layer<K::gated_deltanet>::check(kinds); });
    CHECK(e.find("layer 2 ") != std::string::npos);
    const auto p = check_message([&] { pattern<"GGAGG">::check(kinds); });
    CHECK(p.find("expected 5 layers, found 6") != std::string::npos);
    const auto a = check_message([&] { any_of<K::gated_deltanet>::check(kinds); });
    CHECK(a.find("layer 2") != std::string::npos);
    // The lists also come from stacks built in code: no message assumes a checkpoint.
    for (const auto& msg : {m, e, p, a}) CHECK(msg.find("checkpoint") == std::string::npos);

    // Nemotron-H pattern strings.
    const auto nem = kinds_from_pattern("M-M*-");
    CHECK_NOTHROW(pattern<"M-M*-">::check(nem));
    const auto n2 = check_message([&] { pattern<"M-M*-">::check(kinds_from_pattern("M-MM-")); });
    CHECK(n2.find("layer 3") != std::string::npos);
    CHECK(n2.find("expected 'attention'") != std::string::npos);
    CHECK(n2.find("is 'mamba2'") != std::string::npos);
    // Kinds are open: any capital letter parses (a kind some mixer may declare, e.g. Nemotron-H's E for MoE), and a
    // schedule that does not use it rejects it, naming the letter; other characters are rejected at parse time.
    const auto moe = kinds_from_pattern("M-E");
    CHECK(moe[2] == layer_kind('E'));
    const auto me = check_message([&] { pattern<"M-M">::check(moe); });
    CHECK(me.find("kind 'E'") != std::string::npos);
    CHECK_THROWS_AS(kinds_from_pattern("M-e"), config_error);
    CHECK_THROWS_AS(kinds_from_pattern("M?M"), config_error);
    // A kind a mixer declares is found by its Hugging Face layer type.
    const kind_info swa{layer_kind('S', "sliding_attention"), {"sliding_attention"}};
    const auto st = kinds_from_layer_types(std::vector<std::string>{"sliding_attention", "full_attention"}, K::gated_deltanet,
                                           std::span<const kind_info>(&swa, 1));
    CHECK(st[0] == layer_kind('S'));
    CHECK(st[1] == K::attention);
    const auto bad = check_message([&] { kinds_from_layer_types(std::vector<std::string>{"linear_attention", "moe"}, K::mamba2); });
    CHECK(bad.find("'moe' at layer 1") != std::string::npos);
}
