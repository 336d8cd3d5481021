// Rows for training: softmax and log_softmax along an axis (numerically stable: the
// row maximum is subtracted before exp), and one_hot. One kernel source for every
// device: a functor per row (every position of the other axes) that makes three
// passes over the row — max, sum of exponentials, write — with a faster form for the
// innermost axis of a linearly readable operand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "expr.hpp"
#include "reduce.hpp"

namespace locus {

namespace detail {

template <class T, bool Log, class Ev, std::size_t R>
struct softmax_row_kernel {
  T* out;
  index_array<R> ost;  // output strides (contiguous)
  Ev ev;
  index_array<R> shape;
  std::size_t axis;
  LOCUS_HOST_DEVICE void operator()(index_t row) const {
    using C = compute_t<T>;
    index_t idx[R];
    unravel_except_axis(row, shape, axis, idx);
    index_t base = 0;
    for (std::size_t k = 0; k < R; ++k) base += idx[k] * ost.v[k];
    const index_t len = shape.v[axis], step = ost.v[axis];
    C m = -C(1) / C(0);  // -inf
    for (index_t j = 0; j < len; ++j) {
      idx[axis] = j;
      m = op::maximum{}(m, static_cast<C>(ev.at_index(idx)));
    }
    C s = 0;
    for (index_t j = 0; j < len; ++j) {
      idx[axis] = j;
      s += m_exp(static_cast<C>(ev.at_index(idx)) - m);
    }
    const C log_s = m_log(s);
    const C inv_s = C(1) / s;
    for (index_t j = 0; j < len; ++j) {
      idx[axis] = j;
      const C z = static_cast<C>(ev.at_index(idx)) - m;
      out[base + j * step] = store<T>(Log ? z - log_s : m_exp(z) * inv_s);
    }
  }
};

// The common case: softmax along the innermost axis of an expression that can be read
// by linear index (contiguous operands of the output's shape). Rows are contiguous, so
// the row is read with at_linear (no index arithmetic); softmax writes exp(z) while
// summing and then scales what it wrote, as a hand-written loop does.
template <class T, bool Log, class Ev>
struct softmax_last_axis_kernel {
  T* out;
  Ev ev;
  index_t len;
  LOCUS_HOST_DEVICE void operator()(index_t row) const {
    using C = compute_t<T>;
    const index_t base = row * len;
    T* o = out + base;
    C m = -C(1) / C(0);  // -inf
    for (index_t j = 0; j < len; ++j) m = op::maximum{}(m, static_cast<C>(ev.at_linear(base + j)));
    C s = 0;
    if constexpr (Log) {
      for (index_t j = 0; j < len; ++j) s += m_exp(static_cast<C>(ev.at_linear(base + j)) - m);
      const C log_s = m_log(s);  // (x - m) - log_s: x - (m + log_s) would round away small results
      for (index_t j = 0; j < len; ++j) o[j] = store<T>((static_cast<C>(ev.at_linear(base + j)) - m) - log_s);
    } else if constexpr (std::is_same_v<T, C>) {
      for (index_t j = 0; j < len; ++j) {
        const C v = m_exp(static_cast<C>(ev.at_linear(base + j)) - m);
        o[j] = v;
        s += v;
      }
      const C inv_s = C(1) / s;
      for (index_t j = 0; j < len; ++j) o[j] *= inv_s;
    } else {  // half output: keep the unrounded exponentials out of the stored row
      for (index_t j = 0; j < len; ++j) s += m_exp(static_cast<C>(ev.at_linear(base + j)) - m);
      const C inv_s = C(1) / s;
      for (index_t j = 0; j < len; ++j) o[j] = store<T>(m_exp(static_cast<C>(ev.at_linear(base + j)) - m) * inv_s);
    }
  }
};

template <bool Log, class X>
auto softmax_impl(const X& x, std::size_t axis) {
  using E = expr_of_t<X>;
  using T = typename E::value_type;
  using D = typename E::device;
  constexpr std::size_t R = E::rank;
  if constexpr (R < 1) {
    static_assert(always_false<X>,
                  "locus: softmax needs rank >= 1 (it normalises along an axis), but got a rank-0 "
                  "value; give it an axis first: x.reshape({1}) (an expression: locus::eval(x) first)");
    return 0;
  } else if constexpr (!dtype_traits<T>::is_floating) {
    static_assert(always_false<X>,
                  "locus: softmax needs a floating dtype; convert first with locus::cast<float>(x)");
    return 0;
  } else {
    const E e = to_expr(x);
    const auto shape = e.shape();
    check_axis(axis, shape);
    tensor<T, D, R> out(shape);
    if (out.numel() == 0) return out;
    index_array<R> sh{}, st{};
    const auto strides = contiguous_strides(shape);
    for (std::size_t k = 0; k < R; ++k) {
      sh.v[k] = shape[k];
      st.v[k] = strides[k];
    }
    const index_t rows = out.numel() / shape[axis];
    const auto ev = e.make_eval(shape);
    if (axis == R - 1 && e.linear_ok(shape)) {
      launch_n<D>(rows, softmax_last_axis_kernel<T, Log, decltype(ev)>{out.data_handle(), ev, shape[axis]},
                  shape[axis]);
      return out;
    }
    launch_n<D>(rows, softmax_row_kernel<T, Log, decltype(ev), R>{out.data_handle(), st, ev, sh, axis},
                shape[axis]);
    return out;
  }
}

template <class T, class L>
struct one_hot_kernel {
  T* out;
  const L* labels;
  index_t classes;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t row = i / classes, c = i % classes;
    out[i] = store<T>(static_cast<compute_t<T>>(static_cast<index_t>(labels[row]) == c ? 1 : 0));
  }
};

}  // namespace detail

/// exp(x - max) / sum(exp(x - max)) along `axis`.
template <Operand X>
auto softmax(const X& x, std::size_t axis) {
  return detail::softmax_impl<false>(x, axis);
}

/// x - max - log(sum(exp(x - max))) along `axis`: stable for any magnitude of x.
template <Operand X>
auto log_softmax(const X& x, std::size_t axis) {
  return detail::softmax_impl<true>(x, axis);
}

/// One-hot encoding: labels of shape S (integers in [0, classes)) give a tensor of
/// shape S + [classes] with 1 at each label. On host-accessible devices a label out of
/// range throws index_error naming its position and value; on cuda such a row is all
/// zeros (checking would need a synchronisation).
template <Dtype T = float, class L>
  requires detail::tensor_traits<std::remove_cvref_t<L>>::is_tensor ||
           detail::tensor_traits<std::remove_cvref_t<L>>::is_view
auto one_hot(const L& labels, index_t classes) {
  using tr = detail::tensor_traits<std::remove_cvref_t<L>>;
  using LT = typename tr::value_type;
  using D = typename tr::device;
  constexpr std::size_t R = tr::rank;
  static_assert(std::is_integral_v<LT> && !std::is_same_v<LT, bool>,
                "locus: one_hot needs integer labels (i64, i32 or u8), but got a floating or bool "
                "dtype; convert first: locus::one_hot(locus::eval(locus::cast<std::int64_t>(labels)), classes)");
  if (classes <= 0) throw shape_error("locus: one_hot needs classes > 0, got " + std::to_string(classes));
  const auto lv = detail::as_view_const(labels);
  extents<R + 1> shape{};
  for (std::size_t k = 0; k < R; ++k) shape[k] = lv.shape()[k];
  shape[R] = classes;
  if (!lv.is_contiguous()) throw shape_error("locus: one_hot needs contiguous labels; clone() them first");
  if constexpr (D::host_accessible) {
    const LT* p = lv.data_handle();
    for (index_t i = 0; i < lv.numel(); ++i)
      if (p[i] < 0 || static_cast<index_t>(p[i]) >= classes)
        throw index_error("locus: label " + std::to_string(static_cast<long long>(p[i])) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
  }
  tensor<T, D, R + 1> out(shape);
  detail::launch_n<D>(out.numel(), detail::one_hot_kernel<T, LT>{out.data_handle(), lv.data_handle(), classes});
  return out;
}

}  // namespace locus
