// Streams and events: move-only RAII wrappers over cudaStream_t and cudaEvent_t, and
// stream_guard, which makes a stream the current one of this host thread. Work on
// `cuda` (kernels, memsets, copies, to_async) is enqueued on the current stream
// (detail::current_stream()), the legacy default stream until a guard says otherwise.
//
//   locus::stream s;                      // throws cuda_error without a usable GPU
//   {
//     locus::stream_guard g(s);           // work on cuda now goes to s
//     auto z = locus::zeros<float, locus::cuda>({1024});
//   }                                     // the previous stream is current again
//   locus::event e;
//   e.record(s);
//   other.wait(e);                        // other runs after what s had enqueued
//   e.synchronize();                      // the host waits for it
//
// Streams are created non-blocking (cudaStreamNonBlocking): they never synchronise
// implicitly with the legacy default stream, so a copy on a side stream really
// overlaps kernels on the default stream. Order work between streams with events.
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"

#if LOCUS_HAS_CUDA

#include <utility>

#include "../backend/cuda/runtime.hpp"

namespace locus {

class event;

/// A CUDA stream (non-blocking), owned. Move-only; destroying it waits for the work
/// already enqueued on it, then releases the handle (so memory the caching allocator
/// holds for this stream is never handed to a later stream that reuses the handle
/// while kernels still use it).
class stream {
 public:
  /// Creates a stream on the current device. Throws cuda_error (the runtime's text,
  /// e.g. "no CUDA-capable device is detected") without a usable GPU.
  stream() { LOCUS_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { reset(); }

  /// Blocks the calling thread until everything enqueued on this stream is done.
  void synchronize() const { LOCUS_CUDA_CHECK(cudaStreamSynchronize(checked())); }

  /// True when everything enqueued on this stream is done (does not block).
  [[nodiscard]] bool query() const {
    const cudaError_t st = cudaStreamQuery(checked());
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error
      return false;
    }
    LOCUS_CUDA_CHECK(st);
    return true;
  }

  /// Work enqueued on this stream after this call waits until `e` has completed (the
  /// host does not block).
  inline void wait(const event& e) const;

  /// The raw handle, for interop (cuBLAS, NCCL, kernels launched by hand).
  [[nodiscard]] cudaStream_t native_handle() const noexcept { return handle_; }

 private:
  // A moved-from stream has no handle; passing nullptr on would silently mean the
  // legacy default stream.
  cudaStream_t checked() const {
    if (!handle_) throw error("locus: use of a moved-from locus::stream");
    return handle_;
  }
  void reset() noexcept {
    if (handle_) {
      // Finish the stream's work first: the cuda allocator keys cached blocks by stream
      // handle, and the runtime may hand this handle to the next stream created, which
      // must not receive a block that kernels of this one still use.
      (void)cudaStreamSynchronize(handle_);
      (void)cudaStreamDestroy(handle_);
    }
    handle_ = nullptr;
  }
  cudaStream_t handle_ = nullptr;
};

/// A CUDA event (timing disabled: the cheap kind, for ordering and completion),
/// owned. Move-only.
class event {
 public:
  /// Throws cuda_error without a usable GPU.
  event() { LOCUS_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming)); }
  event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  event& operator=(event&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  /// Captures the work enqueued on `s` so far: the event completes when it is done.
  void record(const stream& s) {
    if (!s.native_handle()) throw error("locus: event::record on a moved-from locus::stream");
    record_on(s.native_handle());
  }
  /// Captures the work enqueued so far on this thread's current stream.
  void record() { record_on(detail::current_stream()); }

  /// Blocks the calling thread until the recorded work is done (returns at once if
  /// nothing was recorded).
  void synchronize() const { LOCUS_CUDA_CHECK(cudaEventSynchronize(checked())); }

  /// True when the recorded work is done, or nothing was recorded (does not block).
  [[nodiscard]] bool query() const {
    const cudaError_t st = cudaEventQuery(checked());
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error
      return false;
    }
    LOCUS_CUDA_CHECK(st);
    return true;
  }

  [[nodiscard]] cudaEvent_t native_handle() const noexcept { return handle_; }

  /// Records on a raw stream handle (for streams locus does not own).
  void record_on(cudaStream_t s) { LOCUS_CUDA_CHECK(cudaEventRecord(checked(), s)); }

 private:
  cudaEvent_t checked() const {
    if (!handle_) throw error("locus: use of a moved-from locus::event");
    return handle_;
  }
  void reset() noexcept {
    if (handle_) (void)cudaEventDestroy(handle_);
    handle_ = nullptr;
  }
  cudaEvent_t handle_ = nullptr;
};

inline void stream::wait(const event& e) const {
  if (!e.native_handle()) throw error("locus: stream::wait on a moved-from locus::event");
  LOCUS_CUDA_CHECK(cudaStreamWaitEvent(checked(), e.native_handle(), 0));
}

namespace detail {
/// Makes a raw stream handle current for this thread for a scope (the handle is not
/// owned). stream_guard is the public face; the loader uses this one for the
/// consumer's stream, which it does not own.
class raw_stream_guard {
 public:
  explicit raw_stream_guard(cudaStream_t s) noexcept
      : previous_(std::exchange(current_stream_ref(), s)) {}
  raw_stream_guard(const raw_stream_guard&) = delete;
  raw_stream_guard& operator=(const raw_stream_guard&) = delete;
  ~raw_stream_guard() { current_stream_ref() = previous_; }

 private:
  cudaStream_t previous_;
};
}  // namespace detail

/// Makes `s` the current stream of this host thread until the guard goes out of
/// scope, then restores the previous one. Work on cuda enqueued meanwhile (kernels,
/// memsets, copies, to_async) goes to `s`, and cuda allocations are tied to `s` by
/// the caching allocator. The stream must outlive the guard. Not movable: a guard
/// belongs to one scope of one thread.
class stream_guard {
 public:
  explicit stream_guard(const stream& s) : guard_(handle_of(s)) {}
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;

 private:
  static cudaStream_t handle_of(const stream& s) {
    if (!s.native_handle()) throw error("locus: stream_guard on a moved-from locus::stream");
    return s.native_handle();
  }
  detail::raw_stream_guard guard_;
};

}  // namespace locus

#else  // !LOCUS_HAS_CUDA

#include "../core/config.hpp"

namespace locus {

// Without CUDA the names exist so that naming them is a clear error, not an unknown
// identifier.
class stream {
 public:
  template <class U = void>
  stream() {
    static_assert(detail::always_false<U>,
                  "locus: locus::stream needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; install the CUDA toolkit and configure with "
                  "-DLOCUS_ENABLE_CUDA=ON, or drop the stream (cpu work is synchronous)");
  }
};
class event {
 public:
  template <class U = void>
  event() {
    static_assert(detail::always_false<U>,
                  "locus: locus::event needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; install the CUDA toolkit and configure with "
                  "-DLOCUS_ENABLE_CUDA=ON, or drop the event (cpu work is synchronous)");
  }
};
class stream_guard {
 public:
  template <class S>
  explicit stream_guard(const S&) {
    static_assert(detail::always_false<S>,
                  "locus: locus::stream_guard needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; install the CUDA toolkit and configure with "
                  "-DLOCUS_ENABLE_CUDA=ON");
  }
};

}  // namespace locus

#endif
