// The CUDA runtime, seen through locus: the checked-call macro, the current stream
// (one per device, per host thread), the registry of locus's streams that host reads
// wait for, and helpers that turn runtime error codes into locus exceptions.
// Host compilers may include this file (these are plain runtime API calls); it is
// only included when CUDA is compiled in.
//
// The default stream is always stored explicitly as cudaStreamLegacy, never as
// nullptr (0): in a translation unit built with `nvcc --default-stream per-thread`
// (CUDA_API_PER_THREAD_DEFAULT_STREAM), 0 means the *calling thread's* default
// stream, so a 0 captured on one thread and used on another (the loader's producer
// thread) would name a different stream. cudaStreamLegacy names the same stream from
// every thread in both build modes, so locus works in both (and the legacy stream
// still synchronises with the per-thread default streams of blocking code around it).
//
// Host reads. locus's streams are non-blocking (they never synchronise implicitly
// with the legacy stream), so "synchronise the current stream" is not enough for a
// blocking copy between host and cuda: the data may have been written under another
// stream_guard. locus therefore keeps a registry of the streams it created (per
// device), and a blocking host <-> cuda copy (to<cpu>, copy() with a host side,
// everything built on copy_bytes) first makes the copying stream wait, with events,
// for the work already enqueued on every registered stream of the device that owns
// the cuda memory and on the legacy stream. The chosen rule and why:
//   - a last-writer event per allocation would need every kernel launch, memset, cuBLASLt
//     call and CUB call to record an event on each output: one cudaEventRecord per
//     launch on the hot path and bookkeeping in every backend, for a host read that is
//     rare (a loss report, a checkpoint);
//   - "the streams recorded for the block" misses the case the issue names: a kernel
//     under stream_guard(side) that writes a tensor allocated on the main stream records
//     nothing (nothing tells locus which tensors a kernel writes);
//   - cudaDeviceSynchronize is correct but waits for every stream of the device,
//     including streams of other libraries (NCCL, a data pipeline) that have nothing to
//     do with the tensor.
// Waiting for every locus stream of the device is correct for any writer under any
// locus stream (whatever thread enqueued it), costs one event record and one
// stream-wait per live stream (a handful) per host read, and never blocks on work
// locus did not order. Not covered: work on streams locus did not create (a raw
// cudaStream_t of another library); order it before the read with an event.
#pragma once

#include "../../core/config.hpp"

#if !LOCUS_HAS_CUDA
#error "locus: backend/cuda/runtime.hpp needs a build with CUDA (LOCUS_ENABLE_CUDA=1)"
#endif

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "../../core/error.hpp"

/// Checks a CUDA runtime call; throws locus::cuda_error with the call, file, line
/// and the runtime's text.
#define LOCUS_CUDA_CHECK(call)                                                          \
  do {                                                                                \
    const cudaError_t locus_cuda_check_status_ = (call);                              \
    if (locus_cuda_check_status_ != cudaSuccess) {                                    \
      (void)cudaGetLastError();                                                       \
      throw ::locus::cuda_error(#call, __FILE__, __LINE__,                            \
                                static_cast<int>(locus_cuda_check_status_),           \
                                cudaGetErrorString(locus_cuda_check_status_));        \
    }                                                                                 \
  } while (false)

namespace locus::detail {

/// The handle locus stores for "the default stream": explicit in both build modes
/// (see the header comment), never nullptr.
inline cudaStream_t default_stream() noexcept { return cudaStreamLegacy; }

/// One value per device index, with a fallback for devices never set: the current
/// stream of each device on one host thread. A plain class so that the host suite
/// can drive it with made-up handles and device numbers (no GPU needed).
template <class Handle>
class per_device_slots {
 public:
  /// Device numbers at or above this are refused (a corrupt index, not a GPU).
  static constexpr int max_devices = 1024;

  explicit per_device_slots(Handle fallback) noexcept : fallback_(fallback) {}

  /// The value of `device`, or the fallback when it was never set (or device < 0).
  [[nodiscard]] Handle get(int device) const noexcept {
    if (device < 0 || static_cast<std::size_t>(device) >= slots_.size()) return fallback_;
    return slots_[static_cast<std::size_t>(device)];
  }
  /// Sets the value of `device` and returns the previous one. Throws value_error for
  /// a device outside [0, max_devices).
  Handle exchange(int device, Handle h) {
    if (device < 0 || device >= max_devices)
      throw_value_error("locus: device index %d is outside [0, %d)", device, max_devices);
    if (static_cast<std::size_t>(device) >= slots_.size())
      slots_.resize(static_cast<std::size_t>(device) + 1, fallback_);
    Handle previous = slots_[static_cast<std::size_t>(device)];
    slots_[static_cast<std::size_t>(device)] = h;
    return previous;
  }
  [[nodiscard]] Handle fallback() const noexcept { return fallback_; }

 private:
  std::vector<Handle> slots_;
  Handle fallback_;
};

/// This thread's current stream of every device.
inline per_device_slots<cudaStream_t>& current_streams() noexcept {
  thread_local per_device_slots<cudaStream_t> slots(default_stream());
  return slots;
}

/// The calling thread's current device; 0 when the runtime cannot say (no driver:
/// every later call reports that error itself).
inline int current_device_or_zero() noexcept {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return d;
}

inline int current_device() {
  int d = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

/// The stream new work on `cuda` goes to: the current stream of the calling thread's
/// current device (cudaSetDevice(1) switches to device 1's stream). The legacy default
/// stream until a stream_guard says otherwise.
inline cudaStream_t current_stream_for(int device) noexcept { return current_streams().get(device); }
inline cudaStream_t current_stream() noexcept { return current_stream_for(current_device_or_zero()); }

/// Makes `device` current for a scope when it is not already (and restores the
/// previous one); does nothing when it already is.
class device_scope {
 public:
  explicit device_scope(int device) : previous_(current_device()) {
    if (device != previous_) {
      LOCUS_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_;
  bool switched_ = false;
};

// ---- the registry of locus's streams ----------------------------------------------------

/// A stream locus created, with the event host reads record on it.
struct registered_stream {
  cudaStream_t handle;
  int device;
  cudaEvent_t marker;
};

/// Which registered streams a host read from `device`, copying on `reader`, must wait
/// for: every stream of that device except the reader itself (its own order already
/// holds) and except the streams `capturing(handle)` says are capturing a CUDA graph.
/// A capturing stream executes nothing new: what is enqueued on it during the capture
/// becomes a graph that runs only when launched, so no host read can need it yet.
/// Recording a marker on it would instead join the read into the capture (another
/// thread's to<cpu> while the trainer captures its step) and invalidate the capture.
/// Not waited for either: work enqueued on that stream before its capture began (in
/// locus, only the trainer's copy of the batch into its own static buffers, which no
/// one else reads); a host read of memory such a stream writes is the caller's race.
/// The pure part of order_after_all, for the host suite.
template <class Capturing>
std::vector<std::size_t> streams_to_wait_for(const std::vector<registered_stream>& all, cudaStream_t reader,
                                             int device, Capturing&& capturing) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i].device == device && all[i].handle != reader && !capturing(all[i].handle)) out.push_back(i);
  return out;
}
inline std::vector<std::size_t> streams_to_wait_for(const std::vector<registered_stream>& all,
                                                    cudaStream_t reader, int device) {
  return streams_to_wait_for(all, reader, device, [](cudaStream_t) { return false; });
}

/// Whether s is capturing a CUDA graph (cudaStreamIsCapturing says so, active or
/// invalidated); a stream the runtime cannot query counts as not capturing (the
/// marker's record then reports the runtime's error).
inline bool stream_is_capturing(cudaStream_t s) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

class stream_registry {
 public:
  void add(cudaStream_t s, int device, cudaEvent_t marker) {
    std::lock_guard lock(mutex_);
    streams_.push_back({s, device, marker});
  }
  /// Removes s (before it is destroyed); returns false when it was not registered.
  bool remove(cudaStream_t s) noexcept {
    std::lock_guard lock(mutex_);
    for (auto& e : streams_) {
      if (e.handle == s) {
        e = streams_.back();
        streams_.pop_back();
        return true;
      }
    }
    return false;
  }
  [[nodiscard]] std::size_t count(int device) {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& e : streams_) n += e.device == device ? 1 : 0;
    return n;
  }

  /// Makes `reader` (a stream of the current device, `device`) wait for the work
  /// enqueued so far on every registered stream of that device that is not capturing a
  /// graph (see streams_to_wait_for) and on the legacy stream. The host does not block
  /// here.
  void order_after_all(cudaStream_t reader, int device) {
    std::lock_guard lock(mutex_);
    for (std::size_t i : streams_to_wait_for(streams_, reader, device, stream_is_capturing)) {
      LOCUS_CUDA_CHECK(cudaEventRecord(streams_[i].marker, streams_[i].handle));
      LOCUS_CUDA_CHECK(cudaStreamWaitEvent(reader, streams_[i].marker, 0));
    }
    if (reader != default_stream()) {
      if (static_cast<std::size_t>(device) >= legacy_markers_.size())
        legacy_markers_.resize(static_cast<std::size_t>(device) + 1, nullptr);
      cudaEvent_t& m = legacy_markers_[static_cast<std::size_t>(device)];
      if (!m) LOCUS_CUDA_CHECK(cudaEventCreateWithFlags(&m, cudaEventDisableTiming));
      LOCUS_CUDA_CHECK(cudaEventRecord(m, default_stream()));
      LOCUS_CUDA_CHECK(cudaStreamWaitEvent(reader, m, 0));
    }
  }

 private:
  std::mutex mutex_;
  std::vector<registered_stream> streams_;
  std::vector<cudaEvent_t> legacy_markers_;  // per device, created on first use, kept
};

/// One per process, never destroyed (streams with static storage may outlive any
/// destruction order we could pick).
inline stream_registry& streams_of_locus() {
  static auto* r = new stream_registry();
  return *r;
}

/// The device that owns the memory at p (cuda memory); the current device when the
/// runtime does not know p.
inline int device_of(const void* p) {
  cudaPointerAttributes a{};
  if (p && cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice)
    return a.device;
  (void)cudaGetLastError();
  return current_device();
}

/// The scope of one blocking copy between host memory and the cuda memory at
/// `device_memory`: the memory's device is current, and stream() (that device's
/// current stream on this thread) has been ordered after every locus stream of the
/// device (see the header comment). Enqueue the copy on stream(), then synchronise it.
class host_transfer_scope {
 public:
  explicit host_transfer_scope(const void* device_memory)
      : device_(device_of(device_memory)), on_device_(device_), stream_(current_stream_for(device_)) {
    streams_of_locus().order_after_all(stream_, device_);
  }
  host_transfer_scope(const host_transfer_scope&) = delete;
  host_transfer_scope& operator=(const host_transfer_scope&) = delete;
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  int device_;
  device_scope on_device_;
  cudaStream_t stream_;
};

}  // namespace locus::detail
