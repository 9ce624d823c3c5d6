// Tokenizers as a replaceable policy: the `tokenizer` concept, and the byte-level tokenizer of the shared
// KJV checkpoints (token id = byte value, vocabulary 256, no BOS/EOS; ../shared/models/README.md).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hymix {

/// What the tools need from a tokenizer: text -> ids, one id -> its bytes, and the vocabulary size.
template <class T>
concept tokenizer = requires(const T& t, std::string_view text, std::int32_t id) {
    { t.encode(text) } -> std::same_as<std::vector<std::int32_t>>;
    { t.decode(id) } -> std::convertible_to<std::string>;
    { t.vocab_size() } -> std::convertible_to<std::int64_t>;
};

/// Byte-level tokenizer: every byte is its own token (ids 0..255).
struct byte_tokenizer {
    std::vector<std::int32_t> encode(std::string_view text) const {
        std::vector<std::int32_t> ids(text.size());
        for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
        return ids;
    }
    /// The byte of token `id` (ids outside 0..255 decode to an empty string).
    std::string decode(std::int32_t id) const {
        if (id < 0 || id > 255) return {};
        return std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
    }
    std::int64_t vocab_size() const noexcept { return 256; }
};
static_assert(tokenizer<byte_tokenizer>);

}  // namespace hymix
