// `hymix score`: bits per byte of a text file (hymix/text/score.hpp), by default over the whole file or, for the
// KJV text of shared/data, over its held-out bytes; a running estimate with its standard error on stderr.
#include <cstdint>
#include <span>

#include "load.hpp"
#include "tool.hpp"

namespace tool {

namespace {

// shared/data/kjv.txt (shared/data/README.md), recognised by its size and 64-bit FNV-1a hash; the shared models
// were trained on the bytes before the held-out offset (shared/models/README.md).
constexpr std::int64_t kjv_size = 4'298'239, kjv_heldout_offset = 4'083'327;
constexpr std::uint64_t kjv_fnv1a = 0x21be438cea8082f0ull;

std::uint64_t fnv1a(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
}

bool is_kjv(std::string_view text) { return static_cast<std::int64_t>(text.size()) == kjv_size && fnv1a(text) == kjv_fnv1a; }

}  // namespace

int run_score(const common_options& c, const score_options& o) {
    const auto t_start = clock_type::now();
    const std::string text = read_file(o.text, "--text");
    const auto size = static_cast<std::int64_t>(text.size());
    std::int64_t offset = o.offset.value_or(0);
    if (!o.offset && !o.bytes && is_kjv(text)) {
        offset = kjv_heldout_offset;
        console::note("text: the KJV of shared/data (recognised by size and hash): scoring its held-out bytes [{}, {}); "
                      "--offset and --bytes choose another range",
                      offset, size);
    }
    if (offset > size) throw usage_error(fmt::format("--offset {} is past the end of '{}' ({} bytes)", offset, o.text, size));
    const std::int64_t n = o.bytes.value_or(size - offset);
    if (n > size - offset)
        throw usage_error(fmt::format("--bytes {} from --offset {} runs past the end of '{}' ({} bytes)", n, offset, o.text, size));
    if (n < 2 && !o.offset && !o.bytes)  // the whole file: the input cannot be used (exit 2), the command line is fine
        throw hymix::value_error(fmt::format("nothing to score: '{}' has {} byte(s); the first byte has no context, so at least 2 are "
                                             "needed",
                                             o.text, size));
    if (n < 2)
        throw usage_error(fmt::format("nothing to score: the range [{}, {}) of '{}' ({} bytes) has {} byte(s); the first "
                                      "byte has no context, so at least 2 are needed",
                                      offset, offset + n, o.text, size, n));
    if (o.score.full_windows_only && o.score.window >= n)
        throw usage_error(fmt::format("--full-windows needs more than --window {} bytes; the range has {}", o.score.window, n));

    return with_model(c, [&](auto& m) -> int {
        const bool tty = console::stderr_is_terminal();
        std::int64_t reported_tenths = 0;
        auto progress = [&](const hymix::score_progress& p) {
            const auto line = fmt::format("[{}/{} windows] {} bytes: bits/byte {:.4f} ± {:.4f}", p.windows_done, p.windows_total,
                                          p.scored_bytes, p.bits_per_byte, p.std_error);
            if (tty) {
                console::status(line);
            } else if (p.windows_done * 10 / p.windows_total > reported_tenths || p.windows_done == p.windows_total) {
                reported_tenths = p.windows_done * 10 / p.windows_total;  // about ten lines in a log
                console::note("{}", line);
            }
        };
        const auto r = hymix::score_bits_per_byte(
            m.model, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()), offset, n,
            o.score, progress);
        console::end_lines();
        fmt::print("model {}  text {}  offset {}  bytes {}  window {}{}\n", m.dir.filename().string(),
                   std::filesystem::path(o.text).filename().string(), offset, n, o.score.window,
                   o.score.full_windows_only ? "  (whole windows only)" : "");
        fmt::print("bits/byte {:.6f} ± {:.6f}  ({} windows, {} scored bytes, {:.1f} s, {:.0f} tokens/s)\n", r.bits_per_byte,
                   r.std_error, r.windows, r.scored_bytes, r.seconds, per_second(r.scored_bytes, r.seconds));
        std::fflush(stdout);
        console::note("total: {:.2f} s", seconds_since(t_start));
        return exit_ok;
    });
}

}  // namespace tool
