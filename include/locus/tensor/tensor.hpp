// tensor<T, D, R> owns memory on device D; tensor_view<T, D, R> is the non-owning
// counterpart (pointer, shape, strides). dtype, device and rank are in the type, so
// mixing them does not compile; element access, span() and data() exist only where
// host code may read the memory. tensor is move-only: a deep copy is clone() or
// to<D2>(), never a hidden copy constructor.
//
// Length (over 600 lines): tensor and tensor_view are one pair (conversions, views,
// element access on host-readable devices) whose rules must be read together.
#pragma once

#include <cstddef>
#include <array>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/config.hpp"
#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../core/shape.hpp"
#include "../memory/allocator.hpp"

namespace locus {

template <class T, class D, std::size_t R>
class tensor;
template <class T, class D, std::size_t R>
class tensor_view;

namespace detail {
/// Base of every lazy expression node (ops/expr.hpp).
struct expression_tag {};
template <class T, class D, std::size_t R, class E>
void construct_from_expr(tensor<T, D, R>& t, const E& e);
template <class T, class D, std::size_t R, class E>
void assign_expr(tensor<T, D, R>& t, const E& e);
template <class T, class D, std::size_t R, class E>
void assign_expr(const tensor_view<T, D, R>& v, const E& e);

template <class X>
struct tensor_traits {
  static constexpr bool is_tensor = false;
  static constexpr bool is_view = false;
};
template <class T, class D, std::size_t R>
struct tensor_traits<tensor<T, D, R>> {
  static constexpr bool is_tensor = true;
  static constexpr bool is_view = false;
  using value_type = T;
  using element_type = T;
  using device = D;
  static constexpr std::size_t rank = R;
};
template <class T, class D, std::size_t R>
struct tensor_traits<tensor_view<T, D, R>> {
  static constexpr bool is_tensor = false;
  static constexpr bool is_view = true;
  using value_type = std::remove_cv_t<T>;
  using element_type = T;
  using device = D;
  static constexpr std::size_t rank = R;
};

template <std::size_t R, class... I>
index_t offset_of(const extents<R>& shape, const extents<R>& strides, I... idx) {
  static_assert(sizeof...(I) == R,
                "locus: element access takes exactly one index per axis, but the number of "
                "indices differs from the tensor's rank; write t(i, j) for a rank-2 tensor, or "
                "read a flat offset through t.reshape({t.numel()})(k)");
  const index_t ids[] = {static_cast<index_t>(idx)..., 0};
  index_t off = 0;
  for (std::size_t a = 0; a < R; ++a) {
#ifdef LOCUS_CHECK_BOUNDS
    if (ids[a] < 0 || ids[a] >= shape[a])
      throw_index_error("locus: index %lld out of range for axis %zu of shape %s", static_cast<long long>(ids[a]),
                        a, shape_chars<R>(shape).s);
#else
    (void)shape;
#endif
    off += ids[a] * strides[a];
  }
  return off;
}

template <std::size_t R2, std::size_t R>
extents<R2> checked_reshape(const extents<R>& from, const extents<R2>& to, bool contiguous) {
  if (!contiguous)
    throw_shape_error("locus: reshape of a non-contiguous view of shape %s; clone() it first (a strided cuda "
                      "view: locus::eval(v) in a .cu file)",
                      shape_chars<R>(from).s);
  const index_t n = checked_numel(to, 1);
  if (n != numel_of(from))
    throw_shape_error("locus: cannot reshape %s (%lld elements) to %s (%lld elements)", shape_chars<R>(from).s,
                      static_cast<long long>(numel_of(from)), shape_chars<R2>(to).s, static_cast<long long>(n));
  return to;
}

/// The message for anything that would point into a temporary tensor (a macro: a
/// static_assert message must be a string literal).
#define LOCUS_TEMPORARY_VIEW_MESSAGE(what)                                                     \
  "locus: " what " of a temporary tensor would dangle: the tensor is freed at the end of "    \
  "the statement; keep it in a variable first: auto t = ...; then use t.view(), t.slice(), "  \
  "t.reshape() or t.span()"

#define LOCUS_RAW_POINTER_MESSAGE                                                               \
  "locus: a raw pointer becomes a view only through locus::unsafe_view<D>(p, shape) (or "     \
  "unsafe_view<D>(p, shape, strides)), where the caller vouches that p is memory of device D; " \
  "a view of a locus tensor is t.view(), t.slice() or t.reshape()"

#define LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE(what)                                                \
  "locus: " what "() takes no device argument: whether host code may read the memory is "    \
  "decided by the tensor's own device; on cpu or pinned write t." what "(), on cuda copy "    \
  "first: auto h = locus::to<locus::cpu>(t); h." what "()"

/// The passkey of tensor_view's raw-pointer constructors: locus's own code builds views
/// of memory it allocated through detail::raw_view; users go through locus::unsafe_view.
struct raw_view_key {
  explicit raw_view_key() = default;
};

/// Whether a view of U on D2 of rank R2 converts to a view of T on D of rank R: the
/// same memory with the same or added constness.
template <class U, class D2, std::size_t R2, class T, class D, std::size_t R>
inline constexpr bool view_converts =
    std::is_same_v<D2, D> && R2 == R && (std::is_same_v<U, T> || std::is_same_v<const U, T>);

/// The compile error of a view conversion that does not exist: device, then dtype,
/// then rank, then constness (the first that differs names the fix).
template <class U, class D2, std::size_t R2, class T, class D, std::size_t R>
constexpr void reject_view_conversion() {
  if constexpr (require_view_device<D2, D>() &&
                require_view_dtype<std::remove_cv_t<U>, std::remove_cv_t<T>>() &&
                require_view_rank<R2, R>()) {
    static_assert(always_false<U>,
                  "locus: a view of const elements does not convert to a mutable view; take "
                  "locus::tensor_view<const T, D, R>, or view a non-const tensor");
  }
}

inline void check_slice(index_t begin, index_t end, index_t extent) {
  if (begin < 0 || end < begin || end > extent)
    throw_shape_error("locus: slice [%lld, %lld) is outside axis 0 of extent %lld", static_cast<long long>(begin),
                      static_cast<long long>(end), static_cast<long long>(extent));
}
}  // namespace detail

/// Any tensor or tensor_view.
template <class X>
concept TensorLike = detail::tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
                     detail::tensor_traits<std::remove_cvref_t<X>>::is_view;

template <class T, class D, std::size_t R>
class tensor_view {
  static_assert(Dtype<T>, "locus: tensor_view element type must be one of f32, f64, i32, i64, "
                          "u8, bool, f16, bf16 (optionally const)");
  // is_device_v rather than the concept: a failed concept adds notes to the message.
  static_assert(is_device_v<D>, "locus: tensor_view device must be locus::cpu, locus::pinned or "
                                "locus::cuda");
  // fires its own message (checks cpu, always enabled, when D is no device: one error)
  static_assert(detail::require_device_enabled<std::conditional_t<is_device_v<D>, D, cpu>>() || true);

 public:
  using value_type = std::remove_cv_t<T>;
  using element_type = T;
  using device_type = D;
  static constexpr std::size_t rank = R;

  tensor_view() noexcept = default;
  /// Raw pointers enter only through locus::unsafe_view<D>(p, shape) (the key is
  /// locus's own): an ordinary constructor would let any pointer be typed as any device.
  /// `gpu`: the GPU the memory belongs to (cuda), or -1 where it is not known (then no
  /// operation can check it) and on host devices.
  tensor_view(detail::raw_view_key, T* data, const extents<R>& shape, const extents<R>& strides,
              int gpu = -1) noexcept
      : data_(data), shape_(shape), strides_(strides), gpu_(gpu) {}
  tensor_view(detail::raw_view_key, T* data, const extents<R>& shape, int gpu = -1) noexcept
      : data_(data), shape_(shape), strides_(detail::contiguous_strides(shape)), gpu_(gpu) {}

  // Prevents: any pointer typed as any device by an ordinary constructor
  // (tensor_view<float, cpu, 1>(cuda_tensor.data_handle(), {4})).
  template <class P>
  tensor_view(P*, const extents<R>&) {
    static_assert(detail::always_false<P>, LOCUS_RAW_POINTER_MESSAGE);
  }
  template <class P>
  tensor_view(P*, const extents<R>&, const extents<R>&) {
    static_assert(detail::always_false<P>, LOCUS_RAW_POINTER_MESSAGE);
  }

  /// A view of T converts to a view of const T.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  tensor_view(const tensor_view<U, D, R>& other) noexcept
      : data_(other.data_handle()), shape_(other.shape()), strides_(other.strides()), gpu_(other.device_index()) {}

  /// A view of another device, dtype, rank or constness does not convert: a compile
  /// error that names the transfer, cast or reshape to write (a candidate list otherwise).
  template <class U, class D2, std::size_t R2>
    requires(!detail::view_converts<U, D2, R2, T, D, R>)
  tensor_view(const tensor_view<U, D2, R2>&) {
    detail::reject_view_conversion<U, D2, R2, T, D, R>();
  }

  /// A view of a tensor (what t.view() returns): tensor<T> gives tensor_view<T> or
  /// tensor_view<const T>, a const tensor only tensor_view<const T>.
  template <class U>
    requires std::is_same_v<U, value_type>
  tensor_view(tensor<U, D, R>& t) noexcept
      : data_(t.data_handle()), shape_(t.shape()), strides_(detail::contiguous_strides(t.shape())),
        gpu_(t.device_index()) {}
  template <class U>
    requires std::is_same_v<const U, T>
  tensor_view(const tensor<U, D, R>& t) noexcept
      : data_(t.data_handle()), shape_(t.shape()), strides_(detail::contiguous_strides(t.shape())),
        gpu_(t.device_index()) {}
  template <class U>
    requires std::is_same_v<U, T>
  tensor_view(const tensor<U, D, R>&) {
    static_assert(detail::always_false<U>,
                  "locus: a const tensor gives a read-only view, not a mutable one; write "
                  "locus::tensor_view<const T, D, R> v = t; (or auto v = t.view();), or drop the "
                  "const from the tensor");
  }
  // Prevents: a view of a temporary, freed at the end of the statement.
  template <class U>
    requires std::is_same_v<U, value_type>
  tensor_view(const tensor<U, D, R>&&) {
    static_assert(detail::always_false<U>, LOCUS_TEMPORARY_VIEW_MESSAGE("a tensor_view"));
  }
  /// A tensor of another device, dtype or rank: the compile error of view conversions.
  template <class U, class D2, std::size_t R2>
    requires(!(std::is_same_v<D2, D> && R2 == R && std::is_same_v<U, value_type>))
  tensor_view(const tensor<U, D2, R2>&) {
    detail::reject_view_conversion<U, D2, R2, T, D, R>();
  }

  // Accessors that return a reference into the object return a copy when the object is
  // a temporary. Prevents: `for (auto e : t.slice(0, 2).shape())` and
  // `const auto& s = zeros(...).shape();` reading a destroyed object (the reference
  // would outlive the statement; a returned value is extended with the binding).
  [[nodiscard]] const extents<R>& shape() const& noexcept { return shape_; }
  [[nodiscard]] extents<R> shape() const&& noexcept { return shape_; }
  [[nodiscard]] const extents<R>& strides() const& noexcept { return strides_; }
  [[nodiscard]] extents<R> strides() const&& noexcept { return strides_; }
  /// The GPU the viewed memory lives on (cuda); -1 on host devices and where locus
  /// does not know it (a view of memory another library allocated, without a device).
  [[nodiscard]] int device_index() const noexcept { return gpu_; }
  [[nodiscard]] index_t extent(std::size_t axis) const {
    if (axis >= R)
      throw shape_error("locus: axis " + std::to_string(axis) + " out of range for rank " +
                        std::to_string(R));
    return shape_[axis];
  }
  [[nodiscard]] index_t stride(std::size_t axis) const { return (void)extent(axis), strides_[axis]; }
  [[nodiscard]] index_t numel() const noexcept { return detail::numel_of(shape_); }
  [[nodiscard]] std::size_t size_bytes() const noexcept {
    return static_cast<std::size_t>(numel()) * sizeof(value_type);
  }
  [[nodiscard]] bool empty() const noexcept { return numel() == 0; }
  [[nodiscard]] bool is_contiguous() const noexcept {
    return detail::is_contiguous(shape_, strides_);
  }

  /// The raw pointer, on whatever device the memory lives (a device pointer for
  /// cuda): for interop with other libraries, never for host reads of GPU memory.
  [[nodiscard]] T* data_handle() const noexcept { return data_; }

  /// Host pointer to the first element. Host-accessible devices only (the view's own
  /// device decides: there is no parameter a caller could set).
  [[nodiscard]] T* data() const noexcept {
    if constexpr (detail::require_host_accessible<D>()) return data_;
    else return nullptr;
  }

  /// The elements as a span. Host-accessible devices only; the view must be
  /// contiguous (shape_error otherwise).
  [[nodiscard]] std::span<T> span() const {
    if constexpr (detail::require_host_accessible<D>()) {
      if (!is_contiguous())
        detail::throw_shape_error("locus: span() of a non-contiguous view of shape %s; clone() it first",
                                  detail::shape_chars<R>(shape_).s);
      return {data_, static_cast<std::size_t>(numel())};
    } else {
      return {};
    }
  }

  /// Element access t(i, j, ...). Host-accessible devices only; bounds-checked when
  /// LOCUS_CHECK_BOUNDS is defined (throws index_error).
  template <class... I>
  T& operator()(I... idx) const {
    if constexpr (detail::require_host_accessible<D>()) {
      static_assert((std::is_integral_v<I> && ...),
                    "locus: indices must be integers, but an index has a floating-point (or "
                    "other non-integer) type; convert it explicitly, e.g. "
                    "t(static_cast<locus::index_t>(x))");
      return data_[detail::offset_of(shape_, strides_, idx...)];
    } else {
      return *data_;
    }
  }

  /// The single element of a rank-0 view. Host-accessible devices only.
  value_type item() const {
    static_assert(R == 0, "locus: item() reads a rank-0 tensor, but this one has rank >= 1; index the "
                          "element with t(i, ...), or reduce first, e.g. locus::sum(t).item()");
    if constexpr (detail::require_host_accessible<D>()) return *data_;
    else return value_type{};
  }

  // Prevents: v.data<locus::cpu>() on a cuda view (the view's own device decides).
  template <class Dev>
  T* data() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("data"));
    return nullptr;
  }
  template <class Dev>
  std::span<T> span() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("span"));
    return {};
  }
  template <class Dev>
  value_type item() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("item"));
    return {};
  }

  [[nodiscard]] tensor_view view() const noexcept { return *this; }

  tensor_view(const tensor_view&) noexcept = default;
  /// Assigning to a view variable rebinds it (as std::span's assignment does); the
  /// elements are untouched. Defaulted, so views stay trivially copyable (kernel
  /// arguments).
  tensor_view& operator=(const tensor_view&) & noexcept = default;
  /// Assigning a tensor or view to a temporary view copies the elements, as PyTorch's
  /// `t[0:2] = u[0:2]` does: `t.slice(0, 2) = u.slice(0, 2);`, `t.view() = u;`.
  /// Prevents: that statement compiling as a rebind of a temporary, which copies nothing.
  /// Same device, dtype and rank (compile errors naming the fix), same shape (shape_error,
  /// nothing written); overlapping sides read as from a separate source. Defined in
  /// transfer/copy.hpp (it is locus::copy with the device rule of an assignment).
  template <class S>
    requires(detail::tensor_traits<S>::is_tensor || detail::tensor_traits<S>::is_view)
  const tensor_view& operator=(const S& src) &&;
  /// Every viewed element becomes s: t.slice(0, 2) = 0.0f (PyTorch's t[0:2] = 0), with
  /// the scalar rules of t + s. Defined in ops/expr.hpp.
  template <class S>
    requires(std::is_arithmetic_v<S> || is_half_v<S>)
  const tensor_view& operator=(const S& s) const&;
  /// Evaluates an expression into the viewed elements (ops/expr.hpp); the expression
  /// must broadcast to this view's shape.
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  const tensor_view& operator=(const E& e) const {
    detail::assign_expr(*this, e);
    return *this;
  }

  /// A view of another rank over the same contiguous memory.
  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const extents<R2>& shape) const {
    return {detail::raw_view_key{}, data_, detail::checked_reshape(shape_, shape, is_contiguous()), gpu_};
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const index_t (&shape)[R2]) const {
    return reshape(detail::to_extents(shape));
  }

  /// Rows [begin, end) along the first axis (a batch), as a view.
  [[nodiscard]] tensor_view slice(index_t begin, index_t end) const {
    static_assert(R >= 1, "locus: slice() needs rank >= 1 (it takes rows along axis 0), but this "
                          "tensor has rank 0; read its value with item(), or reshape it first: "
                          "t.reshape({1})");
    detail::check_slice(begin, end, shape_[0]);
    extents<R> s = shape_;
    s[0] = end - begin;
    // no offset on an empty view: its pointer may be null (offsetting one is UB)
    T* p = s[0] == 0 || detail::numel_of(s) == 0 ? data_ : data_ + begin * strides_[0];
    return {detail::raw_view_key{}, p, s, strides_, gpu_};
  }

  /// A contiguous deep copy in a new tensor on the same device (defined in
  /// transfer/copy.hpp). A strided cuda view throws shape_error, as copy() does:
  /// evaluate it as an expression in a .cu file instead.
  [[nodiscard]] tensor<std::remove_const_t<T>, D, R> clone() const;

 private:
  T* data_ = nullptr;
  extents<R> shape_{};
  extents<R> strides_{};
  int gpu_ = -1;
};

template <class T, class D, std::size_t R>
class tensor {
  static_assert(Dtype<T> && !std::is_const_v<T> && !std::is_volatile_v<T>,
                "locus: tensor element type must be one of f32, f64, i32, i64, u8, bool, "
                "f16, bf16 (not const: use tensor_view<const T, D, R> for read-only access)");
  static_assert(is_device_v<D>, "locus: tensor device must be locus::cpu, locus::pinned or locus::cuda");
  // fires its own message (checks cpu, always enabled, when D is no device: one error)
  static_assert(detail::require_device_enabled<std::conditional_t<is_device_v<D>, D, cpu>>() || true);

 public:
  using value_type = T;
  using element_type = T;
  using device_type = D;
  static constexpr std::size_t rank = R;

  /// An empty tensor (no elements, no memory).
  tensor() noexcept = default;

  /// Uninitialised memory of the given shape on D (see locus::empty).
  explicit tensor(const extents<R>& shape) : shape_(shape) {
    const index_t n = detail::checked_numel(shape, sizeof(T));
    data_ = static_cast<T*>(detail::allocator_for<D>().allocate(static_cast<std::size_t>(n) * sizeof(T)));
    gpu_ = detail::allocation_gpu<D>();
  }

  /// Evaluates an expression (ops/expr.hpp) into a new tensor: one fused kernel.
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  tensor(const E& e) {
    detail::construct_from_expr(*this, e);
  }
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  tensor& operator=(const E& e) & {
    detail::assign_expr(*this, e);
    return *this;
  }
  // Prevents: t.clone() = e, to<cpu>(t) = e: the result is lost with the temporary.
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  tensor& operator=(const E&) && {
    static_assert(detail::always_false<E>, "locus: assigning to a temporary tensor is lost with it (t.clone() = e); "
                                           "assign to a named tensor or to a view of one: t = e; t.slice(0, 2) = e;");
    return *this;
  }
  /// Every element becomes s (PyTorch's t.fill_(s), NumPy's a[...] = s), with the scalar
  /// rules of t + s (an integer outside the dtype's range is a value_error; a floating
  /// scalar into an integer tensor does not compile). Defined in ops/expr.hpp.
  template <class S>
    requires(std::is_arithmetic_v<S> || is_half_v<S>)
  tensor& operator=(const S& s) &;

  tensor(tensor&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        shape_(std::exchange(other.shape_, {})),
        gpu_(std::exchange(other.gpu_, -1)) {}
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      shape_ = std::exchange(other.shape_, {});
      gpu_ = std::exchange(other.gpu_, -1);
    }
    return *this;
  }
  ~tensor() { release(); }

  // Prevents: a hidden deep copy of (GPU) memory on every pass by value.
  // Deleted, so that std::is_copy_constructible_v and std::is_copy_assignable_v tell
  // generic code the truth (std::optional, std::variant, concepts). The usual mistake,
  // copying a non-const tensor (auto b = a; pass by value), is caught by the template
  // below with locus's message; copying a const tensor reaches the deleted declaration.
  tensor(const tensor&) = delete;  // locus: tensor is move-only: write t.clone(), std::move(t) or t.view()
  tensor& operator=(const tensor&) = delete;  // locus: tensor is move-only: write t = u.clone(), std::move(u) or u.view()
  template <class U>
    requires std::is_same_v<U, tensor>
  tensor(U&) {
    static_assert(detail::always_false<U>,
                  "locus: tensor is move-only, copying it would duplicate its memory; write "
                  "t.clone() for a deep copy, std::move(t) to transfer ownership, or take a "
                  "view, a cheap non-owning handle: auto v = t.view()");
  }
  template <class U>
    requires std::is_same_v<U, tensor>
  tensor& operator=(U&) {
    static_assert(detail::always_false<U>,
                  "locus: tensor is move-only, copying it would duplicate its memory; write "
                  "t = u.clone() for a deep copy, std::move(u) to transfer ownership, or keep "
                  "a view instead of a tensor: auto v = u.view()");
    return *this;
  }

  /// Assigning a tensor or view of another device, dtype or rank is a compile error
  /// that names the explicit transfer or cast to write instead. From an rvalue tensor
  /// the conversion is deleted instead, so that std::is_convertible_v and
  /// std::is_constructible_v (which ask about rvalues) are false; the compiler then says
  /// "use of deleted function" and shows the comment on its declaration.
  template <class T2, class D2, std::size_t R2>
  tensor(const tensor<T2, D2, R2>&) {
    reject_conversion<T2, D2, R2, true>();
  }
  template <class T2, class D2, std::size_t R2>
  tensor(tensor<T2, D2, R2>&&) = delete;  // locus: no conversion between devices, dtypes or ranks: write locus::to<D>(x), locus::cast<T>(x) or x.reshape(...)
  template <class T2, class D2, std::size_t R2>
  tensor(const tensor_view<T2, D2, R2>&) {
    reject_conversion<std::remove_cv_t<T2>, D2, R2, false>();
  }
  template <class T2, class D2, std::size_t R2>
  tensor& operator=(const tensor<T2, D2, R2>&) {
    reject_conversion<T2, D2, R2, true>();
    return *this;
  }
  template <class T2, class D2, std::size_t R2>
  tensor& operator=(tensor<T2, D2, R2>&&) = delete;  // locus: no conversion between devices, dtypes or ranks: write locus::to<D>(x), locus::cast<T>(x) or x.reshape(...)
  template <class T2, class D2, std::size_t R2>
  tensor& operator=(const tensor_view<T2, D2, R2>&) {
    reject_conversion<std::remove_cv_t<T2>, D2, R2, false>();
    return *this;
  }

  // A temporary tensor's shape is returned by value (see tensor_view::shape()).
  [[nodiscard]] const extents<R>& shape() const& noexcept { return shape_; }
  [[nodiscard]] extents<R> shape() const&& noexcept { return shape_; }
  [[nodiscard]] extents<R> strides() const noexcept { return detail::contiguous_strides(shape_); }
  /// The GPU that holds the memory (cuda: the device that was current when it was
  /// allocated); -1 on host devices and for an empty tensor that never allocated.
  [[nodiscard]] int device_index() const noexcept { return gpu_; }
  [[nodiscard]] index_t extent(std::size_t axis) const { return view().extent(axis); }
  [[nodiscard]] index_t numel() const noexcept { return detail::numel_of(shape_); }
  [[nodiscard]] std::size_t size_bytes() const noexcept {
    return static_cast<std::size_t>(numel()) * sizeof(T);
  }
  [[nodiscard]] bool empty() const noexcept { return numel() == 0; }
  [[nodiscard]] static constexpr bool is_contiguous() noexcept { return true; }

  [[nodiscard]] T* data_handle() & noexcept { return data_; }
  [[nodiscard]] const T* data_handle() const& noexcept { return data_; }

  // Host access: the tensor's own device decides (no template parameter a caller could
  // set). On a temporary (rvalue) tensor, whatever would point into it (data, span, a
  // view, a slice, a reshape) is a compile error: the memory is freed at the end of the
  // statement. Elements and item() of a temporary are returned by value.
  [[nodiscard]] T* data() & noexcept { return view().data(); }
  [[nodiscard]] const T* data() const& noexcept { return view().data(); }
  [[nodiscard]] std::span<T> span() & { return view().span(); }
  [[nodiscard]] std::span<const T> span() const& { return view().span(); }
  template <class... I>
  T& operator()(I... idx) & {
    return view()(idx...);
  }
  template <class... I>
  const T& operator()(I... idx) const& {
    return view()(idx...);
  }
  template <class... I>
  T operator()(I... idx) const&& {
    return view()(idx...);
  }
  T item() const { return view().item(); }

  // (A tensor converts to its views through tensor_view's constructors.)
  [[nodiscard]] tensor_view<T, D, R> view() & noexcept { return {detail::raw_view_key{}, data_, shape_, gpu_}; }
  [[nodiscard]] tensor_view<const T, D, R> view() const& noexcept { return {detail::raw_view_key{}, data_, shape_, gpu_}; }

  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const extents<R2>& s) & {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<const T, D, R2> reshape(const extents<R2>& s) const& {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const index_t (&s)[R2]) & {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<const T, D, R2> reshape(const index_t (&s)[R2]) const& {
    return view().reshape(s);
  }
  [[nodiscard]] tensor_view<T, D, R> slice(index_t begin, index_t end) & {
    return view().slice(begin, end);
  }
  [[nodiscard]] tensor_view<const T, D, R> slice(index_t begin, index_t end) const& {
    return view().slice(begin, end);
  }

  // ---- views of a temporary: each would dangle at the end of the statement -------------
  // Prevents: heap-use-after-free through ones<float, cpu>({4}).slice(0, 2) and the like.
  tensor_view<T, D, R> view() const&& {
    static_assert(detail::always_false<T>, LOCUS_TEMPORARY_VIEW_MESSAGE("view()"));
    return {};
  }
  template <class S>
  tensor_view<T, D, R> reshape(const S&) const&& {
    static_assert(detail::always_false<S>, LOCUS_TEMPORARY_VIEW_MESSAGE("reshape()"));
    return {};
  }
  template <std::size_t R2>
  tensor_view<T, D, R> reshape(const index_t (&)[R2]) const&& {
    static_assert(detail::always_false_v<R2>, LOCUS_TEMPORARY_VIEW_MESSAGE("reshape()"));
    return {};
  }
  tensor_view<T, D, R> slice(index_t, index_t) const&& {
    static_assert(detail::always_false<T>, LOCUS_TEMPORARY_VIEW_MESSAGE("slice()"));
    return {};
  }
  T* data() const&& noexcept {
    static_assert(detail::always_false<T>, LOCUS_TEMPORARY_VIEW_MESSAGE("data()"));
    return nullptr;
  }
  T* data_handle() const&& noexcept {
    static_assert(detail::always_false<T>, LOCUS_TEMPORARY_VIEW_MESSAGE("data_handle()"));
    return nullptr;
  }
  std::span<T> span() const&& {
    static_assert(detail::always_false<T>, LOCUS_TEMPORARY_VIEW_MESSAGE("span()"));
    return {};
  }

  // Prevents: t.data<locus::cpu>() on a cuda tensor (host access is the tensor's own
  // device's to decide, never the caller's).
  template <class Dev>
  T* data() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("data"));
    return nullptr;
  }
  template <class Dev>
  std::span<T> span() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("span"));
    return {};
  }
  template <class Dev>
  T item() const {
    static_assert(detail::always_false<Dev>, LOCUS_HOST_ACCESS_ARGUMENT_MESSAGE("item"));
    return {};
  }

  /// A deep copy on the same device (defined in transfer/copy.hpp).
  [[nodiscard]] tensor clone() const;

 private:
  template <class T2, class D2, std::size_t R2, bool FromTensor>
  static constexpr void reject_conversion() {
    if constexpr (detail::require_assign_device<D2, D>() &&
                  detail::require_same_copy_dtype<T2, T>() &&
                  detail::require_assign_rank<R, R2>()) {
      static_assert(FromTensor || detail::always_false<T2>,
                    "locus: building a tensor from a tensor_view would copy its memory; "
                    "write v.clone() (same device) or locus::to<D>(v) for an explicit copy");
    }
  }

  void release() noexcept {
    if (data_) detail::allocator_for<D>().deallocate(data_);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  extents<R> shape_{};
  int gpu_ = -1;
};

/// Swaps two tensors of the same type (found by ADL: `using std::swap; swap(a, b);` or
/// `swap(a, b)`); nothing is copied.
template <class T, class D, std::size_t R>
void swap(tensor<T, D, R>& a, tensor<T, D, R>& b) noexcept {
  tensor<T, D, R> t = std::move(a);
  a = std::move(b);
  b = std::move(t);
}
// Prevents: a candidate list for swap(cpu_tensor, cuda_tensor). (std::swap(a, b), named
// with std::, never sees this overload: the standard forbids adding one to std, so there
// the compiler's own "no matching function" is the error.)
template <class T1, class D1, std::size_t R1, class T2, class D2, std::size_t R2>
void swap(tensor<T1, D1, R1>&, tensor<T2, D2, R2>&) {
  static_assert(detail::always_false<T1>,
                "locus: cannot swap tensors of different devices, dtypes or ranks: each keeps its "
                "type; transfer explicitly (b = locus::to<D>(a)), cast (locus::cast<T>(a)) or "
                "reshape first");
}

/// The one door through which a raw pointer becomes a typed view: the caller vouches
/// that p points to memory of device D that holds the given shape (with these strides,
/// in elements) for as long as the view is used. locus checks what it can: extents and
/// strides are >= 0, the element count and the byte size fit index_t, and p is not
/// null when there are elements (shape_error otherwise). It cannot check that the
/// memory is D's: a device pointer typed as cpu is still a crash.
template <Device D, class T, std::size_t R>
[[nodiscard]] tensor_view<T, D, R> unsafe_view(T* p, const extents<R>& shape, const extents<R>& strides) {
  static_assert(Dtype<std::remove_cv_t<T>>, "locus: unsafe_view's element type must be one of f32, "
                                            "f64, i32, i64, u8, bool, f16, bf16 (optionally const)");
  const index_t n = detail::checked_numel(shape, sizeof(T));
  for (std::size_t a = 0; a < R; ++a)
    if (strides[a] < 0)
      throw shape_error("locus: unsafe_view with a negative stride (" + std::to_string(strides[a]) +
                        " on axis " + std::to_string(a) + "); strides count elements and are >= 0");
  if (n > 0) {
    // the last element's offset must fit index_t as well
    index_t last = 0;
    for (std::size_t a = 0; a < R; ++a) {
      if (shape[a] > 1 && strides[a] > (std::numeric_limits<index_t>::max() - last) / (shape[a] - 1))
        throw shape_error("locus: unsafe_view of shape " + detail::shape_string(shape) +
                          " with strides " + detail::shape_string(strides) +
                          ": the last element's offset overflows index_t");
      last += strides[a] * (shape[a] - 1);
    }
    // and the byte just past the last element (what overlap and range checks compute)
    if (last >= std::numeric_limits<index_t>::max() / static_cast<index_t>(sizeof(T)))
      throw shape_error("locus: unsafe_view of shape " + detail::shape_string(shape) + " with strides " +
                        detail::shape_string(strides) + ": the last element's byte offset overflows index_t");
    if (p == nullptr)
      throw shape_error("locus: unsafe_view of a null pointer with shape " + detail::shape_string(shape) +
                        " (" + std::to_string(n) + " elements)");
    if constexpr (!std::is_const_v<T>) {
      // A writable view must not map two elements to one address (a write through it
      // would race with itself, as PyTorch's internal-overlap check says): axes taken
      // by increasing stride, each stride must pass everything the smaller ones reach.
      std::array<std::size_t, R> order{};
      for (std::size_t a = 0; a < R; ++a) order[a] = a;
      for (std::size_t i = 1; i < R; ++i)  // insertion sort by stride (R is small; no <algorithm>)
        for (std::size_t j = i; j > 0 && strides[order[j]] < strides[order[j - 1]]; --j) {
          const std::size_t k = order[j];
          order[j] = order[j - 1];
          order[j - 1] = k;
        }
      index_t reach = 0;
      for (std::size_t a : order) {
        if (shape[a] <= 1) continue;
        if (strides[a] <= reach)
          throw shape_error("locus: unsafe_view of shape " + detail::shape_string(shape) + " with strides " +
                            detail::shape_string(strides) +
                            " maps two elements to one address; a writable view must not overlap "
                            "itself (a view of const elements may, e.g. a stride of 0 to broadcast)");
        reach += strides[a] * (shape[a] - 1);
      }
    }
  }
  // cuda: the GPU the runtime says holds p, so that operations can check it
  return tensor_view<T, D, R>(detail::raw_view_key{}, p, shape, strides, detail::pointer_gpu<D>(p));
}
template <Device D, class T, std::size_t R>
[[nodiscard]] tensor_view<T, D, R> unsafe_view(T* p, const extents<R>& shape) {
  (void)detail::checked_numel(shape, sizeof(T));
  return unsafe_view<D>(p, shape, detail::contiguous_strides(shape));
}
template <Device D, class T, std::size_t R>
[[nodiscard]] tensor_view<T, D, R> unsafe_view(T* p, const index_t (&shape)[R]) {
  return unsafe_view<D>(p, detail::to_extents(shape));
}
template <Device D, class T, std::size_t R>
[[nodiscard]] tensor_view<T, D, R> unsafe_view(T* p, const index_t (&shape)[R], const index_t (&strides)[R]) {
  return unsafe_view<D>(p, detail::to_extents(shape), detail::to_extents(strides));
}

namespace detail {
/// The bytes a strided view spans, [lo, hi); empty for an empty view.
struct byte_range {
  std::uintptr_t lo = 0, hi = 0;
};
template <std::size_t R>
byte_range range_of(const void* p, const extents<R>& shape, const extents<R>& strides,
                    std::size_t elem) noexcept {
  index_t lo = 0, hi = 0;
  for (std::size_t i = 0; i < R; ++i) {
    if (shape[i] <= 0) return {};
    const index_t off = (shape[i] - 1) * strides[i];
    (off < 0 ? lo : hi) += off;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  return {base + static_cast<std::uintptr_t>(lo * static_cast<index_t>(elem)),
          base + static_cast<std::uintptr_t>((hi + 1) * static_cast<index_t>(elem))};
}
inline bool ranges_overlap(const byte_range& a, const byte_range& b) noexcept {
  return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}
template <class T, class D, std::size_t R>
byte_range range_of(const tensor_view<T, D, R>& v) noexcept {
  return range_of(static_cast<const void*>(v.data_handle()), v.shape(), v.strides(), sizeof(T));
}

// ---- one operation, one GPU ------------------------------------------------------------
/// The GPUs an operation's operands live on: the first known one and, if any, another.
struct gpu_seen {
  int first = -1;
  int other = -1;
  void add(int g) noexcept {
    if (g < 0) return;  // a host device, or memory whose GPU is not known
    if (first < 0) first = g;
    else if (g != first && other < 0) other = g;
  }
};

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_gpu_mismatch(const char* what, int a, int b, int current) {
  if (b >= 0)
    throw device_error(format("locus: %s has operands on GPU %d and on GPU %d (GPU %d is current); one "
                              "operation runs on one GPU: move one first, locus::to_device(t, %d), or "
                              "compute each part on its own GPU under locus::device_guard g(n)",
                              what, a, b, current, current),
                       a, b);
  throw device_error(format("locus: %s: the operands live on GPU %d, but GPU %d is current, where the "
                            "work would launch; make their GPU current for this work "
                            "(locus::device_guard g(%d);), or move them: locus::to_device(t, %d)",
                            what, a, current, a, current),
                     a, current);
}

/// Work on cuda launches on the current GPU: every operand and destination whose GPU is
/// known must live there, checked before anything is launched or changed. Host devices
/// have nothing to check (compiled away).
template <class D>
inline void check_gpus(const char* what, const gpu_seen& s) {
  if constexpr (std::is_same_v<typename D::allocator, cuda_allocator_kind>) {
    if (s.first < 0) return;
    const int current = allocation_gpu<D>();
    if (s.other >= 0) throw_gpu_mismatch(what, s.first, s.other, current);
    if (s.first != current) throw_gpu_mismatch(what, s.first, -1, current);
  } else {
    (void)what, (void)s;
  }
}
/// The same for tensors and views.
template <class D, class... V>
inline void check_same_gpu(const char* what, const V&... operands) {
  if constexpr (std::is_same_v<typename D::allocator, cuda_allocator_kind>) {
    gpu_seen s;
    (s.add(operands.device_index()), ...);
    check_gpus<D>(what, s);
  } else {
    (void)what, ((void)operands, ...);
  }
}

/// locus's own door for memory it allocated (no checks: the shapes are its own).
template <class D, class T, std::size_t R>
tensor_view<T, D, R> raw_view(T* p, const extents<R>& shape) noexcept {
  return tensor_view<T, D, R>(raw_view_key{}, p, shape);
}
template <class D, class T, std::size_t R>
tensor_view<T, D, R> raw_view(T* p, const extents<R>& shape, const extents<R>& strides) noexcept {
  return tensor_view<T, D, R>(raw_view_key{}, p, shape, strides);
}
/// ... and of memory on a known GPU (`gpu`: a tensor's device_index()).
template <class D, class T, std::size_t R>
tensor_view<T, D, R> raw_view(T* p, const extents<R>& shape, int gpu) noexcept {
  return tensor_view<T, D, R>(raw_view_key{}, p, shape, gpu);
}
}  // namespace detail

}  // namespace locus

#include "../transfer/copy.hpp"  // copy(), to<D>() and tensor::clone()
