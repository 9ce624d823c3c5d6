// libFuzzer entry point for the safetensors reader: any byte string is parsed as a file image. Only
// hymix::error may come out of the reader; every accessor is exercised on what parses, and a re-written
// copy must parse back to the same tensors (a writer/reader disagreement traps).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "hymix/io/safetensors.hpp"

namespace {

namespace st = hymix::safetensors;

template <class T, std::size_t R>
void touch_view(const st::file& f, const st::tensor_info& t) {
    if (!f.can_view<T, R>(t.name)) return;
    const auto v = f.view<T, R>(t.name);
    if (v.numel() == 0) return;
    volatile T first = v.data[0];
    volatile T last = v.data[v.numel() - 1];
    (void)first;
    (void)last;
}

template <class T>
void touch_copy(const st::file& f, const st::tensor_info& t) {
    const auto c = f.to_tensor<T>(t.name);
    if (c.numel() != t.numel()) __builtin_trap();
    touch_view<T, 0>(f, t);
    touch_view<T, 1>(f, t);
    touch_view<T, 2>(f, t);
    touch_view<T, 3>(f, t);
}

void exercise(const st::file& f) {
    for (const auto& [k, v] : f.metadata()) (void)(k.size() + v.size());
    for (const auto& t : f.tensors()) {
        if (f.bytes(t.name).size() != t.nbytes()) __builtin_trap();
        const auto x = f.to_f32(t.name);
        float acc = 0;
        for (std::int64_t i = 0; i < x.numel(); ++i) acc += x[i] * 0.0f;
        (void)acc;
        switch (t.type) {
            case hymix::dtype::f32: touch_copy<float>(f, t); break;
            case hymix::dtype::f64: touch_copy<double>(f, t); break;
            case hymix::dtype::bf16: touch_copy<hymix::bf16>(f, t); break;
            case hymix::dtype::f16: touch_copy<hymix::f16>(f, t); break;
            case hymix::dtype::i32: touch_copy<std::int32_t>(f, t); break;
            case hymix::dtype::i64: touch_copy<std::int64_t>(f, t); break;
            case hymix::dtype::i8: touch_copy<std::int8_t>(f, t); break;
        }
    }
}

void round_trip(const st::file& f) {
    st::writer w;
    for (const auto& t : f.tensors()) w.add(t.name, t.type, t.shape, f.bytes(t.name));
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    const auto image = w.serialize();
    const auto g = st::file::from_bytes(image, "round trip");
    if (g.names() != f.names() || g.metadata() != f.metadata()) __builtin_trap();
    for (const auto& t : f.tensors()) {
        const auto a = f.bytes(t.name), b = g.bytes(t.name);
        if (a.size() != b.size() || (a.size() && std::memcmp(a.data(), b.data(), a.size()) != 0)) __builtin_trap();
        if (g.info(t.name).shape != t.shape || g.info(t.name).type != t.type) __builtin_trap();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        const auto f = st::file::from_bytes(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz input");
        (void)f.info("missing-name");  // throws format_error
    } catch (const hymix::error&) {
    }
    try {
        const auto f = st::file::from_bytes(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz input");
        exercise(f);
        round_trip(f);
    } catch (const hymix::error&) {
    }
    return 0;
}
