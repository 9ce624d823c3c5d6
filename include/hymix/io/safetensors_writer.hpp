// safetensors writer: collects tensors and metadata, then writes a file the strict reader accepts (header padded
// to a multiple of 8, data packed without holes, largest element size first so zero-copy views are aligned),
// atomically (temporary file, fsync, rename). Format: see safetensors_reader.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"

namespace hymix::safetensors {

/// Collects tensors (copied on add) and metadata, then writes a safetensors file.
/// Layout: the header is padded with spaces so the data section starts at a multiple of 8; tensor data is
/// packed without gaps, largest element size first, so every tensor starts at a multiple of its element
/// size (8 for F64/I64) — zero-copy views work — and strict readers that reject holes accept the file.
/// The header lists tensors in the order they were added.
class writer {
public:
    /// Adds a tensor from raw bytes. Throws value_error for an empty, reserved or duplicate name and
    /// shape_error when `data` is not product(shape) x dtype_size(type) bytes or a dimension is negative.
    writer& add(std::string name, hymix::dtype type, std::vector<std::int64_t> shape,  // [d0, d1, ...]
                std::span<const std::byte> data) {
        if (name == "__metadata__") throw value_error("safetensors writer: tensor name '__metadata__' is reserved");
        if (names_.count(name)) throw value_error("safetensors writer: duplicate tensor name '" + name + "'");
        check_utf8(name, "tensor name");
        std::uint64_t n = 1;
        for (auto d : shape) {
            if (d < 0) throw shape_error("safetensors writer: tensor '" + name + "' has negative dimension in shape " +
                                         shape_string(shape));
            if (d > 0 && n > std::numeric_limits<std::uint64_t>::max() / 8 / static_cast<std::uint64_t>(d))
                throw shape_error("safetensors writer: tensor '" + name + "' shape " + shape_string(shape) +
                                  " overflows");
            n *= static_cast<std::uint64_t>(d);
        }
        if (n * dtype_size(type) != data.size())
            throw shape_error("safetensors writer: tensor '" + name + "' of shape " + shape_string(shape) + " " +
                              std::string(dtype_name(type)) + " needs " + std::to_string(n * dtype_size(type)) +
                              " bytes, got " + std::to_string(data.size()));
        names_.insert(name);
        entries_.push_back({std::move(name), type, std::move(shape), std::vector<std::byte>(data.begin(), data.end())});
        return *this;
    }

    /// Adds a tensor of element type T (float, double, bf16, f16, int32_t, int64_t).
    template <class T>
    writer& add(std::string name, std::vector<std::int64_t> shape, std::span<const T> data) {
        return add(std::move(name), dtype_of_v<T>, std::move(shape), std::as_bytes(data));
    }
    template <class T>
    writer& add(std::string name, const tensor<T>& t) {
        return add(std::move(name), t.shape(), t.span());
    }
    /// Adds a (possibly strided) view; it is gathered into row-major order.
    template <class T, std::size_t R>
    writer& add(std::string name, tensor_view<T, R> v) {
        using U = std::remove_const_t<T>;
        std::vector<U> tmp(static_cast<std::size_t>(v.numel()));
        std::array<std::int64_t, R> idx{};
        for (std::size_t k = 0; k < tmp.size(); ++k) {
            std::int64_t off = 0;
            for (std::size_t d = 0; d < R; ++d) off += idx[d] * v.strides[d];
            tmp[k] = v.data[off];
            for (std::size_t d = R; d-- > 0;) {
                if (++idx[d] < v.shape[d]) break;
                idx[d] = 0;
            }
        }
        return add(std::move(name), std::vector<std::int64_t>(v.shape.begin(), v.shape.end()),
                   std::span<const U>(tmp));
    }

    /// Sets a `__metadata__` entry (both strings must be valid UTF-8).
    writer& set_metadata(std::string key, std::string value) {
        check_utf8(key, "metadata key");
        check_utf8(value, "metadata value");
        metadata_[std::move(key)] = std::move(value);
        return *this;
    }

    std::size_t size() const noexcept { return entries_.size(); }

    /// The complete file image.
    std::vector<std::byte> serialize() const {
        const auto order = layout_order();
        std::vector<std::uint64_t> begin(entries_.size());
        std::uint64_t pos = 0;
        for (auto i : order) {
            begin[i] = pos;
            pos += entries_[i].data.size();
        }
        std::string h = "{";
        if (!metadata_.empty()) {
            h += "\"__metadata__\":{";
            bool first = true;
            for (const auto& [k, v] : metadata_) {
                if (!first) h += ",";
                first = false;
                h += quote(k) + ":" + quote(v);
            }
            h += "}";
        }
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            const auto& e = entries_[i];
            if (h.size() > 1) h += ",";
            h += quote(e.name) + ":{\"dtype\":\"" + std::string(dtype_name(e.type)) + "\",\"shape\":[";
            for (std::size_t d = 0; d < e.shape.size(); ++d) {
                if (d) h += ',';
                h += std::to_string(e.shape[d]);
            }
            h += "],\"data_offsets\":[";
            h += std::to_string(begin[i]);
            h += ',';
            h += std::to_string(begin[i] + e.data.size());
            h += "]}";
        }
        h += "}";
        while (h.size() % 8 != 0) h += ' ';

        std::vector<std::byte> out(8 + h.size() + pos);
        std::uint64_t n = h.size();
        for (int b = 0; b < 8; ++b) out[static_cast<std::size_t>(b)] = static_cast<std::byte>((n >> (8 * b)) & 0xffu);
        std::memcpy(out.data() + 8, h.data(), h.size());
        for (auto i : order)
            if (!entries_[i].data.empty())
                std::memcpy(out.data() + 8 + h.size() + begin[i], entries_[i].data.data(), entries_[i].data.size());
        return out;
    }

    /// Writes the file: to a temporary file in the same directory, flushed, then renamed over `path`, so a
    /// failure never leaves a partial file at `path`. Throws io_error with the path and the OS reason.
    void write(const std::filesystem::path& path) const {
        const auto image = serialize();
        static std::atomic<unsigned> counter{0};
        std::filesystem::path tmp = path;
        tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
        const std::string tp = tmp.string();
        const int fd = ::open(tp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            const int err = errno;
            throw io_error("cannot create '" + tp + "' (writing '" + path.string() + "'): " + std::strerror(err));
        }
        auto fail = [&](const std::string& what) {
            const int err = errno;
            ::close(fd);
            ::unlink(tp.c_str());
            throw io_error(what + " '" + path.string() + "': " + std::strerror(err));
        };
        std::size_t done = 0;
        while (done < image.size()) {
            const ::ssize_t w = ::write(fd, image.data() + done, image.size() - done);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail("error writing");
            }
            done += static_cast<std::size_t>(w);
        }
        if (::fsync(fd) != 0) fail("error flushing");
        if (::close(fd) != 0) {
            const int err = errno;
            ::unlink(tp.c_str());
            throw io_error("error closing '" + path.string() + "': " + std::strerror(err));
        }
        if (std::rename(tp.c_str(), path.string().c_str()) != 0) {
            const int err = errno;
            ::unlink(tp.c_str());
            throw io_error("cannot rename '" + tp + "' to '" + path.string() + "': " + std::strerror(err));
        }
    }

private:
    struct entry {
        std::string name;
        hymix::dtype type;
        std::vector<std::int64_t> shape;
        std::vector<std::byte> data;
    };

    std::vector<std::size_t> layout_order() const {
        std::vector<std::size_t> order(entries_.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return dtype_size(entries_[a].type) > dtype_size(entries_[b].type);
        });
        return order;
    }

    static std::string quote(const std::string& s) { return nlohmann::json(s).dump(); }

    static void check_utf8(const std::string& s, const char* what) {
        try {
            (void)nlohmann::json(s).dump();
        } catch (const nlohmann::json::exception&) {
            throw value_error(std::string("safetensors writer: ") + what + " is not valid UTF-8");
        }
    }

    std::vector<entry> entries_;
    std::set<std::string, std::less<>> names_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace hymix::safetensors
