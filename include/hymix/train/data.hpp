// Byte-level training data over one text file (token id = byte value, vocabulary 256): the train / held-out split
// of ../shared/models/README.md (the first 95% of the bytes train, the rest is held out; for the KJV text the
// boundary is byte 4083327) and batches of random windows drawn uniformly from the training split with a seeded
// generator whose state is saved in checkpoints, so a resumed run draws the same batches as an uninterrupted one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/core/seq_batch.hpp"

namespace hymix::train {

/// The whole text as bytes plus the split point.
struct byte_corpus {
    std::vector<std::uint8_t> bytes;
    std::int64_t train_end = 0;  ///< bytes [0, train_end) train; [train_end, size) are held out

    std::int64_t size() const noexcept { return static_cast<std::int64_t>(bytes.size()); }
    std::int64_t n_train() const noexcept { return train_end; }
    std::int64_t n_heldout() const noexcept { return size() - train_end; }

    /// The split of shared/models/README.md: floor(0.95 · n) (4083327 for the 4298239-byte KJV).
    static std::int64_t default_split(std::int64_t n) { return static_cast<std::int64_t>(static_cast<double>(n) * 0.95); }

    /// Reads `path`. train_fraction in (0, 1]; 0.95 gives the shared split. Throws io_error when the file cannot be
    /// read, value_error when it is too small to hold a training window plus a held-out byte.
    static byte_corpus load(const std::filesystem::path& path, double train_fraction = 0.95) {
        std::error_code ec;
        if (std::filesystem::is_directory(path, ec)) throw io_error("training text '" + path.string() + "' is a directory, not a file");
        std::ifstream f(path, std::ios::binary);
        if (!f) throw io_error("cannot open training text '" + path.string() + "'");
        byte_corpus c;
        try {  // a read error (e.g. EIO) surfaces from the stream buffer as an exception
            c.bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        } catch (const std::exception& e) {
            throw io_error("error reading training text '" + path.string() + "': " + e.what());
        }
        if (f.bad()) throw io_error("error reading training text '" + path.string() + "'");
        c.train_end = train_fraction == 0.95 ? default_split(c.size())
                                             : static_cast<std::int64_t>(static_cast<double>(c.size()) * train_fraction);
        if (!(train_fraction > 0 && train_fraction <= 1))
            throw value_error("byte_corpus: train_fraction must lie in (0, 1], found " + std::to_string(train_fraction));
        if (c.train_end < 2)
            throw value_error("training text '" + path.string() + "' has " + std::to_string(c.size()) +
                              " bytes: too few to train on");
        return c;
    }
};

/// One batch: `n_seq` windows of `seq_len` inputs packed densely (row r = window r / seq_len, position r % seq_len)
/// and their next-byte targets.
struct token_batch {
    std::int64_t n_seq = 0, seq_len = 0;
    std::vector<std::int32_t> inputs, targets;  // [n_seq · seq_len] each
    seq_batch batch() const { return seq_batch::dense(n_seq, seq_len); }
    std::int64_t n_tokens() const noexcept { return n_seq * seq_len; }
};

/// Random windows of seq_len + 1 bytes, start uniform in [0, n_train − seq_len − 1], from a mt19937_64 stream.
class window_sampler {
public:
    window_sampler(const byte_corpus& c, std::int64_t seq_len, std::uint64_t seed) : c_(&c), seq_len_(seq_len), rng_(seed) {
        if (seq_len <= 0) throw value_error("window_sampler: seq_len must be positive, found " + std::to_string(seq_len));
        if (c.n_train() < seq_len + 1)
            throw value_error("window_sampler: the training split has " + std::to_string(c.n_train()) +
                              " bytes, a window needs " + std::to_string(seq_len + 1));
    }

    std::int64_t seq_len() const noexcept { return seq_len_; }
    /// The next batch of n_seq windows.
    token_batch next(std::int64_t n_seq) {
        token_batch b;
        b.n_seq = n_seq;
        b.seq_len = seq_len_;
        b.inputs.resize(static_cast<std::size_t>(n_seq * seq_len_));
        b.targets.resize(b.inputs.size());
        std::uniform_int_distribution<std::int64_t> u(0, c_->n_train() - seq_len_ - 1);
        for (std::int64_t s = 0; s < n_seq; ++s) {
            const std::int64_t start = u(rng_);
            for (std::int64_t t = 0; t < seq_len_; ++t) {
                const auto r = static_cast<std::size_t>(s * seq_len_ + t);
                b.inputs[r] = c_->bytes[static_cast<std::size_t>(start + t)];
                b.targets[r] = c_->bytes[static_cast<std::size_t>(start + t + 1)];
            }
        }
        return b;
    }

    /// The generator's state as text (saved in checkpoints) and its restoration. Throws format_error on bad text.
    std::string state() const {
        std::ostringstream o;
        o << rng_;
        return o.str();
    }
    void set_state(const std::string& s) {
        std::istringstream i(s);
        std::mt19937_64 r;
        i >> r;
        if (i.fail()) throw format_error("window_sampler: malformed generator state in checkpoint");
        rng_ = r;
    }

private:
    const byte_corpus* c_;
    std::int64_t seq_len_;
    std::mt19937_64 rng_;
};

}  // namespace hymix::train
