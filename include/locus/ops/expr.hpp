// Lazy elementwise expressions. `a * x + b`, `relu(...)`, comparisons, where() and
// cast<T>() build a small tree of nodes (operands held as views: pointer, shape,
// strides); assigning the tree to a tensor or view, or locus::eval(tree), runs it as
// ONE kernel over the output (one pass over memory, on the operands' device, through
// backend/launch.hpp). Devices and dtypes are checked when the tree is built: mixing
// them anywhere, however deep, is a compile error naming both. Shapes broadcast by
// NumPy's rules, checked at run time (shape_error naming both shapes).
//
// Scalars take the tensor's dtype and are held in its compute type (f32 for f16 and
// bf16, so `h * 1e5f / 1e5f` is exact); they never change the result's dtype. A
// floating scalar (float, double, f16, bf16) with an integer or bool tensor does not
// compile (it would lose its fraction: cast the tensor, locus::cast<float>(t) * 0.5f);
// an integer scalar outside the tensor's dtype (u8 + 300) is a locus::value_error.
// Integer arithmetic wraps in two's complement (as PyTorch's does), division truncates
// toward zero, MIN / -1 is MIN, and a zero divisor is a value_error raised before any
// element is written (the divisor is scanned first, on its device).
//
// Operands are held by reference (as views), like Eigen's expressions: keep the
// tensors alive until the expression is evaluated (evaluate in the same statement, or
// keep named tensors).
//
// Length (over 600 lines): the expression nodes, their evaluation and the operators
// that build them are one type system: a node's rules (devices, dtypes, broadcasting)
// are checked where it is built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "../backend/launch.hpp"
#include "../core/rules.hpp"
#include "../tensor/tensor.hpp"
#include "math.hpp"

namespace locus {

namespace detail {

/// Device of a scalar operand: it adopts its partner's.
struct no_device {};

/// Result of an operation whose type rule already failed (and printed its message):
/// it absorbs every further operation silently, so one mistake gives one error.
struct invalid_expr : expression_tag {
  using value_type = float;
  using device = no_device;
  static constexpr std::size_t rank = 0;
};

template <class X>
inline constexpr bool is_expr_v = std::is_base_of_v<expression_tag, std::remove_cvref_t<X>>;
template <class X>
inline constexpr bool is_invalid_v = std::is_same_v<std::remove_cvref_t<X>, invalid_expr>;
template <class X>
inline constexpr bool is_operand_v =
    is_expr_v<X> || tensor_traits<std::remove_cvref_t<X>>::is_tensor ||
    tensor_traits<std::remove_cvref_t<X>>::is_view;
template <class X>
inline constexpr bool is_scalar_v =
    std::is_arithmetic_v<std::remove_cvref_t<X>> || is_half_v<std::remove_cvref_t<X>>;

template <std::size_t N>
struct index_array {
  index_t v[N > 0 ? N : 1];
};

/// NumPy broadcasting of two shapes (aligned at the last axis).
template <std::size_t RA, std::size_t RB>
extents<(RA > RB ? RA : RB)> broadcast_shapes(const extents<RA>& a, const extents<RB>& b) {
  constexpr std::size_t RO = RA > RB ? RA : RB;
  extents<RO> out{};
  for (std::size_t k = 0; k < RO; ++k) {
    const index_t ea = k < RO - RA ? 1 : a[k - (RO - RA)];
    const index_t eb = k < RO - RB ? 1 : b[k - (RO - RB)];
    if (ea != eb && ea != 1 && eb != 1)
      throw shape_error("locus: shapes " + shape_string(a) + " and " + shape_string(b) +
                        " cannot be broadcast together (axis " + std::to_string(k) + ": " +
                        std::to_string(ea) + " vs " + std::to_string(eb) + ")");
    out[k] = ea == 1 ? eb : ea;
  }
  return out;
}

// ---- evaluators: trivially copyable functors that run on host and device ------------

template <class T, std::size_t RO>
struct leaf_eval {
  const T* p;
  index_array<RO> st;  // strides aligned to the output's axes; 0 where broadcast
  LOCUS_HOST_DEVICE compute_t<T> at_linear(index_t i) const { return load(p[i]); }
  LOCUS_HOST_DEVICE compute_t<T> at_index(const index_t* idx) const {
    index_t off = 0;
    for (std::size_t k = 0; k < RO; ++k) off += idx[k] * st.v[k];
    return load(p[off]);
  }
};

template <class C>
struct scalar_eval {
  C value;
  LOCUS_HOST_DEVICE C at_linear(index_t) const { return value; }
  LOCUS_HOST_DEVICE C at_index(const index_t*) const { return value; }
};

template <class Op, class A>
struct unary_eval {
  Op op;
  A a;
  LOCUS_HOST_DEVICE auto at_linear(index_t i) const { return op(a.at_linear(i)); }
  LOCUS_HOST_DEVICE auto at_index(const index_t* idx) const { return op(a.at_index(idx)); }
};

template <class Op, class A, class B>
struct binary_eval {
  Op op;
  A a;
  B b;
  LOCUS_HOST_DEVICE auto at_linear(index_t i) const { return op(a.at_linear(i), b.at_linear(i)); }
  LOCUS_HOST_DEVICE auto at_index(const index_t* idx) const {
    return op(a.at_index(idx), b.at_index(idx));
  }
};

template <class C, class A, class B>
struct where_eval {
  C c;
  A a;
  B b;
  LOCUS_HOST_DEVICE auto at_linear(index_t i) const {
    return c.at_linear(i) ? a.at_linear(i) : b.at_linear(i);
  }
  LOCUS_HOST_DEVICE auto at_index(const index_t* idx) const {
    return c.at_index(idx) ? a.at_index(idx) : b.at_index(idx);
  }
};

template <class U, class A>
struct cast_eval {
  A a;
  LOCUS_HOST_DEVICE compute_t<U> at_linear(index_t i) const { return load(store<U>(a.at_linear(i))); }
  LOCUS_HOST_DEVICE compute_t<U> at_index(const index_t* idx) const {
    return load(store<U>(a.at_index(idx)));
  }
};

// ---- expression nodes (host side: operands, shapes, device and dtype) ---------------

template <class T, class D, std::size_t R>
struct leaf_expr : expression_tag {
  using value_type = std::remove_cv_t<T>;
  using device = D;
  static constexpr std::size_t rank = R;
  tensor_view<const value_type, D, R> v;

  extents<R> shape() const { return v.shape(); }
  void collect_gpus(gpu_seen& s) const noexcept { s.add(v.device_index()); }
  template <std::size_t RO>
  bool linear_ok(const extents<RO>& out) const {
    if constexpr (RO != R) return false;
    else return v.is_contiguous() && v.shape() == out;
  }
  /// Does evaluating into dst read memory that dst writes, other than each element's
  /// own value (same address, same strides after broadcasting)? Then the kernel could
  /// read an element another thread has already overwritten.
  template <class U, class D2, std::size_t RO>
  bool aliases(const tensor_view<U, D2, RO>& dst) const {
    if (!ranges_overlap(range_of(v), range_of(dst))) return false;
    if (static_cast<const void*>(v.data_handle()) != static_cast<const void*>(dst.data_handle())) return true;
    if constexpr (RO < R) {
      return true;
    } else {
      for (std::size_t k = 0; k < RO; ++k) {
        if (dst.shape()[k] == 1) continue;  // one position: the stride is never used
        const index_t s = k < RO - R ? 0 : (v.shape()[k - (RO - R)] == 1 ? 0 : v.strides()[k - (RO - R)]);
        if (s != dst.strides()[k]) return true;
      }
      return false;
    }
  }
  template <std::size_t RO>
  leaf_eval<value_type, RO> make_eval(const extents<RO>& out) const {
    leaf_eval<value_type, RO> e{v.data_handle(), {}};
    for (std::size_t k = 0; k < RO; ++k) {
      if (k < RO - R) {
        e.st.v[k] = 0;
      } else {
        const std::size_t a = k - (RO - R);
        e.st.v[k] = (v.shape()[a] == 1 && out[k] != 1) ? 0 : v.strides()[a];
      }
    }
    return e;
  }
};

/// A scalar operand meeting dtype T: held in T's compute type (f32 for f16 and bf16:
/// the scalar joins the f32 computation and is never rounded to 16 bits first).
template <class T>
struct scalar_expr : expression_tag {
  using value_type = T;
  using device = no_device;
  static constexpr std::size_t rank = 0;
  compute_t<T> value;
  extents<0> shape() const { return {}; }
  void collect_gpus(gpu_seen&) const noexcept {}
  template <std::size_t RO>
  bool linear_ok(const extents<RO>&) const { return true; }
  template <class V>
  bool aliases(const V&) const { return false; }
  template <std::size_t RO>
  scalar_eval<compute_t<T>> make_eval(const extents<RO>&) const { return {value}; }
};

template <class Op, class A, class Result>
struct unary_expr : expression_tag {
  using value_type = Result;
  using device = typename A::device;
  static constexpr std::size_t rank = A::rank;
  Op op;
  A a;
  auto shape() const { return a.shape(); }
  void collect_gpus(gpu_seen& s) const noexcept { a.collect_gpus(s); }
  template <std::size_t RO>
  bool linear_ok(const extents<RO>& out) const { return a.linear_ok(out); }
  template <class V>
  bool aliases(const V& dst) const { return a.aliases(dst); }
  template <std::size_t RO>
  auto make_eval(const extents<RO>& out) const {
    return unary_eval<Op, decltype(a.make_eval(out))>{op, a.make_eval(out)};
  }
};

template <class DA, class DB>
using common_device_t = std::conditional_t<std::is_same_v<DA, no_device>, DB, DA>;

template <class T>
[[noreturn]] void throw_division_by_zero() {
  throw value_error(std::string("locus: integer division by zero (the ") + std::string(dtype_name<T>) +
                    " divisor holds a 0); PyTorch raises ZeroDivisionError here too: keep zeros out of the "
                    "divisor, e.g. a / locus::where(b == 0, 1, b), or divide in floating point: "
                    "locus::cast<float>(a) / locus::cast<float>(b)");
}

/// Sets *flag where the divisor's evaluator is 0 at position i of the output (row-major):
/// an atomic store (threads on the host, CUDA threads) of the same value.
template <class Ev, std::size_t RO>
struct zero_divisor_scan {
  Ev ev;
  index_array<RO> shape;
  int* flag;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    index_t idx[RO > 0 ? RO : 1];
    for (std::size_t k = RO; k-- > 0;) {
      idx[k] = i % shape.v[k];
      i /= shape.v[k];
    }
    if (ev.at_index(idx) == 0) {
#if defined(__CUDA_ARCH__)
      atomicExch(flag, 1);
#else
      __atomic_store_n(flag, 1, __ATOMIC_RELAXED);
#endif
    }
  }
};

/// Integer division: before any kernel divides, look for a zero in the divisor over the
/// output (a scan on the operands' device; cuda reads one flag back). PyTorch, eager,
/// raises for any zero divisor too, so where(b != 0, a / b, 0) raises in both.
template <class D, class T, class Ev, std::size_t RO>
void check_divisor(const Ev& ev, const extents<RO>& out) {
  if constexpr (std::is_same_v<Ev, scalar_eval<compute_t<T>>>) {
    if (ev.value == compute_t<T>(0)) throw_division_by_zero<T>();
  } else {
    const index_t n = numel_of(out);
    if (n == 0) return;
    zero_divisor_scan<Ev, RO> k{ev, {}, nullptr};
    for (std::size_t i = 0; i < RO; ++i) k.shape.v[i] = out[i];
    int found = 0;
    if constexpr (D::host_accessible) {
      k.flag = &found;
      launch_n<D>(n, k);
    } else {
      tensor<int, D, 0> flag{extents<0>{}};
#if LOCUS_HAS_CUDA
      LOCUS_CUDA_CHECK(cudaMemsetAsync(flag.data_handle(), 0, sizeof(int), current_stream()));
#endif
      k.flag = flag.data_handle();
      launch_n<D>(n, k);
      copy_bytes<D, cpu>(&found, flag.data_handle(), sizeof(int));
    }
    if (found) throw_division_by_zero<T>();
  }
}

template <class Op, class A, class B, class Result>
struct binary_expr : expression_tag {
  using value_type = Result;
  using device = common_device_t<typename A::device, typename B::device>;
  static constexpr std::size_t rank = A::rank > B::rank ? A::rank : B::rank;
  Op op;
  A a;
  B b;
  extents<rank> shape_;
  binary_expr(Op o, A x, B y) : op(o), a(std::move(x)), b(std::move(y)), shape_(broadcast_shapes(a.shape(), b.shape())) {}
  void collect_gpus(gpu_seen& s) const noexcept {
    a.collect_gpus(s);
    b.collect_gpus(s);
  }
  extents<rank> shape() const { return shape_; }  // by value: expressions are temporaries
  template <std::size_t RO>
  bool linear_ok(const extents<RO>& out) const { return a.linear_ok(out) && b.linear_ok(out); }
  template <class V>
  bool aliases(const V& dst) const { return a.aliases(dst) || b.aliases(dst); }
  template <std::size_t RO>
  auto make_eval(const extents<RO>& out) const {
    auto eb = b.make_eval(out);
    if constexpr (std::is_same_v<Op, op::div> && !dtype_traits<typename B::value_type>::is_floating)
      check_divisor<device, typename B::value_type>(eb, out);
    return binary_eval<Op, decltype(a.make_eval(out)), decltype(eb)>{op, a.make_eval(out), eb};
  }
};

template <class C, class A, class B>
struct where_expr : expression_tag {
  using value_type = typename A::value_type;
  using device = common_device_t<typename C::device, common_device_t<typename A::device, typename B::device>>;
  static constexpr std::size_t rank =
      C::rank > A::rank ? (C::rank > B::rank ? C::rank : B::rank) : (A::rank > B::rank ? A::rank : B::rank);
  C c;
  A a;
  B b;
  extents<rank> shape_;
  where_expr(C x, A y, B z)
      : c(std::move(x)), a(std::move(y)), b(std::move(z)),
        shape_(broadcast_shapes(c.shape(), broadcast_shapes(a.shape(), b.shape()))) {}
  void collect_gpus(gpu_seen& s) const noexcept {
    c.collect_gpus(s);
    a.collect_gpus(s);
    b.collect_gpus(s);
  }
  extents<rank> shape() const { return shape_; }  // by value: expressions are temporaries
  template <std::size_t RO>
  bool linear_ok(const extents<RO>& out) const {
    return c.linear_ok(out) && a.linear_ok(out) && b.linear_ok(out);
  }
  template <class V>
  bool aliases(const V& dst) const { return c.aliases(dst) || a.aliases(dst) || b.aliases(dst); }
  template <std::size_t RO>
  auto make_eval(const extents<RO>& out) const {
    return where_eval<decltype(c.make_eval(out)), decltype(a.make_eval(out)), decltype(b.make_eval(out))>{
        c.make_eval(out), a.make_eval(out), b.make_eval(out)};
  }
};

template <class U, class A>
struct cast_expr : expression_tag {
  using value_type = U;
  using device = typename A::device;
  static constexpr std::size_t rank = A::rank;
  A a;
  auto shape() const { return a.shape(); }
  void collect_gpus(gpu_seen& s) const noexcept { a.collect_gpus(s); }
  template <std::size_t RO>
  bool linear_ok(const extents<RO>& out) const { return a.linear_ok(out); }
  template <class V>
  bool aliases(const V& dst) const { return a.aliases(dst); }
  template <std::size_t RO>
  auto make_eval(const extents<RO>& out) const {
    return cast_eval<U, decltype(a.make_eval(out))>{a.make_eval(out)};
  }
};

// ---- building nodes -------------------------------------------------------------------

template <class X>
auto as_view_const(const X& x) {
  using tr = tensor_traits<std::remove_cvref_t<X>>;
  if constexpr (tr::is_view) return tensor_view<const typename tr::value_type, typename tr::device, tr::rank>(raw_view_key{}, x.data_handle(), x.shape(), x.strides(), x.device_index());
  else return x.view();
}

/// Tensor or view -> leaf; expression -> itself.
template <class X>
auto to_expr(const X& x) {
  if constexpr (is_expr_v<X>) {
    return x;
  } else {
    using tr = tensor_traits<std::remove_cvref_t<X>>;
    using V = typename tr::value_type;
    return leaf_expr<V, typename tr::device, tr::rank>{{}, tensor_view<const V, typename tr::device, tr::rank>(as_view_const(x))};
  }
}

template <class X>
using expr_of_t = decltype(to_expr(std::declval<const X&>()));


/// Checks the device and dtype rules for two operands (either may be a scalar).
template <class EA, class EB>
constexpr bool operands_compatible() {
  using DA = typename EA::device;
  using DB = typename EB::device;
  if constexpr (!std::is_same_v<DA, no_device> && !std::is_same_v<DB, no_device>) {
    if constexpr (!require_same_operand_device<DA, DB>()) return false;
    else return require_same_operand_dtype<typename EA::value_type, typename EB::value_type>();
  } else {
    return true;
  }
}

/// The scalar s as an operand meeting dtype T, in T's compute type. Integer dtypes: the
/// scalar must lie in T's range (value_error otherwise: 300 with a u8 tensor would wrap
/// to 44). Floating scalars never get here for integer dtypes (require_scalar_dtype).
template <class T, class S>
scalar_expr<T> scalar_operand(const S& s) {
  using C = compute_t<T>;
  if constexpr (dtype_traits<T>::is_floating) {
    if constexpr (is_half_v<S>) return {{}, static_cast<C>(static_cast<float>(s))};
    else return {{}, static_cast<C>(s)};
  } else {
    if (!integer_fits<T>(s)) {
      const std::string v = std::is_signed_v<S> ? std::to_string(static_cast<long long>(s))
                                                : std::to_string(static_cast<unsigned long long>(s));
      throw value_error("locus: the scalar " + v + " is outside the range of " + std::string(dtype_name<T>) +
                        " (" + dtype_range_string<T>() + "), the dtype of the tensor it meets, and would "
                        "wrap to another value; compute in a wider dtype, e.g. locus::cast<" +
                        wider_dtype_spelling<T>() + ">(t) + " + v);
    }
    if constexpr (std::is_same_v<T, bool>) return {{}, s != S(0)};
    else return {{}, static_cast<C>(s)};
  }
}

/// Operations that are not defined on a dtype (bool: -, /, pow).
template <class Op, class T>
constexpr bool require_op_dtype() {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, bool> &&
                (std::is_same_v<Op, op::sub> || std::is_same_v<Op, op::div> || std::is_same_v<Op, op::pow>)) {
    static_assert(always_false<Op>,
                  "locus: -, / and pow are not defined for bool tensors (PyTorch refuses - on bool too); "
                  "bool has + (or), * (and), comparisons, maximum, minimum and where: for xor write a != b, "
                  "or compute in integers, e.g. locus::cast<locus::i32>(mask) - 1");
    return false;
  } else if constexpr (std::is_same_v<std::remove_cv_t<T>, bool> && std::is_same_v<Op, op::neg>) {
    static_assert(always_false<Op>,
                  "locus: negation is not defined for a bool tensor (PyTorch refuses it too); for logical "
                  "not write mask == false, or negate integers: -locus::cast<locus::i32>(mask)");
    return false;
  } else {
    return true;
  }
}

/// The compile-time rules of scalar S meeting a T operand under Op, each failing alone.
template <class Op, class S, class T>
constexpr bool scalar_rules_ok() {
  if constexpr (!require_scalar_dtype<S, T>()) return false;
  else return require_op_dtype<Op, T>();
}

/// Run-time rules of a scalar right operand: an integer divided by 0, an integer to a
/// negative power (PyTorch: "Integers to negative integer powers are not allowed").
template <class Op, class T, class S>
void check_scalar_right(const S& s) {
  if constexpr (!dtype_traits<T>::is_floating && std::is_same_v<Op, op::div>) {
    if (s == S(0)) throw_division_by_zero<T>();
  } else if constexpr (!dtype_traits<T>::is_floating && std::is_same_v<Op, op::pow> && std::is_signed_v<S>) {
    if (s < S(0))
      throw value_error("locus: an integer tensor to a negative power (" + std::to_string(static_cast<long long>(s)) +
                        ") is not an integer (PyTorch refuses it too); compute in floating point: "
                        "locus::pow(locus::cast<float>(t), " + std::to_string(static_cast<long long>(s)) + ")");
  }
}

template <class Op, bool Compare, class A, class B>
auto make_binary(const A& a, const B& b) {
  if constexpr (is_invalid_v<A> || is_invalid_v<B>) {
    return invalid_expr{};
  } else if constexpr (is_scalar_v<A> && is_scalar_v<B>) {
    static_assert(always_false<A>, "locus: an elementwise operation needs at least one tensor operand");
    return invalid_expr{};
  } else if constexpr (is_scalar_v<A>) {
    using EB = expr_of_t<B>;
    using T = typename EB::value_type;
    using R = std::conditional_t<Compare, bool, T>;
    if constexpr (scalar_rules_ok<Op, A, T>())
      return binary_expr<Op, scalar_expr<T>, EB, R>(Op{}, scalar_operand<T>(a), to_expr(b));
    else
      return invalid_expr{};
  } else if constexpr (is_scalar_v<B>) {
    using EA = expr_of_t<A>;
    using T = typename EA::value_type;
    using R = std::conditional_t<Compare, bool, T>;
    if constexpr (scalar_rules_ok<Op, B, T>()) {
      auto s = scalar_operand<T>(b);
      check_scalar_right<Op, T>(b);
      return binary_expr<Op, EA, scalar_expr<T>, R>(Op{}, to_expr(a), s);
    } else {
      return invalid_expr{};
    }
  } else {
    using EA = expr_of_t<A>;
    using EB = expr_of_t<B>;
    if constexpr (!operands_compatible<EA, EB>()) {
      return invalid_expr{};
    } else if constexpr (!require_op_dtype<Op, typename EA::value_type>()) {
      return invalid_expr{};
    } else {
      using R = std::conditional_t<Compare, bool, typename EA::value_type>;
      return binary_expr<Op, EA, EB, R>(Op{}, to_expr(a), to_expr(b));
    }
  }
}

template <class Op, class A>
auto make_unary(const A& a) {
  if constexpr (is_invalid_v<A>) {
    return invalid_expr{};
  } else {
    using EA = expr_of_t<A>;
    if constexpr (require_op_dtype<Op, typename EA::value_type>())
      return unary_expr<Op, EA, typename EA::value_type>{{}, Op{}, to_expr(a)};
    else
      return invalid_expr{};
  }
}

template <class Op, class A>
auto make_float_unary(const A& a) {
  if constexpr (is_invalid_v<A>) {
    return invalid_expr{};
  } else {
    using T = typename expr_of_t<A>::value_type;
    static_assert(dtype_traits<T>::is_floating,
                  "locus: this function needs a floating-point dtype (f32, f64, f16, bf16); "
                  "convert integers first with locus::cast<float>(x)");
    return make_unary<Op>(a);
  }
}

// ---- evaluation -------------------------------------------------------------------------

template <class T, std::size_t RO, class Ev>
struct assign_linear_kernel {
  T* out;
  Ev ev;
  LOCUS_HOST_DEVICE void operator()(index_t i) const { out[i] = store<T>(ev.at_linear(i)); }
};

template <class T, std::size_t RO, class Ev>
struct assign_strided_kernel {
  T* out;
  index_array<RO> shape;
  index_array<RO> ost;
  Ev ev;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    index_t idx[RO > 0 ? RO : 1];
    index_t off = 0;
    for (std::size_t k = RO; k-- > 0;) {
      idx[k] = i % shape.v[k];
      i /= shape.v[k];
      off += idx[k] * ost.v[k];
    }
    out[off] = store<T>(ev.at_index(idx));
  }
  /// Elements lo .. hi-1 on the host (launch_n's blocks): the index decomposed once, then
  /// stepped like an odometer, so a transpose or a strided view costs no division per
  /// element (a profile of the GPT job found a third of its time in those divisions).
  void block(index_t lo, index_t hi) const {
    if (lo >= hi) return;
    if constexpr (RO == 0) {
      out[0] = store<T>(ev.at_index(nullptr));
    } else {
      index_t idx[RO];
      index_t off = 0;
      index_t rest = lo;
      for (std::size_t k = RO; k-- > 0;) {
        idx[k] = rest % shape.v[k];
        rest /= shape.v[k];
        off += idx[k] * ost.v[k];
      }
      const index_t last = shape.v[RO - 1], step = ost.v[RO - 1];
      for (index_t i = lo; i < hi;) {
        // the run along the last axis from idx[RO - 1] to its end (or hi)
        const index_t run = last - idx[RO - 1] < hi - i ? last - idx[RO - 1] : hi - i;
        for (index_t j = 0; j < run; ++j) {
          out[off + j * step] = store<T>(ev.at_index(idx));
          ++idx[RO - 1];
        }
        i += run;
        off += run * step;
        // carry into the axes before the last
        if (idx[RO - 1] == last) {
          idx[RO - 1] = 0;
          off -= last * step;
          for (std::size_t k = RO - 1; k-- > 0;) {
            ++idx[k];
            off += ost.v[k];
            if (idx[k] < shape.v[k]) break;
            off -= shape.v[k] * ost.v[k];
            idx[k] = 0;
          }
        }
      }
    }
  }
};

template <class E>
struct is_host_cast_leaf : std::false_type {};
template <class U, class T, class D, std::size_t R>
struct is_host_cast_leaf<cast_expr<U, leaf_expr<T, D, R>>>
    : std::bool_constant<D::host_accessible &&
                         ((std::is_same_v<T, float> && is_half_v<U>) ||
                          (is_half_v<T> && std::is_same_v<U, float>))> {};

/// Evaluates expression e into dst (same device and dtype; e's shape must broadcast to
/// dst's shape). One kernel over dst.
template <class T, class D, std::size_t RO, class E>
void evaluate_into_checked(const tensor_view<T, D, RO>& dst, const E& e) {
  const auto full = broadcast_shapes(dst.shape(), e.shape());
  if (full != dst.shape())
    throw shape_error("locus: cannot assign an expression of shape " + shape_string(e.shape()) +
                      " to a destination of shape " + shape_string(dst.shape()) +
                      " (the destination was not changed)");
  const index_t n = dst.numel();
  if (n == 0) return;
  if (e.aliases(dst)) {
    // An operand reads dst's memory through another mapping (t += transpose(t), a
    // broadcast row of t, an overlapping view): evaluate into a temporary first.
    tensor<T, D, RO> tmp(dst.shape());
    evaluate_into_checked(tmp.view(), e);
    evaluate_into_checked(dst, leaf_expr<T, D, RO>{{}, std::as_const(tmp).view()});
    return;
  }
  if constexpr (is_host_cast_leaf<E>::value) {
    // Whole-tensor f32 <-> f16/bf16 conversion on the host: the vectorised path.
    if (dst.is_contiguous() && e.a.v.is_contiguous() && e.a.v.shape() == dst.shape()) {
      convert_n(e.a.v.data_handle(), dst.data_handle(), static_cast<std::size_t>(n));
      return;
    }
  }
  if (dst.is_contiguous() && e.linear_ok(dst.shape())) {
    launch_n<D>(n, assign_linear_kernel<T, RO, decltype(e.make_eval(dst.shape()))>{
                       dst.data_handle(), e.make_eval(dst.shape())});
  } else {
    assign_strided_kernel<T, RO, decltype(e.make_eval(dst.shape()))> k{dst.data_handle(), {}, {}, e.make_eval(dst.shape())};
    for (std::size_t i = 0; i < RO; ++i) {
      k.shape.v[i] = dst.shape()[i];
      k.ost.v[i] = dst.strides()[i];
    }
    launch_n<D>(n, k);
  }
}

/// An expression's operands (and a destination's GPU, `dst`) on the current GPU, before
/// a launch: device_error otherwise (cuda only; nothing on host devices).
template <class E>
void check_expr_gpus(const char* what, const E& e, int dst = -1) {
  using D = typename E::device;
  if constexpr (!std::is_same_v<D, no_device> &&
                std::is_same_v<typename D::allocator, cuda_allocator_kind>) {
    gpu_seen s;
    s.add(dst);
    e.collect_gpus(s);
    check_gpus<D>(what, s);
  } else {
    (void)what, (void)e, (void)dst;
  }
}

/// The rules every evaluation into an existing view checks (`view = e`, `t += e`), each
/// failing alone: nothing below a failed rule is instantiated.
template <class T, class D, std::size_t RO, class E>
void evaluate_into(const tensor_view<T, D, RO>& dst, const E& e) {
  if constexpr (std::is_const_v<T>) {
    static_assert(always_false<E>,
                  "locus: cannot assign through a view of const elements; write into a mutable "
                  "view (t.view() of a non-const tensor) or into a new tensor: auto y = locus::eval(e)");
  } else if constexpr (E::rank > RO) {
    static_assert(always_false<E>,
                  "locus: the expression has a higher rank than the destination; assigning through "
                  "a view (and +=, -=, *=, /=) broadcasts the source up to the destination's rank, "
                  "never down: reshape the source (x.reshape({n}); an expression: locus::eval(x) first) or "
                  "reduce it (locus::sum(x, axis))");
  } else {
    if constexpr (std::is_same_v<typename D::allocator, cuda_allocator_kind>) {
      // every operand and the destination on the current GPU, before the launch
      gpu_seen s;
      s.add(dst.device_index());
      e.collect_gpus(s);
      check_gpus<D>("an expression", s);
    }
    evaluate_into_checked(dst, e);
  }
}

/// Type rules for `destination = expression` (device, dtype, rank).
template <class T, class D, std::size_t R, class E, bool SameRank>
constexpr bool check_expr_assign() {
  if constexpr (is_invalid_v<E>) {
    return false;  // the operation that produced it already reported the error
  } else if constexpr (!require_assign_device<typename E::device, D>()) {
    return false;
  } else if constexpr (!require_assign_dtype<typename E::value_type, T>()) {
    return false;
  } else if constexpr (SameRank) {
    return require_assign_rank<R, E::rank>();
  } else {
    return true;
  }
}

template <class T, class D, std::size_t R, class E>
void construct_from_expr(tensor<T, D, R>& t, const E& e) {
  if constexpr (check_expr_assign<T, D, R, E, true>()) {
    tensor<T, D, R> out(e.shape());
    evaluate_into(out.view(), e);
    t = std::move(out);
  }
}

template <class T, class D, std::size_t R, class E>
void assign_expr(tensor<T, D, R>& t, const E& e) {
  if constexpr (check_expr_assign<T, D, R, E, true>()) {
    if (t.shape() == e.shape()) {
      evaluate_into(t.view(), e);  // in place; other aliasing goes through a temporary there
    } else {
      tensor<T, D, R> out(e.shape());
      evaluate_into(out.view(), e);
      t = std::move(out);
    }
  }
}

template <class T, class D, std::size_t R, class E>
void assign_expr(const tensor_view<T, D, R>& v, const E& e) {
  if constexpr (check_expr_assign<T, D, R, E, false>()) evaluate_into(v, e);  // const: see there
}

}  // namespace detail

/// Any tensor, view or expression.
template <class X>
concept Operand = detail::is_operand_v<X>;

// ---- operators ----------------------------------------------------------------------------
// Unconstrained beyond "one side is a locus operand", so that a device or dtype mix
// reaches the static_assert (whose message is the first error) instead of failing
// overload resolution with a list of candidates.
#define LOCUS_DETAIL_BINARY_OPERATOR(SYM, OP, CMP)                                           \
  template <class A, class B>                                                                \
    requires((detail::is_operand_v<A> && (detail::is_operand_v<B> || detail::is_scalar_v<B>)) || \
             (detail::is_scalar_v<A> && detail::is_operand_v<B>))                            \
  auto operator SYM(const A& a, const B& b) {                                                \
    return detail::make_binary<detail::op::OP, CMP>(a, b);                                   \
  }
LOCUS_DETAIL_BINARY_OPERATOR(+, add, false)
LOCUS_DETAIL_BINARY_OPERATOR(-, sub, false)
LOCUS_DETAIL_BINARY_OPERATOR(*, mul, false)
LOCUS_DETAIL_BINARY_OPERATOR(/, div, false)
LOCUS_DETAIL_BINARY_OPERATOR(==, eq, true)
LOCUS_DETAIL_BINARY_OPERATOR(!=, ne, true)
LOCUS_DETAIL_BINARY_OPERATOR(<, lt, true)
LOCUS_DETAIL_BINARY_OPERATOR(<=, le, true)
LOCUS_DETAIL_BINARY_OPERATOR(>, gt, true)
LOCUS_DETAIL_BINARY_OPERATOR(>=, ge, true)
#undef LOCUS_DETAIL_BINARY_OPERATOR

template <Operand A>
auto operator-(const A& a) {
  return detail::make_unary<detail::op::neg>(a);
}

#define LOCUS_DETAIL_UNARY_FUNCTION(NAME, OP)                 \
  template <Operand A>                                        \
  auto NAME(const A& a) {                                     \
    return detail::make_float_unary<detail::op::OP>(a);       \
  }
LOCUS_DETAIL_UNARY_FUNCTION(exp, exp)
LOCUS_DETAIL_UNARY_FUNCTION(log, log)
LOCUS_DETAIL_UNARY_FUNCTION(sqrt, sqrt)
LOCUS_DETAIL_UNARY_FUNCTION(rsqrt, rsqrt)
LOCUS_DETAIL_UNARY_FUNCTION(tanh, tanh)
LOCUS_DETAIL_UNARY_FUNCTION(sigmoid, sigmoid)
LOCUS_DETAIL_UNARY_FUNCTION(gelu, gelu_erf)        // exact: 0.5 x (1 + erf(x / sqrt 2))
LOCUS_DETAIL_UNARY_FUNCTION(gelu_tanh, gelu_tanh)  // the tanh approximation
#undef LOCUS_DETAIL_UNARY_FUNCTION

template <Operand A>
auto neg(const A& a) {
  return detail::make_unary<detail::op::neg>(a);
}
template <Operand A>
auto abs(const A& a) {
  return detail::make_unary<detail::op::abs>(a);
}
template <Operand A>
auto relu(const A& a) {
  return detail::make_unary<detail::op::relu>(a);
}

/// Elementwise power; either side may be a scalar.
template <class A, class B>
  requires(detail::is_operand_v<A> || detail::is_operand_v<B>)
auto pow(const A& a, const B& b) {
  return detail::make_binary<detail::op::pow, false>(a, b);
}
/// NaN-propagating elementwise maximum and minimum.
template <class A, class B>
  requires(detail::is_operand_v<A> || detail::is_operand_v<B>)
auto maximum(const A& a, const B& b) {
  return detail::make_binary<detail::op::maximum, false>(a, b);
}
template <class A, class B>
  requires(detail::is_operand_v<A> || detail::is_operand_v<B>)
auto minimum(const A& a, const B& b) {
  return detail::make_binary<detail::op::minimum, false>(a, b);
}
/// min(max(x, lo), hi).
template <Operand A, class L, class H>
auto clamp(const A& x, const L& lo, const H& hi) {
  return minimum(maximum(x, lo), hi);
}

/// cond ? a : b elementwise; cond has dtype bool, a and b share device and dtype.
template <Operand C, class A, class B>
auto where(const C& cond, const A& a, const B& b) {
  namespace d = detail;
  if constexpr (d::is_invalid_v<C> || d::is_invalid_v<A> || d::is_invalid_v<B>) {
    return d::invalid_expr{};
  } else {
    using EC = d::expr_of_t<C>;
    static_assert(std::is_same_v<typename EC::value_type, bool>,
                  "locus: where() needs a bool condition; compare first, e.g. where(x > 0, x, 0)");
    if constexpr (d::is_scalar_v<A> && d::is_scalar_v<B>) {
      static_assert(d::always_false<A>,
                    "locus: where() needs at least one tensor value operand, but both values are "
                    "scalars (the result's dtype would be a guess); make one a tensor, e.g. "
                    "locus::full<float, D>(shape, a) (where(c, 1.0f, 0.0f) is locus::cast<float>(c))");
      return d::invalid_expr{};
    } else if constexpr (d::is_scalar_v<B>) {
      using EA = d::expr_of_t<A>;
      using T = typename EA::value_type;
      if constexpr (!d::require_same_operand_device<typename EC::device, typename EA::device>())
        return d::invalid_expr{};
      else if constexpr (!d::require_scalar_dtype<B, T>())
        return d::invalid_expr{};
      else
        return d::where_expr<EC, EA, d::scalar_expr<T>>(d::to_expr(cond), d::to_expr(a), d::scalar_operand<T>(b));
    } else if constexpr (d::is_scalar_v<A>) {
      using EB = d::expr_of_t<B>;
      using T = typename EB::value_type;
      if constexpr (!d::require_same_operand_device<typename EC::device, typename EB::device>())
        return d::invalid_expr{};
      else if constexpr (!d::require_scalar_dtype<A, T>())
        return d::invalid_expr{};
      else
        return d::where_expr<EC, d::scalar_expr<T>, EB>(d::to_expr(cond), d::scalar_operand<T>(a), d::to_expr(b));
    } else {
      using EA = d::expr_of_t<A>;
      using EB = d::expr_of_t<B>;
      if constexpr (d::require_same_operand_device<typename EC::device, typename EA::device>() &&
                    d::operands_compatible<EA, EB>())
        return d::where_expr<EC, EA, EB>(d::to_expr(cond), d::to_expr(a), d::to_expr(b));
      else
        return d::invalid_expr{};
    }
  }
}

/// Converts the dtype, elementwise (rounding to nearest even into f16/bf16). The only
/// way to change dtype; on the host, a whole contiguous f32 <-> f16/bf16 tensor uses
/// the vectorised F16C/AVX2 conversion.
template <Dtype U, Operand A>
auto cast(const A& a) {
  if constexpr (detail::is_invalid_v<A>) {
    return detail::invalid_expr{};
  } else {
    return detail::cast_expr<U, detail::expr_of_t<A>>{{}, detail::to_expr(a)};
  }
}

/// Evaluates an expression into a new tensor on its device.
template <Operand E>
auto eval(const E& e) {
  if constexpr (detail::is_invalid_v<E>) {
    return 0;
  } else {
    using X = detail::expr_of_t<E>;
    return tensor<typename X::value_type, typename X::device, X::rank>(detail::to_expr(e));
  }
}

// ---- scalar fill (tensor.hpp declares it) ---------------------------------------------------
namespace detail {
template <class T, class D, std::size_t R, class S>
void fill_scalar(const tensor_view<T, D, R>& v, const S& s) {
  if constexpr (std::is_const_v<T>) {
    static_assert(always_false<S>, "locus: cannot fill a view of const elements; fill a tensor or a mutable view");
  } else if constexpr (require_scalar_dtype<S, T>()) {
    evaluate_into(v, scalar_operand<T>(s));  // an integer out of range: value_error, nothing written
  }
}
}  // namespace detail

template <class T, class D, std::size_t R>
template <class S>
  requires(std::is_arithmetic_v<S> || is_half_v<S>)
tensor<T, D, R>& tensor<T, D, R>::operator=(const S& s) & {
  detail::fill_scalar(view(), s);
  return *this;
}
template <class T, class D, std::size_t R>
template <class S>
  requires(std::is_arithmetic_v<S> || is_half_v<S>)
const tensor_view<T, D, R>& tensor_view<T, D, R>::operator=(const S& s) const& {
  detail::fill_scalar(*this, s);
  return *this;
}

// ---- compound assignment -------------------------------------------------------------------
#define LOCUS_DETAIL_COMPOUND(SYM, OP)                                                    \
  template <class T, class D, std::size_t R, class E>                                    \
    requires(detail::is_operand_v<E> || detail::is_scalar_v<E>)                           \
  tensor<T, D, R>& operator SYM##=(tensor<T, D, R>& t, const E& e) {                      \
    auto x = detail::make_binary<detail::op::OP, false>(t.view(), e);                     \
    if constexpr (!detail::is_invalid_v<decltype(x)>) detail::evaluate_into(t.view(), x); \
    return t;                                                                             \
  }                                                                                       \
  template <class T, class D, std::size_t R, class E>                                    \
    requires(detail::is_operand_v<E> || detail::is_scalar_v<E>)                           \
  const tensor_view<T, D, R>& operator SYM##=(const tensor_view<T, D, R>& v, const E& e) { \
    auto x = detail::make_binary<detail::op::OP, false>(v, e);                            \
    if constexpr (!detail::is_invalid_v<decltype(x)>) detail::evaluate_into(v, x);       \
    return v;                                                                             \
  }
LOCUS_DETAIL_COMPOUND(+, add)
LOCUS_DETAIL_COMPOUND(-, sub)
LOCUS_DETAIL_COMPOUND(*, mul)
LOCUS_DETAIL_COMPOUND(/, div)
#undef LOCUS_DETAIL_COMPOUND

}  // namespace locus
