// Extents and strides. Rank is a compile-time integer, extents are run-time and
// signed, so that a negative extent or an element count that overflows is caught
// (as shape_error naming the shape) before anything is allocated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "config.hpp"
#include "error.hpp"

namespace locus {

template <std::size_t R>
using extents = std::array<index_t, R>;

namespace detail {

/// "[2, 3]" into out (cap bytes, cap >= 3): one non-template function for every rank.
inline void write_shape(char* out, std::size_t cap, const index_t* e, std::size_t r) noexcept {
  std::size_t n = 0;
  out[n++] = '[';
  for (std::size_t i = 0; i < r && n + 1 < cap; ++i) {
    const int w = std::snprintf(out + n, cap - n, i ? ", %lld" : "%lld", static_cast<long long>(e[i]));
    if (w < 0) break;
    n = n + static_cast<std::size_t>(w) < cap ? n + static_cast<std::size_t>(w) : cap - 1;
  }
  if (n + 1 < cap) out[n++] = ']';
  out[n] = '\0';
}

/// A shape as text in a buffer big enough for any rank-R shape (messages pass .s to %s).
template <std::size_t R>
struct shape_chars {
  char s[R * 22 + 3];
  explicit shape_chars(const extents<R>& e) noexcept { write_shape(s, sizeof s, e.data(), R); }
};

template <std::size_t R>
std::string shape_string(const extents<R>& s) {
  return shape_chars<R>(s).s;
}

template <std::size_t R>
extents<R> to_extents(const index_t (&s)[R]) {
  extents<R> e{};
  for (std::size_t i = 0; i < R; ++i) e[i] = s[i];
  return e;
}

/// Number of elements; throws shape_error for negative extents or when the byte
/// size would not fit in a signed 64-bit integer.
template <std::size_t R>
index_t checked_numel(const extents<R>& s, std::size_t elem_size) {
  index_t n = 1;
  const index_t max_elems =
      std::numeric_limits<index_t>::max() / static_cast<index_t>(elem_size == 0 ? 1 : elem_size);
  for (std::size_t i = 0; i < R; ++i) {
    if (s[i] < 0)
      throw_shape_error("locus: negative extent %lld at axis %zu in shape %s; extents must be >= 0",
                        static_cast<long long>(s[i]), i, shape_chars<R>(s).s);
  }
  for (std::size_t i = 0; i < R; ++i) {
    if (s[i] == 0) return 0;
  }
  for (std::size_t i = 0; i < R; ++i) {
    if (n > max_elems / s[i])
      throw_shape_error("locus: shape %s has more elements than fit in %zu-byte elements addressed by 64 bits",
                        shape_chars<R>(s).s, elem_size);
    n *= s[i];
  }
  return n;
}

/// a * b for non-negative extents and strides, saturated at index_t's maximum instead of
/// overflowing (found by the structure-aware safetensors fuzzer: a tensor of shape
/// [0, 2^63 - 1, 2] made contiguous_strides overflow).
inline index_t mul_saturated(index_t a, index_t b) noexcept {
  index_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::numeric_limits<index_t>::max();
  return r;
}

template <std::size_t R>
index_t numel_of(const extents<R>& s) noexcept {
  for (std::size_t i = 0; i < R; ++i)
    if (s[i] == 0) return 0;  // before multiplying: [0, huge, huge] must not overflow
  index_t n = 1;
  for (std::size_t i = 0; i < R; ++i) n = mul_saturated(n, s[i]);
  return n;
}

/// Row-major strides. Products past index_t's range saturate (no undefined behaviour):
/// they occur only for shapes whose element count is 0 (a zero extent beside huge ones)
/// or beyond anything allocatable, where no element is ever addressed through them.
template <std::size_t R>
extents<R> contiguous_strides(const extents<R>& s) noexcept {
  extents<R> st{};
  index_t acc = 1;
  for (std::size_t i = R; i-- > 0;) {
    st[i] = acc;
    acc = mul_saturated(acc, s[i]);
  }
  return st;
}

template <std::size_t R>
bool is_contiguous(const extents<R>& shape, const extents<R>& strides) noexcept {
  for (std::size_t i = 0; i < R; ++i)
    if (shape[i] == 0) return true;  // empty: nothing to lay out
  index_t acc = 1;
  for (std::size_t i = R; i-- > 0;) {
    if (shape[i] != 1 && strides[i] != acc) return false;
    acc *= shape[i];
  }
  return true;
}

}  // namespace detail
}  // namespace locus
