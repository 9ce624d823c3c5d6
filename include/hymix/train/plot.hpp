// Small self-contained SVG line plots for the result files that long runs write under docs/ (loss curves, sweeps):
// one or more named series over shared axes, with ticks, labels and a legend; no dependency beyond the standard
// library, so every run can draw its own figure next to its CSV.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "hymix/core/error.hpp"

namespace hymix::train {

struct plot_series {
    std::string name;
    std::vector<std::pair<double, double>> points;  // (x, y); non-finite points are skipped
    std::string color;                              // empty: from the default palette
    bool markers = false;                           // draw a dot at each point
};

struct plot_spec {
    std::string title, x_label, y_label;
    std::vector<plot_series> series;
    int width = 720, height = 420;
};

namespace detail {
inline std::string svg_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '&') o += "&amp;";
        else if (c == '<') o += "&lt;";
        else if (c == '>') o += "&gt;";
        else if (c == '"') o += "&quot;";
        else o += c;
    }
    return o;
}
inline std::string num(double v, int prec = 4) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*g", prec, v);
    return b;
}
/// About five round tick values covering [lo, hi].
inline std::vector<double> ticks(double lo, double hi) {
    std::vector<double> t;
    const double span = hi - lo;
    if (!(span > 0)) return {lo};
    const double raw = span / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
    for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) t.push_back(std::abs(v) < 1e-12 * step ? 0.0 : v);
    return t;
}
}  // namespace detail

/// The SVG document of `p`.
inline std::string svg_line_plot(const plot_spec& p) {
    static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& s : p.series)
        for (auto [x, y] : s.points)
            if (std::isfinite(x) && std::isfinite(y)) {
                x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
            }
    if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1;
    const double pad = 0.04 * (y1 - y0);
    y0 -= pad, y1 += pad;
    const double L = 70, R = 20 + 170, T = 40, B = 55, W = p.width, H = p.height;
    auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    auto Y = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
    std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(p.width) + "\" height=\"" +
                    std::to_string(p.height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    o += "<text x=\"" + detail::num(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + detail::svg_escape(p.title) + "</text>\n";
    for (double t : detail::ticks(x0, x1)) {
        o += "<line x1=\"" + detail::num(X(t), 6) + "\" y1=\"" + detail::num(T) + "\" x2=\"" + detail::num(X(t), 6) + "\" y2=\"" +
             detail::num(H - B) + "\" stroke=\"#e5e5e5\"/>\n";
        o += "<text x=\"" + detail::num(X(t), 6) + "\" y=\"" + detail::num(H - B + 16) + "\" text-anchor=\"middle\">" + detail::num(t) + "</text>\n";
    }
    for (double t : detail::ticks(y0, y1)) {
        o += "<line x1=\"" + detail::num(L) + "\" y1=\"" + detail::num(Y(t), 6) + "\" x2=\"" + detail::num(W - R) + "\" y2=\"" +
             detail::num(Y(t), 6) + "\" stroke=\"#e5e5e5\"/>\n";
        o += "<text x=\"" + detail::num(L - 6) + "\" y=\"" + detail::num(Y(t) + 4, 6) + "\" text-anchor=\"end\">" + detail::num(t) + "</text>\n";
    }
    o += "<rect x=\"" + detail::num(L) + "\" y=\"" + detail::num(T) + "\" width=\"" + detail::num(W - L - R) + "\" height=\"" +
         detail::num(H - T - B) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    o += "<text x=\"" + detail::num(L + (W - L - R) / 2) + "\" y=\"" + detail::num(H - 12) + "\" text-anchor=\"middle\">" +
         detail::svg_escape(p.x_label) + "</text>\n";
    o += "<text transform=\"translate(16 " + detail::num(T + (H - T - B) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         detail::svg_escape(p.y_label) + "</text>\n";
    for (std::size_t i = 0; i < p.series.size(); ++i) {
        const auto& s = p.series[i];
        const std::string c = s.color.empty() ? palette[i % 8] : s.color;
        std::string pts;
        for (auto [x, y] : s.points)
            if (std::isfinite(x) && std::isfinite(y)) pts += detail::num(X(x), 7) + "," + detail::num(Y(y), 7) + " ";
        o += "<polyline fill=\"none\" stroke=\"" + c + "\" stroke-width=\"1.6\" points=\"" + pts + "\"/>\n";
        if (s.markers)
            for (auto [x, y] : s.points)
                if (std::isfinite(x) && std::isfinite(y))
                    o += "<circle cx=\"" + detail::num(X(x), 7) + "\" cy=\"" + detail::num(Y(y), 7) + "\" r=\"3\" fill=\"" + c + "\"/>\n";
        const double ly = T + 14 + 18 * static_cast<double>(i);
        o += "<line x1=\"" + detail::num(W - R + 12) + "\" y1=\"" + detail::num(ly - 4) + "\" x2=\"" + detail::num(W - R + 32) + "\" y2=\"" +
             detail::num(ly - 4) + "\" stroke=\"" + c + "\" stroke-width=\"2\"/>\n";
        o += "<text x=\"" + detail::num(W - R + 38) + "\" y=\"" + detail::num(ly) + "\">" + detail::svg_escape(s.name) + "</text>\n";
    }
    o += "</svg>\n";
    return o;
}

/// Writes svg_line_plot(p) to `path` (via a temporary file and a rename). Throws io_error.
inline void write_svg(const std::filesystem::path& path, const plot_spec& p) {
    const auto tmp = path.string() + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) throw io_error("cannot write '" + tmp + "'");
        f << svg_line_plot(p);
        if (!f.flush()) throw io_error("error writing '" + tmp + "'");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw io_error("cannot rename '" + tmp + "' to '" + path.string() + "': " + ec.message());
}

}  // namespace hymix::train
