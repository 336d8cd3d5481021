// Per-device allocators with statistics. Every tensor allocation goes through one:
// `cpu` through a counting aligned allocator (memory/host_allocator.hpp), `pinned` and
// `cuda` through a caching allocator in front of cudaHostAlloc / cudaMalloc
// (memory/caching_allocator.hpp, which describes its design; the resources are
// memory/cuda_resources.hpp). set_memory_limit<D> caps any device, so the
// out-of-memory path is testable without a GPU. This file holds the one instance per
// device and the public queries (memory_stats, empty_cache, set_memory_limit, ...).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cuda_resources.hpp"

namespace locus {
namespace detail {


/// The allocator of device D: one per process, never destroyed (tensors with static
/// storage may outlive any destruction order we could pick).
#if LOCUS_HAS_CUDA
/// release_stream_blocks' way to the caching allocators that exist in this process:
/// each registers itself when it is first created (0: cuda, 1: pinned), so that code
/// compiled into every file that may destroy a stream (locus::stream's destructor)
/// does not instantiate the allocators (about 0.1 s of every user file's compile); an
/// allocator that was never created holds no blocks to release.
LOCUS_SHARED_STATE inline std::atomic<void (*)(void*)>& stream_release_hook(int which) noexcept {
  static std::atomic<void (*)(void*)> hooks[2] = {nullptr, nullptr};
  return hooks[which];
}
#endif

/// The storage of the allocators, by kind (0: cpu, 1: pinned, 2: cuda). The kind is an
/// int rather than the device type because g++ and clang++ give an instantiation the
/// visibility of its template arguments: under -fvisibility=hidden the device tags are
/// hidden, which would make allocator_for<cpu>'s static hidden despite the attribute.
template <int Kind>
LOCUS_SHARED_STATE auto& allocator_instance() {
  if constexpr (Kind == 0) {
    static auto* a = new host_allocator();
    return *a;
  }
#if LOCUS_HAS_CUDA
  else if constexpr (Kind == 1) {
    static caching_allocator<pinned_resource>* const a = [] {
      static caching_allocator<pinned_resource>* const made = new caching_allocator<pinned_resource>();
      stream_release_hook(1).store(+[](void* s) { made->release_stream(s); }, std::memory_order_release);
      return made;
    }();
    return *a;
  } else {
    static caching_allocator<cuda_resource>* const a = [] {
      static caching_allocator<cuda_resource>* const made = new caching_allocator<cuda_resource>();
      stream_release_hook(0).store(+[](void* s) { made->release_stream(s); }, std::memory_order_release);
      return made;
    }();
    return *a;
  }
#else
  else {
    static_assert(Kind == 0, "locus: no caching allocator without CUDA");
    static auto* a = new host_allocator();
    return *a;
  }
#endif
}

/// The kind of device D's allocator (allocator_instance's Kind). Dependent on D, so that
/// allocator_for's body names no caching allocator before it is called: a non-dependent
/// allocator_instance<1>() there (its return type deduced) instantiated both caching
/// allocators in every file that includes locus (0.3 to 0.4 s of each compile, also under
/// -fsyntax-only). Without CUDA every kind is 0 (require_device_enabled has fired).
template <class D>
inline constexpr int allocator_kind =
#if LOCUS_HAS_CUDA
    std::is_same_v<typename D::allocator, host_allocator_kind>     ? 0
    : std::is_same_v<typename D::allocator, pinned_allocator_kind> ? 1
                                                                   : 2;
#else
    0;
#endif

template <class D>
auto& allocator_for() {
  require_device_enabled<D>();
  return allocator_instance<allocator_kind<D>>();
}

/// The GPU that memory allocated on D now belongs to: the current device for cuda
/// (cudaMalloc allocates there), -1 for host devices, which have no GPU.
template <class D>
int allocation_gpu() noexcept {
#if LOCUS_HAS_CUDA
  if constexpr (std::is_same_v<typename D::allocator, cuda_allocator_kind>) return event_pool::current_device();
#endif
  return -1;
}

/// The GPU that holds the D memory at p, as the runtime knows it (memory another library
/// allocated: unsafe_view); -1 for host devices, a null pointer or memory the runtime
/// does not know.
template <class D>
int pointer_gpu(const void* p) noexcept {
#if LOCUS_HAS_CUDA
  if constexpr (std::is_same_v<typename D::allocator, cuda_allocator_kind>) {
    cudaPointerAttributes a{};
    if (p && cudaPointerGetAttributes(&a, p) == cudaSuccess &&
        (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged))
      return a.device;
    (void)cudaGetLastError();
  }
#endif
  (void)p;
  return -1;
}

#if LOCUS_HAS_CUDA
/// Notes that work on stream `s` uses the cuda or pinned block holding `p` (p may
/// point anywhere inside a live block: views point into blocks). When the block is
/// freed, an event is recorded on `s` and the block is not reused until it has
/// completed. Pointers no caching allocator handed out (cpu memory, foreign memory
/// of unsafe_view) are ignored; so is a cuda block's own allocation stream.
/// `device` is the GPU of `s` (the event is created and recorded with it current;
/// cudaStreamLegacy names a different stream on each GPU); the 2-argument form takes
/// the current GPU. (A template only so that files that never call it instantiate
/// nothing.)
template <class D = cuda, class P = pinned>  // P: dependent, so nothing is instantiated before a call
void record_block_use(const void* p, cudaStream_t s, int device) {
  if (!p) return;
  allocator_for<D>().record_use(p, static_cast<void*>(s), device);
  allocator_for<P>().record_use(p, static_cast<void*>(s), device);
}
template <class D = cuda>
void record_block_use(const void* p, cudaStream_t s) {
  record_block_use<D>(p, s, event_pool::current_device());
}

/// For a stream that has finished its work (synchronised) and is about to be
/// destroyed: call before cudaStreamDestroy, so that no new stream can have its
/// handle yet. Its cuda blocks, cached and live, become blocks any stream may take
/// (none is returned to the system), and it leaves every block's list of users.
inline void release_stream_blocks(cudaStream_t s) {
  for (int which = 0; which < 2; ++which)
    if (auto* release = stream_release_hook(which).load(std::memory_order_acquire)) release(static_cast<void*>(s));
}

/// The cuda blocks of one captured CUDA graph (an alias, so that files that never
/// name it instantiate nothing: do not forward-declare it as a class). Make one with
/// make_graph_pool and hold it as long as the graph exists; destroy the graph (its
/// cudaGraphExec_t) first. When the pool is destroyed its segments return to the
/// system at once if none of its blocks is live; a tensor from the pool that outlives
/// it is still freed safely: its block returns to the (destroyed) pool, whose segments
/// are released when the last block is freed (and no scope is alive).
using graph_pool = basic_graph_pool<caching_allocator<cuda_resource>>;

/// A new, empty graph pool of the cuda allocator.
template <class D = cuda>
std::shared_ptr<graph_pool> make_graph_pool() {
  return std::make_shared<graph_pool>(allocator_for<D>());
}

/// While alive, cuda allocations of this thread come from the pool, and frees of the
/// pool's blocks (from any thread, in or out of scope) go back to it only:
/// `graph_pool_scope s(*pool);`. Capture under cudaStreamCaptureModeRelaxed (the pool
/// may call cudaMalloc when it grows; see memory/caching_allocator.hpp's file comment).
using graph_pool_scope = basic_graph_pool_scope<caching_allocator<cuda_resource>>;
#endif

}  // namespace detail

/// Statistics of device D's allocator (allocated, reserved, peak, counts).
template <Device D>
memory_statistics memory_stats() {
  return detail::allocator_for<D>().stats();
}

/// Returns device D's cached, unused blocks to the system.
template <Device D>
void empty_cache() {
  detail::allocator_for<D>().empty_cache();
}

/// Caps device D's allocator at `bytes` (reserved bytes for caching allocators).
/// std::numeric_limits<std::size_t>::max() removes the cap.
template <Device D>
void set_memory_limit(std::size_t bytes) {
  detail::allocator_for<D>().set_limit(bytes);
}

/// The most bytes the cpu allocator keeps of freed blocks of 64 KiB and more for reuse
/// by a request of the same size (default 1 GiB; never more than the process's peak of
/// allocated bytes). 0 turns the cache off; lowering the limit gives back what is over.
/// empty_cache<cpu>() gives back everything kept.
inline void set_cpu_cache_limit(std::size_t bytes) noexcept { detail::allocator_for<cpu>().set_cache_limit(bytes); }
/// The cpu allocator's cache limit (set_cpu_cache_limit).
[[nodiscard]] inline std::size_t cpu_cache_limit() noexcept { return detail::allocator_for<cpu>().cache_limit(); }

/// Starts a new peak: peak_allocated_bytes becomes the current allocated_bytes.
template <Device D>
void reset_peak_memory_stats() {
  detail::allocator_for<D>().reset_peak();
}

// ---- per GPU ------------------------------------------------------------------------------
// The forms above cover every GPU of the process together (one caching allocator serves
// them all); these take one GPU's index. Only cuda has GPUs.
namespace detail {
template <class D>
constexpr bool require_gpu_device() {
  static_assert(std::is_same_v<typename D::allocator, cuda_allocator_kind>,
                "locus: only cuda memory belongs to a GPU; drop the GPU index: memory_stats<D>(), "
                "empty_cache<D>(), set_memory_limit<D>(bytes), reset_peak_memory_stats<D>()");
  return std::is_same_v<typename D::allocator, cuda_allocator_kind>;
}
#if LOCUS_HAS_CUDA
/// A GPU index of this process, or a device_error naming the GPUs there are.
inline void check_memory_gpu(int gpu) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  if (gpu < 0 || gpu >= n)
    throw device_error(format("locus: GPU %d does not exist: this process sees %d GPU%s%s", gpu, n, n == 1 ? "" : "s",
                              n > 0 ? format(", numbered 0 to %d", n - 1).c_str() : " (locus::environment() says why)"),
                       gpu, -1);
}
#endif
}  // namespace detail

/// Statistics of one GPU's memory (the cuda allocator's blocks on GPU `gpu`).
template <Device D>
memory_statistics memory_stats(int gpu) {
  if constexpr (detail::require_gpu_device<D>()) {
#if LOCUS_HAS_CUDA
    detail::check_memory_gpu(gpu);
    return detail::allocator_for<D>().stats(gpu);
#endif
  }
  return {};
}
/// Returns GPU `gpu`'s cached, unused blocks to the system (the other GPUs keep theirs).
template <Device D>
void empty_cache(int gpu) {
  if constexpr (detail::require_gpu_device<D>()) {
#if LOCUS_HAS_CUDA
    detail::check_memory_gpu(gpu);
    detail::allocator_for<D>().empty_cache(gpu);
#endif
  }
}
/// Caps GPU `gpu`'s reserved bytes (beside the cap of all GPUs together); an allocation
/// past it is an out_of_memory naming "cuda:<gpu>" and that GPU's numbers.
template <Device D>
void set_memory_limit(std::size_t bytes, int gpu) {
  if constexpr (detail::require_gpu_device<D>()) {
#if LOCUS_HAS_CUDA
    detail::check_memory_gpu(gpu);
    detail::allocator_for<D>().set_limit(bytes, gpu);
#endif
  }
}
/// One line per device the build has (cpu; pinned and each GPU of cuda with CUDA):
/// allocated, reserved, peak and limit, for logs and the doctor program. (A template
/// only so that a file that never calls it does not instantiate the caching allocators:
/// 0.3 to 0.4 s of every user file's compile, with -fsyntax-only too.)
template <class P = pinned, class C = cuda>  // dependent, so nothing is instantiated before a call
std::string memory_summary() {
  const auto mib = [](std::size_t b) { return detail::format("%.1f MiB", static_cast<double>(b) / 1048576.0); };
  const auto line = [&](const std::string& name, const memory_statistics& m) {
    return detail::format("  %-8s allocated %s, reserved %s, peak %s, limit %s\n", name.c_str(),
                          mib(m.allocated_bytes).c_str(), mib(m.reserved_bytes).c_str(),
                          mib(m.peak_allocated_bytes).c_str(),
                          m.limit_bytes == std::numeric_limits<std::size_t>::max() ? "none"
                                                                                    : mib(m.limit_bytes).c_str());
  };
  std::string out = "memory:\n" + line("cpu", detail::allocator_for<cpu>().stats());
#if LOCUS_HAS_CUDA
  out += line("pinned", detail::allocator_for<P>().stats());
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  for (int g = 0; g < n; ++g) out += line("cuda:" + std::to_string(g), detail::allocator_for<C>().stats(g));
  if (n == 0) out += "  cuda     no GPU visible\n";
#endif
  return out;
}

/// Starts a new peak on GPU `gpu`.
template <Device D>
void reset_peak_memory_stats(int gpu) {
  if constexpr (detail::require_gpu_device<D>()) {
#if LOCUS_HAS_CUDA
    detail::check_memory_gpu(gpu);
    detail::allocator_for<D>().reset_peak(gpu);
#endif
  }
}

}  // namespace locus
