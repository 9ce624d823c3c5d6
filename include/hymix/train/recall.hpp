// Byte-level associative-recall tasks (issue 10's recall benchmark): multi-query associative recall (MQAR; Arora
// et al. 2023, "Zoology", §3: key-value pairs, then queries whose answers are the values bound to their keys) and a
// needle in a text haystack, from one seeded generator. hymix trains on them through the ordinary trainer (the
// `batches` hook of train_setup) and scores accuracy under Oryx's mode schedules (examples/recall.cpp).
//
// One sequence is T + 1 bytes s[0..T]; the model reads s[0..T) and predicts the next byte:
//   - keys are bytes 0x80–0xBF (64 keys), values bytes 0xC0–0xFF (64 values): outside ASCII, so an ASCII haystack
//     (the KJV text) never contains them and a key byte always starts a pair;
//   - the last 2·Q bytes are the queries: Q distinct keys of the context's pairs in random order, each followed by its
//     value (s[C + 2j] = key, s[C + 2j + 1] = value, C = T + 1 − 2Q). The target at each query key's position is the
//     value; every other position has target −1 (no loss, not scored). Values of earlier queries are visible to later
//     ones, as in MQAR;
//   - the context s[0..C) is filler (a window of the haystack at a uniform start, or uniform printable ASCII
//     0x20–0x7E when there is no haystack) with N pairs (key, value) written over it: N distinct keys drawn without
//     replacement, values uniform (repeats allowed). `scatter` = false puts the pairs back to back at the start (MQAR);
//     true puts them in N distinct 2-byte slots at uniform positions 2·i of the context (needles at random depths).
// Sequence i of a call with seed S is generated from its own stream (mt19937_64 seeded by a SplitMix64 mix of S and
// i), with draws reduced by modulo (a draw from [0, m) is biased by under m / 2⁶⁴: 2⁻⁴² for a window start in a
// 4 MB haystack), so a sequence does not depend on the batch size and is the same under every standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "hymix/core/error.hpp"
#include "hymix/train/data.hpp"

namespace hymix::train {

inline constexpr int recall_key_base = 0x80, recall_value_base = 0xC0, recall_alphabet = 64;

/// One recall task. Shapes: sequences of seq_len input bytes; n_pairs pairs in the context, n_queries of them asked.
struct recall_task {
    std::int64_t seq_len = 256;  ///< T, input bytes per sequence
    std::int64_t n_pairs = 16;   ///< N, 1 … 64
    std::int64_t n_queries = 16; ///< Q, 1 … N
    bool scatter = false;        ///< pairs at random depths (needle) instead of back to back at the start (MQAR)

    /// Bytes before the query region: C = T + 1 − 2Q.
    std::int64_t context_len() const noexcept { return seq_len + 1 - 2 * n_queries; }

    /// Throws config_error naming the field when the task cannot be generated.
    void validate() const {
        const auto s = describe();
        if (n_pairs < 1 || n_pairs > recall_alphabet)
            throw config_error("recall task " + s + ": n_pairs must lie in [1, " + std::to_string(recall_alphabet) + "], found " +
                               std::to_string(n_pairs));
        if (n_queries < 1 || n_queries > n_pairs)
            throw config_error("recall task " + s + ": n_queries must lie in [1, n_pairs = " + std::to_string(n_pairs) + "], found " +
                               std::to_string(n_queries));
        if (context_len() < 2 * n_pairs)
            throw config_error("recall task " + s + ": seq_len " + std::to_string(seq_len) + " leaves " + std::to_string(std::max<std::int64_t>(0, context_len())) +
                               " context bytes, the pairs need " + std::to_string(2 * n_pairs));
    }
    /// "mqar:T:N:Q" or "needle:T:N:Q".
    std::string describe() const {
        return std::string(scatter ? "needle" : "mqar") + ":" + std::to_string(seq_len) + ":" + std::to_string(n_pairs) + ":" + std::to_string(n_queries);
    }
};

/// MQAR with n pairs back to back and all n asked.
inline recall_task mqar_task(std::int64_t seq_len, std::int64_t n_pairs) { return {seq_len, n_pairs, n_pairs, false}; }
/// n needles (pairs) at random depths of the haystack, all asked at the end (n = 1: the classic needle in a haystack).
inline recall_task needle_task(std::int64_t seq_len, std::int64_t n_needles = 1) { return {seq_len, n_needles, n_needles, true}; }

/// Parses "mqar:T:N", "mqar:T:N:Q", "needle:T", "needle:T:N" or "needle:T:N:Q". Throws config_error.
inline recall_task parse_recall_task(const std::string& spec) {
    std::vector<std::int64_t> v;
    const auto colon = spec.find(':');
    const std::string kind = spec.substr(0, colon);
    try {
        std::size_t p = colon;
        while (p != std::string::npos) {
            const auto q = spec.find(':', p + 1);
            const std::string f = spec.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1);
            std::size_t used = 0;
            v.push_back(std::stoll(f, &used));
            if (used != f.size()) throw std::invalid_argument(f);
            p = q;
        }
    } catch (const std::exception&) {
        throw config_error("recall task '" + spec + "': the fields after the kind must be integers");
    }
    recall_task t;
    if (kind == "mqar" && (v.size() == 2 || v.size() == 3)) t = {v[0], v[1], v.size() == 3 ? v[2] : v[1], false};
    else if (kind == "needle" && v.size() >= 1 && v.size() <= 3)
        t = {v[0], v.size() > 1 ? v[1] : 1, v.size() > 2 ? v[2] : (v.size() > 1 ? v[1] : 1), true};
    else
        throw config_error("recall task '" + spec + "' is not mqar:T:N[:Q] or needle:T[:N[:Q]]");
    t.validate();
    return t;
}

/// A haystack: text whose bytes are all below 0x80 (checked once here).
class recall_haystack {
public:
    recall_haystack() = default;
    /// Throws value_error naming the offset of the first byte of the key/value alphabet.
    explicit recall_haystack(std::span<const std::uint8_t> text) : text_(text) {
        for (std::size_t i = 0; i < text.size(); ++i)
            if (text[i] >= recall_key_base)
                throw value_error("recall haystack: byte " + std::to_string(text[i]) + " at offset " + std::to_string(i) +
                                  " lies in the key/value alphabet (0x80-0xFF); the haystack must be ASCII");
    }
    std::span<const std::uint8_t> text() const noexcept { return text_; }
    bool empty() const noexcept { return text_.empty(); }

private:
    std::span<const std::uint8_t> text_;
};

namespace detail {
inline std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
/// k distinct values of [0, n) in random order (partial Fisher–Yates).
inline std::vector<std::int64_t> draw_distinct(std::mt19937_64& g, std::int64_t n, std::int64_t k) {
    std::vector<std::int64_t> a(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = i;
    for (std::int64_t i = 0; i < k; ++i) {
        const auto j = i + static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(n - i));
        std::swap(a[static_cast<std::size_t>(i)], a[static_cast<std::size_t>(j)]);
    }
    a.resize(static_cast<std::size_t>(k));
    return a;
}
}  // namespace detail

/// The T + 1 bytes of sequence `index` of `task` under `seed` (see the top of this file). The haystack must hold at
/// least C bytes when not empty. Throws config_error (task), value_error (haystack too short).
inline std::vector<std::uint8_t> recall_sequence(const recall_task& task, const recall_haystack& hay, std::uint64_t seed, std::uint64_t index) {
    task.validate();
    const std::int64_t T = task.seq_len, C = task.context_len(), N = task.n_pairs, Q = task.n_queries;
    std::mt19937_64 g(detail::splitmix64(seed ^ detail::splitmix64(index + 0x51ed27ULL)));
    std::vector<std::uint8_t> s(static_cast<std::size_t>(T + 1));
    if (!hay.empty()) {
        const auto n = static_cast<std::int64_t>(hay.text().size());
        if (n < C)
            throw value_error("recall task " + task.describe() + ": the haystack has " + std::to_string(n) + " bytes, a context needs " +
                              std::to_string(C));
        const auto start = static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(n - C + 1));
        std::copy_n(hay.text().begin() + start, C, s.begin());
    } else {
        for (std::int64_t t = 0; t < C; ++t) s[static_cast<std::size_t>(t)] = static_cast<std::uint8_t>(0x20 + g() % 95);
    }
    const auto keys = detail::draw_distinct(g, recall_alphabet, N);
    std::vector<std::uint8_t> values(static_cast<std::size_t>(N));
    for (auto& v : values) v = static_cast<std::uint8_t>(recall_value_base + g() % recall_alphabet);
    std::vector<std::int64_t> slots;
    if (task.scatter) {
        slots = detail::draw_distinct(g, C / 2, N);
        std::sort(slots.begin(), slots.end());
    } else {
        for (std::int64_t i = 0; i < N; ++i) slots.push_back(i);
    }
    for (std::int64_t i = 0; i < N; ++i) {
        const auto p = static_cast<std::size_t>(2 * slots[static_cast<std::size_t>(i)]);
        s[p] = static_cast<std::uint8_t>(recall_key_base + keys[static_cast<std::size_t>(i)]);
        s[p + 1] = values[static_cast<std::size_t>(i)];
    }
    const auto asked = detail::draw_distinct(g, N, Q);
    for (std::int64_t j = 0; j < Q; ++j) {
        const auto i = static_cast<std::size_t>(asked[static_cast<std::size_t>(j)]);
        s[static_cast<std::size_t>(C + 2 * j)] = static_cast<std::uint8_t>(recall_key_base + keys[i]);
        s[static_cast<std::size_t>(C + 2 * j + 1)] = values[i];
    }
    return s;
}

/// A batch of recall sequences, dense [n_seq, T]: inputs s[0..T) and targets (the value at each query key's position,
/// −1 elsewhere). Sequence r of the batch is sequence first_index + r of the stream, using tasks[(first_index + r) %
/// tasks.size()] (a mixture; every task must have the same seq_len). Throws config_error (tasks), value_error.
inline token_batch make_recall_batch(std::span<const recall_task> tasks, const recall_haystack& hay, std::int64_t n_seq, std::uint64_t seed,
                                     std::uint64_t first_index = 0) {
    if (tasks.empty()) throw config_error("make_recall_batch: no task");
    if (n_seq < 1) throw config_error("make_recall_batch: n_seq must be positive, found " + std::to_string(n_seq));
    const std::int64_t T = tasks[0].seq_len;
    for (const auto& t : tasks)
        if (t.seq_len != T)
            throw config_error("make_recall_batch: tasks of one batch must share seq_len: " + tasks[0].describe() + " and " + t.describe());
    token_batch b;
    b.n_seq = n_seq;
    b.seq_len = T;
    b.inputs.resize(static_cast<std::size_t>(n_seq * T));
    b.targets.assign(static_cast<std::size_t>(n_seq * T), -1);
    for (std::int64_t r = 0; r < n_seq; ++r) {
        const auto idx = first_index + static_cast<std::uint64_t>(r);
        const auto& task = tasks[static_cast<std::size_t>(idx % tasks.size())];
        const auto s = recall_sequence(task, hay, seed, idx);
        for (std::int64_t t = 0; t < T; ++t) b.inputs[static_cast<std::size_t>(r * T + t)] = s[static_cast<std::size_t>(t)];
        for (std::int64_t j = 0; j < task.n_queries; ++j) {
            const auto t = task.context_len() + 2 * j;
            b.targets[static_cast<std::size_t>(r * T + t)] = s[static_cast<std::size_t>(t + 1)];
        }
    }
    return b;
}
inline token_batch make_recall_batch(const recall_task& task, const recall_haystack& hay, std::int64_t n_seq, std::uint64_t seed,
                                     std::uint64_t first_index = 0) {
    return make_recall_batch(std::span<const recall_task>(&task, 1), hay, n_seq, seed, first_index);
}

/// Accuracy of predictions on a batch's scored rows.
struct recall_score {
    std::int64_t answers = 0, correct = 0;    ///< scored rows, rows whose prediction is the target
    std::int64_t sequences = 0, perfect = 0;  ///< sequences, sequences with every answer right
    double accuracy() const noexcept { return answers > 0 ? static_cast<double>(correct) / static_cast<double>(answers) : 0.0; }
    recall_score& operator+=(const recall_score& o) noexcept {
        answers += o.answers;
        correct += o.correct;
        sequences += o.sequences;
        perfect += o.perfect;
        return *this;
    }
};

/// Scores `predicted` (one byte per row of b, e.g. the argmax of each row's logits) against b's targets. Throws
/// shape_error when the sizes differ.
inline recall_score score_recall(const token_batch& b, std::span<const std::int32_t> predicted) {
    if (static_cast<std::int64_t>(predicted.size()) != b.n_tokens())
        throw shape_error("score_recall: " + std::to_string(predicted.size()) + " predictions for " + std::to_string(b.n_tokens()) + " rows");
    recall_score s;
    for (std::int64_t r = 0; r < b.n_seq; ++r) {
        bool all = true;
        for (std::int64_t t = 0; t < b.seq_len; ++t) {
            const auto i = static_cast<std::size_t>(r * b.seq_len + t);
            if (b.targets[i] < 0) continue;
            ++s.answers;
            if (predicted[i] == b.targets[i]) ++s.correct;
            else all = false;
        }
        ++s.sequences;
        if (all) ++s.perfect;
    }
    return s;
}

}  // namespace hymix::train
