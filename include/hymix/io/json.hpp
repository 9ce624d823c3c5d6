// Reading Hugging Face `config.json` files: JSON with the non-standard float spellings real configs use
// (bare `Infinity` / `-Infinity` / `NaN` from Python's json.dumps, `{"__float__": "Infinity"}` from
// transformers 5), plus typed key look-ups with precise errors (spec.md §3.7, §3.8 "Infinity in config.json").
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hymix/core/error.hpp"

namespace hymix::io {

using json = nlohmann::json;

namespace detail {

/// Deepest nesting of objects/arrays accepted in any JSON hymix reads (configs are 3–4 levels deep).
inline constexpr int max_json_depth = 128;

/// One rewrite of a bare float token: its span in the original and in the rewritten text.
struct json_rewrite {
    std::size_t orig_begin, orig_end, new_begin, new_end;
};

/// Text with bare `Infinity` / `-Infinity` / `NaN` tokens (outside strings) replaced by
/// `{"__float__": "..."}` objects, and the table mapping rewritten positions back to the original.
struct rewritten_json {
    std::string text;
    std::vector<json_rewrite> rewrites;  // in increasing position order

    /// Position in the original text of position `p` of the rewritten text.
    std::size_t original_position(std::size_t p) const {
        auto it = std::upper_bound(rewrites.begin(), rewrites.end(), p,
                                   [](std::size_t v, const json_rewrite& r) { return v < r.new_begin; });
        if (it == rewrites.begin()) return p;
        --it;
        if (p < it->new_end) return it->orig_begin;
        return it->orig_end + (p - it->new_end);
    }
};

inline bool is_word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '+' || c == '-';
}

/// Replaces the bare non-standard float tokens. Text inside JSON strings is never touched; a token only
/// counts when it is not glued to neighbouring letters/digits (so `NaNx` stays as is and fails to parse).
inline rewritten_json rewrite_special_floats(std::string_view in) {
    static constexpr std::string_view tokens[] = {"-Infinity", "Infinity", "NaN"};
    rewritten_json out;
    out.text.reserve(in.size());
    std::size_t i = 0;
    while (i < in.size()) {
        const char c = in[i];
        if (c == '"') {  // copy a string literal verbatim, honouring backslash escapes
            std::size_t j = i + 1;
            while (j < in.size() && in[j] != '"') j += (in[j] == '\\') ? 2 : 1;
            j = std::min(j + 1, in.size());
            out.text.append(in.substr(i, j - i));
            i = j;
            continue;
        }
        bool replaced = false;
        if (c == '-' || c == 'I' || c == 'N') {
            for (std::string_view tok : tokens) {
                if (in.substr(i, tok.size()) != tok) continue;
                const bool left_ok = i == 0 || !is_word_char(in[i - 1]);
                const bool right_ok = i + tok.size() == in.size() || !is_word_char(in[i + tok.size()]);
                if (!left_ok || !right_ok) continue;
                const std::string rep = "{\"__float__\":\"" + std::string(tok) + "\"}";
                out.rewrites.push_back({i, i + tok.size(), out.text.size(), out.text.size() + rep.size()});
                out.text += rep;
                i += tok.size();
                replaced = true;
                break;
            }
        }
        if (!replaced) {
            out.text.push_back(c);
            ++i;
        }
    }
    return out;
}

/// (line, column), both 1-based, of byte `pos` of `text`.
inline std::pair<std::size_t, std::size_t> line_column(std::string_view text, std::size_t pos) {
    pos = std::min(pos, text.size());
    std::size_t line = 1, col = 1;
    for (std::size_t k = 0; k < pos; ++k) {
        if (text[k] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    return {line, col};
}

/// nlohmann's parse_error message without its own "parse error at line L, column C: " prefix (its
/// positions refer to the rewritten text).
inline std::string parse_error_detail(const std::string& what) {
    const auto col = what.find("column");
    const auto p = col == std::string::npos ? std::string::npos : what.find(": ", col);
    return p == std::string::npos ? what : what.substr(p + 2);
}

/// The value a `{"__float__": s}` object stands for; throws format_error for an unknown spelling.
inline double special_float(const json& s, const std::string& origin) {
    if (s.is_string()) {
        const auto& v = s.get_ref<const std::string&>();
        if (v == "Infinity") return std::numeric_limits<double>::infinity();
        if (v == "-Infinity") return -std::numeric_limits<double>::infinity();
        if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
    }
    throw format_error(origin + ": {\"__float__\": ...} must hold \"Infinity\", \"-Infinity\" or \"NaN\", found " +
                       s.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 60));
}

/// Throws format_error when a JSON document nests deeper than max_json_depth.
inline void check_depth(int depth, const std::string& origin) {
    if (depth >= max_json_depth)
        throw format_error(origin + ": JSON nested deeper than " + std::to_string(max_json_depth) + " levels");
}

}  // namespace detail

/// Parses JSON text that may use the non-standard float spellings of Hugging Face configs: bare
/// `Infinity`, `-Infinity`, `NaN` wherever a number may appear, and `{"__float__": "Infinity"}`
/// (also "-Infinity", "NaN"); all become JSON numbers (double ±inf / NaN). Duplicate keys keep the
/// last value, as Python's json module does. `origin` (usually the file name) prefixes every message.
/// Throws format_error naming `origin`, line, column and byte offset for malformed JSON, an unknown
/// `__float__` spelling, or nesting deeper than 128 levels.
inline json parse_json(std::string_view text, const std::string& origin = "<json text>") {
    const detail::rewritten_json rw = detail::rewrite_special_floats(text);
    const json::parser_callback_t cb = [&origin](int depth, json::parse_event_t ev, json& parsed) {
        if (ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start)
            detail::check_depth(depth, origin);
        if (ev == json::parse_event_t::object_end && parsed.is_object() && parsed.size() == 1) {
            const auto it = parsed.find("__float__");
            if (it != parsed.end()) parsed = detail::special_float(*it, origin);
        }
        return true;
    };
    try {
        return json::parse(rw.text.begin(), rw.text.end(), cb);
    } catch (const json::parse_error& e) {
        const std::size_t rewritten_pos = e.byte > 0 ? e.byte - 1 : 0;
        const std::size_t pos = rw.original_position(rewritten_pos);
        const auto [line, col] = detail::line_column(text, pos);
        throw format_error(origin + ": malformed JSON at line " + std::to_string(line) + ", column " +
                           std::to_string(col) + " (byte " + std::to_string(pos) + "): " +
                           detail::parse_error_detail(e.what()));
    } catch (const json::exception& e) {
        throw format_error(origin + ": malformed JSON: " + e.what());
    }
}

/// Largest JSON file hymix reads (configs and shard indexes are kilobytes to a few megabytes).
inline constexpr std::uintmax_t max_json_bytes = 256u << 20;

/// Reads a whole regular file (at most max_json_bytes) into a string. Throws io_error with the path and the OS
/// reason; FIFOs, devices and oversized files are rejected before reading, so a read can never hang or explode.
inline std::string read_text_file(const std::filesystem::path& path) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
        throw io_error("cannot read '" + path.string() + "': not a regular file");
    if (!ec && std::filesystem::is_regular_file(st)) {
        const auto size = std::filesystem::file_size(path, ec);
        if (!ec && size > max_json_bytes)
            throw io_error("cannot read '" + path.string() + "': " + std::to_string(size) + " bytes, more than the " +
                           std::to_string(max_json_bytes) + " a JSON file may have");
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        const int err = errno;
        throw io_error("cannot open '" + path.string() + "': " + std::strerror(err));
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw io_error("error while reading '" + path.string() + "'");
    return std::move(ss).str();
}

/// Reads and parses a JSON file (see parse_json). Throws io_error when the file cannot be read and
/// format_error when it is malformed; messages name the path.
inline json read_json_file(const std::filesystem::path& path) {
    if (std::filesystem::is_directory(path)) throw io_error("cannot read '" + path.string() + "': is a directory");
    return parse_json(read_text_file(path), path.string());
}

// ---- typed look-ups ------------------------------------------------------------------------------

namespace detail {

template <class T> struct is_std_vector : std::false_type {};
template <class U, class A> struct is_std_vector<std::vector<U, A>> : std::true_type {};

/// JSON kind of a value, distinguishing integers from floats: "integer", "float", "string", ...
inline std::string json_kind(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "integer";
        case json::value_t::number_float: return "float";
        case json::value_t::string: return "string";
        case json::value_t::array: return "array";
        case json::value_t::object: return "object";
        case json::value_t::binary: return "binary";
        case json::value_t::discarded: return "discarded";
    }
    return "unknown";
}

/// "integer 7", "string \"abc\"", "array" — what was found, for messages.
inline std::string json_found(const json& v) {
    if (v.is_primitive() && !v.is_null()) {
        std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
        if (s.size() > 60) s = s.substr(0, 57) + "...";
        return json_kind(v) + " " + s;
    }
    return json_kind(v);
}

/// Human name of the JSON type a C++ type is read from.
template <class T>
std::string json_expected() {
    if constexpr (std::is_same_v<T, json>) return "any JSON value";
    else if constexpr (std::is_same_v<T, bool>) return "boolean";
    else if constexpr (std::is_integral_v<T>) return std::is_unsigned_v<T> ? "non-negative integer" : "integer";
    else if constexpr (std::is_floating_point_v<T>) return "number";
    else if constexpr (std::is_same_v<T, std::string>) return "string";
    else if constexpr (is_std_vector<T>::value) return "array of " + json_expected<typename T::value_type>();
    else static_assert(sizeof(T) == 0, "hymix::io: unsupported type for a JSON look-up");
}

[[noreturn]] inline void type_mismatch(const std::string& origin, const std::string& where, const std::string& expected,
                                       const json& found) {
    throw config_error((origin.empty() ? std::string("JSON") : origin) + ": key '" + where + "': expected " + expected +
                       ", found " + json_found(found));
}

/// Converts `v` to T with hymix's rules (integers accept integral floats such as 256.0 when in range;
/// numbers accept integers, floats and ±inf/NaN). Throws config_error naming origin and `where`.
template <class T>
T json_to(const json& v, const std::string& where, const std::string& origin) {
    if constexpr (std::is_same_v<T, json>) {
        return v;
    } else if constexpr (std::is_same_v<T, bool>) {
        if (!v.is_boolean()) type_mismatch(origin, where, json_expected<T>(), v);
        return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (std::in_range<T>(u)) return static_cast<T>(u);
        } else if (v.is_number_integer()) {
            const auto s = v.get<std::int64_t>();
            if (std::in_range<T>(s)) return static_cast<T>(s);
        } else if (v.is_number_float()) {
            const double d = v.get<double>();
            if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
                const auto s = static_cast<std::int64_t>(d);
                if (std::in_range<T>(s)) return static_cast<T>(s);
            }
        }
        if (v.is_number())
            throw config_error((origin.empty() ? std::string("JSON") : origin) + ": key '" + where + "': expected " +
                               json_expected<T>() + " in range [" + std::to_string(std::numeric_limits<T>::min()) +
                               ", " + std::to_string(std::numeric_limits<T>::max()) + "], found " + json_found(v));
        type_mismatch(origin, where, json_expected<T>(), v);
    } else if constexpr (std::is_floating_point_v<T>) {
        if (!v.is_number()) type_mismatch(origin, where, json_expected<T>(), v);
        return static_cast<T>(v.get<double>());
    } else if constexpr (std::is_same_v<T, std::string>) {
        if (!v.is_string()) type_mismatch(origin, where, json_expected<T>(), v);
        return v.get<std::string>();
    } else if constexpr (is_std_vector<T>::value) {
        if (!v.is_array()) type_mismatch(origin, where, json_expected<T>(), v);
        T out;
        out.reserve(v.size());
        for (std::size_t i = 0; i < v.size(); ++i)
            out.push_back(json_to<typename T::value_type>(v[i], where + "[" + std::to_string(i) + "]", origin));
        return out;
    } else {
        static_assert(sizeof(T) == 0, "hymix::io: unsupported type for a JSON look-up");
    }
}

inline void require_object_value(const json& j, std::string_view key, const std::string& origin) {
    if (!j.is_object())
        throw config_error((origin.empty() ? std::string("JSON") : origin) + ": cannot look up key '" +
                           std::string(key) + "' in a JSON " + json_kind(j) + " (expected an object)");
}

}  // namespace detail

/// Whether object `j` has `key` with a non-null value.
inline bool has(const json& j, std::string_view key) {
    if (!j.is_object()) return false;
    const auto it = j.find(key);
    return it != j.end() && !it->is_null();
}

/// Value of required `key` in object `j` as T (bool, any integer, float/double, std::string,
/// std::vector of those, or json). `origin` (the file name) prefixes messages.
/// Throws config_error naming origin and key when `j` is not an object, the key is missing or null,
/// or the value has the wrong JSON type (message gives expected vs found type) or is out of range for T.
template <class T>
T require(const json& j, std::string_view key, const std::string& origin = {}) {
    detail::require_object_value(j, key, origin);
    const auto it = j.find(key);
    if (it == j.end())
        throw config_error((origin.empty() ? std::string("JSON") : origin) + ": missing required key '" +
                           std::string(key) + "' (expected " + detail::json_expected<T>() + ")");
    if (it->is_null())
        throw config_error((origin.empty() ? std::string("JSON") : origin) + ": key '" + std::string(key) +
                           "': expected " + detail::json_expected<T>() + ", found null");
    return detail::json_to<T>(*it, std::string(key), origin);
}

/// Value of optional `key` in object `j` as T, or `fallback` when the key is absent or null.
/// Throws config_error (as require) when `j` is not an object or the value has the wrong type.
template <class T>
T get(const json& j, std::string_view key, const T& fallback, const std::string& origin = {}) {
    detail::require_object_value(j, key, origin);
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    return detail::json_to<T>(*it, std::string(key), origin);
}

/// A JSON value as it would be written in a config file, for messages: numbers (NaN and ±Infinity spelled as
/// Python writes them), quoted strings, true/false/null; arrays and objects are shortened to 60 characters.
inline std::string json_text(const json& v) {
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isnan(d)) return "NaN";
        if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
    }
    if (v.is_array() || v.is_object()) {
        std::string out = v.is_array() ? "[" : "{";
        bool first = true;
        for (auto it = v.begin(); it != v.end() && out.size() < 60; ++it, first = false) {
            if (!first) out += ", ";
            if (v.is_object()) out += "\"" + it.key() + "\": ";
            out += json_text(*it);
        }
        if (out.size() > 60) out = out.substr(0, 57) + "...";
        return out + (v.is_array() ? "]" : "}");
    }
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

/// The object stored at `key` (by reference). Throws config_error when it is missing or not an object.
inline const json& require_object(const json& j, std::string_view key, const std::string& origin = {}) {
    detail::require_object_value(j, key, origin);
    const auto it = j.find(key);
    if (it == j.end())
        throw config_error((origin.empty() ? std::string("JSON") : origin) + ": missing required key '" +
                           std::string(key) + "' (expected object)");
    if (!it->is_object()) detail::type_mismatch(origin, std::string(key), "object", *it);
    return *it;
}

/// The keys of one object of a config file, read so that every error names the file, the key's full path (e.g.
/// 'text_config.rms_norm_eps') and the value found, including values that are only wrong for the model
/// ("must be > 0"). Defaults of absent keys are reported as such ("absent, default 16").
class config_keys {
public:
    /// `j` is the object, `origin` the file (e.g. ".../config.json"), `path` the keys leading to `j` ("" at the top).
    config_keys(const json& j, std::string origin, std::string path = {})
        : j_(&j), origin_(std::move(origin)), path_(std::move(path)) {
        if (!j.is_object())
            throw config_error(origin_ + ": " + (path_.empty() ? std::string("the top level") : "key '" + path_ + "'") +
                               " must be a JSON object, found " + detail::json_found(j));
    }

    const json& value() const noexcept { return *j_; }
    const std::string& origin() const noexcept { return origin_; }
    /// Full path of `key`: "text_config.hidden_size".
    std::string path(std::string_view key) const { return path_.empty() ? std::string(key) : path_ + "." + std::string(key); }
    bool has(std::string_view key) const { return io::has(*j_, key); }

    /// Required key as T; config_error naming file and key when it is missing, null or of the wrong type.
    template <class T>
    T require(std::string_view key) const {
        const auto it = j_->find(key);
        if (it == j_->end() || it->is_null())
            throw config_error(origin_ + ": " + (it == j_->end() ? "missing required key '" : "key '") + path(key) + "'" +
                               (it == j_->end() ? "" : " is null") + " (expected " + detail::json_expected<T>() + ")");
        return detail::json_to<T>(*it, path(key), origin_);
    }
    /// Optional key as T, or `fallback` when absent or null.
    template <class T>
    T get(std::string_view key, const T& fallback) const {
        const auto it = j_->find(key);
        if (it == j_->end() || it->is_null()) return fallback;
        return detail::json_to<T>(*it, path(key), origin_);
    }
    /// The nested object at `key` (required).
    config_keys object(std::string_view key) const {
        const auto it = j_->find(key);
        if (it == j_->end()) throw config_error(origin_ + ": missing required key '" + path(key) + "' (expected object)");
        return config_keys(*it, origin_, path(key));
    }

    /// "key 'rms_norm_eps' = NaN", or "key 'head_dim' (absent, default 256)" with `fallback_text` for absent keys.
    std::string describe(std::string_view key, std::string_view fallback_text = {}) const {
        const auto it = j_->find(key);
        if (it == j_->end() || it->is_null())
            return "key '" + path(key) + "' (" + (it == j_->end() ? "absent" : "null") +
                   (fallback_text.empty() ? std::string() : ", default " + std::string(fallback_text)) + ")";
        return "key '" + path(key) + "' = " + json_text(*it);
    }
    /// Throws config_error "<origin>: key '<path>' = <value>: <what>".
    [[noreturn]] void fail(std::string_view key, std::string_view what, std::string_view fallback_text = {}) const {
        throw config_error(origin_ + ": " + describe(key, fallback_text) + ": " + std::string(what));
    }

    /// Largest size a config key may give (2^24): products of two or three sizes (d_inner, q_proj rows, tensor
    /// element counts) then stay far inside int64.
    static constexpr std::int64_t max_size = std::int64_t{1} << 24;

    /// Integer key that must be > 0 and <= max_size (required, or `fallback` when absent).
    std::int64_t positive(std::string_view key) const { return check_positive(key, require<std::int64_t>(key), {}); }
    std::int64_t positive(std::string_view key, std::int64_t fallback) const {
        return check_positive(key, get<std::int64_t>(key, fallback), std::to_string(fallback));
    }
    /// Number key that must be finite and > 0 (or >= 0 with `allow_zero`), `fallback` when absent.
    double finite_positive(std::string_view key, double fallback, bool allow_zero = false) const {
        const double v = get<double>(key, fallback);
        if (!std::isfinite(v) || v < 0.0 || (v == 0.0 && !allow_zero))
            fail(key, allow_zero ? "must be finite and >= 0" : "must be finite and > 0", json_text(json(fallback)));
        return v;
    }

    /// As finite_positive, for a value stored as fp32: it must stay finite and > 0 after rounding to float.
    float finite_positive_f32(std::string_view key, double fallback) const {
        const double v = finite_positive(key, fallback);
        const auto f = static_cast<float>(v);
        if (!std::isfinite(f) || !(f > 0.0f)) fail(key, "must be finite and > 0 in 32-bit floating point", json_text(json(fallback)));
        return f;
    }

private:
    std::int64_t check_positive(std::string_view key, std::int64_t v, const std::string& fallback_text) const {
        if (v <= 0) fail(key, "must be > 0", fallback_text);
        if (v > max_size) fail(key, "must be <= " + std::to_string(max_size) + " (products of sizes must not overflow)", fallback_text);
        return v;
    }

    const json* j_;
    std::string origin_, path_;
};

}  // namespace hymix::io
