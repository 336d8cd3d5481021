// Per-device allocators with statistics. Every tensor allocation goes through one:
// `cpu` through a counting aligned allocator, `pinned` and `cuda` through a caching
// allocator in front of cudaHostAlloc / cudaMalloc. set_memory_limit<D> caps any
// device, so the out-of-memory path is testable without a GPU.
//
// The caching allocator (pinned, cuda), PyTorch's design in locus's form:
// - Segments and blocks. Requests are rounded to a size class (size_class); requests
//   of at most 1 MiB are carved from shared 2 MiB segments, requests below 10 MiB from
//   20 MiB segments, larger ones get a segment of their own (rounded to 2 MiB). A
//   cached block larger than a request is split and the rest stays cached; freed
//   neighbours merge. A trainer whose batch size varies is served from the cache once
//   its largest batch has been seen. allocated_bytes counts the blocks handed out
//   (their class, or a little more where the rest was too small to split),
//   reserved_bytes the segments.
// - Streams. A cuda block belongs to the stream current when it was allocated, and
//   is reused only by allocations on that stream (and GPU): later work there runs
//   after whatever used the block before the free. THE RULE: a block is reused by
//   another stream only after every stream that used it has passed the point where
//   it was freed. Locus knows a stream used a block when told:
//   locus::record_stream(t, s) (built on detail::record_block_use) marks tensor t as
//   used by work on s; asynchronous copies and the loader record their streams. At
//   free, an event is recorded on each such stream (for pinned blocks, which belong
//   to no stream, on every recorded stream: the DMA engine reads them), and the block
//   is reusable only once all have completed. Allocation polls them
//   (cudaEventQuery; only cudaSuccess counts as done, an error keeps the block
//   pending until empty_cache or the out-of-memory path synchronizes); free never
//   blocks (when no event can be recorded, the block stays pending until such a
//   synchronize). A stream is (handle, GPU): record_block_use(p, s, device) names
//   the GPU of s (cudaStreamLegacy is one handle on every GPU); events are created
//   and recorded with that GPU current. A tensor used on another stream without
//   record_stream is not protected: that is the user's race, as in PyTorch.
// - A destroyed stream's blocks are not stranded: detail::release_stream_blocks(s)
//   (called by locus::stream's destructor once the stream has finished) makes its
//   blocks, cached and live, any-stream blocks the next stream can take; nothing is
//   returned to the system (that would synchronise the device), empty_cache does.
// - Out of memory. When the limit or the device refuses, the allocator returns only
//   the cached segments that make the room (the smallest that suffices, else the
//   largest first), after one device synchronisation if freed blocks still wait for
//   events; then all cached segments; then it throws locus::out_of_memory with the
//   numbers. It frees nothing when that could not make room.
// - Graph pools (detail::graph_pool, detail::graph_pool_scope): while a scope is
//   alive on a thread, cuda allocations of that thread come from the graph's private
//   pool and return to it; the pool's segments go back to the system when the pool
//   is destroyed and none of its blocks is live. While any scope is alive, or the
//   allocating thread's current stream captures, the allocator calls no cudaFree,
//   no synchronize and no cudaEventQuery (each invalidates a ThreadLocal/Global
//   capture; pending blocks stay pending meanwhile, as PyTorch skips process_events).
//   Growing a pool during capture calls cudaMalloc (cudaHostAlloc for pinned) under
//   cudaThreadExchangeStreamCaptureMode(Relaxed), the previous mode restored
//   (PyTorch's cudaMallocMaybeCapturing). A cuda allocation on a capturing stream
//   not served from a pool throws locus::error (use the trainer's cuda_graph mode
//   or a graph_pool_scope). A shared-cache block (cuda or pinned) freed while its
//   own stream or a stream that used it captures is parked: the graph baked its
//   address in, so it is never reused until empty_cache (called with no capture
//   underway; call it only after destroying graphs that may replay into such
//   blocks). It counts in pending_bytes meanwhile.
// - Pinned: only the errors that mean CUDA is unavailable here (no device/driver,
//   event_pool::unavailable) switch to pageable memory; any other cudaHostAlloc
//   error throws cuda_error (out of memory takes the out-of-memory path).
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

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#endif

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

/// Pageable host memory: no cache (malloc already has one), but counted and capped.
/// Each block carries its size in a 64-byte header in front of the data (the data
/// stays 64-byte aligned), so freeing needs no lookup table.
class host_allocator {
 public:
  static constexpr std::string_view device_name = "cpu";

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    if (fault::inject()) throw out_of_memory(device_name, bytes, allocated_, allocated_, limit_, "injected fault");
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
/// (at most 25% waste). A request is rounded to its class; that is the size of the
/// block it gets (or more: see caching_allocator's splitting rule).
inline std::size_t size_class(std::size_t bytes) noexcept {
  constexpr std::size_t small = 1u << 20;
  if (bytes <= small) return round_up(bytes == 0 ? 1 : bytes, 512);
  std::size_t p = small;
  while (p <= (bytes - 1) / 2) p *= 2;  // p < bytes <= 2p, without overflowing p
  const std::size_t step = p / 4;
  return round_up(bytes, step);
}

/// The largest request a caching allocator considers (larger ones are refused as
/// out_of_memory before any rounding could wrap).
inline constexpr std::size_t max_request_bytes = std::size_t{1} << 62;
/// Requests of at most this many bytes are "small": served from small segments.
inline constexpr std::size_t small_request_bytes = std::size_t{1} << 20;
/// Segment sizes, PyTorch's: small requests share 2 MiB segments, requests below
/// 10 MiB share 20 MiB segments, larger ones get their own, rounded to 2 MiB.
inline constexpr std::size_t small_segment_bytes = std::size_t{2} << 20;
inline constexpr std::size_t large_segment_bytes = std::size_t{20} << 20;
inline constexpr std::size_t shared_segment_limit = std::size_t{10} << 20;

/// The segment the allocator asks the system for when no cached block fits `size`
/// (already a size class).
inline std::size_t segment_size(std::size_t size) noexcept {
  if (size <= small_request_bytes) return small_segment_bytes;
  if (size < shared_segment_limit) return large_segment_bytes;
  return round_up(size, small_segment_bytes);
}

/// Whether a block of `block` bytes handed out for `size` bytes is split, the rest
/// staying cached (PyTorch's rule): in small segments when 512 bytes or more remain,
/// in large ones when more than 1 MiB remains (a smaller rest could only serve small
/// requests, which large segments do not serve).
inline bool should_split(bool small, std::size_t block, std::size_t size) noexcept {
  const std::size_t rest = block - size;
  return small ? rest >= 512 : rest > small_request_bytes;
}

/// Stream key of a block that any stream may take: blocks of a released stream
/// (release_stream_blocks) and every pinned block.
inline constexpr std::uintptr_t any_stream = ~std::uintptr_t{0};

/// A caching allocator over a raw resource. Resource provides
///   static constexpr std::string_view device_name;
///   static constexpr bool stream_ordered;  true: blocks belong to their allocation
///                                          stream (cuda); false: to none (pinned)
///   void* raw_allocate(std::size_t)   -> nullptr when out of memory, throws otherwise
///   void raw_free(void* p, int place) noexcept
///   int place()                       -> which GPU (or 0), part of the cache key
///   int current_place()               -> the GPU of work enqueued now (for events)
///   void* stream()                    -> the stream an allocation is tied to
///   bool fallback() const
///   using event_token = ...;          (copyable)
///   event_token record_event(int place, void* stream) noexcept
///   bool event_done(event_token) noexcept    (never blocks)
///   void release_event(event_token) noexcept (back to the resource's event pool)
///   bool capturing(void* stream) noexcept    (the stream is under graph capture)
///   bool current_capturing() noexcept        (this thread's current stream captures)
///   void synchronize() noexcept              (the host waits for every device; after
///                                            it, every recorded event counts as done)
///
/// The rules (see also the file comment):
/// - Blocks are carved from segments (segment_size); a cached block larger than a
///   request is split (should_split) and freed neighbours merge again, so varying
///   batch sizes are served from the cache once the largest has been seen.
/// - A block belongs to its allocation stream (cuda) and is reused only for work on
///   that stream (and place), which runs after everything enqueued before the free.
///   Streams recorded with record_use (other than the own one; for pinned, every
///   stream: the DMA engine reads pinned memory) get an event each at free; the block
///   is reusable only once every one has completed (polled, never waited for, when
///   allocating). Events come from the resource's pool.
/// - release_stream(s), called after s has finished its work and before its handle
///   is destroyed: s's blocks, free and live, become any_stream blocks (the next
///   stream may take them; nothing is returned to the system), and s is dropped from
///   the use lists (its work is done).
/// - Private pools (graph pools): while a pool_scope is alive on a thread, that
///   thread's allocations come from the pool; its blocks return only to it, and its
///   segments go back to the system once the pool is destroyed and none of its
///   blocks is live or pending. While any pool scope is alive, or the allocating
///   thread's stream captures, the allocator never returns memory to the system,
///   never synchronizes and never queries events (no poll, no deferred processing).
/// - Captures: a stream_ordered allocation on a capturing stream outside a pool
///   throws locus::error; a shared-cache block freed while its stream or a user
///   stream captures is parked until empty_cache (never reused before).
/// - Out of memory (the limit or the system): first the cached segments that make
///   the room are returned (the smallest that suffices, else the largest first),
///   after one synchronize when pending blocks must first complete; then everything
///   cached; then out_of_memory. Nothing is returned when it could not make room.
template <class Resource>
class caching_allocator {
 public:
  static constexpr std::string_view device_name = Resource::device_name;
  using event_token = typename Resource::event_token;

  struct pool_state;

 private:
  struct block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::uintptr_t stream = any_stream;  // the stream that may reuse it without events
    int place = 0;
    bool small = false;                  // from a small segment
    enum state_t : unsigned char { free_, live, pending, deferred, parked } state = free_;
    int events = 0;                      // outstanding events while pending
    pool_state* pool = nullptr;
    block* prev = nullptr;               // neighbours in the segment
    block* next = nullptr;
    struct use {
      std::uintptr_t stream;
      int place;
    };
    std::vector<use> uses;               // streams to record events on at free
  };
  struct block_less {
    bool operator()(const block* a, const block* b) const noexcept {
      if (a->small != b->small) return a->small < b->small;
      if (a->place != b->place) return a->place < b->place;
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->addr < b->addr;
    }
  };

 public:
  /// A set of cached blocks: the shared cache, or one private (graph) pool.
  struct pool_state {
    std::set<block*, block_less> free;
    std::size_t blocks = 0;    // live, pending or deferred blocks of the pool
    std::size_t reserved = 0;  // bytes of its segments
    bool destroyed = false;
    const void* owner = nullptr;
  };

  caching_allocator() { shared_.owner = this; }
  caching_allocator(const caching_allocator&) = delete;
  caching_allocator& operator=(const caching_allocator&) = delete;
  ~caching_allocator() {
    // Only test allocators are destroyed (allocator_for's live forever). Blocks still
    // live are the caller's leak; their memory goes back with the rest.
    std::set<block*> all;
    const auto collect = [&](pool_state& p) { all.insert(p.free.begin(), p.free.end()); };
    collect(shared_);
    for (auto& p : pools_) collect(*p);
    for (auto& [a, b] : live_) all.insert(b);
    for (auto& q : queues_)
      for (std::size_t i = q.head; i < q.events.size(); ++i) {
        resource_.release_event(q.events[i].token);
        all.insert(q.events[i].b);
      }
    all.insert(deferred_.begin(), deferred_.end());
    all.insert(parked_.begin(), parked_.end());
    for (block* b : all)
      if (!b->prev) resource_.raw_free(reinterpret_cast<void*>(b->addr), b->place);
    for (block* b : all) delete b;
  }

  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    if (fault::inject()) {
      std::lock_guard lock(mutex_);
      throw out_of_memory(device_name, bytes, allocated_, reserved_, limit_, "injected fault");
    }
    if (bytes > max_request_bytes) {
      std::lock_guard lock(mutex_);
      throw out_of_memory(device_name, bytes, allocated_, reserved_, limit_, "the system refused");
    }
    const std::size_t size = size_class(bytes);
    const bool small = size <= small_request_bytes;
    const int place = resource_.place();
    const std::uintptr_t stream =
        Resource::stream_ordered ? reinterpret_cast<std::uintptr_t>(resource_.stream()) : any_stream;
    const tls_pool& t = current_tls();
    const bool in_pool = t.pool && t.owner == this;
    // One query per allocation (as PyTorch's): is this thread's current stream capturing?
    const bool capturing_now = resource_.current_capturing();
    if (Resource::stream_ordered && !in_pool && capturing_now)
      throw error(
          "locus: an allocation on a stream under CUDA graph capture, outside a graph pool: its "
          "address would be baked into the graph and handed to other tensors later; capture with the "
          "trainer's cuda_graph mode, or allocate under a detail::graph_pool_scope of the graph's pool "
          "on the capturing thread");
    std::lock_guard lock(mutex_);
    capture_guard cg(capture_, capturing_now);
    place_stats& ps = at(place);  // (grows the per-GPU table before anything changes)
    pool_state& pool = in_pool ? *t.pool : shared_;
    // No event queries while a capture may be underway (a pool scope is alive, or this
    // thread's stream captures): cudaEventQuery on the capturing thread invalidates a
    // ThreadLocal/Global capture. Pending blocks simply stay pending meanwhile.
    if (!capture_underway()) {
      if (!queues_.empty()) poll_events();
      if (!deferred_.empty()) process_deferred();
    }
    block* b = find_free(pool, small, place, stream, size);
    if (b) {
      ++cache_hits_;
      ++ps.cache_hits;
    } else {
      const std::size_t before = system_allocations_;
      b = grow(pool, size, small, place, stream);
      if (system_allocations_ == before) ++cache_hits_, ++ps.cache_hits;  // a pending block completed meanwhile
    }
    b = take(pool, b, size, stream);
    live_.emplace(b->addr, b);
    allocated_ += b->size;
    ++allocations_;
    if (allocated_ > peak_) peak_ = allocated_;
    ps.allocated += b->size;
    ++ps.allocations;
    if (ps.allocated > ps.peak) ps.peak = ps.allocated;
    return reinterpret_cast<void*>(b->addr);
  }

  void deallocate(void* p) noexcept {
    if (!p) return;
    std::lock_guard lock(mutex_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == live_.end()) return;
    block* b = it->second;
    live_.erase(it);
    allocated_ -= b->size;
    places_[static_cast<std::size_t>(b->place)].allocated -= b->size;
    const bool own_capturing = Resource::stream_ordered && b->stream != any_stream &&
                               resource_.capturing(reinterpret_cast<void*>(b->stream));
    const bool use_capturing = any_use_capturing(b);
    if (b->pool == &shared_ && (own_capturing || use_capturing)) {
      // A shared block freed while a capture that may use it is underway: the graph
      // baked its address in, and replays would write into whoever got it next. It
      // leaves circulation for good; only empty_cache (no capture underway) brings it
      // back. See the class comment.
      b->state = block::parked;
      b->uses.clear();
      add_pending(b);
      parked_.push_back(b);
      return;
    }
    if (b->uses.empty()) {
      free_block(b);
      return;
    }
    add_pending(b);
    if (use_capturing) {
      b->state = block::deferred;  // events recorded once the capture is over
      deferred_.push_back(b);
      return;
    }
    record_events(b);  // records events, never synchronizes
  }

  /// Notes that the block holding `p` (anywhere inside a live block) is used by work
  /// on `stream` of GPU `place` (see the class comment). Pointers the allocator did
  /// not hand out are ignored, as is the block's own (stream, place). A stream is
  /// named by (handle, place): cudaStreamLegacy is the same handle on every GPU.
  void record_use(const void* p, void* stream, int place) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t s = reinterpret_cast<std::uintptr_t>(stream);
    std::lock_guard lock(mutex_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return;
    block* b = (--it)->second;
    if (a >= b->addr + b->size) return;
    if (Resource::stream_ordered && s == b->stream && place == b->place) return;
    for (const auto& u : b->uses)
      if (u.stream == s && u.place == place) return;
    b->uses.push_back({s, place});
  }
  /// The same, for a stream of the current GPU.
  void record_use(const void* p, void* stream) { record_use(p, stream, resource_.current_place()); }

  /// `stream` is finished (synchronised) and about to be destroyed: its blocks become
  /// any-stream blocks (see the class comment).
  void release_stream(void* stream) noexcept {
    const std::uintptr_t s = reinterpret_cast<std::uintptr_t>(stream);
    std::lock_guard lock(mutex_);
    const auto drop_uses = [&](block* b) {
      for (std::size_t i = 0; i < b->uses.size();) {
        if (b->uses[i].stream == s) {
          b->uses[i] = b->uses.back();
          b->uses.pop_back();
        } else {
          ++i;
        }
      }
    };
    for (auto& [a, b] : live_) {
      if (b->stream == s) b->stream = any_stream;
      drop_uses(b);
    }
    for (block* b : deferred_) {
      if (b->stream == s) b->stream = any_stream;
      drop_uses(b);
    }
    for (block* b : parked_)
      if (b->stream == s) b->stream = any_stream;
    for (auto& q : queues_)
      for (std::size_t i = q.head; i < q.events.size(); ++i)
        if (q.events[i].b->stream == s) q.events[i].b->stream = any_stream;
    if (!Resource::stream_ordered) return;
    const auto rekey = [&](pool_state& pool) {
      // Take them all out first (marked live, so no merge deletes one of them while
      // others are put back), then put each back as an any-stream block.
      std::vector<block*> found;
      for (block* b : pool.free)
        if (b->stream == s) found.push_back(b);
      for (block* b : found) {
        pool.free.erase(b);
        b->state = block::live;
        b->stream = any_stream;
      }
      for (block* b : found) insert_free(pool, b);
    };
    rekey(shared_);
    for (auto& p : pools_) rekey(*p);
  }

  /// Statistics of one place (GPU), or of all together (place < 0).
  memory_statistics stats(int place) {
    if (place < 0) return stats();
    std::lock_guard lock(mutex_);
    memory_statistics s;
    if (static_cast<std::size_t>(place) < places_.size()) {
      const place_stats& ps = places_[static_cast<std::size_t>(place)];
      s.allocated_bytes = ps.allocated;
      s.reserved_bytes = ps.reserved;
      s.peak_allocated_bytes = ps.peak;
      s.allocations = ps.allocations;
      s.cache_hits = ps.cache_hits;
      s.limit_bytes = ps.limit;
      s.pending_bytes = ps.pending;
      s.system_allocations = ps.system_allocations;
    }
    s.fallback = resource_.fallback();
    return s;
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
    s.pending_bytes = pending_bytes_;
    s.system_allocations = system_allocations_;
    return s;
  }
  /// Returns every cached segment with no live or pending block to the system (after
  /// one synchronize when pending blocks exist, so that they can complete), and puts
  /// blocks freed during a capture (parked) back into circulation. Does nothing while
  /// a pool scope is alive or this thread's stream captures.
  void empty_cache(int place = -1) {
    if (resource_.current_capturing()) return;
    std::lock_guard lock(mutex_);
    if (!may_free()) return;
    if (!queues_.empty()) {
      resource_.synchronize();
      complete_all_events();
    }
    if (!parked_.empty()) {
      std::vector<block*> parked;
      parked.swap(parked_);
      for (block* b : parked) {
        if (place >= 0 && b->place != place) {
          parked_.push_back(b);  // another GPU's: stays parked
          continue;
        }
        sub_pending(b);
        free_block(b);
      }
    }
    release(shared_, std::numeric_limits<std::size_t>::max(), false, place);
  }
  /// Caps reserved bytes; cached segments are returned until reserved bytes are
  /// within the new limit where that is possible.
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mutex_);
    limit_ = bytes;
    if (reserved_ > limit_ && may_free()) release(shared_, reserved_ - limit_, false);
  }
  /// Caps one place's (GPU's) reserved bytes, beside the cap of all together.
  void set_limit(std::size_t bytes, int place) {
    if (place < 0) return set_limit(bytes);
    std::lock_guard lock(mutex_);
    place_stats& ps = at(place);
    ps.limit = bytes;
    if (ps.reserved > ps.limit && may_free()) release(shared_, ps.reserved - ps.limit, false, place);
  }
  void reset_peak(int place = -1) {
    std::lock_guard lock(mutex_);
    if (place < 0) {
      peak_ = allocated_;
      for (auto& ps : places_) ps.peak = ps.allocated;
    } else if (static_cast<std::size_t>(place) < places_.size()) {
      places_[static_cast<std::size_t>(place)].peak = places_[static_cast<std::size_t>(place)].allocated;
    }
  }
  Resource& resource() noexcept { return resource_; }

  /// The size of the live block at exactly `p` (0 if none): what allocated_bytes
  /// counts for it.
  std::size_t block_size(const void* p) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    return it == live_.end() ? 0 : it->second->size;
  }

  // ---- private pools --------------------------------------------------------------

  pool_state* create_pool() {
    std::lock_guard lock(mutex_);
    pools_.push_back(std::make_unique<pool_state>());
    pools_.back()->owner = this;
    return pools_.back().get();
  }
  /// The pool's owner lets go: its segments return to the system now if none of its
  /// blocks is live or pending, else when the last one is freed (or has completed).
  void destroy_pool(pool_state* p) noexcept {
    std::lock_guard lock(mutex_);
    p->destroyed = true;
    retire_pools();
  }
  std::size_t pool_reserved(const pool_state* p) {
    std::lock_guard lock(mutex_);
    return p->reserved;
  }
  /// Makes `p` this thread's pool; returns the previous one (for leave_pool).
  struct tls_pool {
    const void* owner = nullptr;
    pool_state* pool = nullptr;
  };
  tls_pool enter_pool(pool_state* p) noexcept {
    scopes_.fetch_add(1, std::memory_order_relaxed);
    return std::exchange(current_tls(), tls_pool{this, p});
  }
  void leave_pool(tls_pool previous) noexcept {
    current_tls() = previous;
    if (scopes_.fetch_sub(1, std::memory_order_relaxed) == 1) {
      std::lock_guard lock(mutex_);
      retire_pools();
    }
  }

 private:
  struct pending_event {
    event_token token;
    block* b;
  };
  struct stream_queue {
    std::uintptr_t stream;
    int place;
    std::vector<pending_event> events;  // in recording order: they complete in order
    std::size_t head = 0;               // events[head..] are outstanding
  };

  static tls_pool& current_tls() noexcept {
    thread_local tls_pool t;
    return t;
  }

  /// No system frees (and no synchronize) while a pool scope is alive or the
  /// allocating thread's stream captures.
  bool may_free() const noexcept { return scopes_.load(std::memory_order_relaxed) == 0 && !capture_; }
  bool capture_underway() const noexcept { return !may_free(); }
  /// Sets capture_ for one allocation (under the mutex), clears it on every exit.
  struct capture_guard {
    bool& flag;
    capture_guard(bool& f, bool v) noexcept : flag(f) { flag = v; }
    capture_guard(const capture_guard&) = delete;
    capture_guard& operator=(const capture_guard&) = delete;
    ~capture_guard() { flag = false; }
  };

  /// After a synchronize, every event recorded before it has completed (or the
  /// context has failed and nothing will run again): release them all, without
  /// querying (a failed query or recording counts as done only here).
  void complete_all_events() noexcept {
    std::vector<stream_queue> queues;
    queues.swap(queues_);
    for (auto& q : queues)
      for (std::size_t h = q.head; h < q.events.size(); ++h) {
        const pending_event e = q.events[h];
        resource_.release_event(e.token);
        if (--e.b->events == 0) {
          sub_pending(e.b);
          free_block(e.b);
        }
      }
  }

  bool any_use_capturing(const block* b) noexcept {
    for (const auto& u : b->uses)
      if (resource_.capturing(reinterpret_cast<void*>(u.stream))) return true;
    return false;
  }

  void record_events(block* b) noexcept {
    b->state = block::pending;
    for (const auto& u : b->uses) {
      const event_token tok = resource_.record_event(u.place, reinterpret_cast<void*>(u.stream));
      stream_queue* q = nullptr;
      for (auto& x : queues_)
        if (x.stream == u.stream && x.place == u.place) q = &x;
      if (!q) {
        queues_.push_back(stream_queue{u.stream, u.place, {}});
        q = &queues_.back();
      }
      q->events.push_back({tok, b});
      ++b->events;
    }
    b->uses.clear();
  }

  void poll_events() noexcept {
    for (std::size_t i = 0; i < queues_.size();) {
      auto& q = queues_[i].events;
      std::size_t& h = queues_[i].head;
      while (h < q.size() && resource_.event_done(q[h].token)) {
        const pending_event e = q[h++];
        resource_.release_event(e.token);
        if (--e.b->events == 0) {
          sub_pending(e.b);
          free_block(e.b);
        }
      }
      if (h == q.size()) {
        queues_[i] = std::move(queues_.back());
        queues_.pop_back();
      } else {
        if (h >= 64 && 2 * h >= q.size()) {  // a queue that never drains stays small
          q.erase(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(h));
          h = 0;
        }
        ++i;
      }
    }
  }

  void process_deferred() noexcept {
    for (std::size_t i = 0; i < deferred_.size();) {
      block* b = deferred_[i];
      if (b->uses.empty()) {  // its streams were released meanwhile
        sub_pending(b);
        deferred_[i] = deferred_.back();
        deferred_.pop_back();
        free_block(b);
      } else if (!any_use_capturing(b)) {
        deferred_[i] = deferred_.back();
        deferred_.pop_back();
        record_events(b);
      } else {
        ++i;
      }
    }
  }

  block* find_free(pool_state& pool, bool small, int place, std::uintptr_t stream, std::size_t size) {
    block key;
    key.small = small;
    key.place = place;
    key.size = size;
    const std::uintptr_t keys[2] = {stream, any_stream};
    for (std::uintptr_t s : keys) {
      key.stream = s;
      auto it = pool.free.lower_bound(&key);
      if (it != pool.free.end() && (*it)->small == small && (*it)->place == place && (*it)->stream == s)
        return *it;
      if (s == any_stream) break;
    }
    return nullptr;
  }

  /// Hands out free block b (in pool.free) for `size` bytes on `stream`, splitting off
  /// the rest.
  block* take(pool_state& pool, block* b, std::size_t size, std::uintptr_t stream) {
    pool.free.erase(b);
    if (should_split(b->small, b->size, size)) {
      auto* rest = new block;
      rest->addr = b->addr + size;
      rest->size = b->size - size;
      rest->stream = b->stream;  // an any-stream rest stays any-stream
      rest->place = b->place;
      rest->small = b->small;
      rest->pool = &pool;
      rest->prev = b;
      rest->next = b->next;
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      rest->state = block::free_;
      pool.free.insert(rest);
    }
    if (Resource::stream_ordered) b->stream = stream;
    b->state = block::live;
    ++pool.blocks;
    return b;
  }

  static bool mergeable(const block* a, const block* n) noexcept {
    return n && n->state == block::free_ &&
           (a->stream == n->stream || a->stream == any_stream || n->stream == any_stream);
  }

  /// b (not in any set) becomes free: merged with free neighbours it may share with,
  /// then inserted into its pool's free set.
  void insert_free(pool_state& pool, block* b) noexcept {
    block* const neighbours[2] = {b->prev, b->next};
    for (block* n : neighbours) {
      if (!mergeable(b, n)) continue;
      pool.free.erase(n);
      if (b->stream == any_stream) b->stream = n->stream;
      if (n == b->prev) {
        b->addr = n->addr;
        b->prev = n->prev;
        if (b->prev) b->prev->next = b;
      } else {
        b->next = n->next;
        if (b->next) b->next->prev = b;
      }
      b->size += n->size;
      delete n;
    }
    b->state = block::free_;
    pool.free.insert(b);
  }

  void free_block(block* b) noexcept {
    pool_state& pool = *b->pool;
    --pool.blocks;
    insert_free(pool, b);
    if (pool.destroyed && pool.blocks == 0) retire_pools();
  }

  /// Waits for the device once, so that every pending block completes; returns a
  /// cached block that serves the request now, if one does.
  block* sync_and_find(pool_state& pool, std::size_t size, bool small, int place, std::uintptr_t stream) noexcept {
    resource_.synchronize();
    if (queues_.empty()) return nullptr;
    complete_all_events();
    return find_free(pool, small, place, stream, size);
  }

  /// No cached block serves the request: a new segment (within the limit, returning
  /// cached segments where that makes room), or a block that a synchronisation freed.
  block* grow(pool_state& pool, std::size_t size, bool small, int place, std::uintptr_t stream) {
    std::size_t seg = segment_size(size);
    place_stats& ps = at(place);
    // Room under the cap of all places and under this place's own cap: the smaller.
    const auto room = [](std::size_t reserved, std::size_t limit) { return reserved > limit ? std::size_t{0} : limit - reserved; };
    const bool own_binds = room(ps.reserved, ps.limit) < room(reserved_, limit_);
    const bool over = reserved_ > limit_ || ps.reserved > ps.limit;
    const std::size_t headroom = std::min(room(reserved_, limit_), room(ps.reserved, ps.limit));
    if (over || seg > headroom) {
      // The usual segment does not fit the limit: a segment of exactly the request,
      // after returning cached segments where they make the room.
      seg = size;
      if (over || size > headroom) {
        if (!queues_.empty() && may_free())
          if (block* b = sync_and_find(pool, size, small, place, stream)) return b;
        const std::size_t excess = own_binds ? (ps.reserved > ps.limit ? ps.reserved - ps.limit : 0)
                                             : (reserved_ > limit_ ? reserved_ - limit_ : 0);
        const std::size_t need = size - headroom + excess;
        if (!may_free() || !release(shared_, need, true, own_binds ? place : -1)) {
          const char* why = may_free() ? "memory limit"
                                       : "memory limit; cached memory cannot be returned while a graph pool "
                                         "scope is alive";
          if (own_binds)  // this GPU's own limit: its numbers, under its name (cuda:1)
            throw out_of_memory(std::string(device_name) + ":" + std::to_string(place), size, ps.allocated,
                                ps.reserved, ps.limit, why);
          throw out_of_memory(device_name, size, allocated_, reserved_, limit_, why);
        }
      }
    }
    void* p = resource_.raw_allocate(seg);
    if (!p && seg > size) p = resource_.raw_allocate(seg = size);
    if (!p && may_free()) {
      // The system refused: wait for the device once, return the cached segments that
      // make the room (then all of them) and try again.
      if (block* b = sync_and_find(pool, size, small, place, stream)) return b;
      if (release(shared_, seg, false)) p = resource_.raw_allocate(seg);
      if (!p && release(shared_, std::numeric_limits<std::size_t>::max(), false))
        p = resource_.raw_allocate(seg);
    }
    if (!p)
      throw out_of_memory(device_name, size, allocated_, reserved_, limit_,
                          may_free() ? "the device has no free memory left, with the cache emptied and "
                                       "the allocation retried"
                                     : "the device has no free memory left; cached memory cannot be "
                                       "returned while a graph pool scope is alive");
    ++system_allocations_;
    reserved_ += seg;
    pool.reserved += seg;
    ++ps.system_allocations;
    ps.reserved += seg;
    auto* b = new block;
    b->addr = reinterpret_cast<std::uintptr_t>(p);
    b->size = seg;
    b->stream = stream;
    b->place = place;
    b->small = small;
    b->pool = &pool;
    b->state = block::free_;
    pool.free.insert(b);
    return b;
  }

  /// Returns whole free segments of `pool` to the system: the smallest that frees
  /// `need` bytes, else the largest first until `need` is met. Returns false, freeing
  /// nothing, if all of them would not make `need` (need = max(): free all, return
  /// whether any was freed). `sync_if_short`: when short and blocks are pending,
  /// synchronize once and count the blocks that completed.
  bool release(pool_state& pool, std::size_t need, bool sync_if_short, int place = -1) noexcept {
    const bool all = need == std::numeric_limits<std::size_t>::max();
    std::vector<std::pair<std::size_t, block*>> segs;  // (bytes, first block)
    std::size_t total = 0;
    const auto collect = [&] {
      segs.clear();
      total = 0;
      for (block* b : pool.free) {
        if (b->prev || (place >= 0 && b->place != place)) continue;
        std::size_t bytes = 0;
        const block* x = b;
        for (; x && x->state == block::free_; x = x->next) bytes += x->size;
        if (x) continue;  // a block of the segment is not free
        segs.emplace_back(bytes, b);
        total += bytes;
      }
    };
    collect();
    if (!all && total < need && sync_if_short && !queues_.empty() && may_free()) {
      resource_.synchronize();
      complete_all_events();
      collect();
    }
    if (all ? segs.empty() : total < need) return false;
    std::size_t freed = 0;
    for (std::size_t i = 1; i < segs.size(); ++i)  // by size (few segments; no <algorithm>)
      for (std::size_t j = i; j > 0 && segs[j].first < segs[j - 1].first; --j) std::swap(segs[j], segs[j - 1]);
    if (!all) {
      for (auto& s : segs)
        if (s.first >= need) {
          free_segment(pool, s.second, s.first);
          return true;
        }
    }
    for (auto it = segs.rbegin(); it != segs.rend() && (all || freed < need); ++it) {
      free_segment(pool, it->second, it->first);
      freed += it->first;
    }
    return true;
  }

  void free_segment(pool_state& pool, block* head, std::size_t bytes) noexcept {
    resource_.raw_free(reinterpret_cast<void*>(head->addr), head->place);
    reserved_ -= bytes;
    pool.reserved -= bytes;
    places_[static_cast<std::size_t>(head->place)].reserved -= bytes;
    for (block* b = head; b;) {
      block* n = b->next;
      pool.free.erase(b);
      delete b;
      b = n;
    }
  }

  /// Destroyed pools with nothing live or pending give their segments back.
  void retire_pools() noexcept {
    if (!may_free()) return;
    for (std::size_t i = 0; i < pools_.size();) {
      pool_state& p = *pools_[i];
      if (p.destroyed && p.blocks == 0) {
        release(p, std::numeric_limits<std::size_t>::max(), false);
        pools_[i] = std::move(pools_.back());
        pools_.pop_back();
      } else {
        ++i;
      }
    }
  }

  std::mutex mutex_;
  Resource resource_;
  pool_state shared_;
  std::vector<std::unique_ptr<pool_state>> pools_;
  std::map<std::uintptr_t, block*> live_;
  std::vector<stream_queue> queues_;
  std::vector<block*> deferred_;
  std::vector<block*> parked_;  // freed during a capture: out of circulation (see deallocate)
  std::atomic<int> scopes_{0};
  bool capture_ = false;        // the allocation under way runs on a capturing stream
  std::size_t allocated_ = 0, reserved_ = 0, peak_ = 0, allocations_ = 0, cache_hits_ = 0,
              pending_bytes_ = 0, system_allocations_ = 0;
  std::size_t limit_ = std::numeric_limits<std::size_t>::max();

  /// The same figures per place (GPU), grown (under the mutex) the first time a place
  /// allocates or is given a limit; the totals above stay what they were.
  struct place_stats {
    std::size_t allocated = 0, reserved = 0, peak = 0, allocations = 0, cache_hits = 0, pending = 0,
                system_allocations = 0;
    std::size_t limit = std::numeric_limits<std::size_t>::max();
  };
  std::vector<place_stats> places_;
  place_stats& at(int place) {
    const std::size_t i = static_cast<std::size_t>(place < 0 ? 0 : place);
    if (i >= places_.size()) places_.resize(i + 1);
    return places_[i];
  }
  void add_pending(const block* b) noexcept {
    pending_bytes_ += b->size;
    places_[static_cast<std::size_t>(b->place)].pending += b->size;
  }
  void sub_pending(const block* b) noexcept {
    pending_bytes_ -= b->size;
    places_[static_cast<std::size_t>(b->place)].pending -= b->size;
  }
};

/// A private pool of a caching allocator (for one captured CUDA graph): owns the
/// allocator's pool state until destroyed. See caching_allocator's class comment.
template <class Allocator>
class basic_graph_pool {
 public:
  explicit basic_graph_pool(Allocator& a) : allocator_(&a), state_(a.create_pool()) {}
  basic_graph_pool(const basic_graph_pool&) = delete;
  basic_graph_pool& operator=(const basic_graph_pool&) = delete;
  ~basic_graph_pool() { allocator_->destroy_pool(state_); }
  /// Bytes of the segments the pool holds.
  [[nodiscard]] std::size_t reserved_bytes() const { return allocator_->pool_reserved(state_); }
  [[nodiscard]] Allocator& allocator() const noexcept { return *allocator_; }
  [[nodiscard]] typename Allocator::pool_state* state() const noexcept { return state_; }

 private:
  Allocator* allocator_;
  typename Allocator::pool_state* state_;
};

/// While alive, this thread's allocations from the pool's allocator come from the
/// pool. The pool must outlive the scope. Scopes nest (the inner one wins).
template <class Allocator>
class basic_graph_pool_scope {
 public:
  explicit basic_graph_pool_scope(basic_graph_pool<Allocator>& p)
      : allocator_(&p.allocator()), previous_(allocator_->enter_pool(p.state())) {}
  basic_graph_pool_scope(const basic_graph_pool_scope&) = delete;
  basic_graph_pool_scope& operator=(const basic_graph_pool_scope&) = delete;
  ~basic_graph_pool_scope() { allocator_->leave_pool(previous_); }

 private:
  Allocator* allocator_;
  typename Allocator::tls_pool previous_;
};

#if LOCUS_HAS_CUDA
/// Sets the current device for a scope (no call when it is current already).
class place_guard {
 public:
  explicit place_guard(int device) noexcept {
    int cur = 0;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != device && cudaSetDevice(device) == cudaSuccess)
      previous_ = cur;
  }
  place_guard(const place_guard&) = delete;
  place_guard& operator=(const place_guard&) = delete;
  ~place_guard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

/// Completion events, pooled per device (creating one per free is too slow). Used
/// under the allocator's mutex.
class event_pool {
 public:
  struct token {
    cudaEvent_t event = nullptr;  // null: nothing to wait for (unless failed)
    int device = 0;
    bool failed = false;  // no event could be recorded: done only after a synchronize
  };
  /// Records an event on `stream` of GPU `device` (made current for the call, the
  /// previous device restored). Never blocks: when no event can be recorded the token
  /// says so, and the block stays pending until the allocator synchronizes the device
  /// (empty_cache, out of memory).
  token record(int device, void* stream) noexcept {
    place_guard g(device);
    token t{nullptr, device, false};
    if (static_cast<std::size_t>(device) < free_.size() && !free_[static_cast<std::size_t>(device)].empty()) {
      t.event = free_[static_cast<std::size_t>(device)].back();
      free_[static_cast<std::size_t>(device)].pop_back();
    } else if (cudaEventCreateWithFlags(&t.event, cudaEventDisableTiming) != cudaSuccess) {
      t.event = nullptr;
    }
    if (t.event && cudaEventRecord(t.event, static_cast<cudaStream_t>(stream)) == cudaSuccess) return t;
    // No event (rare: an error path). Not waited for here (the allocator's mutex is
    // held): the block stays pending until a synchronize.
    (void)cudaGetLastError();
    if (t.event) release(t);
    return token{nullptr, device, true};
  }
  /// Only cudaSuccess is done. Not ready, or any error, keeps the block pending (an
  /// error is not retried in a loop: the allocator polls once per allocation, and its
  /// empty_cache / out-of-memory paths synchronize and then count every event done).
  static bool done(token t) noexcept {
    if (!t.event) return !t.failed;
    const cudaError_t st = cudaEventQuery(t.event);
    if (st == cudaSuccess) return true;
    (void)cudaGetLastError();
    return false;
  }
  void release(token t) noexcept {
    if (!t.event) return;
    const auto d = static_cast<std::size_t>(t.device < 0 ? 0 : t.device);
    if (free_.size() <= d) free_.resize(d + 1);
    free_[d].push_back(t.event);
  }
  /// The errors that mean CUDA is unavailable on this machine (no driver, no device,
  /// a driver too old or mismatched, not supported). For cudaHostAlloc only these
  /// switch pinned memory to the pageable fallback, for good.
  static bool unavailable(cudaError_t st) noexcept {
    switch (st) {
      case cudaErrorNoDevice:
      case cudaErrorInsufficientDriver:
      case cudaErrorInitializationError:
      case cudaErrorNotSupported:
      case cudaErrorStubLibrary:
      case cudaErrorDevicesUnavailable:
      case cudaErrorSystemNotReady:
      case cudaErrorSystemDriverMismatch:
      case cudaErrorCompatNotSupportedOnDevice:
        return true;
      default:
        return false;
    }
  }
  static bool capturing(void* stream) noexcept {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      // e.g. the legacy stream while another stream captures: not safe. Without a
      // usable driver nothing can capture.
      return !unavailable(e);
    }
    return st != cudaStreamCaptureStatusNone;
  }
  /// cudaMalloc / cudaHostAlloc; when the current stream captures, under capture mode
  /// Relaxed for the call (ThreadLocal and Global forbid them on the capturing thread;
  /// PyTorch's cudaMallocMaybeCapturing), the previous mode restored.
  template <class F>
  static cudaError_t maybe_capturing(F&& f) noexcept {
    if (!capturing(static_cast<void*>(current_stream()))) return f();
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    const cudaError_t st = f();
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    return st;
  }
  /// Waits for every GPU (after it, every event recorded before has completed).
  static void synchronize_all() noexcept {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    for (int d = 0; d < n; ++d) {
      place_guard g(d);
      if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    }
  }
  static int current_device() noexcept {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return d;
  }

 private:
  std::vector<std::vector<cudaEvent_t>> free_;
};

/// Page-locked host memory from cudaHostAlloc. Without a usable driver (CI, a
/// machine without a GPU) it falls back to aligned pageable memory, says so in
/// memory_stats<pinned>().fallback and environment(), and every host path keeps working.
/// Pinned blocks belong to no stream: every stream recorded as a user gets an event.
class pinned_resource {
 public:
  static constexpr std::string_view device_name = "pinned";
  static constexpr bool stream_ordered = false;
  using event_token = event_pool::token;
  // raw_allocate and raw_free run under the caching allocator's lock; uses_cuda() is
  // also asked outside it (the capture query of every allocation), so the two facts it
  // reads are atomics beside the containers they summarise.
  void* raw_allocate(std::size_t bytes) {
    if (!fallback_.load(std::memory_order_relaxed)) {
      void* p = nullptr;
      const cudaError_t st =
          event_pool::maybe_capturing([&] { return cudaHostAlloc(&p, bytes, cudaHostAllocDefault); });
      if (st == cudaSuccess) {
        locked_.push_back(p);
        locked_count_.store(locked_.size(), std::memory_order_release);
        return p;
      }
      (void)cudaGetLastError();
      if (st == cudaErrorMemoryAllocation) return nullptr;
      if (!event_pool::unavailable(st)) LOCUS_CUDA_CHECK(st);  // a real error: throws cuda_error
      fallback_.store(true, std::memory_order_release);  // no driver or no device: no page-locking here
    }
    return aligned_host_alloc(bytes);
  }
  void raw_free(void* p, int) noexcept {
    for (auto& q : locked_) {
      if (q == p) {
        q = locked_.back();
        locked_.pop_back();
        locked_count_.store(locked_.size(), std::memory_order_release);
        (void)cudaFreeHost(p);
        return;
      }
    }
    std::free(p);
  }
  int place() const noexcept { return 0; }
  int current_place() const noexcept { return uses_cuda() ? event_pool::current_device() : 0; }
  void* stream() const noexcept { return nullptr; }
  bool fallback() const noexcept { return fallback_.load(std::memory_order_acquire); }
  // Page-locked blocks (locked_) keep getting events even after a later fallback.
  event_token record_event(int place, void* s) noexcept {
    return uses_cuda() ? events_.record(place, s) : event_token{};
  }
  bool event_done(event_token t) noexcept { return event_pool::done(t); }
  void release_event(event_token t) noexcept { events_.release(t); }
  bool capturing(void* s) noexcept { return uses_cuda() && event_pool::capturing(s); }
  bool current_capturing() noexcept { return capturing(static_cast<void*>(current_stream())); }
  void synchronize() noexcept {
    if (uses_cuda()) event_pool::synchronize_all();
  }

 private:
  bool uses_cuda() const noexcept {
    return !fallback_.load(std::memory_order_acquire) || locked_count_.load(std::memory_order_acquire) != 0;
  }
  std::atomic<bool> fallback_{false};
  std::vector<void*> locked_;
  std::atomic<std::size_t> locked_count_{0};
  event_pool events_;
};

/// Device memory of the current GPU from cudaMalloc.
class cuda_resource {
 public:
  static constexpr std::string_view device_name = "cuda";
  static constexpr bool stream_ordered = true;
  using event_token = event_pool::token;
  void* raw_allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t st = event_pool::maybe_capturing([&] { return cudaMalloc(&p, bytes); });
    if (st == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    LOCUS_CUDA_CHECK(st);
    return p;
  }
  void raw_free(void* p, int place) noexcept {
    place_guard g(place);
    (void)cudaFree(p);
  }
  int place() const {
    int d = 0;
    LOCUS_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  int current_place() const noexcept { return event_pool::current_device(); }
  void* stream() const noexcept { return static_cast<void*>(current_stream()); }
  bool fallback() const noexcept { return false; }
  event_token record_event(int place, void* s) noexcept { return events_.record(place, s); }
  bool event_done(event_token t) noexcept { return event_pool::done(t); }
  void release_event(event_token t) noexcept { events_.release(t); }
  bool capturing(void* s) noexcept { return event_pool::capturing(s); }
  bool current_capturing() noexcept { return event_pool::capturing(stream()); }
  void synchronize() noexcept { event_pool::synchronize_all(); }

 private:
  event_pool events_;
};
#endif

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

template <class D>
auto& allocator_for() {
  require_device_enabled<D>();
  if constexpr (std::is_same_v<typename D::allocator, host_allocator_kind>) {
    return allocator_instance<0>();
  }
#if LOCUS_HAS_CUDA
  else if constexpr (std::is_same_v<typename D::allocator, pinned_allocator_kind>) {
    return allocator_instance<1>();
  } else {
    return allocator_instance<2>();
  }
#else
  else {
    return allocator_instance<0>();  // unreachable: require_device_enabled fired
  }
#endif
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
/// may call cudaMalloc when it grows; see the file comment).
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
/// allocated, reserved, peak and limit, for logs and the doctor program.
inline std::string memory_summary() {
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
  out += line("pinned", detail::allocator_for<pinned>().stats());
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  for (int g = 0; g < n; ++g) out += line("cuda:" + std::to_string(g), detail::allocator_for<cuda>().stats(g));
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
