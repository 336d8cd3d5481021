// The raw resources under the caching allocator on a CUDA build: place_guard (the
// current GPU for a scope), event_pool (the events that say when a freed block's
// streams have passed its free), pinned_resource (cudaHostAlloc, falling back to
// pageable memory only where CUDA is unavailable) and cuda_resource (cudaMalloc).
// Empty without CUDA.
#pragma once

#include "caching_allocator.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"

namespace locus::detail {

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

}  // namespace locus::detail
#endif
