// safetensors reader / writer / sharded index: every malformed-file case gets a specific format_error,
// round trips for every dtype, zero-copy views into the mapping, and the shared checkpoints.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "hymix/io/safetensors.hpp"
#include "support/random.hpp"
#include "support/shared.hpp"

using namespace hymix;
namespace st = hymix::safetensors;

namespace {

/// File image: 8-byte little-endian length, header text, then `data_bytes` bytes (values 0, 1, 2, ...).
std::string image(const std::string& header, std::size_t data_bytes = 0) {
    std::string s(8, '\0');
    const std::uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) s[static_cast<std::size_t>(b)] = static_cast<char>((n >> (8 * b)) & 0xffu);
    s += header;
    for (std::size_t i = 0; i < data_bytes; ++i) s.push_back(static_cast<char>(i & 0x7f));
    return s;
}

std::filesystem::path write_temp(const std::string& name, const std::string& bytes) {
    const auto p = test::tmp_dir() / name;
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
}

/// Opens the bytes as a file on disk and returns the format_error message (fails the test if none).
std::string format_error_of(const std::string& bytes, const std::string& name = "io_st_bad.safetensors") {
    const auto p = write_temp(name, bytes);
    try {
        st::file f(p);
        FAIL("expected format_error for " << name);
    } catch (const format_error& e) {
        const std::string msg = e.what();
        CHECK_MESSAGE(msg.find(p.string()) != std::string::npos, msg);  // names the file
        // the in-memory parser must agree
        std::vector<std::byte> b(bytes.size());
        if (!bytes.empty()) std::memcpy(b.data(), bytes.data(), bytes.size());
        CHECK_THROWS_AS(st::file::from_bytes(b, "mem"), format_error);
        return msg;
    }
    return {};
}

bool has(const std::string& msg, const std::string& s) { return msg.find(s) != std::string::npos; }

const std::string one_f32 = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

}  // namespace

// ---- malformed files ------------------------------------------------------------------------------

TEST_CASE("file shorter than 8 bytes") {
    CHECK(has(format_error_of("", "io_st_empty.safetensors"), "0 bytes"));
    CHECK(has(format_error_of("abcde", "io_st_short.safetensors"), "shorter than the 8-byte"));
}

TEST_CASE("header length larger than the file") {
    std::string b = image("{}");
    b[0] = 100;
    const auto msg = format_error_of(b);
    CHECK(has(msg, "header length 100"));
    CHECK(has(msg, "2 bytes"));
    std::string huge(8, '\xff');
    CHECK(has(format_error_of(huge), "header length 18446744073709551615"));
    // A damaged length before a JSON header is not called another kind of file; text is.
    CHECK_FALSE(has(msg, "not a safetensors file"));
    const auto text = format_error_of("In the beginning God created the heaven and the earth.\n", "io_st_text.safetensors");
    CHECK(has(text, "header length"));
    CHECK(has(text, "this is not a safetensors file"));
}

TEST_CASE("header not JSON / not an object / too deep") {
    CHECK(has(format_error_of(image("{\"t\": ")), "not valid JSON"));
    CHECK(has(format_error_of(image("hello!!!")), "not valid JSON"));
    CHECK(has(format_error_of(image("")), "not valid JSON"));
    CHECK(has(format_error_of(image("[1, 2]  ")), "must be a JSON object, found array"));
    CHECK(has(format_error_of(image("42")), "found integer"));
    CHECK(has(format_error_of(image(std::string(5000, '[') + std::string(5000, ']'))), "nested deeper"));
    CHECK(has(format_error_of(image("{\"a\":\"\xff\"}")), "not valid JSON"));  // invalid UTF-8
}

TEST_CASE("tensor entry not an object, or missing dtype / shape / data_offsets") {
    CHECK(has(format_error_of(image(R"({"w": [1, 2]})")), "'w': header entry must be an object, found array"));
    CHECK(has(format_error_of(image(R"({"w": {"shape":[1],"data_offsets":[0,4]}})")), "'w': header entry has no 'dtype'"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","data_offsets":[0,4]}})")), "no 'shape'"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":[1]}})")), "no 'data_offsets'"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":4,"shape":[1],"data_offsets":[0,4]}})")), "'dtype' must be a string"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":7,"data_offsets":[0,4]}})")), "'shape' must be an array"));
}

TEST_CASE("unknown dtype") {
    const auto msg = format_error_of(image(R"({"w": {"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1));
    CHECK(has(msg, "'w'"));
    CHECK(has(msg, "F8_E4M3"));
    CHECK(has(msg, "expected one of"));
}

TEST_CASE("negative, non-integer and overflowing shape entries") {
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
              "shape[0] must be a non-negative integer, found -2"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":[2, 1.5],"data_offsets":[0,8]}})", 8)),
              "shape[1] must be a non-negative integer, found 1.5"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8)),
              "found \"2\""));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":[4294967296, 4294967296],"data_offsets":[0,8]}})", 8)),
              "overflows"));
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})", 8)),
              "shape[0] must be a non-negative integer"));
    // a zero dimension does not hide an overflow of the other dimensions
    CHECK(has(format_error_of(image(R"({"w": {"dtype":"F64","shape":[0, 4294967296, 4294967296],"data_offsets":[0,0]}})")),
              "overflows"));
}

TEST_CASE("data_offsets not two non-negative integers") {
    for (const char* bad : {"[0]", "[0,4,8]", "[-1,4]", "[0,\"4\"]", "[0,4.0]", "{\"a\":0}", "null"}) {
        const auto msg = format_error_of(
            image(std::string(R"({"w": {"dtype":"F32","shape":[1],"data_offsets":)") + bad + "}}", 8));
        CHECK_MESSAGE(has(msg, "'data_offsets' must be two non-negative integers"), bad);
    }
}

TEST_CASE("data_offsets out of range, reversed, wrong length, overlapping") {
    auto msg = format_error_of(image(R"({"w": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8));
    CHECK(has(msg, "[4, 12] out of range of the 8-byte data section"));
    msg = format_error_of(image(R"({"w": {"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8));
    CHECK(has(msg, "reversed"));
    msg = format_error_of(image(R"({"w": {"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
    CHECK(has(msg, "span 8 bytes, expected 12"));
    msg = format_error_of(image(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                    "b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
    CHECK(has(msg, "'a' [0, 8]"));
    CHECK(has(msg, "'b' [4, 12]"));
    CHECK(has(msg, "overlap"));
    // the same range twice also overlaps
    msg = format_error_of(image(R"({"a": {"dtype":"I32","shape":[2],"data_offsets":[0,8]},
                                    "b": {"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
    CHECK(has(msg, "overlap"));
}

TEST_CASE("duplicate tensor names and duplicate keys") {
    auto msg = format_error_of(image("{" + one_f32 + "," + one_f32 + "}", 8));
    CHECK(has(msg, "duplicate tensor name 't'"));
    msg = format_error_of(image(R"({"t":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})", 8));
    CHECK(has(msg, "duplicate key 'dtype'"));
}

TEST_CASE("__metadata__ must map strings to strings") {
    CHECK(has(format_error_of(image(R"({"__metadata__": {"format": 1}})")), "'__metadata__' value for 'format'"));
    CHECK(has(format_error_of(image(R"({"__metadata__": [1]})")), "'__metadata__' must be an object"));
}

TEST_CASE("missing file is io_error with path and reason; missing tensor names tensor and file") {
    const auto p = test::tmp_dir() / "io_st_does_not_exist.safetensors";
    std::filesystem::remove(p);
    try {
        st::file f(p);
        FAIL("expected io_error");
    } catch (const io_error& e) {
        CHECK(has(e.what(), p.string()));
        CHECK(has(e.what(), "No such file or directory"));
    }
    CHECK_THROWS_AS(st::file{test::tmp_dir()}, io_error);  // a directory

    const auto good = write_temp("io_st_one.safetensors", image("{" + one_f32 + "}", 8));
    const st::file f(good);
    try {
        (void)f.info("nope");
        FAIL("expected format_error");
    } catch (const format_error& e) {
        CHECK(has(e.what(), "'nope'"));
        CHECK(has(e.what(), good.string()));
    }
    CHECK_THROWS_AS(f.to_f32("nope"), format_error);
}

// ---- valid edge cases -----------------------------------------------------------------------------

TEST_CASE("empty tensor list, zero-sized tensors, trailing-space padding, gaps between tensors") {
    const st::file e = st::file(write_temp("io_st_empty_list.safetensors", image("{}")));
    CHECK(e.size() == 0);
    CHECK(e.metadata().empty());
    const st::file e2 = st::file(write_temp("io_st_meta_only.safetensors", image(R"({"__metadata__":{"a":"b"}}     )")));
    CHECK(e2.size() == 0);
    CHECK(e2.metadata().at("a") == "b");

    const std::string h = R"({"z": {"dtype":"F32","shape":[0, 5],"data_offsets":[8,8]},)" + one_f32 +
                          R"(,"z2": {"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]}})" + std::string(13, ' ');
    const st::file f(write_temp("io_st_zero.safetensors", image(h, 8)));
    REQUIRE(f.size() == 3);
    CHECK(f.names() == std::vector<std::string>{"z", "t", "z2"});  // file order, not sorted
    CHECK(f.info("z").numel() == 0);
    CHECK(f.to_f32("z").shape() == std::vector<std::int64_t>{0, 5});
    CHECK(f.view<float, 2>("z").numel() == 0);
    CHECK(f.to_f32("z2").numel() == 0);

    // like the reference reader: holes between tensors and trailing bytes are rejected (a header length that is
    // off by a few bytes, which still parses thanks to the padding, shows up this way instead of as shifted weights)
    const std::string holes = image(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})", 12);
    CHECK_THROWS_WITH_AS(st::file::from_bytes(std::as_bytes(std::span(holes))),
                         doctest::Contains("without holes"), format_error);
    const std::string trailing = image(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 9);
    CHECK_THROWS_WITH_AS(st::file::from_bytes(std::as_bytes(std::span(trailing))),
                         doctest::Contains("trailing bytes"), format_error);
    std::string shifted = image(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}   )", 4);
    shifted[0] = static_cast<char>(shifted[0] - 1);  // header length one short: the last space becomes data
    CHECK_THROWS_AS(st::file::from_bytes(std::as_bytes(std::span(shifted))), format_error);
}

// ---- round trips ----------------------------------------------------------------------------------

TEST_CASE("writer round trip: every dtype, rank 0, zero-size, metadata; layout is packed and aligned") {
    const auto u = test::uniform(37 * 5, -3.f, 3.f, 11);
    tensor<float> f32({37, 5});
    std::copy(u.begin(), u.end(), f32.data());
    tensor<double> f64({3, 7});
    for (std::int64_t i = 0; i < f64.numel(); ++i) f64[i] = std::sin(0.37 * double(i)) * 1e3;
    std::vector<bf16> b16(13);
    std::vector<f16> h16(13);
    for (std::size_t i = 0; i < 13; ++i) {
        b16[i] = bf16::from_float(u[i]);
        h16[i] = f16::from_float(u[i + 13]);
    }
    tensor<std::int32_t> i32({9});
    for (std::int64_t i = 0; i < 9; ++i) i32[i] = std::int32_t(i * 1000003 - 4000000);
    tensor<std::int64_t> i64({2, 3});
    for (std::int64_t i = 0; i < 6; ++i) i64[i] = (std::int64_t{1} << 40) * (i - 3) + 7;
    tensor<float> scalar(std::vector<std::int64_t>{});
    scalar[0] = 42.5f;
    tensor<double> empty({4, 0, 2});

    st::writer w;
    w.add("b16", {13}, std::span<const bf16>(b16));  // 2-byte first in add order: the layout reorders
    w.add("f32", f32).add("f64", f64).add("i32", i32).add("i64", i64).add("scalar", scalar).add("empty", empty);
    w.add("h16", {1, 13}, std::span<const f16>(h16));
    w.set_metadata("format", "pt").set_metadata("note", "ünïcödé");
    const auto path = test::tmp_dir() / "io_st_roundtrip.safetensors";
    w.write(path);

    const st::file r(path);
    CHECK(r.names() == std::vector<std::string>{"b16", "f32", "f64", "i32", "i64", "scalar", "empty", "h16"});
    CHECK(r.metadata().at("format") == "pt");
    CHECK(r.metadata().at("note") == "ünïcödé");
    CHECK(r.data_offset() % 8 == 0);

    // packed (no holes) and every tensor aligned to its element size
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const auto& t : r.tensors()) {
        CHECK(t.begin % dtype_size(t.type) == 0);
        ranges.emplace_back(t.begin, t.end);
    }
    std::sort(ranges.begin(), ranges.end());
    std::uint64_t pos = 0;
    for (auto [b, e] : ranges) {
        CHECK(b == pos);
        pos = e;
    }
    CHECK(pos + r.data_offset() == r.image().size());

    CHECK(r.info("f32").type == dtype::f32);
    CHECK(r.info("f32").shape == std::vector<std::int64_t>{37, 5});
    const auto rf = r.to_tensor<float>("f32");
    CHECK(std::equal(rf.data(), rf.data() + rf.numel(), f32.data()));
    const auto rd = r.to_tensor<double>("f64");
    CHECK(std::equal(rd.data(), rd.data() + rd.numel(), f64.data()));
    const auto rb = r.to_tensor<bf16>("b16");
    CHECK(std::equal(rb.data(), rb.data() + 13, b16.data()));
    const auto rh = r.to_tensor<f16>("h16");
    CHECK(rh.shape() == std::vector<std::int64_t>{1, 13});
    CHECK(std::equal(rh.data(), rh.data() + 13, h16.data()));
    const auto ri = r.to_tensor<std::int32_t>("i32");
    CHECK(std::equal(ri.data(), ri.data() + 9, i32.data()));
    const auto rl = r.to_tensor<std::int64_t>("i64");
    CHECK(std::equal(rl.data(), rl.data() + 6, i64.data()));
    CHECK(r.info("scalar").rank() == 0);
    CHECK(r.to_f32("scalar")[0] == 42.5f);
    CHECK(r.view<float, 0>("scalar")() == 42.5f);
    CHECK(r.info("empty").shape == std::vector<std::int64_t>{4, 0, 2});
    CHECK(r.to_tensor<double>("empty").numel() == 0);

    // to_f32 from every dtype against plain double-precision conversions
    auto check_f32 = [&](const char* name, auto ref_at) {
        const auto t = r.to_f32(name);
        std::vector<double> ref(static_cast<std::size_t>(t.numel()));
        for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = ref_at(i);
        CHECK_MESSAGE(test::rel_error(t.data(), ref.data(), ref.size()) < 1e-7, name);
    };
    check_f32("f64", [&](std::size_t i) { return f64[std::int64_t(i)]; });
    check_f32("i32", [&](std::size_t i) { return double(i32[std::int64_t(i)]); });
    check_f32("i64", [&](std::size_t i) { return double(i64[std::int64_t(i)]); });
    check_f32("b16", [&](std::size_t i) {  // bf16 = top 16 bits of an f32
        std::uint32_t bits = std::uint32_t(b16[i].bits) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        return double(v);
    });
    check_f32("h16", [&](std::size_t i) {  // plain decoding of the binary16 fields
        const unsigned s = h16[i].bits >> 15, e = (h16[i].bits >> 10) & 31u, m = h16[i].bits & 1023u;
        const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + double(m) / 1024.0, int(e) - 15);
        return s ? -mag : mag;
    });
    CHECK(std::abs(r.to_f32("h16")[0] - u[13]) < 2e-3);

    // dtype / rank mismatches
    CHECK_THROWS_AS((r.view<double, 2>("f32")), dtype_error);
    CHECK_THROWS_AS((r.view<float, 3>("f32")), shape_error);
    CHECK_THROWS_AS(r.to_tensor<std::int32_t>("f32"), dtype_error);
    CHECK_FALSE(r.can_view<double, 2>("f32"));
}

TEST_CASE("zero-copy views point into the mapping; unaligned data falls back to copies") {
    st::writer w;
    tensor<float> a({4, 6});
    for (std::int64_t i = 0; i < a.numel(); ++i) a[i] = float(i) * 0.5f;
    w.add("a", a);
    const auto path = test::tmp_dir() / "io_st_view.safetensors";
    w.write(path);
    const st::file r(path);
    REQUIRE(r.can_view<float, 2>("a"));
    const auto v = r.view<float, 2>("a");
    const auto img = r.image();
    const auto* p = reinterpret_cast<const std::byte*>(v.data);
    CHECK(p >= img.data());
    CHECK(p + 4 * 24 <= img.data() + img.size());
    CHECK(p == r.bytes("a").data());
    CHECK(v(3, 5) == 11.5f);
    CHECK(v.shape == std::array<std::int64_t, 2>{4, 6});

    // F32 at data offset 2 (after a 2-byte BF16 tensor; header padded to a multiple of 8): not viewable, but the
    // copying accessors work (and agree with the bytes)
    std::string hdr = R"({"p":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"u":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}})";
    hdr.append((8 - hdr.size() % 8) % 8, ' ');
    std::string b = image(hdr);
    const float vals[2] = {1.25f, -7.5f};
    b.append(2, '\0');
    b.append(reinterpret_cast<const char*>(vals), 8);
    const st::file u(write_temp("io_st_unaligned.safetensors", b));
    CHECK_FALSE(u.can_view<float, 1>("u"));
    CHECK_THROWS_AS((u.view<float, 1>("u")), format_error);
    const auto t = u.to_f32("u");
    CHECK(t[0] == 1.25f);
    CHECK(t[1] == -7.5f);
    CHECK(u.to_tensor<float>("u")[1] == -7.5f);
}

TEST_CASE("writer: strided views, errors, and atomic replace") {
    tensor<float> a({3, 4});
    for (std::int64_t i = 0; i < 12; ++i) a[i] = float(i);
    auto v = a.view<2>();
    tensor_view<const float, 2> col(v.data + 1, {3, 2}, {4, 2});  // columns 1 and 3
    st::writer w;
    w.add("col", col);
    CHECK_THROWS_AS(w.add("col", a), value_error);
    CHECK_THROWS_AS(w.add("__metadata__", a), value_error);
    CHECK_THROWS_AS(w.add("bad", dtype::f32, {3}, std::span<const std::byte>()), shape_error);
    CHECK_THROWS_AS(w.add("neg", dtype::f32, {-1}, std::span<const std::byte>()), shape_error);
    CHECK_THROWS_AS(w.add("\xff", a), value_error);
    const auto path = test::tmp_dir() / "io_st_atomic.safetensors";
    {
        std::ofstream f(path);
        f << "old contents";
    }
    w.write(path);
    const st::file r(path);
    const auto t = r.to_f32("col");
    CHECK(t.shape() == std::vector<std::int64_t>{3, 2});
    CHECK(t[0] == 1.0f);
    CHECK(t[1] == 3.0f);
    CHECK(t[5] == 11.0f);
    for (const auto& e : std::filesystem::directory_iterator(test::tmp_dir()))
        CHECK_MESSAGE(e.path().filename().string().find("io_st_atomic.safetensors.tmp") == std::string::npos,
                      e.path().string());

    const auto nodir = test::tmp_dir() / "no_such_dir" / "x.safetensors";
    CHECK_THROWS_AS(w.write(nodir), io_error);
    CHECK_FALSE(std::filesystem::exists(nodir));
}

// ---- sharded checkpoints ----------------------------------------------------------------------------

TEST_CASE("sharded checkpoint index: lookups and clear errors") {
    const auto dir = test::tmp_dir() / "io_st_sharded";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    tensor<float> a({2, 2}), b({3});
    a.fill(1.0f);
    b.fill(2.0f);
    st::writer().add("layer.0.w", a).write(dir / "model-00001-of-00002.safetensors");
    st::writer().add("layer.1.w", b).add("extra", b).write(dir / "model-00002-of-00002.safetensors");
    auto write_index = [&](const std::string& body) {
        std::ofstream f(dir / "model.safetensors.index.json", std::ios::trunc);
        f << body;
    };
    write_index(R"({"metadata": {"total_size": 28}, "weight_map": {
        "layer.0.w": "model-00001-of-00002.safetensors", "layer.1.w": "model-00002-of-00002.safetensors"}})");
    const auto ck = st::open_checkpoint(dir);
    CHECK(ck.shards().size() == 2);
    CHECK(ck.names() == std::vector<std::string>{"layer.0.w", "layer.1.w"});
    CHECK(ck.to_f32("layer.0.w")[3] == 1.0f);
    CHECK(ck.to_f32("layer.1.w")[2] == 2.0f);
    CHECK(ck.view<float, 1>("layer.1.w")(1) == 2.0f);
    CHECK(ck.index_metadata()["total_size"] == 28);
    CHECK(ck.shard_of("layer.1.w").origin().find("00002") != std::string::npos);
    try {
        (void)ck.info("layer.2.w");
        FAIL("expected format_error");
    } catch (const format_error& e) {
        CHECK(has(e.what(), "'layer.2.w'"));
        CHECK(has(e.what(), "model.safetensors.index.json"));
    }

    write_index(R"({"weight_map": {"layer.0.w": "model-00003-of-00002.safetensors"}})");
    try {
        st::sharded_file s(dir / "model.safetensors.index.json");
        FAIL("expected io_error");
    } catch (const io_error& e) {
        CHECK(has(e.what(), "model-00003-of-00002.safetensors"));
        CHECK(has(e.what(), "model.safetensors.index.json"));
        CHECK(has(e.what(), "layer.0.w"));
    }
    write_index(R"({"weight_map": {"layer.9.w": "model-00001-of-00002.safetensors"}})");
    try {
        st::sharded_file s(dir / "model.safetensors.index.json");
        FAIL("expected format_error");
    } catch (const format_error& e) {
        CHECK(has(e.what(), "'layer.9.w'"));
        CHECK(has(e.what(), "model-00001-of-00002.safetensors"));
    }
    write_index(R"({"weight_map": {"layer.0.w": "../escape.safetensors"}})");
    CHECK_THROWS_AS(st::sharded_file(dir / "model.safetensors.index.json"), format_error);
    write_index(R"({"weight_map": {"layer.0.w": 3}})");
    CHECK_THROWS_AS(st::sharded_file(dir / "model.safetensors.index.json"), format_error);
    write_index(R"({"metadata": {}})");
    CHECK_THROWS_AS(st::sharded_file(dir / "model.safetensors.index.json"), format_error);
    write_index(R"({"weight_map": )");
    CHECK_THROWS_AS(st::sharded_file(dir / "model.safetensors.index.json"), format_error);

    // without an index, model.safetensors is used; with neither, io_error
    std::filesystem::remove(dir / "model.safetensors.index.json");
    CHECK_THROWS_AS(st::open_checkpoint(dir), io_error);
    st::writer().add("w", a).write(dir / "model.safetensors");
    CHECK(st::open_checkpoint(dir).names() == std::vector<std::string>{"w"});
}

// ---- the shared checkpoints ------------------------------------------------------------------------

TEST_CASE("shared checkpoints load with sane shapes") {
    HYMIX_REQUIRE_SHARED("models/kjv-mamba2-byte/model.safetensors");
    const auto models = test::shared_dir() / "models";
    for (const std::string name : {"kjv-mamba2-byte", "kjv-gdn-byte", "kjv-hybrid-byte"}) {
        CAPTURE(name);
        const st::file m(models / name / "model.safetensors");
        CHECK(m.size() > 10);
        std::size_t params = 0;
        for (const auto& t : m.tensors()) {
            CHECK(t.type == dtype::f32);
            CHECK(t.rank() >= 1);
            CHECK(t.rank() <= 3);
            params += static_cast<std::size_t>(t.numel());
        }
        CHECK(params > 1'000'000);
        CHECK(params < 10'000'000);

        const st::file ref(models / name / "reference.safetensors");
        CHECK(ref.info("input_ids").type == dtype::i64);
        CHECK(ref.info("input_ids").shape == std::vector<std::int64_t>{1, 300});
        // README says float64; kjv-mamba2-byte's reference logits are in fact stored as F32
        const auto lt = ref.info("logits").type;
        CHECK((lt == dtype::f64 || lt == dtype::f32));
        if (lt != dtype::f64) MESSAGE(name << "/reference.safetensors: logits stored as " << dtype_name(lt));
        CHECK(ref.info("logits").shape == std::vector<std::int64_t>{1, 300, 256});
        CHECK(ref.info("gen_ids").shape == std::vector<std::int64_t>{1, 112});
        const auto ids = ref.to_tensor<std::int64_t>("input_ids");
        CHECK(std::all_of(ids.data(), ids.data() + ids.numel(), [](std::int64_t v) { return v >= 0 && v < 256; }));
        const auto logits = ref.to_f32("logits");
        CHECK(std::all_of(logits.data(), logits.data() + logits.numel(), [](float v) { return std::isfinite(v); }));

        const st::file act(models / name / "activations.safetensors");
        CHECK(act.info("embeddings").shape == std::vector<std::int64_t>{1, 300, 256});
        CHECK(act.info("final_norm").shape == std::vector<std::int64_t>{1, 300, 256});
        CHECK(act.contains("layers.0.mixer_output"));
        CHECK(act.contains("layers.5.output"));
        CHECK(act.info("input_ids").type == dtype::i64);
        for (const auto& t : act.tensors())
            if (t.name != "input_ids") CHECK(t.type == dtype::f64);
    }
    const st::file m(models / "kjv-mamba2-byte" / "model.safetensors");
    CHECK(m.info("backbone.embeddings.weight").shape == std::vector<std::int64_t>{256, 256});
    CHECK(m.contains("backbone.layers.5.mixer.A_log"));
    CHECK(m.contains("backbone.norm_f.weight"));
    // the embedding table of a real checkpoint: zero-copy view agrees with the copying accessor
    if (m.can_view<float, 2>("backbone.embeddings.weight")) {
        const auto v = m.view<float, 2>("backbone.embeddings.weight");
        const auto c = m.to_f32("backbone.embeddings.weight");
        CHECK(std::equal(c.data(), c.data() + c.numel(), v.data));
    }
    CHECK(st::open_checkpoint(models / "kjv-mamba2-byte").names().size() == m.size());

    // writer reproduces every tensor of a real checkpoint bit for bit
    st::writer w;
    for (const auto& t : m.tensors()) w.add(t.name, t.type, t.shape, m.bytes(t.name));
    const auto path = test::tmp_dir() / "io_st_mamba2_copy.safetensors";
    w.write(path);
    const st::file copy(path);
    REQUIRE(copy.names() == m.names());
    for (const auto& t : m.tensors()) {
        const auto a = m.bytes(t.name), b = copy.bytes(t.name);
        CHECK_MESSAGE((a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0), t.name);
    }
    std::filesystem::remove(path);
}
