// Memory spaces: tag types naming where a tensor's elements live. A tensor view carries its space in its type
// (tensor_view<T, R, Space>), so handing a host view to an op of a device backend fails to compile.
#pragma once

#include <concepts>

namespace hymix {

/// Ordinary host memory (what the CPU and reference backends read and write).
struct host_space {
    static constexpr const char* name = "host";
    static constexpr bool host_accessible = true;
};

/// Memory of device `Id` of some accelerator backend: not dereferenceable on the host.
template <int Id = 0>
struct device_space {
    static constexpr const char* name = "device";
    static constexpr bool host_accessible = false;
};

/// A memory-space tag names itself and says whether host code may dereference its pointers.
template <class S>
concept memory_space = requires {
    { S::name } -> std::convertible_to<const char*>;
    { S::host_accessible } -> std::convertible_to<bool>;
};

}  // namespace hymix
