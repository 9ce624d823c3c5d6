// Warnings: conditions hymix accepts but a user should hear about (e.g. a config.json that contradicts the
// checkpoint where Hugging Face transformers itself accepts it). They go to one process-wide handler: by
// default a line "hymix: warning: ..." on stderr; set_warning_handler replaces it (e.g. to log or to collect).
#pragma once

#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace hymix {

/// Receives the text of one warning (without a prefix or a trailing newline).
using warning_handler = std::function<void(std::string_view)>;

namespace detail {

struct warning_sink {
    std::mutex mu;
    warning_handler handler;
    static warning_sink& get() {
        static warning_sink s;
        return s;
    }
};

inline void print_warning(std::string_view msg) {
    std::fflush(stdout);  // a warning starts on a line of its own, after what the program printed so far
    std::fprintf(stderr, "hymix: warning: %.*s\n", static_cast<int>(msg.size()), msg.data());
    std::fflush(stderr);
}

}  // namespace detail

/// Installs `h` as the warning handler (an empty function restores the default, stderr) and returns the previous
/// one. Thread-safe; the handler is called with a lock held, so it must not call warn() itself.
inline warning_handler set_warning_handler(warning_handler h) {
    auto& s = detail::warning_sink::get();
    std::lock_guard<std::mutex> lock(s.mu);
    return std::exchange(s.handler, std::move(h));
}

/// Reports one warning through the installed handler.
inline void warn(std::string_view msg) {
    auto& s = detail::warning_sink::get();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.handler) s.handler(msg);
    else detail::print_warning(msg);
}

}  // namespace hymix
