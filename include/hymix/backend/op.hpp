// One dispatch point per op and backend. Every op hymix runs (projections, norms, convolutions, the SSD and
// gated-delta stages, attention, RoPE, SwiGLU, the embedding gather and the elementwise pieces of the mixers) is an
// empty tag type; a backend implements an op by specialising `op_impl<Op, Backend>` with a static `run`. Mixers,
// blocks and stacks call `dispatch<Op>(be, args...)` (through the named wrappers of hymix/ops/) and never loop over
// activations themselves, so a new backend is new specialisations, not edits, and a backend that lacks an op fails
// to compile with a message naming both (the primary template only static_asserts; tested in tests/failtest).
// A backend that offers an op profile (`op_profiler()` returning a non-null op_profile*) has its void ops timed
// here (backend/op_profile.hpp); without one, dispatch is the direct call. A backend with a subnormal-flush setting
// (`flush_subnormals()`, the CPU backend) has each op run under it on the calling thread (backend/float_env.hpp), so
// an op's serial parts flush as its parallel tasks do.
#pragma once

#include <concepts>
#include <type_traits>
#include <utility>

#include "hymix/backend/concepts.hpp"
#include "hymix/backend/float_env.hpp"
#include "hymix/backend/op_profile.hpp"

namespace hymix {

/// The implementation of op `Op` on backend `Backend`: specialise with `static void run(const Backend&, ...)`.
/// The primary template is the "not implemented" case.
template <class Op, class Backend>
struct op_impl {
    static constexpr bool implemented = false;
};

namespace detail {
/// Reads as the diagnostic: "backend_lacks_op<Op, Backend>" appears with both types spelled out.
template <class Op, class Backend>
struct backend_lacks_op : std::false_type {};

template <class Op, class Backend>
constexpr bool implements_op_v() {
    if constexpr (requires { op_impl<Op, Backend>::implemented; })
        return op_impl<Op, Backend>::implemented;
    else
        return true;  // a specialisation need not say so
}
}  // namespace detail

/// True when `Backend` implements `Op` (has a specialisation of op_impl).
template <class Op, class Backend>
inline constexpr bool implements_op = detail::implements_op_v<Op, Backend>();

/// True when `Backend`'s op_impl<Op, Backend>::run takes these arguments. A backend may implement an op for some
/// argument types only (f32 weights, say, but not 8-bit ones): callers that pick among storages at run time
/// (linear_weight::visit_stored) ask this and report a storage the backend cannot run as value_error.
template <class Op, class Backend, class... Args>
concept runs_op = requires(const Backend& be, Args&&... args) { op_impl<Op, Backend>::run(be, std::forward<Args>(args)...); };

/// Whether a visitor of stored weights dispatches `Op` with these arguments: yes where the backend runs them, and also
/// where it lacks the op altogether (dispatch then fails to compile with its message naming op and backend).
template <class Op, class Backend, class... Args>
concept dispatchable_op = !implements_op<Op, Backend> || runs_op<Op, Backend, Args...>;

/// A backend that can time its ops: `op_profiler()` returns the profile to record into, or nullptr.
template <class Backend>
concept profiling_backend = requires(const Backend& be) {
    { be.op_profiler() } -> std::same_as<op_profile*>;
};

/// A backend whose work can run with subnormals flushed to zero: `flush_subnormals()` says whether it does.
template <class Backend>
concept subnormal_flushing_backend = requires(const Backend& be) {
    { be.flush_subnormals() } -> std::same_as<bool>;
};

namespace detail {
/// op_impl<Op, Backend>::run, timed into the backend's op profile when it has one set and the op returns nothing.
template <class Op, class Backend, class... Args>
decltype(auto) dispatch_profiled(const Backend& be, Args&&... args) {
    if constexpr (profiling_backend<Backend> &&
                  std::is_void_v<decltype(op_impl<Op, Backend>::run(be, std::forward<Args>(args)...))>) {
        if (op_profile* p = be.op_profiler())
            profiled_call<Op>(*p, be, [&] { op_impl<Op, Backend>::run(be, std::forward<Args>(args)...); }, args...);
        else
            op_impl<Op, Backend>::run(be, std::forward<Args>(args)...);
    } else {
        return op_impl<Op, Backend>::run(be, std::forward<Args>(args)...);
    }
}
}  // namespace detail

/// Runs op `Op` on backend `be`. Fails to compile, naming the op and the backend, when the backend lacks it. Ops that
/// return nothing are timed into the backend's op profile when it has one set (queries that return a value are not).
template <class Op, backend Backend, class... Args>
decltype(auto) dispatch(const Backend& be, Args&&... args) {
    if constexpr (!implements_op<Op, Backend>) {
        static_assert(detail::backend_lacks_op<Op, Backend>::value,
                      "hymix: this backend does not implement this op (the instantiation above names them as Op and "
                      "Backend): specialise hymix::op_impl<Op, Backend>");
    } else if constexpr (subnormal_flushing_backend<Backend>) {
        const subnormal_flush_scope fp(be.flush_subnormals());
        return detail::dispatch_profiled<Op>(be, std::forward<Args>(args)...);
    } else {
        return detail::dispatch_profiled<Op>(be, std::forward<Args>(args)...);
    }
}

/// dispatch on a backend held as a non-const lvalue: the same call. This overload exists for name lookup. A backend
/// whose template arguments are xsimd types (basic_cpu_backend<Arch>, or a user's backend on an xsimd arch) brings
/// namespace xsimd into argument-dependent lookup, and xsimd::dispatch<ArchList>(F&& f) takes one argument of any
/// type: for `dispatch<MyOp>(be)` with no op arguments, written unqualified under `using namespace hymix`, it would be
/// a better match than the const& form above, and the call would build an xsimd dispatcher holding the backend and
/// run nothing (or fail to compile deep inside xsimd, for a backend it cannot copy). A non-const reference to the
/// backend is more specialised than F&&, so this one is chosen (tests/backend/test_cpu.cpp).
template <class Op, backend Backend, class... Args>
    requires(!std::is_const_v<Backend>)
decltype(auto) dispatch(Backend& be, Args&&... args) {
    return dispatch<Op>(std::as_const(be), std::forward<Args>(args)...);
}

/// The same for a backend passed as an rvalue (a temporary, or std::move of one, const or not) with no op arguments:
/// this overload and xsimd's F&& are equally specialised, and this one, being constrained, wins the tie (C++20
/// [temp.func.order]). With op arguments xsimd's one-argument template is not viable and the const& form serves.
template <class Op, class Backend>
    requires(backend<std::remove_cvref_t<Backend>> && !std::is_reference_v<Backend>)
decltype(auto) dispatch(Backend&& be) {
    return dispatch<Op>(std::as_const(be));
}

}  // namespace hymix
