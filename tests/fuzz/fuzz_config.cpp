// libFuzzer entry point for the config.json reader: any byte string is parsed as a Hugging Face config
// (non-standard float tokens included), every top-level key is read with each typed accessor, and the object is
// read by the HF Mamba-2 and Qwen3.5 config readers. Only hymix::error may escape the readers.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/io/json.hpp"
#include "hymix/models/hf_mamba2.hpp"
#include "hymix/models/hf_qwen3_5.hpp"

namespace {

template <class T>
void try_get(const hymix::io::json& j, const std::string& key) {
    try {
        (void)hymix::io::get<T>(j, key, T{}, "fuzz.json");
    } catch (const hymix::config_error&) {
    }
    try {
        (void)hymix::io::require<T>(j, key, "fuzz.json");
    } catch (const hymix::config_error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    // The position map of the token rewrite must stay inside the original text.
    const auto rw = hymix::io::detail::rewrite_special_floats(text);
    for (std::size_t p = 0; p <= rw.text.size(); p += 1 + rw.text.size() / 64)
        if (rw.original_position(p) > text.size()) __builtin_trap();
    try {
        const auto j = hymix::io::parse_json(text, "fuzz.json");
        if (!j.is_object()) {
            try_get<int>(j, "x");  // not an object: config_error
            return 0;
        }
        for (const auto& [key, value] : j.items()) {
            try_get<bool>(j, key);
            try_get<int>(j, key);
            try_get<std::uint8_t>(j, key);
            try_get<std::int64_t>(j, key);
            try_get<std::uint64_t>(j, key);
            try_get<double>(j, key);
            try_get<float>(j, key);
            try_get<std::string>(j, key);
            try_get<std::vector<double>>(j, key);
            try_get<std::vector<std::int64_t>>(j, key);
            try_get<std::vector<std::vector<std::string>>>(j, key);
            try {
                (void)hymix::io::require_object(j, key, "fuzz.json");
            } catch (const hymix::config_error&) {
            }
            (void)hymix::io::has(j, key);
        }
        // The model config readers (io::config_keys): any object, read as each family it could be; bad values must
        // come out as hymix errors (config_error naming the key), never as another exception or undefined behaviour.
        for (const char* mt : {"", "mamba2", "qwen3_5_text", "qwen3_5"}) {
            auto k = j;
            if (*mt) k["model_type"] = mt;
            try {
                (void)hymix::models::read_hf_mamba2_config(k, "fuzz.json");
            } catch (const hymix::error&) {
            }
            try {
                (void)hymix::models::read_hf_qwen3_5_config(k, "fuzz.json");
            } catch (const hymix::error&) {
            }
        }
    } catch (const hymix::error&) {
    }
    return 0;
}
