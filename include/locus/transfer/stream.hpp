// Streams and events: move-only RAII wrappers over cudaStream_t and cudaEvent_t;
// stream_guard, which makes a stream the current one of its device for this host
// thread; and record_stream, which tells locus that a tensor is used on a stream.
// Work on `cuda` (kernels, memsets, copies, to_async) is enqueued on the current
// stream (detail::current_stream()): one per device per host thread, the legacy
// default stream (cudaStreamLegacy, stored explicitly) until a guard says otherwise.
//
//   locus::stream s;                      // on the current device; cuda_error without a GPU
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
//
// Devices. A stream belongs to the device current when it was made. A guard makes it
// the current stream *of that device* and makes that device current for its scope
// (as PyTorch's CUDAStreamGuard does); after the guard both are restored. Each device
// has its own current stream: after cudaSetDevice(1), work goes to device 1's.
//
// Using memory on more than one stream: the rule. The caching allocator ties a block
// to the stream current when it was allocated, and reuses a freed block on that
// stream at once (later work on that stream runs after the work already there). A
// tensor that work on *another* stream also reads or writes must be made known, or a
// block freed on its own stream could be handed out (and overwritten) while that other
// stream's kernels still use it:
//   - locus records for you: the sources and destinations of to_async/copy_async on
//     the stream the copy is enqueued on, and the loader's batches on the stream they
//     are handed out to (and on its side stream for the copy that fills them);
//   - you call locus::record_stream(t, s) for any other tensor that work on stream s
//     uses while t was allocated under another stream (kernels, expressions, matmul
//     under stream_guard(s) on a tensor made outside it). Once per tensor and stream
//     is enough; calling it again is harmless. At free, the allocator records an event
//     on each such stream and reuses the block only when they have completed.
//   - a stream_guard records nothing by itself: which tensors the work in its scope
//     touches cannot be known (a captured reference, a view, a raw pointer).
// Ordering the work itself (the consumer stream waits for the producer's event) stays
// yours: record_stream protects the memory, not the data. Host reads need neither:
// a blocking copy to the host waits for every locus stream of the device
// (backend/cuda/runtime.hpp).
#pragma once

#include <type_traits>
#include <utility>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../tensor/tensor.hpp"

namespace locus::detail {
// Prevents: a cpu (pageable) tensor recorded as used on a stream: nothing on a stream
// reads pageable memory asynchronously (to_async refuses it), and its allocator has
// no streams. Pinned memory is allowed: the copy engine reading it on a stream is a
// real use.
template <class X>
constexpr bool require_stream_recordable() {
  using tr = tensor_traits<std::remove_cvref_t<X>>;
  if constexpr (!tr::is_tensor && !tr::is_view) {
    static_assert(always_false<X>,
                  "locus: record_stream takes a tensor or tensor_view, but the argument is "
                  "neither (an expression has no memory yet); evaluate it first, auto v = "
                  "locus::eval(e), and record v");
    return false;
  } else if constexpr (std::is_same_v<typename tr::device, cpu>) {
    static_assert(always_false<X>,
                  "locus: record_stream marks cuda or pinned memory as used on a stream, but "
                  "this tensor is cpu (pageable) memory, which no stream uses asynchronously; "
                  "drop the call, or move the data to a stream-visible device first: "
                  "auto p = locus::to<locus::pinned>(t)");
    return false;
  } else {
    return true;
  }
}
}  // namespace locus::detail

#if LOCUS_HAS_CUDA

#include "../backend/cuda/runtime.hpp"
#include "../memory/allocator.hpp"

namespace locus {

class event;

namespace detail {
/// Builds a stream that host reads do not wait for (the loader's side stream, whose
/// writes reach the consumer only through an event it waits on).
struct unlisted_stream_key {
  explicit unlisted_stream_key() = default;
};
}  // namespace detail

/// A CUDA stream (non-blocking) of the device current when it was made, owned.
/// Move-only. Destroying it waits for the work already enqueued on it, hands its
/// cached blocks back to the allocator (nothing is stranded until empty_cache), then
/// releases the handle.
class stream {
 public:
  /// Creates a stream on the current device. Throws cuda_error (the runtime's text,
  /// e.g. "no CUDA-capable device is detected") without a usable GPU.
  stream() : stream(true) {}
  explicit stream(detail::unlisted_stream_key) : stream(false) {}
  stream(stream&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)),
        marker_(std::exchange(other.marker_, nullptr)),
        device_(other.device_),
        listed_(other.listed_) {}
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
      marker_ = std::exchange(other.marker_, nullptr);
      device_ = other.device_;
      listed_ = other.listed_;
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

  /// The device this stream belongs to.
  [[nodiscard]] int device() const noexcept { return device_; }

  /// The raw handle, for interop (cuBLAS, NCCL, kernels launched by hand).
  [[nodiscard]] cudaStream_t native_handle() const noexcept { return handle_; }

 private:
  explicit stream(bool listed) : device_(detail::current_device()), listed_(listed) {
    LOCUS_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking));
    if (!listed_) return;
    try {
      LOCUS_CUDA_CHECK(cudaEventCreateWithFlags(&marker_, cudaEventDisableTiming));
      detail::streams_of_locus().add(handle_, device_, marker_);
    } catch (...) {
      if (marker_) (void)cudaEventDestroy(marker_);
      (void)cudaStreamDestroy(handle_);
      throw;
    }
  }
  // A moved-from stream has no handle; passing nullptr on would silently mean the
  // default stream.
  cudaStream_t checked() const {
    if (!handle_) throw error("locus: use of a moved-from locus::stream");
    return handle_;
  }
  void reset() noexcept {
    if (handle_) {
      // Out of the registry first (no host read records on it any more), then finish
      // its work, then hand its cached blocks back: the runtime may give this handle
      // to the next stream created, which must not receive a block that kernels of
      // this one still use.
      if (listed_) detail::streams_of_locus().remove(handle_);
      (void)cudaStreamSynchronize(handle_);
      try {
        detail::release_stream_blocks(handle_);
      } catch (...) {  // a destructor cannot throw; the blocks stay cached (empty_cache frees them)
      }
      if (marker_) (void)cudaEventDestroy(marker_);
      (void)cudaStreamDestroy(handle_);
    }
    handle_ = nullptr;
    marker_ = nullptr;
  }
  cudaStream_t handle_ = nullptr;
  cudaEvent_t marker_ = nullptr;  // recorded by host reads (registered streams only)
  int device_ = 0;
  bool listed_ = true;
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
/// Makes a raw stream handle of `device` the current stream of that device for this
/// thread, and that device current, for a scope (the handle is not owned).
/// stream_guard is the public face; the loader uses this one for the consumer's
/// stream, which it does not own.
class raw_stream_guard {
 public:
  raw_stream_guard(cudaStream_t s, int device) : device_(device), on_device_(device) {
    previous_ = current_streams().exchange(device_, s);
  }
  raw_stream_guard(const raw_stream_guard&) = delete;
  raw_stream_guard& operator=(const raw_stream_guard&) = delete;
  ~raw_stream_guard() { (void)current_streams().exchange(device_, previous_); }  // the slot exists

 private:
  int device_;
  device_scope on_device_;  // restored after the stream (members are destroyed in reverse)
  cudaStream_t previous_ = default_stream();
};
}  // namespace detail

/// Makes `s` the current stream of its device for this host thread, and its device
/// the current one, until the guard goes out of scope; then restores both. Work on
/// cuda enqueued meanwhile (kernels, memsets, copies, to_async) goes to `s`, and cuda
/// allocations are tied to `s` by the caching allocator. The stream must outlive the
/// guard (a temporary stream is a compile error). Not movable: a guard belongs to one
/// scope of one thread. It records no tensor as used on `s` (see the header: record_stream).
class stream_guard {
 public:
  // A guard that is itself a temporary (locus::stream_guard{s};) ends at the ';' and
  // makes nothing current for the lines after it: a warning (an error under -Werror).
  [[nodiscard("locus: a stream_guard acts for its scope; name it: locus::stream_guard g(s);")]]
  explicit stream_guard(const stream& s) : guard_(handle_of(s), s.device()) {}
  // Prevents: stream_guard g(locus::stream{}); (PyTorch's `with
  // torch.cuda.stream(torch.cuda.Stream()):`): the stream is destroyed at the end of the
  // statement and the guard would keep its dead handle current, so the next kernel would
  // go to a freed (or reused) stream. Any rvalue stream, const or not, lands here.
  template <class S>
    requires(std::is_same_v<std::remove_cvref_t<S>, stream> && !std::is_lvalue_reference_v<S>)
  explicit stream_guard(S&&) : guard_(refuse_temporary<S>(), 0) {}
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;

 private:
  template <class S>
  static cudaStream_t refuse_temporary() {
    static_assert(detail::always_false<S>,
                  "locus: stream_guard got a temporary stream (or std::move of one), destroyed at the end of this statement "
                  "while the guard would keep it current; name the stream so that it outlives the guard: "
                  "locus::stream s; locus::stream_guard g(s);");
    return nullptr;
  }
  static cudaStream_t handle_of(const stream& s) {
    if (!s.native_handle()) throw error("locus: stream_guard on a moved-from locus::stream");
    return s.native_handle();
  }
  detail::raw_stream_guard guard_;
};

namespace detail {
/// Marks the memory of t as used on raw stream s (cuda or pinned; empty: nothing).
template <class X>
void record_on_stream(const X& t, cudaStream_t s) {
  const void* p = static_cast<const void*>(as_view(t).data_handle());
  if (p) record_block_use(p, s);
}
/// The same for a stream of `device` (the stream's own device, which need not be the
/// current one: the allocator files the use under that device's blocks).
template <class X>
void record_on_stream(const X& t, cudaStream_t s, int device) {
  const void* p = static_cast<const void*>(as_view(t).data_handle());
  if (p) record_block_use(p, s, device);
}
}  // namespace detail

/// Tells locus that work on stream `s` uses t's memory (a cuda or pinned tensor or
/// view; a view marks the block it lies in): when t's block is freed, it is reused
/// only after the work enqueued on `s` until then has completed. Call it for a tensor
/// allocated under one stream and used by work on another (the header's rule). A cpu
/// tensor is a compile error. Throws locus::error for a moved-from stream.
template <class X>
void record_stream(const X& t, const stream& s) {
  if constexpr (detail::require_stream_recordable<X>()) {
    if (!s.native_handle()) throw error("locus: record_stream on a moved-from locus::stream");
    detail::record_on_stream(t, s.native_handle(), s.device());
  }
}
// Prevents: record_stream(t, locus::stream{}): the allocator would keep the handle of a
// stream destroyed at the end of the statement, and at t's free record an event on it
// (or on whichever stream the runtime hands that handle to next).
template <class X, class S>
  requires(std::is_same_v<std::remove_cvref_t<S>, stream> && !std::is_lvalue_reference_v<S>)
void record_stream(const X&, S&&) {
  static_assert(detail::always_false<S>,
                "locus: record_stream got a temporary stream, destroyed at the end of this statement, so the use "
                "it records would name a dead stream; record on the named stream the work runs on: "
                "locus::stream s; locus::record_stream(t, s);");
}

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

template <class X, class S>
void record_stream(const X&, const S&) {
  if constexpr (detail::require_stream_recordable<X>())
    static_assert(detail::always_false<X>,
                  "locus: record_stream needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; drop the call (cpu work is synchronous)");
}

}  // namespace locus

#endif
