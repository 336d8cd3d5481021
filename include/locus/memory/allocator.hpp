// Per-device allocators with statistics. Every tensor allocation goes through one:
// `cpu` through a counting aligned allocator, `pinned` and `cuda` through a caching
// allocator (size-binned, stream-aware) in front of cudaHostAlloc / cudaMalloc.
// A failed allocation empties the cache, retries once, then throws
// locus::out_of_memory with the numbers; set_memory_limit<D> caps any device, so the
// out-of-memory path is testable without a GPU.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#endif

namespace locus {

/// What an allocator holds. The numbers behind PyTorch's memory_allocated() and
/// memory_reserved().
struct memory_statistics {
  std::size_t allocated_bytes = 0;       ///< held by live tensors (rounded to the block size)
  std::size_t reserved_bytes = 0;        ///< obtained from the system: allocated + cached
  std::size_t peak_allocated_bytes = 0;  ///< high-water mark of allocated_bytes
  std::size_t allocations = 0;           ///< successful allocations, cache hits included
  std::size_t cache_hits = 0;            ///< allocations served from the cache
  std::size_t limit_bytes = std::numeric_limits<std::size_t>::max();  ///< max() = no limit
  /// pinned only: page-locking was unavailable (no driver), so ordinary host memory
  /// backs the device. Everything still works; asynchronous copies are not overlapped.
  bool fallback = false;
};

namespace detail {

inline constexpr std::size_t host_alignment = 64;

inline std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

inline void* aligned_host_alloc(std::size_t bytes) noexcept {
  return std::aligned_alloc(host_alignment, round_up(bytes, host_alignment));
}

/// Pageable host memory: no cache (malloc already has one), but counted and capped.
/// Each block carries its size in a 64-byte header in front of the data (the data
/// stays 64-byte aligned), so freeing needs no lookup table.
class host_allocator {
 public:
  static constexpr std::string_view device_name = "cpu";

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    // A request within two alignments of SIZE_MAX cannot be rounded up, let alone met.
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * host_alignment)
      throw out_of_memory(device_name, bytes, allocated_, allocated_, limit_, "the system refused");
    const std::size_t size = round_up(bytes, host_alignment);
    if (size > limit_ || allocated_ > limit_ - size)
      throw out_of_memory(device_name, size, allocated_, allocated_, limit_, "memory limit");
    auto* block = static_cast<unsigned char*>(aligned_host_alloc(size + host_alignment));
    if (!block) throw out_of_memory(device_name, size, allocated_, allocated_, limit_, "the system refused");
    *reinterpret_cast<std::size_t*>(block) = size;
    allocated_ += size;
    ++allocations_;
    if (allocated_ > peak_) peak_ = allocated_;
    return block + host_alignment;
  }

  void deallocate(void* p) noexcept {
    if (!p) return;
    auto* block = static_cast<unsigned char*>(p) - host_alignment;
    const std::size_t size = *reinterpret_cast<const std::size_t*>(block);
    std::free(block);
    std::lock_guard lock(mutex_);
    allocated_ -= size;
  }

  memory_statistics stats() {
    std::lock_guard lock(mutex_);
    memory_statistics s;
    s.allocated_bytes = allocated_;
    s.reserved_bytes = allocated_;
    s.peak_allocated_bytes = peak_;
    s.allocations = allocations_;
    s.limit_bytes = limit_;
    return s;
  }
  void empty_cache() noexcept {}
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = allocated_;
  }

 private:
  std::mutex mutex_;
  std::size_t allocated_ = 0, peak_ = 0, allocations_ = 0;
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
};

/// Size classes: 512-byte granules up to 1 MiB, then four classes per power of two
/// (at most 25% waste), so freed blocks are found again by exact class.
inline std::size_t size_class(std::size_t bytes) noexcept {
  constexpr std::size_t small = 1u << 20;
  if (bytes <= small) return round_up(bytes == 0 ? 1 : bytes, 512);
  std::size_t p = small;
  while (p * 2 < bytes) p *= 2;  // p < bytes <= 2p
  const std::size_t step = p / 4;
  return round_up(bytes, step);
}

/// A caching allocator over a raw resource. Resource provides
///   static constexpr std::string_view device_name;
///   void* raw_allocate(std::size_t)   -> nullptr when out of memory, throws otherwise
///   void raw_free(void*) noexcept
///   int place()                      -> which GPU (or 0), part of the cache key
///   void* stream()                   -> the stream an allocation is tied to
///   bool fallback() const
/// Blocks are reused only on the stream (and GPU) they were allocated for, so a block
/// freed while kernels on that stream still use it is only handed to later work on
/// the same stream, which runs after them.
template <class Resource>
class caching_allocator {
 public:
  static constexpr std::string_view device_name = Resource::device_name;

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t size = size_class(bytes);
    const key k{resource_.place(), resource_.stream(), size};
    std::lock_guard lock(mutex_);
    if (auto it = free_.find(k); it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      live_[p] = k;
      cached_ -= size;
      note_allocation(size);
      ++cache_hits_;
      return p;
    }
    const std::size_t in_use = reserved_ - cached_;
    if (in_use > limit_ || size > limit_ - in_use) {
      // Even an empty cache would not make room: fail with every statistic unchanged.
      throw out_of_memory(device_name, size, in_use, reserved_, limit_, "memory limit");
    }
    if (reserved_ + size > limit_) release_cached();  // the cached blocks make the room
    void* p = resource_.raw_allocate(size);
    if (!p) {
      release_cached();
      p = resource_.raw_allocate(size);
      if (!p)
        throw out_of_memory(device_name, size, reserved_ - cached_, reserved_, limit_,
                            "the device has no free memory left, with the cache emptied and the "
                            "allocation retried once");
    }
    reserved_ += size;
    live_[p] = k;
    note_allocation(size);
    return p;
  }

  void deallocate(void* p) noexcept {
    if (!p) return;
    std::lock_guard lock(mutex_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    const key k = it->second;
    live_.erase(it);
    allocated_ -= k.size;
    cached_ += k.size;
    free_[k].push_back(p);
  }

  memory_statistics stats() {
    std::lock_guard lock(mutex_);
    memory_statistics s;
    s.allocated_bytes = allocated_;
    s.reserved_bytes = reserved_;
    s.peak_allocated_bytes = peak_;
    s.allocations = allocations_;
    s.cache_hits = cache_hits_;
    s.limit_bytes = limit_;
    s.fallback = resource_.fallback();
    return s;
  }
  void empty_cache() {
    std::lock_guard lock(mutex_);
    release_cached();
  }
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = allocated_;
  }
  Resource& resource() noexcept { return resource_; }

 private:
  struct key {
    int place;
    void* stream;
    std::size_t size;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept {
      std::size_t h = std::hash<void*>{}(k.stream);
      h ^= k.size + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h ^= static_cast<std::size_t>(k.place) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      return h;
    }
  };

  void note_allocation(std::size_t size) {
    allocated_ += size;
    ++allocations_;
    if (allocated_ > peak_) peak_ = allocated_;
  }
  void release_cached() noexcept {
    for (auto& [k, blocks] : free_) {
      for (void* p : blocks) {
        resource_.raw_free(p);
        reserved_ -= k.size;
        cached_ -= k.size;
      }
      blocks.clear();
    }
    free_.clear();
  }

  std::mutex mutex_;
  Resource resource_;
  std::unordered_map<key, std::vector<void*>, key_hash> free_;
  std::unordered_map<void*, key> live_;
  std::size_t allocated_ = 0, reserved_ = 0, cached_ = 0, peak_ = 0, allocations_ = 0,
              cache_hits_ = 0;
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
};

#if LOCUS_HAS_CUDA
/// Page-locked host memory from cudaHostAlloc. Without a usable driver (CI, a
/// machine without a GPU) it falls back to aligned pageable memory, says so in
/// memory_stats<pinned>().fallback and environment(), and every host path keeps working.
class pinned_resource {
 public:
  static constexpr std::string_view device_name = "pinned";
  void* raw_allocate(std::size_t bytes) {
    if (!fallback_) {
      void* p = nullptr;
      const cudaError_t st = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
      if (st == cudaSuccess) {
        locked_.push_back(p);
        return p;
      }
      (void)cudaGetLastError();
      if (st == cudaErrorMemoryAllocation) return nullptr;
      fallback_ = true;  // no driver or no device: page-locking is not available here
    }
    return aligned_host_alloc(bytes);
  }
  void raw_free(void* p) noexcept {
    for (auto& q : locked_) {
      if (q == p) {
        q = locked_.back();
        locked_.pop_back();
        (void)cudaFreeHost(p);
        return;
      }
    }
    std::free(p);
  }
  int place() const noexcept { return 0; }
  void* stream() const noexcept { return nullptr; }
  bool fallback() const noexcept { return fallback_; }

 private:
  bool fallback_ = false;
  std::vector<void*> locked_;
};

/// Device memory of the current GPU from cudaMalloc.
class cuda_resource {
 public:
  static constexpr std::string_view device_name = "cuda";
  void* raw_allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (st == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    LOCUS_CUDA_CHECK(st);
    return p;
  }
  void raw_free(void* p) noexcept { (void)cudaFree(p); }
  int place() const {
    int d = 0;
    LOCUS_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  void* stream() const noexcept { return static_cast<void*>(current_stream()); }
  bool fallback() const noexcept { return false; }
};
#endif

/// The allocator of device D: one per process, never destroyed (tensors with static
/// storage may outlive any destruction order we could pick).
template <class D>
auto& allocator_for() {
  require_device_enabled<D>();
  if constexpr (std::is_same_v<typename D::allocator, host_allocator_kind>) {
    static auto* a = new host_allocator();
    return *a;
  }
#if LOCUS_HAS_CUDA
  else if constexpr (std::is_same_v<typename D::allocator, pinned_allocator_kind>) {
    static auto* a = new caching_allocator<pinned_resource>();
    return *a;
  } else {
    static auto* a = new caching_allocator<cuda_resource>();
    return *a;
  }
#else
  else {
    static auto* a = new host_allocator();  // unreachable: require_device_enabled fired
    return *a;
  }
#endif
}

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

/// Starts a new peak: peak_allocated_bytes becomes the current allocated_bytes.
template <Device D>
void reset_peak_memory_stats() {
  detail::allocator_for<D>().reset_peak();
}

}  // namespace locus
