// Where a model's time goes, op by op. A backend that holds an `op_profile` (basic_cpu_backend::set_op_profile)
// has every op it runs through `dispatch` timed: wall time from entry to return (the backend synchronised at both
// ends), added up per op and per argument shapes. A profile answers questions a benchmark of a whole model cannot
// ("which op stops scaling on 16 cores?", "how much of a decode step is the LM head?") without an external profiler,
// which the machines hymix is measured on do not always have.
//
// Only outermost ops are timed: an op dispatched while another op of the same profile is running (from any thread)
// counts in its caller's time, so the entries add up to the time spent inside ops. Work outside ops (the stack's
// own bookkeeping, allocation) is what is left of the caller's wall time. One profile serves one calling thread at a
// time: two threads running ops at once on backends that share a profile have the later one's ops left out.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hymix {

/// The short name of op tag `Op` ("hymix::ops::linear_op" → "linear"), from the compiler's spelling of the type.
template <class Op>
std::string_view op_name() noexcept {
#if defined(__clang__) || defined(__GNUC__)
    std::string_view s = __PRETTY_FUNCTION__;
    // GCC: "... [with Op = hymix::ops::linear_op; ...]"; clang: "... [Op = hymix::ops::linear_op]".
    const auto eq = s.find("Op = ");
    if (eq == std::string_view::npos) return s;
    s.remove_prefix(eq + 5);
    s = s.substr(0, s.find_first_of(";]"));
#else
    std::string_view s = "op";
#endif
    if (const auto c = s.rfind("::"); c != std::string_view::npos) s.remove_prefix(c + 2);
    if (s.size() > 3 && s.substr(s.size() - 3) == "_op") s.remove_suffix(3);
    return s;
}

/// Time per op, accumulated over calls. Thread-safe to record into; entries() and the writers may run while nothing
/// records.
class op_profile {
public:
    struct entry {
        std::string op;        // short op name (op_name)
        std::string shapes;    // the argument views' shapes, "[512,1024] [6144,1024] [512,6144]"; empty when grouped by op
        std::int64_t calls = 0;
        double seconds = 0;    // wall time inside the op, summed over calls
    };

    /// by_shape: one entry per (op, argument shapes) when true, per op when false.
    explicit op_profile(bool by_shape = true) : by_shape_(by_shape) {}

    bool by_shape() const noexcept { return by_shape_; }

    /// Adds one call of `op` with argument shapes `shapes` that took `seconds`.
    void record(std::string_view op, std::string shapes, double seconds) {
        std::lock_guard lock(mu_);
        auto& e = acc_[{std::string(op), by_shape_ ? std::move(shapes) : std::string()}];
        e.first += 1;
        e.second += seconds;
    }

    /// The entries, most time first.
    std::vector<entry> entries() const {
        std::vector<entry> out;
        {
            std::lock_guard lock(mu_);
            for (const auto& [k, v] : acc_) out.push_back({k.first, k.second, v.first, v.second});
        }
        std::stable_sort(out.begin(), out.end(), [](const entry& a, const entry& b) { return a.seconds > b.seconds; });
        return out;
    }

    /// The entries summed over shapes, one per op, most time first.
    std::vector<entry> by_op() const {
        std::map<std::string, entry> m;
        for (const auto& e : entries()) {
            auto& t = m[e.op];
            t.op = e.op;
            t.calls += e.calls;
            t.seconds += e.seconds;
        }
        std::vector<entry> out;
        for (auto& [k, v] : m) out.push_back(std::move(v));
        std::stable_sort(out.begin(), out.end(), [](const entry& a, const entry& b) { return a.seconds > b.seconds; });
        return out;
    }

    /// Seconds inside ops, all entries.
    double total_seconds() const {
        std::lock_guard lock(mu_);
        double s = 0;
        for (const auto& [k, v] : acc_) s += v.second;
        return s;
    }

    void reset() {
        std::lock_guard lock(mu_);
        acc_.clear();
    }

    /// CSV with a header: op,shapes,calls,seconds,fraction (of total_seconds()); shapes quoted.
    void write_csv(std::ostream& os) const {
        const auto es = entries();
        double tot = 0;
        for (const auto& e : es) tot += e.seconds;
        os << "op,shapes,calls,seconds,fraction\n";
        for (const auto& e : es)
            os << e.op << ",\"" << e.shapes << "\"," << e.calls << ',' << e.seconds << ',' << (tot > 0 ? e.seconds / tot : 0.0) << '\n';
    }

    /// Marks an op as running; true when none was (this one is outermost and is timed). Each enter() is matched by a
    /// leave(). Used by dispatch to time outermost ops only.
    bool enter() noexcept { return depth_.fetch_add(1, std::memory_order_acq_rel) == 0; }
    void leave() noexcept { depth_.fetch_sub(1, std::memory_order_acq_rel); }

private:
    bool by_shape_;
    mutable std::mutex mu_;
    std::map<std::pair<std::string, std::string>, std::pair<std::int64_t, double>> acc_;
    std::atomic<int> depth_{0};
};

namespace detail {
/// The shapes of the arguments that are tensor views, "[a,b] [c,d]"; other arguments are left out.
template <class... Args>
std::string arg_shapes(const Args&... args) {
    std::string s;
    auto one = [&](const auto& a) {
        if constexpr (requires { a.shape.size(); a.shape[0]; }) {
            if (!s.empty()) s += ' ';
            s += '[';
            for (std::size_t i = 0; i < a.shape.size(); ++i) {
                if (i) s += ',';
                s += std::to_string(a.shape[i]);
            }
            s += ']';
        }
    };
    (one(args), ...);
    static_cast<void>(one);  // an op without arguments besides the backend
    return s;
}

/// Times one call of f (an op) into `p` when it is the outermost op running on p; just calls f otherwise.
template <class Op, class Backend, class F, class... Args>
void profiled_call(op_profile& p, const Backend& be, F&& f, const Args&... args) {
    struct guard {
        op_profile& p;
        ~guard() { p.leave(); }
    };
    const bool outer = p.enter();
    guard g{p};
    if (!outer) {
        f();
        return;
    }
    std::string shapes = p.by_shape() ? arg_shapes(args...) : std::string();  // before the call: f may move from args
    be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.record(op_name<Op>(), std::move(shapes), dt);
}
}  // namespace detail

}  // namespace hymix
