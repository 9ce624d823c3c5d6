// safetensors reader: read-only POSIX mmap of a file, header parsed and validated once, zero-copy typed views and
// converting accessors. Format (huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the data section.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hymix/core/convert.hpp"
#include "hymix/core/dtype.hpp"
#include "hymix/core/error.hpp"
#include "hymix/core/tensor.hpp"
#include "hymix/io/json.hpp"

namespace hymix::safetensors {

/// Largest JSON header accepted (the reference implementation's limit).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// One tensor entry of a safetensors header.
struct tensor_info {
    std::string name;
    hymix::dtype type = hymix::dtype::f32;
    std::vector<std::int64_t> shape;  // [d0, d1, ...]; empty for a scalar (rank 0)
    std::uint64_t begin = 0;          // byte offsets into the data section (after the header)
    std::uint64_t end = 0;

    std::int64_t numel() const {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;  // validated at parse time: cannot overflow
        return n;
    }
    std::uint64_t nbytes() const { return end - begin; }
    std::size_t rank() const { return shape.size(); }
};

namespace detail {

struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
};

/// Bytes of one file image: a read-only mmap of a file, or a 64-byte aligned heap copy.
class byte_store {
public:
    byte_store(const byte_store&) = delete;
    byte_store& operator=(const byte_store&) = delete;
    ~byte_store() {
        if (mapped_) ::munmap(const_cast<std::byte*>(data_), size_);
    }

    /// Maps `path` read-only. Throws io_error (path + OS reason) and format_error for files under 8 bytes.
    static std::shared_ptr<const byte_store> map_file(const std::filesystem::path& path) {
        const std::string p = path.string();
        const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            const int err = errno;
            throw io_error("cannot open safetensors file '" + p + "': " + std::strerror(err));
        }
        struct fd_closer {
            int fd;
            ~fd_closer() { ::close(fd); }
        } closer{fd};
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            throw io_error("cannot stat safetensors file '" + p + "': " + std::strerror(err));
        }
        if (!S_ISREG(st.st_mode)) throw io_error("cannot read safetensors file '" + p + "': not a regular file");
        const auto size = static_cast<std::size_t>(st.st_size);
        if (size < 8)
            throw format_error("safetensors file '" + p + "' is " + std::to_string(size) +
                               " bytes long, shorter than the 8-byte header length field");
        void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int err = errno;
            throw io_error("cannot mmap safetensors file '" + p + "': " + std::strerror(err));
        }
        auto s = std::shared_ptr<byte_store>(new byte_store());
        s->data_ = static_cast<const std::byte*>(m);
        s->size_ = size;
        s->mapped_ = true;
        return s;
    }

    /// Copies `bytes` into an aligned heap buffer.
    static std::shared_ptr<const byte_store> copy_of(std::span<const std::byte> bytes) {
        auto s = std::shared_ptr<byte_store>(new byte_store());
        const std::size_t n = std::max<std::size_t>(bytes.size(), 1);
        s->heap_.reset(static_cast<std::byte*>(::operator new(n, std::align_val_t{64})));
        if (!bytes.empty()) std::memcpy(s->heap_.get(), bytes.data(), bytes.size());
        s->data_ = s->heap_.get();
        s->size_ = bytes.size();
        return s;
    }

    const std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }

private:
    byte_store() = default;
    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    bool mapped_ = false;
    std::unique_ptr<std::byte, aligned_delete> heap_;
};

inline std::uint64_t read_u64_le(const std::byte* p) noexcept {
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint64_t>(p[i]);
    return v;
}

/// Parses the header JSON, rejecting duplicate keys in any object and nesting deeper than a few levels.
/// Returns the document and the top-level keys in file order.
inline std::pair<nlohmann::json, std::vector<std::string>> parse_header_json(std::string_view text,
                                                                            const std::string& origin) {
    using json = nlohmann::json;
    std::vector<std::set<std::string, std::less<>>> open_objects;
    std::vector<std::string> top_keys;
    const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
        switch (ev) {
            case json::parse_event_t::object_start:
            case json::parse_event_t::array_start:
                if (depth >= 8)
                    throw format_error(origin + ": header JSON nested deeper than 8 levels (a safetensors header "
                                                "has 3)");
                if (ev == json::parse_event_t::object_start) open_objects.emplace_back();
                break;
            case json::parse_event_t::object_end:
                if (!open_objects.empty()) open_objects.pop_back();
                break;
            case json::parse_event_t::key: {
                const auto& k = parsed.get_ref<const std::string&>();
                if (!open_objects.empty() && !open_objects.back().insert(k).second) {
                    if (depth == 1) throw format_error(origin + ": duplicate tensor name '" + k + "' in header");
                    throw format_error(origin + ": duplicate key '" + k + "' in header (at nesting depth " +
                                       std::to_string(depth) + ")");
                }
                if (depth == 1) top_keys.push_back(k);
                break;
            }
            default: break;
        }
        return true;
    };
    try {
        json j = json::parse(text.begin(), text.end(), cb);
        return {std::move(j), std::move(top_keys)};
    } catch (const json::parse_error& e) {
        throw format_error(origin + ": header is not valid JSON (byte " + std::to_string(e.byte) + " of " +
                           std::to_string(text.size()) + "-byte header): " + io::detail::parse_error_detail(e.what()));
    } catch (const json::exception& e) {
        throw format_error(origin + ": header is not valid JSON: " + e.what());
    }
}

/// Non-negative integer held by a JSON value, or false.
inline bool json_u64(const nlohmann::json& v, std::uint64_t& out) {
    if (v.is_number_unsigned()) {
        out = v.get<std::uint64_t>();
        return true;
    }
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) {
        out = static_cast<std::uint64_t>(v.get<std::int64_t>());
        return true;
    }
    return false;
}

inline std::string short_dump(const nlohmann::json& v) {
    std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

/// Validates and decodes one header entry.
inline tensor_info parse_entry(const std::string& name, const nlohmann::json& e, std::uint64_t data_size,
                               const std::string& origin) {
    const std::string where = origin + ": tensor '" + name + "'";
    if (!e.is_object())
        throw format_error(where + ": header entry must be an object, found " + io::detail::json_kind(e));
    tensor_info t;
    t.name = name;

    const auto dt = e.find("dtype");
    if (dt == e.end()) throw format_error(where + ": header entry has no 'dtype'");
    if (!dt->is_string()) throw format_error(where + ": 'dtype' must be a string, found " + short_dump(*dt));
    try {
        t.type = parse_dtype(dt->get_ref<const std::string&>());
    } catch (const dtype_error& err) {
        throw format_error(where + ": " + err.what());
    }

    const auto sh = e.find("shape");
    if (sh == e.end()) throw format_error(where + ": header entry has no 'shape'");
    if (!sh->is_array()) throw format_error(where + ": 'shape' must be an array, found " + short_dump(*sh));
    // Product of the non-zero dims, with the byte size, must fit in int64 so that every partial product
    // computed later (numel, strides) stays in range.
    constexpr auto limit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
    std::uint64_t prod = dtype_size(t.type);
    bool has_zero = false;
    for (std::size_t i = 0; i < sh->size(); ++i) {
        std::uint64_t d = 0;
        if (!json_u64((*sh)[i], d))
            throw format_error(where + ": shape[" + std::to_string(i) + "] must be a non-negative integer, found " +
                               short_dump((*sh)[i]));
        if (d == 0) {
            has_zero = true;
        } else if (d > limit / prod) {
            throw format_error(where + ": shape " + short_dump(*sh) + " overflows: element count times " +
                               std::to_string(dtype_size(t.type)) + " bytes exceeds 2^63 - 1");
        } else {
            prod *= d;
        }
        t.shape.push_back(static_cast<std::int64_t>(d));
    }
    const std::uint64_t expected_bytes = has_zero ? 0 : prod;

    const auto off = e.find("data_offsets");
    if (off == e.end()) throw format_error(where + ": header entry has no 'data_offsets'");
    if (!off->is_array() || off->size() != 2 || !json_u64((*off)[0], t.begin) || !json_u64((*off)[1], t.end))
        throw format_error(where + ": 'data_offsets' must be two non-negative integers [begin, end], found " +
                           short_dump(*off));
    std::string range = "[";  // built by appending: `"[" + std::string&&` trips GCC 12's -Wrestrict false positive
    range += std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.begin > t.end) throw format_error(where + ": data_offsets " + range + " are reversed (begin > end)");
    if (t.end > data_size)
        throw format_error(where + ": data_offsets " + range + " out of range of the " + std::to_string(data_size) +
                           "-byte data section");
    if (t.end - t.begin != expected_bytes)
        throw format_error(where + ": data_offsets " + range + " span " + std::to_string(t.end - t.begin) +
                           " bytes, expected " + std::to_string(expected_bytes) + " (shape " +
                           shape_string(t.shape) + " x " + std::to_string(dtype_size(t.type)) + "-byte " +
                           std::string(dtype_name(t.type)) + ")");
    return t;
}

}  // namespace detail

/// A safetensors file opened for reading: the header is parsed and validated once, the data stays in the
/// read-only mapping. Copies share the mapping; views returned stay valid while any copy is alive.
class file {
public:
    /// Maps and validates `path`. Throws io_error (path and OS reason) when it cannot be opened, and
    /// format_error naming the file and the defect for any malformed header or offsets.
    explicit file(const std::filesystem::path& path) : file(detail::byte_store::map_file(path), path.string()) {}

    /// Parses an in-memory file image (copied; used by the fuzzer and tests). `origin` names it in messages.
    static file from_bytes(std::span<const std::byte> image, const std::string& origin = "<memory>") {
        if (image.size() < 8)
            throw format_error("safetensors file '" + origin + "' is " + std::to_string(image.size()) +
                               " bytes long, shorter than the 8-byte header length field");
        return file(detail::byte_store::copy_of(image), origin);
    }

    const std::string& origin() const noexcept { return origin_; }
    /// Every tensor, in header (file) order.
    const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
    std::size_t size() const noexcept { return tensors_.size(); }
    std::vector<std::string> names() const {
        std::vector<std::string> n;
        n.reserve(tensors_.size());
        for (const auto& t : tensors_) n.push_back(t.name);
        return n;
    }
    bool contains(std::string_view name) const { return index_.find(std::string(name)) != index_.end(); }
    /// The `__metadata__` string map (empty when absent).
    const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

    /// Entry for `name`. Throws format_error naming the tensor and the file when absent.
    const tensor_info& info(std::string_view name) const {
        const auto it = index_.find(std::string(name));
        if (it == index_.end())
            throw format_error(origin_ + ": no tensor named '" + std::string(name) + "' (the file holds " +
                               std::to_string(tensors_.size()) + " tensors)");
        return tensors_[it->second];
    }

    /// Raw bytes of a tensor inside the mapping.
    std::span<const std::byte> bytes(std::string_view name) const {
        const auto& t = info(name);
        return {data_begin() + t.begin, static_cast<std::size_t>(t.nbytes())};
    }
    /// The whole file image.
    std::span<const std::byte> image() const noexcept { return {store_->data(), store_->size()}; }
    /// Byte offset of the data section in the file (8 + header length).
    std::size_t data_offset() const noexcept { return data_offset_; }

    /// Whether view<T, R>(name) would succeed (dtype matches, rank R, data aligned for T).
    template <class T, std::size_t R>
    bool can_view(std::string_view name) const {
        const auto& t = info(name);
        return t.type == dtype_of_v<T> && t.rank() == R &&
               (t.nbytes() == 0 || reinterpret_cast<std::uintptr_t>(data_begin() + t.begin) % alignof(T) == 0);
    }

    /// Zero-copy view of a tensor stored as T, pointing into the mapping (data is null for a zero-size tensor).
    /// Throws dtype_error when the stored dtype is not T, shape_error when the rank is not R, and
    /// format_error when the data is not aligned for T (use to_tensor / to_f32 then).
    template <class T, std::size_t R>
    tensor_view<const T, R> view(std::string_view name) const {
        const auto& t = info(name);
        if (t.type != dtype_of_v<T>)
            throw dtype_error(origin_ + ": tensor '" + t.name + "' is " + std::string(dtype_name(t.type)) +
                              ", requested a view of " + std::string(dtype_name(dtype_of_v<T>)));
        if (t.rank() != R)
            throw shape_error(origin_ + ": tensor '" + t.name + "' has shape " + shape_string(t.shape) +
                              " (rank " + std::to_string(t.rank()) + "), requested a view of rank " +
                              std::to_string(R));
        const std::byte* p = data_begin() + t.begin;
        std::array<std::int64_t, R> s{};
        for (std::size_t i = 0; i < R; ++i) s[i] = t.shape[i];  // (a copy into a rank-0 array trips GCC 13's -Wnonnull)
        if (t.nbytes() == 0) return tensor_view<const T, R>(nullptr, s);  // nothing to point at
        if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
            throw format_error(origin_ + ": tensor '" + t.name + "' data at file offset " +
                               std::to_string(data_offset_ + t.begin) + " is not aligned to " +
                               std::to_string(alignof(T)) + " bytes; use a copying accessor");
        return tensor_view<const T, R>(reinterpret_cast<const T*>(p), s);
    }

    /// Copy of a tensor stored as T (exact dtype; any alignment). Throws dtype_error on a dtype mismatch.
    template <class T>
    tensor<T> to_tensor(std::string_view name) const {
        if constexpr (std::is_same_v<T, float>) {
            return to_f32(name);
        } else {
            const auto& t = info(name);
            if (t.type != dtype_of_v<T>)
                throw dtype_error(origin_ + ": tensor '" + t.name + "' is " + std::string(dtype_name(t.type)) +
                                  ", requested " + std::string(dtype_name(dtype_of_v<T>)));
            tensor<T> out(t.shape);
            if (t.nbytes() > 0) std::memcpy(out.data(), data_begin() + t.begin, t.nbytes());
            return out;
        }
    }

    /// Copy converted to fp32 from any stored dtype (f32, f64, bf16, f16, i32, i64, i8).
    tensor<float> to_f32(std::string_view name) const {
        const auto& t = info(name);
        tensor<float> out(t.shape);
        const auto n = static_cast<std::size_t>(t.numel());
        if (n == 0) return out;
        const std::byte* p = data_begin() + t.begin;
        if (reinterpret_cast<std::uintptr_t>(p) % dtype_size(t.type) == 0) {
            convert_to_f32(t.type, p, out.data(), n);
        } else {  // unaligned source: stage through an aligned copy
            std::unique_ptr<std::byte, detail::aligned_delete> tmp(
                static_cast<std::byte*>(::operator new(t.nbytes(), std::align_val_t{64})));
            std::memcpy(tmp.get(), p, t.nbytes());
            convert_to_f32(t.type, tmp.get(), out.data(), n);
        }
        return out;
    }

private:
    file(std::shared_ptr<const detail::byte_store> store, std::string origin)
        : store_(std::move(store)), origin_(std::move(origin)) {
        parse();
    }

    const std::byte* data_begin() const noexcept { return store_->data() + data_offset_; }

    void parse() {
        const std::size_t size = store_->size();
        if (size < 8)
            throw format_error("safetensors file '" + origin_ + "' is " + std::to_string(size) +
                               " bytes long, shorter than the 8-byte header length field");
        const std::uint64_t n = detail::read_u64_le(store_->data());
        // A file of another kind (text, a PyTorch .bin) usually fails here: say so, not only that the length is odd.
        const bool object_follows = size > 8 && static_cast<char>(store_->data()[8]) == '{';
        const std::string kind_hint =
            object_follows ? "" : " (this is not a safetensors file: no JSON header '{' follows the 8-byte length field)";
        if (n > size - 8)
            throw format_error(origin_ + ": header length " + std::to_string(n) + " is larger than the " +
                               std::to_string(size - 8) + " bytes that follow the length field" + kind_hint);
        if (n > max_header_bytes)
            throw format_error(origin_ + ": header length " + std::to_string(n) + " exceeds the limit of " +
                               std::to_string(max_header_bytes) + " bytes" + kind_hint);
        data_offset_ = static_cast<std::size_t>(8 + n);
        const std::uint64_t data_size = size - data_offset_;
        const std::string_view text(reinterpret_cast<const char*>(store_->data() + 8), static_cast<std::size_t>(n));
        auto [header, order] = detail::parse_header_json(text, origin_);
        if (!header.is_object())
            throw format_error(origin_ + ": header must be a JSON object, found " + io::detail::json_kind(header));

        tensors_.reserve(order.size());
        for (const auto& name : order) {
            const auto it = header.find(name);  // present: `order` lists the header's own keys
            const nlohmann::json& e = *it;
            if (name == "__metadata__") {
                read_metadata(e);
                continue;
            }
            index_.emplace(name, tensors_.size());
            tensors_.push_back(detail::parse_entry(name, e, data_size, origin_));
        }
        check_overlaps();
    }

    void read_metadata(const nlohmann::json& m) {
        if (m.is_null()) return;
        if (!m.is_object())
            throw format_error(origin_ + ": '__metadata__' must be an object of strings, found " +
                               io::detail::json_kind(m));
        for (const auto& [k, v] : m.items()) {
            if (!v.is_string())
                throw format_error(origin_ + ": '__metadata__' value for '" + k + "' must be a string, found " +
                                   detail::short_dump(v));
            metadata_.emplace(k, v.get<std::string>());
        }
    }

    /// The tensors must tile the data section exactly, as the reference safetensors reader requires: sorted by
    /// offset, each begins where the previous ended, the first at 0 and the last ends at the end of the file.
    /// Overlaps, holes and trailing bytes are format errors (a shifted header length shows up as one of them).
    void check_overlaps() const {
        std::vector<const tensor_info*> by_offset;
        for (const auto& t : tensors_) by_offset.push_back(&t);
        std::sort(by_offset.begin(), by_offset.end(), [](const tensor_info* a, const tensor_info* b) {
            return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
        });
        std::uint64_t end = 0;
        const tensor_info* prev = nullptr;
        for (const auto* t : by_offset) {
            if (prev && t->begin < end)
                throw format_error(origin_ + ": tensors '" + prev->name + "' [" + std::to_string(prev->begin) + ", " +
                                   std::to_string(prev->end) + "] and '" + t->name + "' [" + std::to_string(t->begin) +
                                   ", " + std::to_string(t->end) + "] overlap in the data section");
            if (t->begin != end)
                throw format_error(origin_ + ": tensor '" + t->name + "' data_offsets start at " + std::to_string(t->begin) +
                                   ", expected " + std::to_string(end) + " (the tensors must cover the data section without holes)");
            end = t->end;
            prev = t;
        }
        const std::uint64_t data_size = store_->size() - data_offset_;
        if (end != data_size)
            throw format_error(origin_ + ": the tensors cover " + std::to_string(end) + " bytes of the " +
                               std::to_string(data_size) + "-byte data section (trailing bytes, or a wrong header length)");
    }

    std::shared_ptr<const detail::byte_store> store_;
    std::string origin_;
    std::size_t data_offset_ = 0;
    std::vector<tensor_info> tensors_;
    std::unordered_map<std::string, std::size_t> index_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace hymix::safetensors
