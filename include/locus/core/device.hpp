// Devices are empty tag types. Each answers, at compile time, where its memory lives
// (host-accessible? readable by GPU kernels?), its name for diagnostics, its
// allocator and how kernels execute on it. Tensors carry one in their type, which
// is what turns "tensors on different devices" into a compile error.
#pragma once

#include <concepts>
#include <string_view>
#include <type_traits>

#include "config.hpp"

namespace locus {

namespace detail {
// Execution tags; backend/ maps each to a Thrust execution policy.
struct host_execution {};
struct cuda_execution {};
// Allocator kinds; memory/ maps each to its allocator object.
struct host_allocator_kind {};
struct pinned_allocator_kind {};
struct cuda_allocator_kind {};
}  // namespace detail

/// Pageable host memory, host execution (Thrust's OpenMP system).
struct cpu {
  static constexpr std::string_view name = "cpu";
  static constexpr bool enabled = true;
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  /// Legal endpoint of an asynchronous host<->GPU copy? Pageable memory is not:
  /// the CUDA runtime silently makes such a copy synchronous.
  static constexpr bool async_copyable = false;
  using execution = detail::host_execution;
  using allocator = detail::host_allocator_kind;
};

/// Page-locked host memory: host-accessible, host execution, and a legal source or
/// target of asynchronous copies to and from `cuda`.
struct pinned {
  static constexpr std::string_view name = "pinned";
  static constexpr bool enabled = LOCUS_HAS_CUDA;
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;
  static constexpr bool async_copyable = true;
  using execution = detail::host_execution;
  using allocator = detail::pinned_allocator_kind;
};

/// Memory of the current CUDA device; work runs asynchronously on the current stream.
struct cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr bool enabled = LOCUS_HAS_CUDA;
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  static constexpr bool async_copyable = true;
  using execution = detail::cuda_execution;
  using allocator = detail::cuda_allocator_kind;
};

template <class D>
inline constexpr bool is_device_v =
    std::is_same_v<D, cpu> || std::is_same_v<D, pinned> || std::is_same_v<D, cuda>;

/// One of locus's device tags.
template <class D>
concept Device = is_device_v<D>;

/// Memory that host code may read and write (cpu, pinned).
template <class D>
concept HostAccessible = Device<D> && D::host_accessible;

/// Memory that GPU kernels read and write (cuda).
template <class D>
concept DeviceAccessible = Device<D> && D::device_accessible;

/// Devices whose kernels run on the host (cpu, pinned).
template <class D>
concept HostExecuted = Device<D> && std::is_same_v<typename D::execution, detail::host_execution>;

}  // namespace locus
