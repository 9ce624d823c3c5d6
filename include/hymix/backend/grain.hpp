// How much work one task of a parallel loop should hold. A fork and join of warm oneTBB threads costs a few
// microseconds (more with more threads), which is all the work of a small layer's decode step: a loop whose items
// are small runs them in tasks of at least a minimum of work, and inline when the whole loop holds less. Callers
// count work in their own unit (multiply-adds, bytes of state touched) and pass the minimum that unit needs.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hymix {

/// Multiply-adds one task of a CPU loop should hold at least: 64 Ki, about 2 µs of an fp32 GEMV from cache on one
/// core, the cost of a fork and join of warm threads (measured with bench_oryx's small layers: a d_model 256 layer's
/// decode step got slower with every thread added while its projections split 256 × 256 weights over all of them).
inline constexpr std::int64_t min_task_macs = std::int64_t{1} << 16;

/// Items per task for items of `work_per_item` each, so that a task holds at least `min_work`: ceil(min_work /
/// work_per_item), at least 1. Exact as parallel_for_static's min_items; as a parallel_for grain, pass it through
/// split_grain.
constexpr std::int64_t items_per_task(std::int64_t work_per_item, std::int64_t min_work) noexcept {
    const std::int64_t w = std::max<std::int64_t>(work_per_item, 1);
    return std::max<std::int64_t>(1, (min_work + w - 1) / w);
}

/// The parallel_for grain whose tasks hold at least `min_items` items: oneTBB's blocked_range halves a range while it
/// is longer than the grain, so its pieces hold between grain / 2 and grain items; a grain of 2 · min_items − 1 keeps
/// every piece at min_items or more (and a range of fewer than 2 · min_items items runs as one task, inline).
constexpr std::int64_t split_grain(std::int64_t min_items) noexcept { return 2 * std::max<std::int64_t>(min_items, 1) - 1; }

/// The parallel_for grain for items of `macs_per_item` multiply-adds each: tasks of at least min_task_macs.
constexpr std::int64_t task_grain(std::int64_t macs_per_item) noexcept {
    return split_grain(items_per_task(macs_per_item, min_task_macs));
}

}  // namespace hymix
