// Oryx language models (models/oryx_lm.hpp; issue 10): a byte LM built by the trainer's spec, written in hymix's
// Oryx layout and loaded by auto_model, gives the stack's own logits under every mode schedule, in one call and split
// into prefill + decode calls (the facade's positions); config and tensor errors name their source; mode schedules
// are refused by models without per-token modes; block-random training through train_model lowers the loss and
// resumes to the identical loss curve, also on synthetic batches (recall tasks through train_setup::batches).

// GCC 12's false `__Y is used uninitialized` inside its AVX-512 intrinsics (bug 105593): see tests/mixer/test_oryx.cpp.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hymix/io/safetensors_reader.hpp"
#include "hymix/models/auto_model.hpp"
#include "hymix/models/oryx_lm.hpp"
#include "hymix/train/byte_lm.hpp"
#include "hymix/train/recall.hpp"
#include "hymix/train/trainer.hpp"
#include "support/random.hpp"

using namespace hymix;
namespace fs = std::filesystem;

namespace {

train::byte_lm_spec spec(const std::string& stack) {
    train::byte_lm_spec s;
    s.stack = stack;
    s.d_model = 32;
    s.n_layers = 2;
    s.head_dim = 8;
    s.linear_heads = 4;
    s.d_ff = 48;
    s.oryx_block_size = 4;
    return s;
}

/// A saved random Oryx byte LM (weights scaled up so that both read-outs matter) and the stack itself.
models::oryx_lm_stack saved_model(const std::string& stack, const fs::path& dir) {
    auto m = train::random_oryx_lm(spec(stack), 3);
    m.for_each_param([](const std::string& name, tensor<float>& t) {
        if (name.find("proj") != std::string::npos)
            for (auto& v : t.span()) v *= 4.f;
    });
    m.weights_changed();
    fs::remove_all(dir);
    train::save_hf(m, train::hf_config(spec(stack)), dir);
    return m;
}

std::vector<std::int32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

/// The step,tokens,loss prefix of every row of a run's loss.csv (times and tokens/s differ between runs).
std::vector<std::string> loss_curve(const fs::path& csv) {
    std::ifstream f(csv);
    std::vector<std::string> rows;
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) rows.push_back(line.substr(0, line.find(',', line.find(',', line.find(',') + 1) + 1)));
    return rows;
}
/// A corpus of `line` repeated n times, written to HYMIX_TEST_TMP/<name>.
train::byte_corpus repeated_text(const std::string& name, const char* line, int n) {
    const fs::path text = fs::path(HYMIX_TEST_TMP) / name;
    {
        std::ofstream f(text, std::ios::binary | std::ios::trunc);
        for (int i = 0; i < n; ++i) f << line;
    }
    return train::byte_corpus::load(text);
}

/// The options of the small train_model runs here: batches of 4 windows, 2 warmup steps, lr 1e-2, a loss row per step,
/// no progress bar and no held-out evaluation (a test that wants one sets eval_bytes).
train::train_options small_run(std::int64_t steps, std::int64_t seq_len) {
    train::train_options o;
    o.steps = steps;
    o.batch = 4;
    o.seq_len = seq_len;
    o.warmup = 2;
    o.adamw.lr = 1e-2;
    o.log_every = 1;
    o.eval_bytes = 0;
    o.progress = false;
    return o;
}

/// The loss of one loss_curve row.
double loss_of(const std::string& row) { return std::stod(row.substr(row.rfind(',') + 1)); }

}  // namespace

TEST_CASE("oryx LM: auto_model loads the Oryx layout and gives the stack's logits under each mode schedule, split or not") {
    const std::string text = "In the beginning God created the heaven and the earth.";
    const auto tok = bytes_of(text);
    const auto T = static_cast<std::int64_t>(tok.size());
    for (const std::string stack : {"oryx-gdn", "oryx-mamba2"}) {
        CAPTURE(stack);
        const fs::path dir = fs::path(HYMIX_TEST_TMP) / ("oryx_lm_" + stack);
        const auto m = saved_model(stack, dir);
        auto am = auto_model::load(dir, 2);
        CHECK(am.info().architecture == "OryxForCausalLM");
        CHECK(am.info().per_token_modes);
        CHECK(am.info().n_layers == 2);
        const cpu_backend be(2);
        const std::int64_t V = 256;
        std::vector<std::vector<float>> per_schedule;
        for (const std::string sched : {"all_linear", "all_attention", "periodic:3:4", "block_random:0.5:5:1"}) {
            CAPTURE(sched);
            const auto s = parse_mode_schedule(sched);
            am.set_mode_schedule(s);
            // The stack with the same modes.
            const auto b = seq_batch::dense(1, T);
            const auto modes = modes_for(dynamic_mode_schedule{s}, b, call_phase::prefill);
            auto c = m.make_cache(1);
            tensor<float> want({T, V});
            m.forward(be, c, b, tok, want.view<2>(), {}, std::span<const unsigned char>(modes));
            auto ac = am.make_cache(1);
            tensor<float> got({T, V});
            am.forward(ac, b, tok, got.view<2>());
            CHECK(test::rel_error(std::vector<float>(got.span().begin(), got.span().end()),
                                  std::vector<float>(want.span().begin(), want.span().end())) < 1e-6);
            per_schedule.emplace_back(got.span().begin(), got.span().end());
            // Split into a prefill of 20 and chunks of 7: the facade keeps positions, so the modes are the same.
            if (sched != "all_linear" && sched != "all_attention") {
                auto sc = am.make_cache(1);
                std::vector<float> split;
                for (std::int64_t t0 = 0; t0 < T;) {
                    const std::int64_t len = std::min<std::int64_t>(t0 == 0 ? 20 : 7, T - t0);
                    tensor<float> lg({len, V});
                    am.forward(sc, seq_batch::dense(1, len), std::span<const std::int32_t>(tok).subspan(static_cast<std::size_t>(t0), static_cast<std::size_t>(len)),
                               lg.view<2>());
                    split.insert(split.end(), lg.span().begin(), lg.span().end());
                    t0 += len;
                }
                CHECK(test::rel_error(split, per_schedule.back()) < 1e-5);
            }
        }
        CHECK(test::rel_error(per_schedule[0], per_schedule[1]) > 1e-3);  // the read-outs differ
        // linear_prefill_attention_decode: a linear prefill then attention decode steps = the stack with that list.
        am.set_mode_schedule(parse_mode_schedule("linear_prefill_attention_decode"));
        auto ac = am.make_cache(1);
        const std::int64_t P = T - 4;
        tensor<float> lg({P, V});
        am.forward(ac, seq_batch::dense(1, P), std::span<const std::int32_t>(tok).subspan(0, static_cast<std::size_t>(P)), lg.view<2>());
        std::vector<float> got(lg.span().begin(), lg.span().end());
        for (std::int64_t t = P; t < T; ++t) {
            tensor<float> one({1, V});
            am.forward(ac, seq_batch::dense(1, 1), std::span<const std::int32_t>(tok).subspan(static_cast<std::size_t>(t), 1), one.view<2>());
            got.insert(got.end(), one.span().begin(), one.span().end());
        }
        std::vector<unsigned char> modes(static_cast<std::size_t>(T), 0);
        for (std::int64_t t = P; t < T; ++t) modes[static_cast<std::size_t>(t)] = 1;
        auto c = m.make_cache(1);
        tensor<float> want({T, V});
        m.forward(be, c, seq_batch::dense(1, T), tok, want.view<2>(), {}, std::span<const unsigned char>(modes));
        CHECK(test::rel_error(got, std::vector<float>(want.span().begin(), want.span().end())) < 1e-5);
    }
}

TEST_CASE("oryx LM: config and tensor errors name their source; schedules need an Oryx model") {
    const fs::path dir = fs::path(HYMIX_TEST_TMP) / "oryx_lm_errors";
    saved_model("oryx-gdn", dir);
    const auto cfg_text = [&] {
        std::ifstream f(dir / "config.json");
        return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }();
    const auto write_cfg = [&](io::json j) {
        std::ofstream f(dir / "config.json", std::ios::trunc);
        f << j.dump(2);
    };
    const auto base = io::parse_json(cfg_text);
    auto bad = base;
    bad["linear_mixer"] = "rwkv";
    write_cfg(bad);
    CHECK_THROWS_WITH_AS(auto_model::load(dir, 1), doctest::Contains("linear_mixer"), config_error);
    bad = base;
    bad["head_dim"] = 7;
    write_cfg(bad);
    CHECK_THROWS_WITH_AS(auto_model::load(dir, 1), doctest::Contains("head_dim"), error);
    bad = base;
    bad["intermediate_size"] = 50;  // the MLP tensors say 48
    write_cfg(bad);
    CHECK_THROWS_WITH_AS(auto_model::load(dir, 1), doctest::Contains("intermediate_size"), shape_error);
    bad = base;
    bad.erase("num_heads");
    write_cfg(bad);
    CHECK_THROWS_WITH_AS(auto_model::load(dir, 1), doctest::Contains("num_heads"), config_error);
    write_cfg(base);
    auto am = auto_model::load(dir, 1);
    CHECK_THROWS_AS(am.set_mode_schedule(block_random{0, 0.5, 0}), config_error);
    // A model without per-token modes refuses a schedule.
    const fs::path mdir = fs::path(HYMIX_TEST_TMP) / "oryx_lm_not_oryx";
    auto ms = spec("mamba2");
    ms.head_dim = 16;
    ms.d_state = 8;
    auto mm = train::random_mamba2_lm(ms, 1);
    train::save_hf(mm, train::hf_config(ms), mdir);
    auto other = auto_model::load(mdir, 1);
    CHECK_FALSE(other.info().per_token_modes);
    CHECK_THROWS_WITH_AS(other.set_mode_schedule(all_linear{}), doctest::Contains("per-token"), config_error);
}

TEST_CASE("oryx LM: block-random training with train_model lowers the loss and resumes to the identical loss curve") {
    const fs::path dir = fs::path(HYMIX_TEST_TMP) / "oryx_lm_train";
    const auto corpus = repeated_text("oryx_lm_train.txt", "And God said, Let there be light: and there was light. ", 200);
    const auto s = spec("oryx-mamba2");
    auto o = small_run(30, 32);
    o.eval_bytes = 512;
    o.eval_window = 64;
    const cpu_backend be(2);
    const auto config = train::hf_config(s);
    fs::remove_all(dir);
    auto m = train::random_oryx_lm(s, 5);
    const auto full = train::train_model(be, m, corpus, o, train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1), dir, false);
    CHECK(full.steps_done == 30);
    CHECK(std::isfinite(full.heldout_bpb));
    // Interrupted after 11 steps, then resumed from the checkpoint.
    const fs::path dir2 = fs::path(HYMIX_TEST_TMP) / "oryx_lm_train_resume";
    fs::remove_all(dir2);
    auto m2 = train::random_oryx_lm(s, 5);
    auto o2 = o;
    o2.stop_after = 11;
    train::train_model(be, m2, corpus, o2, train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1), dir2, false);
    auto m3 = models::load_oryx_lm(train::latest_checkpoint(dir2));
    train::train_model(be, m3, corpus, o, train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1), dir2, true);
    // The loss columns are equal (times and tokens/s differ): compare the step,tokens,loss prefix of every row.
    const auto l1 = loss_curve(dir / "loss.csv"), l2 = loss_curve(dir2 / "loss.csv");
    REQUIRE(l1.size() >= 30);
    CHECK(l1 == l2);
    MESSAGE("first and last rows: " << l1.front() << " ... " << l1.back());
    // The loss falls.
    CHECK(loss_of(l1.back()) < 0.8 * loss_of(l1.front()));
}

TEST_CASE("train_model with frozen parameters: they stay bit-identical, checkpoints hold no moments for them, resume is exact") {
    const auto corpus = repeated_text("oryx_lm_frozen.txt", "In the beginning God created the heaven and the earth. ", 100);
    const auto s = spec("oryx-gdn");
    const auto config = train::hf_config(s);
    auto setup = train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1);
    const auto is_frozen = [](const std::string& n) { return n == "embedding" || n.rfind("layers.0.", 0) == 0; };
    setup.frozen = is_frozen;
    // Frozen alone (backward runs through layer 0), or layer 0 as a frozen prefix (forward only, no gradient tensors).
    for (const std::int64_t prefix : {0, 1}) {
        CAPTURE(prefix);
        setup.frozen_prefix = prefix;
        const auto o = small_run(8, 32);
        const cpu_backend be(2);
        const std::string tag = prefix ? "_prefix" : "";
        const fs::path dir = fs::path(HYMIX_TEST_TMP) / ("oryx_lm_frozen" + tag), dir2 = fs::path(HYMIX_TEST_TMP) / ("oryx_lm_frozen_resume" + tag);
        fs::remove_all(dir);
        fs::remove_all(dir2);
        // Folders that were there before a fresh run are not the run's: they stay.
        fs::create_directories(dir / "checkpoint-77");
        fs::create_directories(dir / "notes");
        auto m = train::random_oryx_lm(s, 5);
        std::vector<std::vector<float>> before;
        std::int64_t n_trained = 0;
        m.for_each_param([&](const std::string& n, tensor<float>& t) {
            if (is_frozen(n)) before.emplace_back(t.span().begin(), t.span().end());
            else ++n_trained;
        });
        REQUIRE(before.size() >= 2);
        REQUIRE(n_trained > 0);
        train::train_model(be, m, corpus, o, setup, dir, false);
        std::size_t k = 0;
        const safetensors::file rd(train::latest_checkpoint(dir) / "trainer_state.safetensors");
        m.for_each_param([&](const std::string& n, tensor<float>& t) {
            CAPTURE(n);
            CHECK(rd.contains(n + ".exp_avg") == !is_frozen(n));
            CHECK(rd.contains(n + ".exp_avg_sq") == !is_frozen(n));
            if (is_frozen(n)) CHECK(std::vector<float>(t.span().begin(), t.span().end()) == before[k++]);
        });
        auto m2 = train::random_oryx_lm(s, 5);
        auto o2 = o;
        o2.stop_after = 3;
        train::train_model(be, m2, corpus, o2, setup, dir2, false);
        auto m3 = models::load_oryx_lm(train::latest_checkpoint(dir2));
        // Leftovers of a crashed call of this run (a checkpoint older than `latest`'s, an unfinished one) go at the
        // resumed run's next save.
        fs::create_directories(dir2 / "checkpoint-1");
        fs::create_directories(dir2 / ".checkpoint-5.tmp");
        train::train_model(be, m3, corpus, o, setup, dir2, true);
        CHECK(loss_curve(dir / "loss.csv") == loss_curve(dir2 / "loss.csv"));
        auto folders = [](const fs::path& d) {
            std::vector<std::string> left;
            for (const auto& e : fs::directory_iterator(d))
                if (e.is_directory()) left.push_back(e.path().filename().string());
            std::sort(left.begin(), left.end());
            return left;
        };
        std::vector<std::string> want{train::latest_checkpoint(dir).filename().string(), "checkpoint-77", "notes"};
        std::sort(want.begin(), want.end());
        CHECK(folders(dir) == want);
        CHECK(folders(dir2) == std::vector<std::string>{train::latest_checkpoint(dir2).filename().string()});
    }
}

TEST_CASE("train_model: a call ending off a log boundary logs its own steps and resumes with the run's tokens; the interrupt "
          "flag stops a run after the step in hand, with its checkpoint") {
    const auto corpus = repeated_text("trainer_rows.txt", "And the evening and the morning were the first day. ", 100);
    const auto s = spec("oryx-gdn");
    const auto config = train::hf_config(s);
    const auto setup = train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1);
    auto o = small_run(20, 32);
    o.log_every = 10;
    const cpu_backend be(2);
    // All fields of every loss.csv row ("nan" parsed as a value).
    auto rows = [](const fs::path& csv) {
        std::vector<std::vector<double>> out;
        std::ifstream f(csv);
        std::string line;
        std::getline(f, line);
        while (std::getline(f, line)) {
            std::vector<double> r;
            std::istringstream is(line);
            for (std::string x; std::getline(is, x, ',');) r.push_back(x.empty() ? NAN : std::strtod(x.c_str(), nullptr));
            out.push_back(r);
        }
        return out;
    };
    const std::int64_t per_step = o.batch * o.seq_len;
    const fs::path dir = fs::path(HYMIX_TEST_TMP) / "trainer_rows";
    fs::remove_all(dir);
    auto o1 = o;
    o1.stop_after = 5;  // ends between log rows
    auto m = train::random_oryx_lm(s, 5);
    const auto r1 = train::train_model(be, m, corpus, o1, setup, dir, false);
    CHECK(r1.steps_done == 5);
    auto c1 = rows(dir / "loss.csv");
    REQUIRE(c1.size() == 1);
    CHECK(c1[0][0] == 5);
    CHECK(c1[0][1] == 5 * per_step);
    CHECK(std::isfinite(c1[0][2]));  // the mean loss of steps 1-5, not a copy of an earlier row
    CHECK(r1.final_loss == doctest::Approx(c1[0][2]).epsilon(1e-5));
    auto m2 = models::load_oryx_lm(train::latest_checkpoint(dir));
    const auto r2 = train::train_model(be, m2, corpus, o, setup, dir, true);
    CHECK(r2.resumed_from == 5);
    CHECK(r2.steps_done == 20);
    CHECK(r2.tokens == 20 * per_step);
    // The resumed call continues the log interval the stop cut (its row at 5 is replaced), so the curve is an
    // uninterrupted run's, rows and all.
    const auto c2 = rows(dir / "loss.csv");
    REQUIRE(c2.size() == 2);
    CHECK(c2[0][0] == 10);
    CHECK(c2[0][1] == 10 * per_step);
    CHECK(c2[1][0] == 20);
    CHECK(c2[1][1] == 20 * per_step);
    CHECK(c2[1][6] >= c1[0][6]);  // seconds keep counting the whole run
    const fs::path whole = fs::path(HYMIX_TEST_TMP) / "trainer_rows_whole";
    fs::remove_all(whole);
    auto mw = train::random_oryx_lm(s, 5);
    train::train_model(be, mw, corpus, o, setup, whole, false);
    CHECK(loss_curve(whole / "loss.csv") == loss_curve(dir / "loss.csv"));

    // The interrupt flag, raised during step 3 (as a signal handler would), ends the run after it with a checkpoint and
    // no held-out evaluation; a flag raised after the last step does not mark a finished run as interrupted.
    const fs::path dir3 = fs::path(HYMIX_TEST_TMP) / "trainer_interrupt";
    fs::remove_all(dir3);
    std::atomic<bool> stop{false};
    auto setup3 = setup;
    setup3.side = [&, inner = setup.side](const seq_batch& b, std::int64_t step, std::int64_t micro, std::vector<unsigned char>& out) {
        inner(b, step, micro, out);
        if (step == 2) stop = true;
    };
    auto o3 = o;
    o3.interrupt = &stop;
    auto m3 = train::random_oryx_lm(s, 5);
    const auto r3 = train::train_model(be, m3, corpus, o3, setup3, dir3, false);
    CHECK(r3.interrupted);
    CHECK(r3.steps_done == 3);
    CHECK(train::latest_checkpoint(dir3).filename() == "checkpoint-3");
    const auto c3 = rows(dir3 / "loss.csv");
    REQUIRE(c3.size() == 1);
    CHECK(c3[0][0] == 3);
    CHECK(c3[0][1] == 3 * per_step);
    auto o4 = o3;
    o4.steps = 3;
    stop = false;
    const fs::path dir4 = fs::path(HYMIX_TEST_TMP) / "trainer_interrupt_late";
    fs::remove_all(dir4);
    auto m4 = train::random_oryx_lm(s, 5);
    const auto r4 = train::train_model(be, m4, corpus, o4, setup3, dir4, false);  // raised during the last step
    CHECK(r4.steps_done == 3);
    CHECK_FALSE(r4.interrupted);
}

TEST_CASE("oryx LM: train_model on recall batches (train_setup::batches) lowers the answer loss, resumes exactly, refuses bad batches") {
    const auto corpus = repeated_text("oryx_lm_recall.txt", "And God said, Let there be light: and there was light. ", 100);
    const train::recall_haystack hay(std::span<const std::uint8_t>(corpus.bytes).first(static_cast<std::size_t>(corpus.train_end)));
    const std::vector<train::recall_task> tasks{train::mqar_task(48, 8), train::needle_task(48, 2)};
    const auto s = spec("oryx-gdn");
    const auto config = train::hf_config(s);
    auto setup = train::oryx_setup<models::oryx_lm_stack>(config, s.oryx_block_size, 0.5, 1);
    setup.batches = [&](std::int64_t step, std::int64_t micro, std::int64_t n_seq) {
        return train::make_recall_batch(std::span<const train::recall_task>(tasks), hay, n_seq, 7,
                                        static_cast<std::uint64_t>((step * 8 + micro) * n_seq));
    };
    const auto o = small_run(24, 48);  // no text evaluation
    const cpu_backend be(2);
    const fs::path dir = fs::path(HYMIX_TEST_TMP) / "oryx_lm_recall", dir2 = fs::path(HYMIX_TEST_TMP) / "oryx_lm_recall_resume";
    fs::remove_all(dir);
    fs::remove_all(dir2);
    auto m = train::random_oryx_lm(s, 5);
    const auto full = train::train_model(be, m, corpus, o, setup, dir, false);
    CHECK(full.steps_done == 24);
    CHECK(full.tokens == 24 * 4 * 48);
    auto m2 = train::random_oryx_lm(s, 5);
    auto o2 = o;
    o2.stop_after = 9;
    train::train_model(be, m2, corpus, o2, setup, dir2, false);
    auto m3 = models::load_oryx_lm(train::latest_checkpoint(dir2));
    train::train_model(be, m3, corpus, o, setup, dir2, true);
    const auto l1 = loss_curve(dir / "loss.csv"), l2 = loss_curve(dir2 / "loss.csv");
    REQUIRE(l1.size() >= 24);
    CHECK(l1 == l2);
    // Only the answers are scored: the loss starts near ln 256 and falls as the model moves its mass to the 64 values
    // (measured: 5.55 -> 4.70 nats in 24 steps).
    MESSAGE("answer loss: " << l1.front() << " ... " << l1.back());
    CHECK(loss_of(l1.front()) > std::log(128.0));
    CHECK(loss_of(l1.back()) < loss_of(l1.front()) - 0.6);
    // A source that returns batches of another shape is refused, naming both shapes.
    auto bad = setup;
    bad.batches = [&](std::int64_t, std::int64_t, std::int64_t n_seq) {
        return train::make_recall_batch(train::mqar_task(40, 4), hay, n_seq, 7);
    };
    fs::remove_all(dir);
    auto m4 = train::random_oryx_lm(s, 5);
    CHECK_THROWS_WITH_AS(train::train_model(be, m4, corpus, o, bad, dir, false), doctest::Contains("4 x 48 was asked"), shape_error);
}

TEST_CASE("oryx LM: 16- and 8-bit projection weights give the rounded / dequantized f32 model's logits in both read-outs") {
    const auto tok = bytes_of("And God said, Let there be light: and there was light.");
    const auto T = static_cast<std::int64_t>(tok.size());
    const std::int64_t V = 256;
    const cpu_backend be(2);
    for (const std::string stack : {"oryx-gdn", "oryx-mamba2"}) {
        CAPTURE(stack);
        const auto m = train::random_oryx_lm(spec(stack), 5);
        for (dtype d : {dtype::bf16, dtype::i8}) {
            CAPTURE(weight_dtype_name(d));
            auto stored = m;
            stored.store_weights_as(d);
            CHECK(stored.weight_dtype() == d);
            auto rounded = stored;
            rounded.store_weights_as(dtype::f32);
            for (const std::string sched : {"all_linear", "all_attention", "periodic:3:4"}) {
                CAPTURE(sched);
                const auto b = seq_batch::dense(1, T);
                const auto modes = modes_for(dynamic_mode_schedule{parse_mode_schedule(sched)}, b, call_phase::prefill);
                auto logits = [&](const auto& model) {
                    auto c = model.make_cache(1);
                    tensor<float> out({T, V});
                    model.forward(be, c, b, tok, out.view<2>(), {}, std::span<const unsigned char>(modes));
                    return std::vector<float>(out.data(), out.data() + out.numel());
                };
                const auto a = logits(stored), r = logits(rounded), f = logits(m);
                double amax = 0, diff = 0, qerr = 0;
                for (std::size_t i = 0; i < a.size(); ++i) {
                    amax = std::max(amax, std::abs(double(r[i])));
                    diff = std::max(diff, std::abs(double(a[i]) - r[i]));
                    qerr = std::max(qerr, std::abs(double(f[i]) - r[i]));
                }
                if (d == dtype::bf16)
                    CHECK(a == r);  // bit for bit: 16-bit weights are widened exactly
                else
                    CHECK(diff <= 1e-5 * amax);  // the dequantized model, summed in another order
                CHECK(qerr > 0);
            }
        }
    }
}
