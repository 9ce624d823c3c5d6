// Hugging Face config.json reading: non-standard float spellings, error positions, typed look-ups,
// and the three shared checkpoints' configs.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "hymix/io/json.hpp"
#include "support/shared.hpp"

using namespace hymix;
using hymix::io::json;

namespace {


template <class E, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("expected an exception");
    return {};
}

}  // namespace

TEST_CASE("bare Infinity / -Infinity / NaN tokens become numbers") {
    const json j = io::parse_json(R"({"a": [0.0, Infinity], "b": -Infinity, "c": NaN, "d": [NaN,-Infinity,Infinity]})");
    CHECK(j["a"][0].get<double>() == 0.0);
    CHECK(j["a"][1].is_number_float());
    CHECK(j["a"][1].get<double>() == std::numeric_limits<double>::infinity());
    CHECK(j["b"].get<double>() == -std::numeric_limits<double>::infinity());
    CHECK(std::isnan(j["c"].get<double>()));
    CHECK(std::isnan(j["d"][0].get<double>()));
    CHECK(j["d"][1].get<double>() == -std::numeric_limits<double>::infinity());
    CHECK(j["d"][2].get<double>() == std::numeric_limits<double>::infinity());
    // a bare token as the whole document
    CHECK(io::parse_json("Infinity").get<double>() == std::numeric_limits<double>::infinity());
    CHECK(std::isnan(io::parse_json(" NaN\n").get<double>()));
}

TEST_CASE("{\"__float__\": ...} objects become numbers, anywhere") {
    const json j = io::parse_json(
        R"({"time_step_limit": [0.0, {"__float__": "Infinity"}], "x": {"__float__": "-Infinity"},
            "n": {"y": [{"__float__": "NaN"}]}})");
    CHECK(j["time_step_limit"][1].get<double>() == std::numeric_limits<double>::infinity());
    CHECK(j["x"].get<double>() == -std::numeric_limits<double>::infinity());
    CHECK(std::isnan(j["n"]["y"][0].get<double>()));
    // an object with more keys is left alone
    const json k = io::parse_json(R"({"o": {"__float__": "NaN", "other": 1}})");
    CHECK(k["o"].is_object());
    // unknown spelling is a format error naming the value
    const auto msg = message_of<format_error>([] { io::parse_json(R"({"a": {"__float__": "inf"}})", "cfg.json"); });
    CHECK(msg.find("cfg.json") != std::string::npos);
    CHECK(msg.find("inf") != std::string::npos);
    CHECK_THROWS_AS(io::parse_json(R"({"a": {"__float__": 1.0}})"), format_error);
}

TEST_CASE("text inside strings is never rewritten") {
    const json j = io::parse_json(R"({"Infinity": "NaN and -Infinity", "s": "a \"NaN\" b", "NaN": [Infinity]})");
    CHECK(j["Infinity"].get<std::string>() == "NaN and -Infinity");
    CHECK(j["s"].get<std::string>() == "a \"NaN\" b");
    CHECK(j["NaN"][0].get<double>() == std::numeric_limits<double>::infinity());
    // escaped backslash right before the closing quote
    const json k = io::parse_json(R"(["x\\", NaN])");
    CHECK(k[0].get<std::string>() == "x\\");
    CHECK(std::isnan(k[1].get<double>()));
}

TEST_CASE("tokens glued to other characters are not rewritten and fail to parse") {
    CHECK_THROWS_AS(io::parse_json("[NaNx]"), format_error);
    CHECK_THROWS_AS(io::parse_json("[xNaN]"), format_error);
    CHECK_THROWS_AS(io::parse_json("[Infinity1]"), format_error);
    CHECK_THROWS_AS(io::parse_json("[--Infinity]"), format_error);
    CHECK_THROWS_AS(io::parse_json("[infinity]"), format_error);
}

TEST_CASE("malformed JSON reports the origin and the position in the original text") {
    // Line 3, column 13 is the stray 'x'; the rewrite of the earlier Infinity must not shift it.
    const std::string text = "{\n  \"a\": [Infinity, 1],\n  \"b\": tru x\n}";
    const auto msg = message_of<format_error>([&] { io::parse_json(text, "model/config.json"); });
    CHECK(msg.find("model/config.json") != std::string::npos);
    CHECK(msg.find("line 3") != std::string::npos);
    CHECK(msg.find("column") != std::string::npos);
    const auto msg2 = message_of<format_error>([] { io::parse_json("{\"a\": 1,}", "c.json"); });
    CHECK(msg2.find("line 1, column 9") != std::string::npos);
    CHECK_THROWS_AS(io::parse_json("", "empty.json"), format_error);
    CHECK_THROWS_AS(io::parse_json("{\"a\": 1} trailing"), format_error);
    CHECK_THROWS_AS(io::parse_json("{\"a\": \"unterminated}"), format_error);
    CHECK_THROWS_AS(io::parse_json("\"\xff\xfe\""), format_error);  // invalid UTF-8
}

TEST_CASE("excessive nesting is a format error, not a stack overflow") {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const auto msg = message_of<format_error>([&] { io::parse_json(deep, "deep.json"); });
    CHECK(msg.find("nested deeper") != std::string::npos);
    const std::string ok = std::string(50, '[') + std::string(50, ']');
    CHECK_NOTHROW(io::parse_json(ok));
}

TEST_CASE("require / get: values, defaults and typed errors naming file and key") {
    const json j = io::parse_json(R"({"n": 256, "neg": -3, "f": 1e-05, "whole": 64.0, "b": true, "s": "silu",
        "v": [0.0, Infinity], "iv": [1, 2, 3], "nul": null, "big": 300, "o": {"k": 1}})",
                                  "config.json");
    CHECK(io::require<int>(j, "n", "config.json") == 256);
    CHECK(io::require<std::int64_t>(j, "neg") == -3);
    CHECK(io::require<double>(j, "f") == doctest::Approx(1e-5));
    CHECK(io::require<float>(j, "n") == 256.0f);
    CHECK(io::require<int>(j, "whole") == 64);
    CHECK(io::require<bool>(j, "b"));
    CHECK(io::require<std::string>(j, "s") == "silu");
    const auto v = io::require<std::vector<double>>(j, "v");
    REQUIRE(v.size() == 2);
    CHECK(std::isinf(v[1]));
    CHECK(io::require<std::vector<int>>(j, "iv") == std::vector<int>{1, 2, 3});
    CHECK(io::get<int>(j, "absent", 7) == 7);
    CHECK(io::get<int>(j, "nul", 9) == 9);
    CHECK(io::get<int>(j, "n", 9) == 256);
    CHECK(io::get<std::string>(j, "s", "x") == "silu");
    CHECK(io::require_object(j, "o", "config.json")["k"] == 1);
    CHECK(io::has(j, "n"));
    CHECK_FALSE(io::has(j, "nul"));
    CHECK_FALSE(io::has(j, "absent"));

    auto msg = message_of<config_error>([&] { io::require<int>(j, "s", "config.json"); });
    CHECK(msg.find("config.json") != std::string::npos);
    CHECK(msg.find("'s'") != std::string::npos);
    CHECK(msg.find("expected integer") != std::string::npos);
    CHECK(msg.find("found string \"silu\"") != std::string::npos);

    msg = message_of<config_error>([&] { io::require<int>(j, "missing", "config.json"); });
    CHECK(msg.find("missing required key 'missing'") != std::string::npos);
    CHECK(msg.find("config.json") != std::string::npos);

    msg = message_of<config_error>([&] { io::require<int>(j, "f", "config.json"); });
    CHECK(msg.find("found float") != std::string::npos);

    msg = message_of<config_error>([&] { io::require<std::uint32_t>(j, "neg", "config.json"); });
    CHECK(msg.find("range") != std::string::npos);
    msg = message_of<config_error>([&] { io::require<std::int8_t>(j, "big", "config.json"); });
    CHECK(msg.find("range") != std::string::npos);

    msg = message_of<config_error>([&] { io::require<std::vector<int>>(j, "v", "config.json"); });
    CHECK(msg.find("'v[1]'") != std::string::npos);  // v[0] = 0.0 is integral, v[1] = inf is not

    msg = message_of<config_error>([&] { io::require<int>(j, "nul", "config.json"); });
    CHECK(msg.find("found null") != std::string::npos);

    CHECK_THROWS_AS(io::get<bool>(j, "n", false), config_error);  // wrong type is not silently defaulted
    CHECK_THROWS_AS(io::require<std::string>(j, "n"), config_error);
    CHECK_THROWS_AS(io::require_object(j, "n"), config_error);
    CHECK_THROWS_AS(io::require<int>(json::array(), "n"), config_error);
}

TEST_CASE("read_json_file: missing file is io_error with the path; bad file is format_error") {
    const auto missing = test::tmp_dir() / "io_json_no_such_file.json";
    std::filesystem::remove(missing);
    const auto msg = message_of<io_error>([&] { io::read_json_file(missing); });
    CHECK(msg.find(missing.string()) != std::string::npos);
    CHECK(msg.find("No such file") != std::string::npos);

    const auto bad = test::tmp_dir() / "io_json_bad.json";
    {
        std::ofstream f(bad);
        f << "{\"a\": [1, 2,, 3]}";
    }
    const auto msg2 = message_of<format_error>([&] { io::read_json_file(bad); });
    CHECK(msg2.find(bad.string()) != std::string::npos);
    CHECK(msg2.find("line 1") != std::string::npos);

    const auto good = test::tmp_dir() / "io_json_good.json";
    {
        std::ofstream f(good);
        f << "{\"time_step_limit\": [0.0, Infinity], \"eps\": NaN}\n";
    }
    const json j = io::read_json_file(good);
    CHECK(std::isinf(j["time_step_limit"][1].get<double>()));
    CHECK(std::isnan(j["eps"].get<double>()));
}

TEST_CASE("the shared checkpoints' config.json files parse") {
    HYMIX_REQUIRE_SHARED("models/kjv-mamba2-byte/config.json");
    const auto dir = test::shared_dir() / "models";
    const json m = io::read_json_file(dir / "kjv-mamba2-byte/config.json");
    const auto origin = (dir / "kjv-mamba2-byte/config.json").string();
    CHECK(io::require<std::string>(m, "model_type", origin) == "mamba2");
    CHECK(io::require<int>(m, "hidden_size", origin) == 256);
    CHECK(io::require<int>(m, "num_heads", origin) == 8);
    CHECK(io::require<int>(m, "state_size", origin) == 64);
    const auto lim = io::require<std::vector<double>>(m, "time_step_limit", origin);
    REQUIRE(lim.size() == 2);
    CHECK(lim[0] == 0.0);
    CHECK(lim[1] == std::numeric_limits<double>::infinity());
    CHECK(io::get<int>(m, "bos_token_id", -1, origin) == -1);  // null in the file

    // the same file as Python's default encoder writes it: bare Infinity instead of the __float__ object
    std::string text = io::read_text_file(dir / "kjv-mamba2-byte/config.json");
    const auto at = text.find("{", text.find("\"time_step_limit\""));
    const auto close = text.find("}", at);
    REQUIRE(at != std::string::npos);
    REQUIRE(close != std::string::npos);
    text.replace(at, close - at + 1, "Infinity");
    const json bare = io::parse_json(text, "bare.json");
    CHECK(io::require<std::vector<double>>(bare, "time_step_limit")[1] == std::numeric_limits<double>::infinity());
    CHECK(bare.size() == m.size());

    for (const char* name : {"kjv-gdn-byte", "kjv-hybrid-byte"}) {
        HYMIX_REQUIRE_SHARED(std::string("models/") + name + "/config.json");
        const json q = io::read_json_file(dir / name / "config.json");
        CHECK(io::require<std::string>(q, "model_type") == "qwen3_5_text");
        CHECK(io::require<int>(q, "hidden_size") == 256);
        CHECK(io::require<std::vector<std::string>>(q, "layer_types").size() == 6);
        CHECK(io::require_object(q, "rope_parameters").contains("rope_theta"));
    }
}
