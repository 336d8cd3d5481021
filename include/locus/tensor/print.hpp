// Printing host tensors and views the way PyTorch does:
//
//   std::cout << t;   // tensor([[0.1000, 0.2000], [0.3000, 0.4000]], shape=[2, 2], dtype=f32, device=cpu)
//
// Elements print with four decimals (scientific notation when the magnitudes call for
// it), integers as integers, bool as True/False, f16 and bf16 as the numbers they
// hold. A tensor of more than 1000 elements shows the first and last three entries of
// every axis with "..." between. locus::to_string(t) gives the same text.
//
// Only host memory prints: a cuda tensor or view in `os << t` is a compile error that
// says to copy it first, and an expression one that says to evaluate it. The header
// needs <iosfwd> only: the user's own <iostream> or <ostream> brings the stream.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <iosfwd>
#include <string>
#include <type_traits>

#include "../core/device.hpp"
#include "../core/dtype.hpp"
#include "../core/shape.hpp"
#include "tensor.hpp"

namespace locus {

namespace detail {

/// More elements than this and every axis is elided to its first and last three.
inline constexpr index_t print_elide_above = 1000;
inline constexpr index_t print_edge_items = 3;

struct print_style {
  bool scientific = false;
};

template <class T>
double print_value(T v) {
  if constexpr (is_half_v<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}

template <class T>
std::string format_element(T v, const print_style& style) {
  char buf[64];
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "True" : "False";
  } else if constexpr (std::is_integral_v<T>) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else {
    const double d = print_value(v);
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
    std::snprintf(buf, sizeof buf, style.scientific ? "%.4e" : "%.4f", d);
  }
  return buf;
}

/// Whether the printed element is shown (not elided) on an axis of extent n.
inline bool print_shown(index_t i, index_t n, bool elide) {
  return !elide || n <= 2 * print_edge_items || i < print_edge_items || i >= n - print_edge_items;
}

template <class T, std::size_t R>
void print_axis(std::string& out, const T* base, const extents<R>& shape, const extents<R>& strides,
                std::size_t axis, index_t offset, bool elide, const print_style& style,
                std::size_t indent) {
  using V = std::remove_cv_t<T>;
  const index_t n = shape[axis];
  out += '[';
  for (index_t i = 0; i < n; ++i) {
    if (!print_shown(i, n, elide)) {
      if (i == print_edge_items) {
        out += "...";
        out += axis + 1 == R ? ", " : ",\n" + std::string(indent + 1, ' ');
      }
      continue;
    }
    const index_t at = offset + i * strides[axis];
    if (axis + 1 == R) out += format_element<V>(base[at], style);
    else print_axis(out, base, shape, strides, axis + 1, at, elide, style, indent + 1);
    if (i + 1 < n) {
      if (axis + 1 == R) out += ", ";
      else out += ",\n" + std::string(R - axis - 1 > 1 ? 1 : 0, '\n') + std::string(indent + 1, ' ');
    }
  }
  out += ']';
}

template <class T, class D, std::size_t R>
std::string format_view(const tensor_view<T, D, R>& v) {
  using V = std::remove_cv_t<T>;
  const bool elide = v.numel() > print_elide_above;
  print_style style;
  if constexpr (!std::is_integral_v<V>) {
    // Scientific when the shown magnitudes span more than four decimals can say.
    double lo = 0, hi = 0;
    bool any = false;
    const auto s = v.shape();
    const auto st = v.strides();
    const index_t n = v.numel();
    for (index_t k = 0; k < n; ++k) {
      index_t rest = k, off = 0;
      bool shown = true;
      for (std::size_t a = R; a-- > 0;) {
        const index_t i = rest % s[a];
        rest /= s[a];
        shown = shown && print_shown(i, s[a], elide);
        off += i * st[a];
      }
      if (!shown) continue;
      const double d = std::fabs(print_value<V>(v.data_handle()[off]));
      if (!std::isfinite(d) || d == 0) continue;
      lo = any ? std::fmin(lo, d) : d;
      hi = any ? std::fmax(hi, d) : d;
      any = true;
    }
    style.scientific = any && (hi >= 1e8 || lo < 1e-4);
  }
  std::string out = "tensor(";
  if constexpr (R == 0) {
    out += format_element<V>(*v.data_handle(), style);
  } else if (v.numel() == 0) {
    out += "[]";
  } else {
    print_axis(out, v.data_handle(), v.shape(), v.strides(), 0, 0, elide, style, 7);
  }
  out += ", shape=" + shape_string(v.shape());
  out += ", dtype=";
  out += dtype_name<V>;
  out += ", device=";
  out += D::name;
  out += ')';
  return out;
}

// Prevents: printing (reading) GPU memory from the host.
template <class D>
constexpr bool require_printable_device() {
  static_assert(D::host_accessible,
                "locus: only host memory prints, but this tensor lives on cuda; copy it first: "
                "std::cout << locus::to<locus::cpu>(t)");
  return D::host_accessible;
}

}  // namespace detail

/// The text `os << t` writes: values, shape, dtype and device.
template <class T, class D, std::size_t R>
std::string to_string(const tensor_view<T, D, R>& v) {
  if constexpr (detail::require_printable_device<D>()) return detail::format_view(v);
  else return {};
}
template <class T, class D, std::size_t R>
std::string to_string(const tensor<T, D, R>& t) {
  if constexpr (detail::require_printable_device<D>()) return detail::format_view(t.view());
  else return {};
}

template <class CharT, class Traits, class T, class D, std::size_t R>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os,
                                              const tensor_view<T, D, R>& v) {
  if constexpr (detail::require_printable_device<D>()) os << to_string(v).c_str();
  return os;
}
template <class CharT, class Traits, class T, class D, std::size_t R>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os,
                                              const tensor<T, D, R>& t) {
  if constexpr (detail::require_printable_device<D>()) os << to_string(t.view()).c_str();
  return os;
}
// Prevents: a page of operator<< candidates for a lazy expression.
template <class CharT, class Traits, class E>
  requires std::is_base_of_v<detail::expression_tag, E>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, const E&) {
  static_assert(detail::always_false<E>,
                "locus: an expression is lazy and has no values to print yet; evaluate it first: "
                "std::cout << locus::eval(e)");
  return os;
}

}  // namespace locus
