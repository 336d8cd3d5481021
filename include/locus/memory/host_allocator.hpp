// The host side of locus's allocators: memory_statistics (what an allocator holds),
// the fault injector's allocation hook, and host_allocator, the counting and capped
// allocator of `cpu` tensors (pageable memory; blocks of 64 KiB and more are kept for reuse
// of the same size, smaller ones go back to malloc). The caching
// allocator of pinned and cuda memory is memory/caching_allocator.hpp; the per-device
// instances and locus::memory_stats<D>() are memory/allocator.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#  define LOCUS_HOST_CACHE_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define LOCUS_HOST_CACHE_ASAN 1
#  endif
#endif
#ifdef LOCUS_HOST_CACHE_ASAN
#  include <sanitizer/asan_interface.h>
#endif

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"

// LOCUS_SHARED_STATE marks the accessors of the state that must be one per process, the
// allocators and the fault injector (function-local statics in inline functions): a
// shared library built with -fvisibility=hidden would otherwise keep its own copy of each
// (its own cpu allocator, statistics, limit and armed fault) apart from the program's.
// With the attribute every DSO built with these headers exports them and the dynamic
// linker binds all to one copy (tests/package/dso/). Define it empty before including
// locus to keep a DSO's allocators private (then no tensor may cross its boundary).
#ifndef LOCUS_SHARED_STATE
#  if defined(__GNUC__) || defined(__clang__)
#    define LOCUS_SHARED_STATE __attribute__((visibility("default")))
#  else
#    define LOCUS_SHARED_STATE
#  endif
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
  /// pinned, cuda: freed blocks waiting for other streams' work (reusable once done).
  std::size_t pending_bytes = 0;
  /// pinned, cuda: segments obtained from the system (cudaHostAlloc / cudaMalloc calls).
  std::size_t system_allocations = 0;
};

/// Fault injection for tests (docs/reliability.md): the k-th allocation request on any
/// device's allocator from now on (k >= 1, counting every device, cache hits included)
/// throws locus::out_of_memory ("injected fault") instead of allocating; 0 disarms. One
/// fault per arming: the requests after it succeed. Requests of 0 bytes are not
/// counted (they allocate nothing). Thread-safe; costs one relaxed atomic load per
/// allocation while disarmed.
namespace fault {

namespace detail {
LOCUS_SHARED_STATE inline std::atomic<std::int64_t>& countdown() noexcept {
  static std::atomic<std::int64_t> c{0};  // > 0: requests left until the fault
  return c;
}
LOCUS_SHARED_STATE inline std::atomic<std::int64_t>& seen() noexcept {
  static std::atomic<std::int64_t> n{0};  // requests since the last arming
  return n;
}
LOCUS_SHARED_STATE inline std::atomic<bool>& fired() noexcept {
  static std::atomic<bool> f{false};
  return f;
}
}  // namespace detail

/// Arms the fault at the k-th allocation request from now (0: disarms).
inline void fail_allocation(std::int64_t k) noexcept {
  detail::seen().store(0, std::memory_order_relaxed);
  detail::fired().store(false, std::memory_order_relaxed);
  detail::countdown().store(k > 0 ? k : 0, std::memory_order_release);
}
/// Allocation requests counted since the last fail_allocation() call, up to and
/// including the failed one (arm with a k larger than any step needs to count them).
[[nodiscard]] inline std::int64_t requests() noexcept { return detail::seen().load(std::memory_order_relaxed); }
/// Whether the armed fault has been thrown.
[[nodiscard]] inline bool fired() noexcept { return detail::fired().load(std::memory_order_relaxed); }

/// Called by every allocator at the top of allocate(): true when this request fails.
inline bool inject() noexcept {
  auto& c = detail::countdown();
  std::int64_t left = c.load(std::memory_order_relaxed);
  if (left == 0) return false;  // disarmed (or fired): the only cost
  detail::seen().fetch_add(1, std::memory_order_relaxed);
  while (left > 0) {
    if (c.compare_exchange_weak(left, left - 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      if (left != 1) return false;
      detail::fired().store(true, std::memory_order_relaxed);
      return true;
    }
  }
  return false;
}

}  // namespace fault

namespace detail {

inline constexpr std::size_t host_alignment = 64;

inline std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

inline void* aligned_host_alloc(std::size_t bytes) noexcept {
  return std::aligned_alloc(host_alignment, round_up(bytes, host_alignment));
}

/// Pageable host memory, counted and capped. Each block carries its size in a 64-byte
/// header in front of the data (the data stays 64-byte aligned), so freeing needs no
/// lookup table.
///
/// Blocks below `cache_min_bytes` go straight back to malloc, whose own bins serve them
/// well. Larger blocks are kept on free, by exact size, and handed to the next request of
/// that size: glibc serves such blocks with mmap and returns them with munmap, so without
/// this every step re-faults every page of its large activations (a checkpointed
/// segment, which frees and re-creates them within one step, ran at 1.95x the plain
/// step's time, bench/RESULTS.md). The cache holds at most `cache_limit()` bytes
/// (default 1 GiB, set_cache_limit to change it, 0 turns it off) and never more than
/// the program's peak of allocated bytes, so `reserved` stays within twice the peak;
/// when a freed block does not fit, the blocks kept longest go back to the system first.
/// A request the system refuses first releases the cache and tries again;
/// `empty_cache()` releases it on demand. Under AddressSanitizer a kept block is poisoned
/// until it is handed out again, so a use after free is still reported. Allocation
/// counts are those of an uncached allocator: every request is an allocation; hits are
/// also counted in `cache_hits`.
class host_allocator {
 public:
  static constexpr std::string_view device_name = "cpu";
  static constexpr std::size_t cache_min_bytes = std::size_t{64} << 10;

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    if (fault::inject()) throw out_of_memory(device_name, bytes, allocated_, reserved(), limit_, "injected fault");
    // A request within two alignments of SIZE_MAX cannot be rounded up, let alone met.
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * host_alignment)
      throw out_of_memory(device_name, bytes, allocated_, reserved(), limit_, "the system refused");
    const std::size_t size = round_up(bytes, host_alignment);
    if (size > limit_ || allocated_ > limit_ - size)
      throw out_of_memory(device_name, size, allocated_, reserved(), limit_, "memory limit");
    unsigned char* block = nullptr;
    if (size >= cache_min_bytes) {
      auto it = by_size_.find(size);
      if (it != by_size_.end()) {
        block = it->second->second;
        kept_.erase(it->second);
        by_size_.erase(it);
        unpoison(block, size);
        cached_ -= size;
        ++cache_hits_;
      }
    }
    if (!block) {
      // Memory kept for other sizes counts against a limit set by the user.
      if (cached_ > 0 && limit_ != std::numeric_limits<std::size_t>::max() && cached_ > limit_ - allocated_ - size)
        release_cache();
      block = static_cast<unsigned char*>(aligned_host_alloc(size + host_alignment));
      if (!block && cached_ > 0) {
        release_cache();
        block = static_cast<unsigned char*>(aligned_host_alloc(size + host_alignment));
      }
      if (!block) throw out_of_memory(device_name, size, allocated_, reserved(), limit_, "the system refused");
      *reinterpret_cast<std::size_t*>(block) = size;
    }
    allocated_ += size;
    ++allocations_;
    if (allocated_ > peak_) peak_ = allocated_;
    if (allocated_ > lifetime_peak_) lifetime_peak_ = allocated_;
    return block + host_alignment;
  }

  void deallocate(void* p) noexcept {
    if (!p) return;
    auto* block = static_cast<unsigned char*>(p) - host_alignment;
    const std::size_t size = *reinterpret_cast<const std::size_t*>(block);
    {
      std::lock_guard lock(mutex_);
      allocated_ -= size;
      const std::size_t cap = std::min(cache_limit_, lifetime_peak_);
      if (size >= cache_min_bytes && size <= cap) {
        while (cached_ + size > cap) drop_oldest();  // the newest sizes are the likeliest asked for
        try {
          kept_.emplace_front(size, block);
          try {
            by_size_.emplace(size, kept_.begin());
          } catch (...) {
            kept_.pop_front();
            throw;
          }
          cached_ += size;
          poison(block, size);
          return;
        } catch (...) {  // no node for the lists: give the block back instead
        }
      }
    }
    std::free(block);
  }

  memory_statistics stats() {
    std::lock_guard lock(mutex_);
    memory_statistics s;
    s.allocated_bytes = allocated_;
    s.reserved_bytes = reserved();
    s.peak_allocated_bytes = peak_;
    s.allocations = allocations_;
    s.cache_hits = cache_hits_;
    s.limit_bytes = limit_;
    return s;
  }
  /// Gives every kept block back to the system.
  void empty_cache() noexcept {
    std::lock_guard lock(mutex_);
    release_cache();
  }
  /// A limit below what is reserved gives kept blocks back (the oldest first) until the
  /// reserved bytes fit it or nothing is kept: kept memory counts against the limit.
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    while (cached_ > 0 && reserved() > limit_) drop_oldest();
  }
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = allocated_;
  }
  /// The most bytes kept for reuse; lowering it gives back what is over.
  void set_cache_limit(std::size_t bytes) noexcept {
    std::lock_guard lock(mutex_);
    cache_limit_ = bytes;
    while (cached_ > cache_limit_) drop_oldest();
  }
  [[nodiscard]] std::size_t cache_limit() noexcept {
    std::lock_guard lock(mutex_);
    return cache_limit_;
  }

  host_allocator() = default;
  host_allocator(const host_allocator&) = delete;
  host_allocator& operator=(const host_allocator&) = delete;
  ~host_allocator() { release_cache(); }

 private:
  std::size_t reserved() const noexcept { return allocated_ + cached_; }
  // Gives the least recently kept block back to the system.
  void drop_oldest() noexcept {
    auto last = std::prev(kept_.end());
    auto [lo, hi] = by_size_.equal_range(last->first);
    for (auto it = lo; it != hi; ++it)
      if (it->second == last) {
        by_size_.erase(it);
        break;
      }
    cached_ -= last->first;
    unpoison(last->second, last->first);
    std::free(last->second);
    kept_.erase(last);
  }
  // The header stays readable (it holds the size); the data is off limits while kept.
  static void poison([[maybe_unused]] unsigned char* block, [[maybe_unused]] std::size_t size) noexcept {
#ifdef LOCUS_HOST_CACHE_ASAN
    ASAN_POISON_MEMORY_REGION(block + host_alignment, size);
#endif
  }
  static void unpoison([[maybe_unused]] unsigned char* block, [[maybe_unused]] std::size_t size) noexcept {
#ifdef LOCUS_HOST_CACHE_ASAN
    ASAN_UNPOISON_MEMORY_REGION(block + host_alignment, size);
#endif
  }
  void release_cache() noexcept {
    for (auto& [size, block] : kept_) {
      unpoison(block, size);
      std::free(block);
    }
    kept_.clear();
    by_size_.clear();
    cached_ = 0;
  }

  std::mutex mutex_;
  using kept_list = std::list<std::pair<std::size_t, unsigned char*>>;
  kept_list kept_;                                          // kept blocks, the newest first
  std::multimap<std::size_t, kept_list::iterator> by_size_;  // the same blocks by size
  std::size_t allocated_ = 0, peak_ = 0, lifetime_peak_ = 0, allocations_ = 0, cache_hits_ = 0, cached_ = 0;
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();
  std::size_t cache_limit_ = std::size_t{1} << 30;
};

}  // namespace detail
}  // namespace locus
