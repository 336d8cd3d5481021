// RMS normalisation over ag::var values (PyTorch's torch.nn.functional.rms_norm over the
// last axis):
//
//   auto y = ag::rms_norm(x, eps);          // x / sqrt(mean(x^2) + eps)
//   auto y = ag::rms_norm(x, gain, eps);    // the same times a learned [C] gain (nn.RMSNorm's weight)
//
// x of any rank >= 1 is normalised along its last axis (C elements a row). Forward keeps
// each row's 1/rms (one number per row); backward gives
// dx = r * (g*w - xhat * mean(g*w * xhat)) with xhat = x * r, and the gain's gradient
// sum over rows of g * xhat, each column added in row order (no atomics: the same bits
// on every run). One source for every device; arithmetic in compute_t<T>.
//
// Rules: a gain of another shape than [C] is a shape_error naming both shapes; eps must
// be finite and >= 0 (value_error); both before anything is recorded.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ops.hpp"

namespace locus::ag {

namespace detail {

template <class T>
struct rms_norm_rows {
  using C = ::locus::detail::compute_t<T>;
  const T* x;
  const T* w;  // null: no gain
  T* y;
  C* inv;  // null: not kept (no gradient wanted)
  index_t cols;
  C eps;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const T* xr = x + r * cols;
    C ss(0);
    for (index_t j = 0; j < cols; ++j) {
      const C v = ::locus::detail::load(xr[j]);
      ss += v * v;
    }
    const C ri = C(1) / ::locus::detail::m_sqrt(ss / static_cast<C>(cols) + eps);
    T* yr = y + r * cols;
    for (index_t j = 0; j < cols; ++j) {
      const C v = ::locus::detail::load(xr[j]) * ri;
      yr[j] = ::locus::detail::store<T>(w ? v * ::locus::detail::load(w[j]) : v);
    }
    if (inv) inv[r] = ri;
  }
};

template <class T>
struct rms_norm_back_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *x, *w, *g;
  const C* inv;
  T* gx;
  index_t cols;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const T* xr = x + r * cols;
    const T* gr = g + r * cols;
    const C ri = inv[r];
    C dot(0);
    for (index_t j = 0; j < cols; ++j) {
      const C gw = w ? ::locus::detail::load(gr[j]) * ::locus::detail::load(w[j]) : ::locus::detail::load(gr[j]);
      dot += gw * ::locus::detail::load(xr[j]) * ri;
    }
    const C mean = dot / static_cast<C>(cols);
    T* out = gx + r * cols;
    for (index_t j = 0; j < cols; ++j) {
      const C gw = w ? ::locus::detail::load(gr[j]) * ::locus::detail::load(w[j]) : ::locus::detail::load(gr[j]);
      const C xh = ::locus::detail::load(xr[j]) * ri;
      const C v = ri * (gw - xh * mean);
      out[j] = ::locus::detail::store<T>(overwrite ? v : ::locus::detail::load(out[j]) + v);
    }
  }
};

/// Column j of the gain's gradient: sum over rows of g * x * r, in row order.
template <class T>
struct rms_norm_gain_column {
  using C = ::locus::detail::compute_t<T>;
  const T *x, *g;
  const C* inv;
  T* gw;
  index_t rows, cols;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t j) const {
    C s(0);
    for (index_t r = 0; r < rows; ++r)
      s += ::locus::detail::load(g[r * cols + j]) * ::locus::detail::load(x[r * cols + j]) * inv[r];
    gw[j] = ::locus::detail::store<T>(overwrite ? s : ::locus::detail::load(gw[j]) + s);
  }
};

template <class T, class D, std::size_t R>
struct rms_norm_node final : node<T, D> {
  using C = ::locus::detail::compute_t<T>;
  std::uint32_t x = 0, w = 0, out = 0;
  bool has_gain = false;
  tensor_view<const T, D, R> xv;
  tensor_view<const T, D, 1> wv;
  tensor<C, D, 1> inv;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, xv.shape());
    if (g.data_handle() == nullptr) return;
    const index_t cols = xv.shape()[R - 1];
    if (cols == 0 || xv.numel() == 0) return;
    const index_t rows = xv.numel() / cols;
    const T* wp = has_gain ? wv.data_handle() : nullptr;
    if (has_gain && t.wants_grad(w)) {
      auto [gw, fresh] = t.template grad_out<1>(w, wv.shape());
      ::locus::detail::launch_n<D>(
          cols, rms_norm_gain_column<T>{xv.data_handle(), g.data_handle(), inv.data_handle(), gw.data_handle(), rows,
                                        cols, fresh},
          rows);
    }
    if (t.wants_grad(x)) {
      auto [gx, fresh] = t.template grad_out<R>(x, xv.shape());
      ::locus::detail::launch_n<D>(
          rows, rms_norm_back_rows<T>{xv.data_handle(), wp, g.data_handle(), inv.data_handle(), gx.data_handle(), cols,
                                      fresh},
          cols);
    }
  }
};

template <class T, class D, std::size_t R>
var<T, D, R> rms_norm_impl(const var<T, D, R>& x, const var<T, D, 1>* w, double eps) {
  static_assert(R >= 1, "locus: ag::rms_norm needs a value of rank 1 or more (it normalises the last axis)");
  auto& t = owner(x, "ag::rms_norm");
  check_contiguous_value(x, "ag::rms_norm");
  const index_t cols = x.shape()[R - 1];
  if (w) {
    t.check_owned(*w, "ag::rms_norm");
    check_contiguous_value(*w, "ag::rms_norm");
    if (w->shape()[0] != cols)
      throw shape_error("locus: ag::rms_norm of x " + shape_text(x.shape()) + " with a gain " +
                        shape_text(w->shape()) + ": the gain must have the last extent of x, [" +
                        std::to_string(cols) + "]");
  }
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw value_error("locus: ag::rms_norm: eps " + std::to_string(eps) + " is not a finite number >= 0");
  using C = ::locus::detail::compute_t<T>;
  const bool grad = x.requires_grad() || (w && w->requires_grad());
  const index_t rows = cols > 0 ? x.numel() / cols : 0;
  auto out = t.template result<R>(x.shape(), grad);
  rms_norm_node<T, D, R>* n = nullptr;
  if (grad) {
    n = &t.template record<rms_norm_node<T, D, R>>();
    try {
      ensure_flat(n->inv, rows);
    } catch (...) {
      t.unrecord();
      t.unresult();
      throw;
    }
  }
  if (rows > 0)
    ::locus::detail::launch_n<D>(rows,
                                 rms_norm_rows<T>{x.value().data_handle(), w ? w->value().data_handle() : nullptr,
                                                  t.writable(out).data_handle(), n ? n->inv.data_handle() : nullptr,
                                                  cols, static_cast<C>(eps)},
                                 cols);
  if (n) {
    n->x = access::id(x);
    n->out = access::id(out);
    n->xv = x.value();
    n->has_gain = w != nullptr;
    if (w) {
      n->w = access::id(*w);
      n->wv = w->value();
    }
  }
  return out;
}

}  // namespace detail

/// x / sqrt(mean(x^2) + eps) along the last axis.
template <class T, class D, std::size_t R>
var<T, D, R> rms_norm(const var<T, D, R>& x, double eps) {
  return detail::rms_norm_impl(x, static_cast<const var<T, D, 1>*>(nullptr), eps);
}
/// The same times `gain` [C] (PyTorch's nn.RMSNorm with its weight).
template <class T, class D, std::size_t R>
var<T, D, R> rms_norm(const var<T, D, R>& x, const var<T, D, 1>& gain, double eps) {
  return detail::rms_norm_impl(x, &gain, eps);
}

// Prevents: a gain of another device or dtype than x ("no matching function").
template <class X, class W>
  requires(is_var_v<X> && is_var_v<W> &&
           !(std::is_same_v<typename X::value_type, typename W::value_type> &&
             std::is_same_v<typename X::device, typename W::device>))
int rms_norm(const X&, const W&, double) {
  (void)detail::check_pair<X, W>();
  return 0;
}

}  // namespace locus::ag
