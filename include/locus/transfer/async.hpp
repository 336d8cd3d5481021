// Asynchronous copies whose result is reachable only through get().
//
//   auto p = locus::to_async<locus::cuda>(std::move(host_batch));  // pinned -> cuda
//   ...                                                            // overlap work here
//   locus::tensor<float, locus::cuda, 2> x = std::move(p).get();   // waits, then hands it over
//
//   d = std::move(locus::copy_async(src, std::move(d))).get();     // reuse a buffer
//   auto [x2, h] = std::move(locus::to_async<locus::cuda>(std::move(h0))).get_with_source();
//
// to_async<D>(src) copies into a new tensor on D; copy_async(src, std::move(dst))
// copies into an existing tensor, which it takes over. Both enqueue cudaMemcpyAsync
// on this thread's current stream (see stream.hpp), record an event after it, and
// return a locus::pending that owns the destination tensor until get() waits on that
// event and hands it back. ready() polls. There is no operator*, ->, call, value() or
// conversion that would read the destination before the copy is done: each is a
// compile error that says to write get().
//
// Endpoints: pinned -> cuda, cuda -> pinned and cuda -> cuda. Pageable `cpu` memory on
// either side is a compile error (the CUDA runtime would silently make the copy
// synchronous); pinned -> pinned is a compile error too (it is a host memcpy: use
// copy() or to<pinned>()). Both sides must be contiguous (shape_error otherwise).
//
// Ownership, which the copy relies on until it completes:
//   - the destination is owned by the pending, always: to_async allocates it,
//     copy_async takes it by rvalue (std::move(dst)). An lvalue destination, a const
//     one and any tensor_view (which owns nothing, and could be a view of a temporary)
//     are compile errors. std::move(p).get() gives the tensor back.
//   - a pinned (host) source is owned too: the host could free or rewrite it while the
//     copy engine reads it, so a pinned lvalue tensor or pinned view is a compile
//     error; move it in (std::move(h)) and take it back after the copy with
//     std::move(p).get_with_source(), which returns {value, source}.
//   - a cuda source may be an lvalue or a view: it is stream-ordered. Later kernels or
//     copies on the same stream run after the copy, and both cuda sides are recorded
//     as used on the copy's stream (record_stream, transfer/stream.hpp): a source
//     allocated under another stream and freed there is not reused until the copy is
//     done. Writing the source from another stream before the copy is done is not
//     ordered by this API (order the streams with an event).
//     A cuda rvalue tensor is owned like a pinned one (get_with_source gives it back).
//   The pending holds its source until the value leaves (std::move(p).get() or
//   get_with_source()) or the pending is destroyed. A pending destroyed (or assigned
//   over) without get() waits for its copy first, so memory is never freed under an
//   in-flight copy.
//   On an exception (shape_error, cuda_error) nothing was moved: dst and src are still
//   the caller's, unchanged.
//
// Not checked: a view taken before the tensor was moved in still points at the same
// memory (as any view of a moved-from tensor does): reading or writing through it
// before get() races with the copy.
//
// Overlap (cuda -> cuda): a source that is the destination's own memory with the same
// layout copies nothing; any other overlap goes through a temporary on the stream.
#pragma once

#include <cstddef>
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

/// A source the pending takes over: a non-const rvalue tensor.
template <class Src>
inline constexpr bool async_owns_source_v =
    tensor_traits<std::remove_cvref_t<Src>>::is_tensor && !std::is_lvalue_reference_v<Src> &&
    !std::is_const_v<std::remove_reference_t<Src>>;

/// The pending's source type: the tensor it owns, or void.
template <class Src>
using async_source_t = std::conditional_t<async_owns_source_v<Src>, std::remove_cvref_t<Src>, void>;

// Prevents: the host freeing, reusing or rewriting page-locked memory while the copy
// engine still reads it (nothing orders host code after a DMA read but the event).
template <class Src>
constexpr bool require_async_source() {
  using tr = tensor_traits<std::remove_cvref_t<Src>>;
  if constexpr (!std::is_same_v<typename tr::device, pinned> || async_owns_source_v<Src>) {
    return true;
  } else if constexpr (tr::is_view) {
    static_assert(always_false<Src>,
                  "locus: the source of an asynchronous copy is a pinned tensor_view, which the "
                  "pending cannot own, and the host could free or rewrite that memory while the "
                  "copy engine still reads it; move the owning pinned tensor in, "
                  "locus::to_async<locus::cuda>(std::move(h)), and take it back after the copy "
                  "with auto [d, h2] = std::move(p).get_with_source()");
    return false;
  } else {
    static_assert(always_false<Src>,
                  "locus: the source of an asynchronous copy is a pinned tensor passed as an "
                  "lvalue (or const), which the host could free or rewrite while the copy "
                  "engine still reads it; move it in, locus::to_async<locus::cuda>(std::move(h)) "
                  "(the pending owns it until the copy is done), and take it back with "
                  "auto [d, h2] = std::move(p).get_with_source()");
    return false;
  }
}

// Prevents: reading, viewing, replacing or freeing the destination while the copy
// writes to it: the pending owns it, so get() is the only way back to it.
template <class Dst>
constexpr bool require_async_destination() {
  using X = std::remove_reference_t<Dst>;
  using tr = tensor_traits<std::remove_cv_t<X>>;
  if constexpr (tr::is_view) {
    static_assert(always_false<Dst>,
                  "locus: the destination of copy_async is a tensor_view, which the pending "
                  "cannot own (the tensor it views could be read, replaced or freed while the "
                  "copy writes to it); move the owning tensor in, "
                  "locus::copy_async(src, std::move(dst)), or write locus::to_async<D>(src) for "
                  "a new tensor");
    return false;
  } else if constexpr (std::is_const_v<X>) {
    static_assert(always_false<Dst>,
                  "locus: copy_async destination is const; pass a mutable tensor, moved in: "
                  "locus::copy_async(src, std::move(dst))");
    return false;
  } else if constexpr (std::is_lvalue_reference_v<Dst>) {
    static_assert(always_false<Dst>,
                  "locus: copy_async takes ownership of its destination, but dst is an lvalue "
                  "tensor that could be read or replaced while the copy writes to it; move it "
                  "in, dst = std::move(locus::copy_async(src, std::move(dst))).get(), or write "
                  "locus::to_async<D>(src) for a new tensor");
    return false;
  } else {
    return true;
  }
}

template <class Src>
constexpr bool require_async_tensor_source() {
  static_assert(!is_expression_v<Src>,
                "locus: to_async and copy_async copy a tensor, but the source is an expression "
                "(a lazy tree with no memory yet); evaluate it first and move the result in: "
                "locus::to_async<D>(locus::eval(e)) (a cuda expression is evaluated by a "
                "kernel: in a .cu file)");
  return !is_expression_v<Src>;
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

/// What std::move(p).get_with_source() returns: the copy's result and the source
/// the pending owned (both tensors; structured bindings work: auto [d, h] = ...).
template <class V, class S>
struct value_and_source {
  V value;
  S source;
};

namespace detail {

/// Only locus's own code builds pendings (a passkey: the constructor is public for
/// it, unusable without one).
struct pending_key {
  explicit pending_key() = default;
};

struct no_source {};

template <class S>
using pending_source_storage = std::conditional_t<std::is_void_v<S>, no_source, S>;

/// The source, moved out when the pending owns it (noexcept: done after the enqueue).
template <class Src, class X>
pending_source_storage<async_source_t<Src>> take_async_source(X& src) noexcept {
  if constexpr (async_owns_source_v<Src>)
    return std::move(src);
  else
    return {};
}

/// cudaMemcpyAsync on the current stream, then `done` recorded after it. A cuda ->
/// cuda copy whose sides overlap copies nothing when the layout is the same (every
/// element is its own source), else goes through a temporary (cudaMemcpy with
/// overlapping ranges is undefined). If the record fails, waits for the stream before
/// throwing, so that the caller may free both sides.
template <class SD, class DD, class T, std::size_t R>
void enqueue_and_record(const tensor_view<T, DD, R>& dst, const tensor_view<const T, SD, R>& src,
                        event& done) {
  const cudaStream_t s = current_stream();
  const std::size_t bytes = src.size_bytes();
  if constexpr (!SD::host_accessible && !DD::host_accessible) {
    if (bytes != 0 && views_overlap(src, dst)) {
      if (!same_mapping(src, dst)) {
        tensor<T, DD, R> tmp(src.shape());  // freed in stream order: reused only after the copies
        LOCUS_CUDA_CHECK(cudaMemcpyAsync(tmp.data_handle(), src.data_handle(), bytes,
                                         cudaMemcpyDeviceToDevice, s));
        LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), tmp.data_handle(), bytes,
                                         cudaMemcpyDeviceToDevice, s));
      }
    } else if (bytes != 0) {
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), src.data_handle(), bytes,
                                       memcpy_kind<SD, DD>(), s));
    }
  } else if (bytes != 0) {
    LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_handle(), src.data_handle(), bytes,
                                     memcpy_kind<SD, DD>(), s));
  }
  try {
    // The cuda sides may belong to blocks of another stream: not reusable before this
    // copy is done (pinned sides are owned by the pending, which waits for it).
    if constexpr (!SD::host_accessible)
      if (bytes != 0) record_block_use(src.data_handle(), s);
    if constexpr (!DD::host_accessible)
      if (bytes != 0) record_block_use(dst.data_handle(), s);
    done.record_on(s);
  } catch (...) {
    (void)cudaStreamSynchronize(s);
    throw;
  }
}

}  // namespace detail

/// The result of an asynchronous copy: the destination tensor V, which becomes
/// reachable when the copy is done, and the source tensor S the pending owns until
/// then (void: none; a cuda lvalue or view source stays the caller's). Move-only.
/// Like a std::future, one thread uses a pending at a time: ready() and get() note
/// the completion, so calling them from two threads at once is a data race; hand a
/// pending over (move it) instead of sharing it.
template <class V, class S = void>
class pending {
  static_assert(detail::tensor_traits<V>::is_tensor,
                "locus: pending<V, S> holds the tensor an asynchronous copy writes, but V is not "
                "a locus::tensor (a tensor_view or another type cannot own that memory); it is "
                "what to_async and copy_async return: write auto p = "
                "locus::to_async<locus::cuda>(std::move(h))");
  static_assert(std::is_void_v<S> || detail::tensor_traits<S>::is_tensor,
                "locus: pending<V, S>'s S is the source tensor it owns (or void for none), but "
                "S is another type; write auto p = locus::to_async<locus::cuda>(std::move(h))");

 public:
  using value_type = V;
  using source_type = S;

  pending(detail::pending_key, V value, event done, detail::pending_source_storage<S> source) noexcept
      : value_(std::move(value)), source_(std::move(source)), done_(std::move(done)),
        state_(state::in_flight) {}

  pending(pending&& other) noexcept
      : value_(std::move(other.value_)),
        source_(std::move(other.source_)),
        done_(std::move(other.done_)),
        state_(std::exchange(other.state_, state::empty)) {}

  /// Waits for this pending's own copy before taking over the other one.
  pending& operator=(pending&& other) noexcept {
    if (this != &other) {
      finish();
      value_ = std::move(other.value_);
      source_ = std::move(other.source_);
      done_ = std::move(other.done_);
      state_ = std::exchange(other.state_, state::empty);
    }
    return *this;
  }

  /// Waits for the copy when get() was never called: the destination is never freed,
  /// and the owned source never released, under an in-flight copy.
  ~pending() { finish(); }

  // Prevents: two owners of one destination, one of which frees it mid-copy.
  // Deleted, so that std::is_copy_constructible_v and std::is_copy_assignable_v tell
  // the truth (as for tensor); copying a non-const pending, the usual mistake, reaches
  // the templates below and their message.
  pending(const pending&) = delete;  // locus: pending is move-only: write std::move(p)
  pending& operator=(const pending&) = delete;  // locus: pending is move-only: write std::move(p)
  template <class U>
    requires std::is_same_v<U, pending>
  pending(U&) {
    static_assert(detail::always_false<U>,
                  "locus: pending is move-only (it owns an in-flight copy); write std::move(p)");
  }
  template <class U>
    requires std::is_same_v<U, pending>
  pending& operator=(U&) {
    static_assert(detail::always_false<U>,
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
  /// pending (which keeps owning it and its source), the tensor itself on an rvalue,
  /// std::move(p).get(), which also releases the source. Throws cuda_error if the copy
  /// failed, locus::error when the value already left.
  [[nodiscard]] V& get() & {
    wait("get()");
    return value_;
  }
  [[nodiscard]] const V& get() const& {
    wait("get()");
    return value_;
  }
  [[nodiscard]] V get() && {
    wait("get()");
    state_ = state::empty;  // the value leaves: a second get() is an error
    source_ = {};
    return std::move(value_);
  }

  /// Waits for the copy, then gives back both the destination and the source the
  /// pending owned: auto [d, h] = std::move(p).get_with_source(). Only for a source
  /// that was moved in (S is not void).
  template <class U = S>
  [[nodiscard]] auto get_with_source() && {
    if constexpr (std::is_void_v<U>) {
      static_assert(detail::always_false<U>,
                    "locus: get_with_source() gives back a source the pending owns, but this "
                    "one owns none (the source was a cuda lvalue or view, which stayed yours); "
                    "write std::move(p).get()");
      return 0;
    } else {
      wait("get_with_source()");
      state_ = state::empty;
      return value_and_source<V, U>{std::move(value_), std::move(source_)};
    }
  }
  template <class U = S>
  void get_with_source() & {
    static_assert(detail::always_false<U>,
                  "locus: get_with_source() hands the value and the source over, so it needs "
                  "an rvalue pending; write std::move(p).get_with_source()");
  }

  // ---- every way of reaching the value except get() is a compile error ------------
  // Prevents: reading (or freeing) the destination of a copy that is still running.
  template <class U = V>
  U& value() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the tensor itself)");
    return const_cast<U&>(value_);
  }
  template <class U = V>
  U& operator*() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the tensor itself)");
    return const_cast<U&>(value_);
  }
  template <class U = V>
  U* operator->() const {
    static_assert(detail::always_false<U>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get() (a reference) or "
                  "std::move(p).get() (the tensor itself)");
    return nullptr;
  }
  // A deduced return type: `float x = p(0, 0);` instantiates the body (and its rule)
  // before the compiler could complain about converting void.
  template <class... I>
  auto operator()(I...) const {
    static_assert(detail::always_false<I...>,
                  "locus: the destination of an asynchronous copy can only be reached "
                  "through get(), which waits for the copy; write p.get()(i, ...) after the "
                  "copy, on a host-accessible destination");
    return typename V::element_type{};
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
                  " on a pending whose value was already taken (std::move(p).get() or "
                  "get_with_source()) or that was moved from");
  }
  void wait(const char* what) const {
    check_has_value(what);
    if (state_ == state::in_flight) {
      done_.synchronize();
      state_ = state::done;
    }
  }
  void finish() noexcept {
    if (state_ == state::in_flight && done_.native_handle())
      (void)cudaEventSynchronize(done_.native_handle());  // a destructor cannot throw
    if (state_ != state::empty) state_ = state::done;
  }

  V value_;
  [[no_unique_address]] detail::pending_source_storage<S> source_;
  event done_;
  mutable state state_;
};

/// Copies src into a new tensor on D2, asynchronously on the current stream.
/// Endpoints: pinned -> cuda, cuda -> pinned, cuda -> cuda (a cpu side is a compile
/// error). A pinned source must be moved in (std::move(h)): the pending owns it until
/// the copy is done (get_with_source() gives it back); so is any rvalue tensor. A cuda
/// lvalue or view source stays the caller's (stream-ordered).
template <Device D2, class Src>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
[[nodiscard]] auto to_async(Src&& src) {
  if constexpr (detail::require_async_tensor_source<Src>()) {
    using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
    using SD = typename st::device;
    using T = typename st::value_type;
    if constexpr (detail::require_async_endpoints<SD, D2>()) {
      if constexpr (detail::require_async_source<Src>()) {
        const tensor_view<const T, SD, st::rank> s = detail::as_view(src);
        detail::require_contiguous_async(s, "source");
        event done;  // first: without a GPU, fail before allocating anything
        tensor<T, D2, st::rank> out(s.shape());
        detail::enqueue_and_record(out.view(), s, done);
        // Nothing below throws: on an exception above, src is untouched.
        return pending<tensor<T, D2, st::rank>, detail::async_source_t<Src>>(
            detail::pending_key{}, std::move(out), std::move(done),
            detail::take_async_source<Src>(src));
      }
    }
  }
}

/// Copies src into dst, asynchronously on the current stream, taking dst over:
/// copy_async(src, std::move(dst)). Same endpoints and source rules as to_async; dtype
/// and rank must match (compile time), shapes must match (shape_error, nothing
/// enqueued, nothing moved). The pending owns dst until std::move(p).get() gives it
/// back. The same tensor as source and destination (std::move(t) twice) copies
/// nothing; get_with_source() then gives an empty source.
template <class Src, TensorLike Dst>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
[[nodiscard]] auto copy_async(Src&& src, Dst&& dst) {
  if constexpr (detail::require_async_tensor_source<Src>()) {
    using st = detail::tensor_traits<std::remove_cvref_t<Src>>;
    using dt = detail::tensor_traits<std::remove_cvref_t<Dst>>;
    using SD = typename st::device;
    using DD = typename dt::device;
    using T = typename dt::value_type;
    if constexpr (detail::require_async_endpoints<SD, DD>()) {
      if constexpr (detail::require_async_destination<Dst>() && detail::require_async_source<Src>()) {
        if constexpr (detail::require_same_copy_dtype<typename st::value_type, T>() &&
                      detail::require_same_copy_rank<st::rank, dt::rank>()) {
          const tensor_view<const T, SD, st::rank> s = detail::as_view(src);
          const tensor_view<T, DD, dt::rank> d = dst.view();
          if (s.shape() != d.shape())
            throw shape_error("locus: copy_async from shape " + detail::shape_string(s.shape()) +
                              " to shape " + detail::shape_string(d.shape()) +
                              "; shapes must be equal (nothing was copied, nothing moved)");
          detail::require_contiguous_async(s, "source");
          event done;
          detail::enqueue_and_record(d, s, done);
          using P = pending<std::remove_cvref_t<Dst>, detail::async_source_t<Src>>;
          if constexpr (std::is_same_v<std::remove_cvref_t<Src>, std::remove_cvref_t<Dst>> &&
                        detail::async_owns_source_v<Src>) {
            // The same tensor on both sides: it is the destination, not also the source.
            if (static_cast<const void*>(&src) == static_cast<const void*>(&dst))
              return P(detail::pending_key{}, std::move(dst), std::move(done), {});
          }
          // Nothing below throws: on an exception above, src and dst are untouched.
          return P(detail::pending_key{}, std::move(dst), std::move(done),
                   detail::take_async_source<Src>(src));
        }
      }
    }
  }
}

#else  // !LOCUS_HAS_CUDA

template <Device D2, class Src>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
void to_async(Src&&) {
  if constexpr (detail::require_async_tensor_source<Src>()) {
    using SD = typename detail::tensor_traits<std::remove_cvref_t<Src>>::device;
    if constexpr (detail::require_async_endpoints<SD, D2>())
      static_assert(detail::always_false<Src>,
                    "locus: to_async needs a build with CUDA, but this one has "
                    "LOCUS_ENABLE_CUDA=0; use locus::to<D>(t)");
  }
}
template <class Src, TensorLike Dst>
  requires(TensorLike<Src> || detail::is_expression_v<Src>)
void copy_async(Src&&, Dst&&) {
  if constexpr (detail::require_async_tensor_source<Src>()) {
    using SD = typename detail::tensor_traits<std::remove_cvref_t<Src>>::device;
    using DD = typename detail::tensor_traits<std::remove_cvref_t<Dst>>::device;
    if constexpr (detail::require_async_endpoints<SD, DD>())
      static_assert(detail::always_false<Src>,
                    "locus: copy_async needs a build with CUDA, but this one has "
                    "LOCUS_ENABLE_CUDA=0; use locus::copy(src, dst)");
  }
}

#endif

}  // namespace locus
