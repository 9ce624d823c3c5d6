// Oryx mode schedules (schedule/mode_schedule.hpp, spec.md §6.5–6.6): the named inference schedules per phase,
// periodic blocks, block-random draws (reproducible from the seed, constant over blocks of 128, p ≈ p_attention over
// many blocks, independent of how a sequence is split into calls), explicit lists, per-row bytes of a seq_batch, the
// run-time parser and its errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "hymix/schedule/mode_schedule.hpp"

using namespace hymix;

namespace {
std::vector<unsigned char> for_one(const auto& s, std::int64_t T, call_phase ph = call_phase::prefill, std::int64_t past = 0,
                                   std::uint64_t id = 0) {
    const std::vector<std::int64_t> p{past};
    const std::vector<std::uint64_t> ids{id};
    return modes_for(s, seq_batch::dense(1, T), ph, p, ids);
}
}  // namespace

TEST_CASE("mode schedules: the named inference schedules") {
    const auto b = seq_batch::packed(std::vector<std::int64_t>{0, 3, 3, 7});
    CHECK(modes_for(all_linear{}, b) == std::vector<unsigned char>(7, 0));
    CHECK(modes_for(all_attention{}, b) == std::vector<unsigned char>(7, 1));
    const linear_prefill_attention_decode lpad;
    CHECK(modes_for(lpad, b, call_phase::prefill) == std::vector<unsigned char>(7, 0));
    CHECK(modes_for(lpad, b, call_phase::decode) == std::vector<unsigned char>(7, 1));
    // without a phase: decode when every sequence has one token
    const auto dec = seq_batch::decode(std::vector<std::int64_t>{4, 1});
    CHECK(modes_for(lpad, dec) == std::vector<unsigned char>(2, 1));
    CHECK(modes_for(lpad, b) == std::vector<unsigned char>(7, 0));
    // rows outside every sequence are 0
    seq_batch pad = seq_batch::padded(4, std::vector<std::int64_t>{2, 3});
    CHECK(modes_for(all_attention{}, pad) == std::vector<unsigned char>{1, 1, 0, 0, 1, 1, 1, 0});
}

TEST_CASE("mode schedules: periodic(every, block) puts one attention block every `every` blocks") {
    periodic_modes p{4, 3, 0};
    p.validate();
    const auto m = for_one(p, 26);
    for (std::int64_t t = 0; t < 26; ++t) CHECK(m[static_cast<std::size_t>(t)] == ((t / 3) % 4 == 0 ? 1 : 0));
    // continuing at n_past = 10 gives the same modes as the whole list
    const auto tail = for_one(p, 16, call_phase::decode, 10);
    CHECK(std::vector<unsigned char>(m.begin() + 10, m.end()) == tail);
    const auto shifted = for_one(periodic_modes{4, 3, 3}, 12);
    CHECK(shifted == std::vector<unsigned char>{0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
    CHECK(for_one(periodic_modes{1, 5, 0}, 9) == std::vector<unsigned char>(9, 1));
    CHECK_THROWS_AS((periodic_modes{0, 3, 0}.validate()), config_error);
    CHECK_THROWS_AS((periodic_modes{2, 0, 0}.validate()), config_error);
    CHECK_THROWS_AS((periodic_modes{2, 3, 2}.validate()), config_error);
}

TEST_CASE("mode schedules: block_random draws per sequence and block of 128, reproducibly, with p ≈ p_attention") {
    block_random r;  // defaults: blocks of 128, p = 0.5
    r.seed = 1234;
    CHECK(r.block_size == 128);
    CHECK(r.p_attention == 0.5);
    const std::int64_t T = 128 * 40 + 17;
    const auto a = for_one(r, T, call_phase::prefill, 0, 7);
    CHECK(a == for_one(r, T, call_phase::prefill, 0, 7));  // reproducible from the seed
    for (std::int64_t t = 0; t < T; ++t) CHECK(a[static_cast<std::size_t>(t)] == a[static_cast<std::size_t>(t / 128 * 128)]);  // blocks of 128
    // a sequence split into calls (n_past) gets the same draws
    CHECK(std::vector<unsigned char>(a.begin() + 300, a.end()) == for_one(r, T - 300, call_phase::prefill, 300, 7));
    // another seed, another sequence: other draws
    block_random r2 = r;
    r2.seed = 1235;
    CHECK(for_one(r2, T, call_phase::prefill, 0, 7) != a);
    CHECK(for_one(r, T, call_phase::prefill, 0, 8) != a);
    // packed: each sequence of a batch is drawn on its own (ids 0, 1, ...), the same as alone
    const auto b = seq_batch::packed(std::vector<std::int64_t>{0, 300, 700});
    const auto packed = modes_for(r, b, call_phase::prefill);
    CHECK(std::vector<unsigned char>(packed.begin(), packed.begin() + 300) == for_one(r, 300, call_phase::prefill, 0, 0));
    CHECK(std::vector<unsigned char>(packed.begin() + 300, packed.end()) == for_one(r, 400, call_phase::prefill, 0, 1));
    // p ≈ p_attention over many blocks (4σ bounds), and the extremes exact
    for (double p : {0.5, 0.1, 0.9}) {
        block_random q;
        q.p_attention = p;
        q.seed = 99;
        const std::int64_t n_blocks = 20000;
        std::int64_t att = 0;
        for (std::uint64_t seq = 0; seq < 10; ++seq)
            for (std::int64_t blk = 0; blk < n_blocks / 10; ++blk) att += q.mode(seq, blk * 128, call_phase::prefill) == token_mode::attention;
        const double frac = static_cast<double>(att) / n_blocks, sigma = std::sqrt(p * (1 - p) / n_blocks);
        INFO("p = " << p << ": attention fraction " << frac);
        CHECK(std::abs(frac - p) < 4 * sigma);
    }
    block_random none = r, all = r;
    none.p_attention = 0.0;
    all.p_attention = 1.0;
    CHECK(for_one(none, 1000) == std::vector<unsigned char>(1000, 0));
    CHECK(for_one(all, 1000) == std::vector<unsigned char>(1000, 1));
    block_random bad;
    bad.p_attention = 1.5;
    CHECK_THROWS_AS(bad.validate(), config_error);
    bad = block_random{};
    bad.block_size = 0;
    CHECK_THROWS_AS(bad.validate(), config_error);
}

TEST_CASE("mode schedules: explicit lists") {
    using tm = token_mode;
    mode_list shared{{{tm::attention, tm::linear, tm::linear, tm::attention}}, std::nullopt};
    CHECK(for_one(shared, 4) == std::vector<unsigned char>{1, 0, 0, 1});
    CHECK(for_one(shared, 2, call_phase::decode, 2) == std::vector<unsigned char>{0, 1});
    CHECK_THROWS_AS(for_one(shared, 5), value_error);  // past the end, no `beyond`
    shared.beyond = tm::linear;
    CHECK(for_one(shared, 6) == std::vector<unsigned char>{1, 0, 0, 1, 0, 0});
    mode_list per_seq{{{tm::attention, tm::attention}, {tm::linear, tm::attention}}, std::nullopt};
    const auto b = seq_batch::packed(std::vector<std::int64_t>{0, 2, 4});
    CHECK(modes_for(per_seq, b, call_phase::prefill) == std::vector<unsigned char>{1, 1, 0, 1});
    const std::vector<std::uint64_t> ids{1, 0};
    CHECK(modes_for(per_seq, b, call_phase::prefill, {}, ids) == std::vector<unsigned char>{0, 1, 1, 1});
    const std::vector<std::uint64_t> bad_ids{2, 0};
    CHECK_THROWS_AS(modes_for(per_seq, b, call_phase::prefill, {}, bad_ids), value_error);
    CHECK_THROWS_AS(modes_for(mode_list{}, b, call_phase::prefill), value_error);
}

TEST_CASE("mode schedules: fill_modes argument checks") {
    const auto b = seq_batch::dense(2, 3);
    std::vector<unsigned char> out(5);
    CHECK_THROWS_AS(fill_modes(all_linear{}, b, call_phase::prefill, out), shape_error);
    const std::vector<std::int64_t> past{1};
    CHECK_THROWS_AS(modes_for(all_linear{}, b, call_phase::prefill, past), shape_error);
    const std::vector<std::uint64_t> ids{1, 2, 3};
    CHECK_THROWS_AS(modes_for(all_linear{}, b, call_phase::prefill, {}, ids), shape_error);
}

TEST_CASE("mode schedules: parsed by name at run time") {
    auto mode_of = [](const any_mode_schedule& s, std::int64_t pos, call_phase ph = call_phase::prefill) {
        return dynamic_mode_schedule{s}.mode(0, pos, ph);
    };
    CHECK(mode_of(parse_mode_schedule("all_linear"), 5) == token_mode::linear);
    CHECK(mode_of(parse_mode_schedule("all_attention"), 5) == token_mode::attention);
    const auto lpad = parse_mode_schedule("linear_prefill_attention_decode");
    CHECK(mode_of(lpad, 5) == token_mode::linear);
    CHECK(mode_of(lpad, 5, call_phase::decode) == token_mode::attention);
    const auto per = std::get<periodic_modes>(parse_mode_schedule("periodic:8:64:2"));
    CHECK(per.every == 8);
    CHECK(per.block == 64);
    CHECK(per.offset == 2);
    CHECK(std::get<periodic_modes>(parse_mode_schedule("periodic:10")).block == 128);
    const auto br = std::get<block_random>(parse_mode_schedule("block_random:0.25:32:7"));
    CHECK(br.p_attention == 0.25);
    CHECK(br.block_size == 32);
    CHECK(br.seed == 7);
    CHECK(std::get<block_random>(parse_mode_schedule("block_random")).block_size == 128);
    CHECK(modes_for(dynamic_mode_schedule{parse_mode_schedule("periodic:2:1")}, seq_batch::dense(1, 4), call_phase::prefill) ==
          std::vector<unsigned char>{1, 0, 1, 0});
    for (const char* bad : {"", "sometimes", "all_linear:3", "periodic", "periodic:x", "periodic:0", "periodic:4:8:4", "block_random:2",
                            "block_random:0.5:0", "block_random:half"})
        CHECK_THROWS_AS(parse_mode_schedule(bad), config_error);
}
