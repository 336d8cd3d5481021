// tensor<T, D, R> owns memory on device D; tensor_view<T, D, R> is the non-owning
// counterpart (pointer, shape, strides). dtype, device and rank are in the type, so
// mixing them does not compile; element access, span() and data() exist only where
// host code may read the memory. tensor is move-only: a deep copy is clone() or
// to<D2>(), never a hidden copy constructor.
#pragma once

#include <cstddef>
#include <cstring>
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
      throw index_error("locus: index " + std::to_string(ids[a]) + " out of range for axis " +
                        std::to_string(a) + " of shape " + shape_string(shape));
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
    throw shape_error("locus: reshape of a non-contiguous view of shape " + shape_string(from) +
                      "; clone() it first (a strided cuda view: locus::eval(v) in a .cu file)");
  const index_t n = checked_numel(to, 1);
  if (n != numel_of(from))
    throw shape_error("locus: cannot reshape " + shape_string(from) + " (" +
                      std::to_string(numel_of(from)) + " elements) to " + shape_string(to) +
                      " (" + std::to_string(n) + " elements)");
  return to;
}

inline void check_slice(index_t begin, index_t end, index_t extent) {
  if (begin < 0 || end < begin || end > extent)
    throw shape_error("locus: slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") is outside axis 0 of extent " + std::to_string(extent));
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
  tensor_view(T* data, const extents<R>& shape, const extents<R>& strides) noexcept
      : data_(data), shape_(shape), strides_(strides) {}
  tensor_view(T* data, const extents<R>& shape) noexcept
      : data_(data), shape_(shape), strides_(detail::contiguous_strides(shape)) {}

  /// A view of T converts to a view of const T.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  tensor_view(const tensor_view<U, D, R>& other) noexcept
      : data_(other.data_handle()), shape_(other.shape()), strides_(other.strides()) {}

  [[nodiscard]] const extents<R>& shape() const noexcept { return shape_; }
  [[nodiscard]] const extents<R>& strides() const noexcept { return strides_; }
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

  /// Host pointer to the first element. Host-accessible devices only.
  template <class Dev = D>
  [[nodiscard]] T* data() const noexcept {
    if constexpr (detail::require_host_accessible<Dev>()) return data_;
    else return nullptr;
  }

  /// The elements as a span. Host-accessible devices only; the view must be
  /// contiguous (shape_error otherwise).
  template <class Dev = D>
  [[nodiscard]] std::span<T> span() const {
    if constexpr (detail::require_host_accessible<Dev>()) {
      if (!is_contiguous())
        throw shape_error("locus: span() of a non-contiguous view of shape " +
                          detail::shape_string(shape_) + "; clone() it first");
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
  template <class Dev = D>
  value_type item() const {
    static_assert(R == 0, "locus: item() reads a rank-0 tensor, but this one has rank >= 1; index the "
                          "element with t(i, ...), or reduce first, e.g. locus::sum(t).item()");
    if constexpr (detail::require_host_accessible<Dev>()) return *data_;
    else return value_type{};
  }

  [[nodiscard]] tensor_view view() const noexcept { return *this; }

  tensor_view(const tensor_view&) noexcept = default;
  tensor_view& operator=(const tensor_view&) noexcept = default;
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
    return {data_, detail::checked_reshape(shape_, shape, is_contiguous())};
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
    return {data_ + begin * strides_[0], s, strides_};
  }

  /// A contiguous deep copy in a new tensor on the same device (defined in
  /// transfer/copy.hpp). A strided cuda view throws shape_error, as copy() does:
  /// evaluate it as an expression in a .cu file instead.
  [[nodiscard]] tensor<std::remove_const_t<T>, D, R> clone() const;

 private:
  T* data_ = nullptr;
  extents<R> shape_{};
  extents<R> strides_{};
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
  }

  /// Evaluates an expression (ops/expr.hpp) into a new tensor: one fused kernel.
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  tensor(const E& e) {
    detail::construct_from_expr(*this, e);
  }
  template <class E>
    requires std::is_base_of_v<detail::expression_tag, E>
  tensor& operator=(const E& e) {
    detail::assign_expr(*this, e);
    return *this;
  }

  tensor(tensor&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), shape_(std::exchange(other.shape_, {})) {}
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      shape_ = std::exchange(other.shape_, {});
    }
    return *this;
  }
  ~tensor() { release(); }

  // Prevents: a hidden deep copy of (GPU) memory on every pass by value.
  tensor(const tensor&) {
    static_assert(detail::always_false<T>,
                  "locus: tensor is move-only, copying it would duplicate its memory; write "
                  "t.clone() for a deep copy, std::move(t) to transfer ownership, or take a "
                  "view, a cheap non-owning handle: auto v = t.view()");
  }
  tensor& operator=(const tensor&) {
    static_assert(detail::always_false<T>,
                  "locus: tensor is move-only, copying it would duplicate its memory; write "
                  "t = u.clone() for a deep copy, std::move(u) to transfer ownership, or keep "
                  "a view instead of a tensor: auto v = u.view()");
    return *this;
  }

  /// Assigning a tensor or view of another device, dtype or rank is a compile error
  /// that names the explicit transfer or cast to write instead.
  template <class T2, class D2, std::size_t R2>
  tensor(const tensor<T2, D2, R2>&) {
    reject_conversion<T2, D2, R2, true>();
  }
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
  tensor& operator=(const tensor_view<T2, D2, R2>&) {
    reject_conversion<std::remove_cv_t<T2>, D2, R2, false>();
    return *this;
  }

  [[nodiscard]] const extents<R>& shape() const noexcept { return shape_; }
  [[nodiscard]] extents<R> strides() const noexcept { return detail::contiguous_strides(shape_); }
  [[nodiscard]] index_t extent(std::size_t axis) const { return view().extent(axis); }
  [[nodiscard]] index_t numel() const noexcept { return detail::numel_of(shape_); }
  [[nodiscard]] std::size_t size_bytes() const noexcept {
    return static_cast<std::size_t>(numel()) * sizeof(T);
  }
  [[nodiscard]] bool empty() const noexcept { return numel() == 0; }
  [[nodiscard]] static constexpr bool is_contiguous() noexcept { return true; }

  [[nodiscard]] T* data_handle() noexcept { return data_; }
  [[nodiscard]] const T* data_handle() const noexcept { return data_; }

  template <class Dev = D>
  [[nodiscard]] T* data() noexcept {
    return view().template data<Dev>();
  }
  template <class Dev = D>
  [[nodiscard]] const T* data() const noexcept {
    return view().template data<Dev>();
  }
  template <class Dev = D>
  [[nodiscard]] std::span<T> span() {
    return view().template span<Dev>();
  }
  template <class Dev = D>
  [[nodiscard]] std::span<const T> span() const {
    return view().template span<Dev>();
  }
  template <class... I>
  T& operator()(I... idx) {
    return view()(idx...);
  }
  template <class... I>
  const T& operator()(I... idx) const {
    return view()(idx...);
  }
  template <class Dev = D>
  T item() const {
    return view().template item<Dev>();
  }

  [[nodiscard]] tensor_view<T, D, R> view() noexcept { return {data_, shape_}; }
  [[nodiscard]] tensor_view<const T, D, R> view() const noexcept { return {data_, shape_}; }
  operator tensor_view<T, D, R>() noexcept { return view(); }
  operator tensor_view<const T, D, R>() const noexcept { return view(); }

  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const extents<R2>& s) {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<const T, D, R2> reshape(const extents<R2>& s) const {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<T, D, R2> reshape(const index_t (&s)[R2]) {
    return view().reshape(s);
  }
  template <std::size_t R2>
  [[nodiscard]] tensor_view<const T, D, R2> reshape(const index_t (&s)[R2]) const {
    return view().reshape(s);
  }
  [[nodiscard]] tensor_view<T, D, R> slice(index_t begin, index_t end) {
    return view().slice(begin, end);
  }
  [[nodiscard]] tensor_view<const T, D, R> slice(index_t begin, index_t end) const {
    return view().slice(begin, end);
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
};

}  // namespace locus

#include "../transfer/copy.hpp"  // copy(), to<D>() and tensor::clone()
