// Rotary position embeddings (RoPE, Su et al. 2021) over ag::var values:
//
//   auto q2 = ag::rope(q);                                  // q [B, H, T, E]: position t = row's T index
//   auto k2 = ag::rope(k, {.base = 10000, .offset = 16});   // positions 16.. (a cached prefix before)
//   auto x2 = ag::rope(x, {.interleaved = true});           // pairs (x[2i], x[2i+1])
//
// x of rank R >= 2 has its positions along axis R-2 and E features along the last axis,
// E even; every other axis is a batch (so [B, H, T, E] after the heads are split, or
// [B, T, E]). Feature pair i of position p turns by the angle p * base^(-2i/E):
//   y_a = x_a cos - x_b sin,   y_b = x_b cos + x_a sin.
// Which features pair: by default a = i, b = i + E/2 (the "rotate half" layout of
// GPT-NeoX and Hugging Face's Llama, whose weights most checkpoints hold); with
// `interleaved` a = 2i, b = 2i + 1 (the original Llama code and torchtune's
// RotaryPositionalEmbeddings). p = offset + the row's index along axis R-2.
//
// A rotation keeps nothing for backward: dx = R(-angle) dy, the same kernel with the
// sine's sign turned. The angles are computed in compute_t<T> (float for f32, bf16 and
// f16, double for f64) as PyTorch's reference code computes them in the input's dtype.
// One source for every device; no allocation in either direction.
//
// Rules: rank < 2 is a compile error; an odd or zero E is a shape_error naming the
// shape; a base that is not finite and > 0, or a negative offset, is a value_error; all
// before anything is recorded.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ops.hpp"

namespace locus::ag {

struct rope_options {
  /// The base of the angles' geometric series (10000 in the RoPE paper and Llama).
  double base = 10000.0;
  /// The position of the first row along axis R-2 (a sequence continued after `offset`
  /// cached positions).
  index_t offset = 0;
  /// Pairs (2i, 2i+1) instead of (i, i + E/2).
  bool interleaved = false;
};

namespace detail {

/// Row r of y (= or +=) the rotation of x's row r by its position's angles (the sine's
/// sign turned for backward: `sign` -1).
template <class T>
struct rope_rows {
  using C = ::locus::detail::compute_t<T>;
  const T* x;
  T* y;
  index_t t, e, offset;
  C log_base, sign;
  bool interleaved, overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const T* xr = x + r * e;
    T* yr = y + r * e;
    const index_t half = e / 2;
    const C p = static_cast<C>(offset + r % t);
    for (index_t i = 0; i < half; ++i) {
      const C angle = p * ::locus::detail::m_exp(-static_cast<C>(2 * i) / static_cast<C>(e) * log_base);
      const C c = ::locus::detail::m_cos(angle), s = sign * ::locus::detail::m_sin(angle);
      const index_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      const C xa = ::locus::detail::load(xr[a]), xb = ::locus::detail::load(xr[b]);
      C ya = xa * c - xb * s, yb = xb * c + xa * s;
      if (!overwrite) {
        ya += ::locus::detail::load(yr[a]);
        yb += ::locus::detail::load(yr[b]);
      }
      yr[a] = ::locus::detail::store<T>(ya);
      yr[b] = ::locus::detail::store<T>(yb);
    }
  }
};

template <class T, class D, std::size_t R>
struct rope_node final : node<T, D> {
  using C = ::locus::detail::compute_t<T>;
  std::uint32_t x = 0, out = 0;
  extents<R> shape{};
  index_t offset = 0;
  C log_base{};
  bool interleaved = false;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, shape);
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    const index_t e = shape[R - 1], len = shape[R - 2];
    index_t rows = 1;
    for (std::size_t i = 0; i + 1 < R; ++i) rows *= shape[i];
    auto [gx, fresh] = t.template grad_out<R>(x, shape);
    if (rows == 0 || len == 0) return;
    ::locus::detail::launch_n<D>(
        rows, rope_rows<T>{g.data_handle(), gx.data_handle(), len, e, offset, log_base, C(-1), interleaved, fresh}, e);
  }
};

}  // namespace detail

/// x turned by its rotary position angles (see the file comment); the same shape.
template <class T, class D, std::size_t R>
var<T, D, R> rope(const var<T, D, R>& x, rope_options o = {}) {
  static_assert(R >= 2, "locus: ag::rope needs a value of rank 2 or more: positions along axis R-2, features along the "
                        "last axis ([B, H, T, E] or [B, T, E]); reshape a single sequence to [T, E]");
  using C = ::locus::detail::compute_t<T>;
  auto& t = detail::owner(x, "ag::rope");
  detail::check_contiguous_value(x, "ag::rope");
  const auto s = x.shape();
  const index_t e = s[R - 1], len = s[R - 2];
  if (e < 2 || e % 2 != 0)
    throw shape_error("locus: ag::rope of x " + detail::shape_text(s) + ": the last extent (the features, " +
                      std::to_string(e) + ") must be even and at least 2: each rotation turns a pair");
  if (!(o.base > 0.0) || !std::isfinite(o.base))
    throw value_error("locus: ag::rope: base " + std::to_string(o.base) + " is not a finite number > 0");
  if (o.offset < 0)
    throw value_error("locus: ag::rope: offset " + std::to_string(o.offset) + " is negative (the first position)");
  if (len > 0 && o.offset > std::numeric_limits<index_t>::max() - (len - 1))
    throw value_error("locus: ag::rope: offset " + std::to_string(o.offset) + " plus the sequence's " +
                      std::to_string(len) + " positions does not fit in a 64-bit position");
  const bool grad = x.requires_grad();
  auto out = t.template result<R>(s, grad);
  const C log_base = static_cast<C>(std::log(o.base));
  if (grad) {
    detail::rope_node<T, D, R>* n = nullptr;
    try {
      n = &t.template record<detail::rope_node<T, D, R>>();
    } catch (...) {  // nothing of the call stays on the tape
      t.unresult();
      throw;
    }
    n->x = detail::access::id(x);
    n->out = detail::access::id(out);
    n->shape = s;
    n->offset = o.offset;
    n->log_base = log_base;
    n->interleaved = o.interleaved;
  }
  const index_t rows = len > 0 ? x.numel() / e : 0;
  if (rows > 0)
    ::locus::detail::launch_n<D>(rows,
                                 detail::rope_rows<T>{x.value().data_handle(), t.writable(out).data_handle(), len, e,
                                                      o.offset, log_base, C(1), o.interleaved, true},
                                 e);
  return out;
}

}  // namespace locus::ag
