// Asynchronous copies whose result cannot be read early.
//
//   auto p = locus::to_async<locus::cuda>(std::move(host_batch));  // pinned -> cuda
//   ...                                                            // overlap work here
//   locus::tensor<float, locus::cuda, 2> x = std::move(p).get();   // waits, then hands it over
//
// to_async<D>(src) copies into a new tensor on D; copy_async(src, dst) copies into an
// existing tensor or view. Both enqueue cudaMemcpyAsync on this thread's current
// stream (see stream.hpp), record an event after it, and return a locus::pending whose
// value (the new tensor, or a view of dst) is reachable only through get(), which
// waits on that event. ready() polls. There is no operator*, ->, call, value() or
// conversion that would read the destination before the copy is done: each is a
// compile error that says to write get().
//
// Endpoints: pinned -> cuda, cuda -> pinned and cuda -> cuda. Pageable `cpu` memory on
// either side is a compile error (the CUDA runtime would silently make the copy
// synchronous); pinned -> pinned is a compile error too (it is a host memcpy: use
// copy() or to<pinned>()). Both sides must be contiguous (shape_error otherwise).
//
// Lifetimes, which the copy relies on until it completes:
//   - the destination: to_async's pending owns it; a pending destroyed (or assigned
//     over) without get() waits for its copy first, so memory is never freed under an
//     in-flight copy. For copy_async, dst must outlive the pending (declare the
//     pending after dst, as usual); a temporary tensor as dst is a compile error.
//   - the source: when given an rvalue tensor (std::move(t)), to_async and copy_async
//     take ownership and free it only once the copy is done. A source passed as an
//     lvalue or as a view is NOT owned: it must stay alive and unmodified until get()
//     (or ready() answered true, or the pending was destroyed). This matters most
//     for pinned sources, whose freed blocks the host may reuse at once.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../core/shape.hpp"
#include "../tensor/tensor.hpp"
#include "copy.hpp"

#if LOCUS_HAS_CUDA
#include "../backend/cuda/runtime.hpp"
#include "stream.hpp"
#endif

namespace locus {

namespace detail {

// Prevents: `non_blocking=True` from pageable memory silently becoming a synchronous
// copy (PyTorch), and an "async" host-to-host copy that overlaps nothing.
template <class S, class D>
constexpr bool require_async_endpoints() {
  if constexpr (std::is_same_v<S, cpu>) {
    static_assert(always_false<S>,
                  "locus: to_async and copy_async need page-locked host memory, but the source "
                  "is cpu (pageable), from which the CUDA runtime silently makes the copy "
                  "synchronous; allocate it as locus::pinned (locus::empty<T, locus::pinned>(shape)) "
                  "or move it there once with locus::to<locus::pinned>(t)");
    return false;
  } else if constexpr (std::is_same_v<D, cpu>) {
    static_assert(always_false<S>,
                  "locus: to_async and copy_async need page-locked host memory, but the "
                  "destination is cpu (pageable), to which the CUDA runtime silently makes the "
                  "copy synchronous; copy into locus::pinned memory instead "
                  "(locus::to_async<locus::pinned>(t), or a destination from "
                  "locus::empty<T, locus::pinned>(shape))");
    return false;
  } else if constexpr (std::is_same_v<S, pinned> && std::is_same_v<D, pinned>) {
    static_assert(always_false<S>,
                  "locus: to_async and copy_async copy between pinned and cuda, or cuda and "
                  "cuda, but both sides are pinned host memory; a host-to-host copy is a "
                  "memcpy: write locus::copy(src, dst) or locus::to<locus::pinned>(t)");
    return false;
  } else {
    return true;
  }
}

template <class V>
void require_contiguous_async(const V& v, const char* side) {
  if (!v.is_contiguous())
    throw shape_error(std::string("locus: to_async and copy_async need contiguous memory, but the ") +
                      side + " is a strided view of shape " + shape_string(v.shape()) +
                      "; clone() it into a contiguous tensor first (a strided cuda view: evaluate it "
                      "in a .cu file, locus::eval(v)), or copy whole rows");
}

}  // namespace detail

#if LOCUS_HAS_CUDA

namespace detail {

/// Something a pending copy keeps alive until it completes (an owned source, the
/// loader's staging buffers), type-erased so pending's type names only its value.
struct keep_alive_base {
  virtual ~keep_alive_base() = default;
};
template <class X>
struct keep_alive final : keep_alive_base {
  explicit keep_alive(X&& v) : held(std::move(v)) {}
  X held;
};
template <class X>
std::unique_ptr<keep_alive_base> make_keep_alive(X&& x) {
  return std::make_unique<keep_alive<std::remove_cvref_t<X>>>(std::forward<X>(x));
}

/// Only locus's own code builds pendings (a passkey: the constructor is public for
/// it, unusable without one).
struct pending_key {
  explicit pending_key() = default;
};

/// Ownership of a source given as a non-const rvalue tensor (moved here before the
/// copy is enqueued, so no failure after that point can free it under the copy);
/// nothing for lvalues and views.
template <class Src, class X>
std::unique_ptr<keep_alive_base> keep_if_rvalue(X& src) {
  using S = std::remove_reference_t<Src>;
  if constexpr (tensor_traits<std::remove_cv_t<S>>::is_tensor && !std::is_lvalue_reference_v<Src> &&
                !std::is_const_v<S>)
    return make_keep_alive(std::move(src));
  else
    return nullptr;
}

/// cudaMemcpyAsync on the current stream, then `done` recorded after it. If the
/// record fails, waits for the stream before throwing, so that the caller may free
/// both sides.
template <class SD, class DD>
void enqueue_and_record(void* dst, const void* src, std::size_t bytes, event& done) {
  const cudaStream_t s = current_stream();
  if (bytes != 0) LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, memcpy_kind<SD, DD>(), s));
  try {
    done.record_on(s);
  } catch (...) {
    (void)cudaStreamSynchronize(s);
    throw;
  }
}

}  // namespace detail

/// The result of an asynchronous copy: a tensor (to_async) or a view of the
/// destination (copy_async) that becomes reachable when the copy is done. Move-only.
/// Like a std::future, one thread uses a pending at a time: ready() and get() note
/// the completion (and release the source they kept alive), so calling them from two
/// threads at once is a data race; hand a pending over (move it) instead of sharing it.
template <class V>
class pending {
  static_assert(detail::tensor_traits<V>::is_tensor || detail::tensor_traits<V>::is_view,
                "locus: pending<V> holds a tensor or a tensor_view, but V is another type; it is what "
                "to_async (pending<tensor<T, D, R>>) and copy_async (pending<tensor_view<T, D, R>>) "
                "return: write auto p = locus::to_async<locus::cuda>(t)");

 public:
  using value_type = V;

  pending(detail::pending_key, V value, event done,
          std::unique_ptr<detail::keep_alive_base> keep = nullptr)
      : value_(std::move(value)), done_(std::move(done)), keep_(std::move(keep)),
        state_(state::in_flight) {}

  pending(pending&& other) noexcept
      : value_(std::move(other.value_)),
        done_(std::move(other.done_)),
        keep_(std::move(other.keep_)),
        state_(std::exchange(other.state_, state::empty)) {}

  /// Waits for this pending's own copy before taking over the other one.
  pending& operator=(pending&& other) noexcept {
    if (this != &other) {
      finish();
      value_ = std::move(other.value_);
      done_ = std::move(other.done_);
      keep_ = std::move(other.keep_);
      state_ = std::exchange(other.state_, state::empty);
    }
    return *this;
  }

  /// Waits for the copy when get() was never called: the destination is never freed,
  /// and the owned source never released, under an in-flight copy.
  ~pending() { finish(); }

  // Prevents: two owners of one destination, one of which frees it mid-copy.
  pending(const pending&) {
    static_assert(detail::always_false<V>,
                  "locus: pending is move-only (it owns an in-flight copy); write std::move(p)");
  }
  pending& operator=(const pending&) {
    static_assert(detail::always_false<V>,
                  "locus: pending is move-only (it owns an in-flight copy); write std::move(p)");
    return *this;
  }

  /// True when the copy is done (does not block). After true, get() returns at once.
  [[nodiscard]] bool ready() const {
    check_has_value("ready()");
    if (state_ == state::done) return true;
    if (!done_.query()) return false;
    state_ = state::done;
    return true;
  }

  /// Waits for the copy, then gives the destination: a reference on an lvalue
  /// pending, the value itself (moved out) on an rvalue: std::move(p).get().
  /// Throws cuda_error if the copy failed.
  [[nodiscard]] V& get() & {
    wait();
    return value_;
  }
  [[nodiscard]] const V& get() const& {
    wait();
    return value_;
  }
  [[nodiscard]] V get() && {
    wait();
    state_ = state::empty;  // the value leaves: a second get() is an error
    return std::move(value_);
  }

  // ---- every way of reaching the value except get() is a compile error ------------
  // Prevents: reading (or freeing) the destination of a copy that is still running.
  template <class U = V>
  U& value() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the value itself: a tensor, or for copy_async a view)");
    return const_cast<U&>(value_);
  }
  template <class U = V>
  U& operator*() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the value itself: a tensor, or for copy_async a view)");
    return const_cast<U&>(value_);
  }
  template <class U = V>
  U* operator->() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the value itself: a tensor, or for copy_async a view)");
    return nullptr;
  }
  template <class... I>
  void operator()(I...) const {
    static_assert(detail::always_false<I...>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get()(i, ...) after the "
                  "copy, on a host-accessible destination");
  }
  template <class T2, class D2, std::size_t R2>
  operator tensor<T2, D2, R2>() const {
    static_assert(detail::always_false<T2>,
                  "locus: a pending copy does not convert to a tensor: the copy may still be "
                  "running; write std::move(p).get() (waits, then gives the tensor) or p.get()");
    return {};
  }
  template <class T2, class D2, std::size_t R2>
  operator tensor_view<T2, D2, R2>() const {
    static_assert(detail::always_false<T2>,
                  "locus: a pending copy does not convert to a tensor_view: the copy may still "
                  "be running; write p.get().view() (waits first)");
    return {};
  }

 private:
  enum class state : unsigned char { empty, in_flight, done };

  void check_has_value(const char* what) const {
    if (state_ == state::empty)
      throw error(std::string("locus: ") + what +
                  " on a pending whose value was already taken (std::move(p).get()) or that "
                  "was moved from");
  }
  void wait() const {
    check_has_value("get()");
    if (state_ == state::in_flight) {
      done_.synchronize();
      state_ = state::done;
    }
    keep_.reset();  // the copy is done: an owned source may go
  }
  void finish() noexcept {
    if (state_ == state::in_flight && done_.native_handle())
      (void)cudaEventSynchronize(done_.native_handle());  // a destructor cannot throw
    if (state_ != state::empty) state_ = state::done;
    keep_.reset();
  }

  V value_;
  event done_;
  mutable std::unique_ptr<detail::keep_alive_base> keep_;
  mutable state state_;
};

/// Copies src into a new tensor on D2, asynchronously on the current stream.
/// Endpoints: pinned -> cuda, cuda -> pinned, cuda -> cuda (a cpu side is a compile
/// error). An rvalue tensor source is owned by the returned pending until the copy
/// is done; an lvalue or view source must outlive the copy and stay unmodified.
template <Device D2, TensorLike Src>
[[nodiscard]] auto to_async(Src&& src) {
  using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
  using SD = typename st::device;
  using T = typename st::value_type;
  if constexpr (detail::require_async_endpoints<SD, D2>()) {
    const auto s = detail::as_view(src);  // moving src below keeps its memory in place
    detail::require_contiguous_async(s, "source");
    event done;  // first: without a GPU, fail before allocating anything
    auto keep = detail::keep_if_rvalue<Src>(src);
    tensor<T, D2, st::rank> out(s.shape());
    detail::enqueue_and_record<SD, D2>(out.data_handle(), s.data_handle(), s.size_bytes(), done);
    return pending<tensor<T, D2, st::rank>>(detail::pending_key{}, std::move(out),
                                            std::move(done), std::move(keep));
  }
}

/// Copies src into dst (an existing tensor or view), asynchronously on the current
/// stream. Same endpoints as to_async; dtype and rank must match (compile time),
/// shapes must match (shape_error, nothing enqueued). The pending's value is a view
/// of dst. dst must outlive the pending; an rvalue tensor source is owned until done.
template <TensorLike Src, TensorLike Dst>
[[nodiscard]] auto copy_async(Src&& src, Dst&& dst) {
  using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
  using dt = detail::tensor_traits<std::remove_cvref_t<Dst>>;
  static_assert(!(dt::is_tensor && !std::is_lvalue_reference_v<Dst>),
                "locus: copy_async into a temporary tensor would free it while the copy writes "
                "to it; pass a tensor that outlives the copy, or write locus::to_async<D>(src), "
                "whose pending owns its destination");
  constexpr bool writable = !std::is_const_v<typename dt::element_type> &&
                            !(dt::is_tensor && std::is_const_v<std::remove_reference_t<Dst>>);
  static_assert(writable, "locus: copy_async destination is const; pass a mutable tensor or tensor_view");
  using SD = typename st::device;
  using DD = typename dt::device;
  using T = typename dt::value_type;
  if constexpr (writable && detail::require_async_endpoints<SD, DD>() &&
                detail::require_same_copy_dtype<typename st::value_type, T>() &&
                detail::require_same_copy_rank<st::rank, dt::rank>()) {
    const auto s = detail::as_view(src);
    tensor_view<T, DD, dt::rank> d = detail::as_view(dst);
    if (s.shape() != d.shape())
      throw shape_error("locus: copy_async from shape " + detail::shape_string(s.shape()) +
                        " to shape " + detail::shape_string(d.shape()) +
                        "; shapes must be equal (nothing was copied)");
    detail::require_contiguous_async(s, "source");
    detail::require_contiguous_async(d, "destination");
    event done;
    auto keep = detail::keep_if_rvalue<Src>(src);
    detail::enqueue_and_record<SD, DD>(d.data_handle(), s.data_handle(), s.size_bytes(), done);
    return pending<tensor_view<T, DD, dt::rank>>(detail::pending_key{}, d, std::move(done),
                                                 std::move(keep));
  }
}

#else  // !LOCUS_HAS_CUDA

template <Device D2, TensorLike Src>
void to_async(Src&&) {
  using SD = typename detail::tensor_traits<std::remove_cvref_t<Src>>::device;
  if constexpr (detail::require_async_endpoints<SD, D2>())
    static_assert(detail::always_false<Src>,
                  "locus: to_async needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; use locus::to<D>(t)");
}
template <TensorLike Src, TensorLike Dst>
void copy_async(Src&&, Dst&&) {
  using SD = typename detail::tensor_traits<std::remove_cvref_t<Src>>::device;
  using DD = typename detail::tensor_traits<std::remove_cvref_t<Dst>>::device;
  if constexpr (detail::require_async_endpoints<SD, DD>())
    static_assert(detail::always_false<Src>,
                  "locus: copy_async needs a build with CUDA, but this one has "
                  "LOCUS_ENABLE_CUDA=0; use locus::copy(src, dst)");
}

#endif

}  // namespace locus
