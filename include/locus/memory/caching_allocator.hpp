// The caching allocator of pinned and cuda memory (detail::caching_allocator over a
// raw resource) and its graph pools. The resources it runs over (cudaHostAlloc,
// cudaMalloc, events) are memory/cuda_resources.hpp; the per-device instances
// memory/allocator.hpp.
//
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

//
// Length (over 600 lines): caching_allocator is one class whose members share the
// pool's invariants (the block lists, the pending events, the graph pools, the out-of-
// memory path); split across files, each part would be read without the invariant it keeps.
#pragma once

#include "host_allocator.hpp"

namespace locus::detail {

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

}  // namespace locus::detail
