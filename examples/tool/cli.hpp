// Command-line value checks for the `hymix` tool: whole numbers and decimals within a stated range, with messages
// that quote the value and the range in plain words (no raw library text, no 300-digit limits); C escapes in
// strings typed on a command line (--stop "\n\n").
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

namespace tool::cli {

/// `lo` to `hi` as the help and the messages show it; `note` explains special values ("0 = all cores").
inline std::string range_text(std::int64_t lo, std::int64_t hi, const std::string& note) {
    return fmt::format("{} to {}{}", lo, hi, note.empty() ? "" : "; " + note);
}

/// A whole number in [lo, hi]. The value is checked as text, before CLI11 converts it.
inline CLI::Validator whole(std::int64_t lo, std::int64_t hi, const std::string& note = {}) {
    const std::string range = range_text(lo, hi, note);
    return CLI::Validator(
        [=](std::string& s) -> std::string {
            std::int64_t v = 0;
            const char* b = s.data() + (!s.empty() && s[0] == '+');
            const auto [end, ec] = std::from_chars(b, s.data() + s.size(), v);
            const bool whole_text = end == s.data() + s.size() && b != end;
            const std::string shown = s.size() > 40 ? s.substr(0, 37) + "..." : s;
            if (ec == std::errc::result_out_of_range || (whole_text && ec == std::errc{} && (v < lo || v > hi)))
                return "'" + shown + "' is out of range (expected " + range + ")";
            if (ec != std::errc{} || !whole_text) return "'" + shown + "' is not a whole number (expected " + range + ")";
            return {};
        },
        "");  // the range is part of the option's description (see add_* in hymix.cpp)
}

/// `s` with the C escapes \n \r \t \\ \" \' and \xHH (two hex digits: any byte) resolved, as a shell passes
/// them on when they are typed without $'...' quoting (--stop "\n\n"). Returns an error message for a backslash
/// not followed by one of those (quoting the string), else an empty string, `out` holding the result.
inline std::string unescape(const std::string& s, std::string& out) {
    out.clear();
    const auto hex = [](char c) {
        return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\') {
            out += s[i];
            continue;
        }
        const char e = i + 1 < s.size() ? s[i + 1] : '\0';
        switch (e) {
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case '\\': out += '\\'; break;
            case '"': out += '"'; break;
            case '\'': out += '\''; break;
            case 'x':
                if (i + 3 < s.size() && hex(s[i + 2]) >= 0 && hex(s[i + 3]) >= 0) {
                    out += static_cast<char>(hex(s[i + 2]) * 16 + hex(s[i + 3]));
                    i += 2;
                    break;
                }
                [[fallthrough]];
            default: {
                const std::string shown = s.size() > 40 ? s.substr(0, 37) + "..." : s;
                return "'" + shown + "': unknown escape at byte " + std::to_string(i) +
                       " (known: \\n \\r \\t \\\\ \\\" \\' \\xHH; a backslash itself is \\\\)";
            }
        }
        ++i;
    }
    return {};
}

/// An unsigned 64-bit number (random seeds).
inline CLI::Validator seed_value() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            std::uint64_t v = 0;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            if (ec == std::errc{} && end == s.data() + s.size() && !s.empty()) return {};
            const std::string shown = s.size() > 40 ? s.substr(0, 37) + "..." : s;
            return "'" + shown + "' is not a seed (expected a whole number from 0 to 18446744073709551615)";
        },
        "");
}

/// A finite decimal number in [lo, hi] (or (lo, hi] when lo_open).
inline CLI::Validator decimal(double lo, double hi, bool lo_open = false, const std::string& note = {}) {
    const std::string range = fmt::format("{}{}, {}]{}", lo_open ? "(" : "[", lo, hi, note.empty() ? "" : "; " + note);
    return CLI::Validator(
        [=](std::string& s) -> std::string {
            const std::string shown = s.size() > 40 ? s.substr(0, 37) + "..." : s;
            std::size_t used = 0;
            double v = 0;
            try {
                v = std::stod(s, &used);
            } catch (const std::out_of_range&) {
                return "'" + shown + "' is out of range (expected " + range + ")";
            } catch (const std::exception&) {
                used = 0;
            }
            if (used == 0 || used != s.size() || !std::isfinite(v)) return "'" + shown + "' is not a number (expected " + range + ")";
            if (v < lo || v > hi || (lo_open && v == lo)) return "'" + shown + "' is out of range (expected " + range + ")";
            return {};
        },
        "");
}

}  // namespace tool::cli
