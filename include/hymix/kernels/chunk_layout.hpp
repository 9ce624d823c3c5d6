// The chunk table of a chunked kernel call (spec.md §3.3, §4.3): every sequence cut into chunks of at most Q
// tokens, the first at the sequence start. The named stages of ssd.hpp and gated_delta.hpp exchange per-chunk
// tensors indexed by it (one work item per (chunk, head), like fla's chunk_indices for varlen batches).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hymix/core/error.hpp"

namespace hymix::kernels {

/// Chunks of the sequences of one call over a token matrix of n_rows rows. Sequence s covers rows
/// [seq_start(s), seq_start(s) + seq_length(s)) and owns chunks [first_chunk(s), first_chunk(s + 1)); chunk k covers
/// rows [row(k), row(k) + length(k)), length(k) ≤ chunk_size(). A sequence of length 0 (or one the caller skips)
/// has no chunks. Built once per call; immutable.
class chunk_layout {
public:
    chunk_layout() = default;

    /// Sequence i is rows [starts[i], starts[i] + lengths[i]). Throws config_error when chunk < 1 and shape_error
    /// when a range lies outside [0, n_rows) or starts and lengths differ in size.
    chunk_layout(std::int64_t n_rows, std::int64_t chunk, std::span<const std::int64_t> starts,
                 std::span<const std::int64_t> lengths)
        : n_rows_(n_rows), chunk_(chunk) {
        if (chunk < 1) throw config_error("chunk_layout: chunk size must be >= 1, found " + std::to_string(chunk));
        if (starts.size() != lengths.size())
            throw shape_error("chunk_layout: " + std::to_string(starts.size()) + " sequence starts but " +
                              std::to_string(lengths.size()) + " lengths");
        seq_first_.clear();
        seq_first_.reserve(starts.size() + 1);
        for (std::size_t s = 0; s < starts.size(); ++s) {
            if (starts[s] < 0 || lengths[s] < 0 || starts[s] + lengths[s] > n_rows)
                throw shape_error("chunk_layout: sequence " + std::to_string(s) + " rows [" + std::to_string(starts[s]) + ", " +
                                  std::to_string(starts[s] + lengths[s]) + ") outside [0, " + std::to_string(n_rows) + ")");
            seq_first_.push_back(n_chunks());
            for (std::int64_t c0 = 0; c0 < lengths[s]; c0 += chunk) {
                rows_.push_back(starts[s] + c0);
                lengths_.push_back(std::min(chunk, lengths[s] - c0));
                seqs_.push_back(static_cast<std::int64_t>(s));
                width_ = std::max(width_, lengths_.back());
            }
        }
        seq_first_.push_back(n_chunks());
        seq_starts_.assign(starts.begin(), starts.end());
        seq_lengths_.assign(lengths.begin(), lengths.end());
    }

    std::int64_t n_rows() const noexcept { return n_rows_; }
    /// The requested chunk size Q.
    std::int64_t chunk_size() const noexcept { return chunk_; }
    /// The longest chunk (≤ Q; 0 without chunks): the padded width of per-chunk [W, W] tiles.
    std::int64_t width() const noexcept { return width_; }
    std::int64_t n_chunks() const noexcept { return static_cast<std::int64_t>(rows_.size()); }
    std::int64_t n_seq() const noexcept { return static_cast<std::int64_t>(seq_starts_.size()); }

    std::int64_t row(std::int64_t k) const { return rows_[static_cast<std::size_t>(k)]; }
    std::int64_t length(std::int64_t k) const { return lengths_[static_cast<std::size_t>(k)]; }
    /// The sequence chunk k belongs to.
    std::int64_t seq(std::int64_t k) const { return seqs_[static_cast<std::size_t>(k)]; }
    /// First chunk of sequence s; first_chunk(n_seq()) == n_chunks().
    std::int64_t first_chunk(std::int64_t s) const { return seq_first_[static_cast<std::size_t>(s)]; }
    std::int64_t seq_start(std::int64_t s) const { return seq_starts_[static_cast<std::size_t>(s)]; }
    std::int64_t seq_length(std::int64_t s) const { return seq_lengths_[static_cast<std::size_t>(s)]; }

    /// Throws shape_error unless the layout was made for a token matrix of n_rows rows.
    void require_rows(std::int64_t n_rows, std::string_view who, std::string_view tensor) const {
        if (n_rows != n_rows_)
            throw shape_error(std::string(who) + ": the chunk layout covers " + std::to_string(n_rows_) + " rows but " +
                              std::string(tensor) + " has " + std::to_string(n_rows));
    }

private:
    std::int64_t n_rows_ = 0, chunk_ = 1, width_ = 0;
    std::vector<std::int64_t> rows_, lengths_, seqs_;             // [n_chunks]
    std::vector<std::int64_t> seq_first_{0};                      // [n_seq + 1]
    std::vector<std::int64_t> seq_starts_, seq_lengths_;          // [n_seq]
};

}  // namespace hymix::kernels
