// RMS and layer normalisation over ag::var values, along the last axis (PyTorch's
// torch.nn.functional.rms_norm and layer_norm over the last axis):
//
//   auto y = ag::rms_norm(x, eps);                  // x / sqrt(mean(x^2) + eps)
//   auto y = ag::rms_norm(x, gain, eps);            // times a learned [C] gain (nn.RMSNorm's weight)
//   auto y = ag::layer_norm(x, eps);                // (x - mean) / sqrt(var + eps), var biased
//   auto y = ag::layer_norm(x, gain, bias, eps);    // times gain plus bias (nn.LayerNorm's weight, bias)
//
// (nn::layer_norm is the same normalisation as a locus layer with its own parameters;
// these take the parameters as values, e.g. nn::param members of a module.)
//
// x of any rank >= 1 is normalised along its last axis (C elements a row). Forward keeps
// each row's 1/rms (one number per row); backward gives
// dx = r * (g*w - xhat * mean(g*w * xhat)) with xhat = x * r, and the gain's gradient
// sum over rows of g * xhat, each column added in row order (no atomics: the same bits
// on every run). One source for every device; arithmetic in compute_t<T>.
//
// layer_norm keeps each row's mean and 1/sd; backward gives
// dx = r * (g*w - mean(g*w) - xhat * mean(g*w * xhat)), the gain's gradient
// sum(g * xhat) and the bias's sum(g) over rows. rms_norm is the same arithmetic without
// the centring (mean 0, no mean(g*w) term): one set of kernels and one tape node serve both.
//
// Rules: a gain or bias of another shape than [C] is a shape_error naming both shapes;
// eps must be finite and >= 0 (value_error); both before anything is recorded.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ops.hpp"

namespace locus::ag {

namespace detail {

/// Row r of y = (x - mean) * r * w + b, r = 1/sqrt(mean((x - mean)^2) + eps); without
/// `center` the mean is 0 (RMS normalisation).
template <class T>
struct norm_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *x, *w, *b;  // w, b null: none
  T* y;
  C* stats;  // [2 * rows]: mean, 1/sd; null: not kept (no gradient wanted)
  index_t cols;
  C eps;
  bool center;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const T* xr = x + r * cols;
    C mean(0);
    if (center) {
      for (index_t j = 0; j < cols; ++j) mean += ::locus::detail::load(xr[j]);
      mean /= static_cast<C>(cols);
      // One correction pass: the rounding of a long sum of large values (a mean of 1e4
      // with a spread of 0.1 in f32) leaves most of its error in the mean, and the sum
      // of the residuals, small numbers, carries it back (the corrected two-pass
      // algorithm; an outside review measured 7x PyTorch's error without it).
      C res(0);
      for (index_t j = 0; j < cols; ++j) res += ::locus::detail::load(xr[j]) - mean;
      mean += res / static_cast<C>(cols);
    }
    C ss(0);
    for (index_t j = 0; j < cols; ++j) {
      const C d = ::locus::detail::load(xr[j]) - mean;
      ss += d * d;
    }
    const C ri = C(1) / ::locus::detail::m_sqrt(ss / static_cast<C>(cols) + eps);
    T* yr = y + r * cols;
    for (index_t j = 0; j < cols; ++j) {
      C v = (::locus::detail::load(xr[j]) - mean) * ri;
      if (w) v *= ::locus::detail::load(w[j]);
      if (b) v += ::locus::detail::load(b[j]);
      yr[j] = ::locus::detail::store<T>(v);
    }
    if (stats) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = ri;
    }
  }
};

/// Row r of dx (= or +=) r * (g*w - [mean(g*w)] - xhat * mean(g*w * xhat)).
template <class T>
struct norm_back_rows {
  using C = ::locus::detail::compute_t<T>;
  const T *x, *w, *g;
  const C* stats;
  T* gx;
  index_t cols;
  bool center, overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const T* xr = x + r * cols;
    const T* gr = g + r * cols;
    const C mean = stats[2 * r], ri = stats[2 * r + 1];
    C sg(0), sgx(0);
    for (index_t j = 0; j < cols; ++j) {
      const C gw = w ? ::locus::detail::load(gr[j]) * ::locus::detail::load(w[j]) : ::locus::detail::load(gr[j]);
      sg += gw;
      sgx += gw * (::locus::detail::load(xr[j]) - mean) * ri;
    }
    const C mg = center ? sg / static_cast<C>(cols) : C(0), mgx = sgx / static_cast<C>(cols);
    T* out = gx + r * cols;
    for (index_t j = 0; j < cols; ++j) {
      const C gw = w ? ::locus::detail::load(gr[j]) * ::locus::detail::load(w[j]) : ::locus::detail::load(gr[j]);
      const C xh = (::locus::detail::load(xr[j]) - mean) * ri;
      const C v = ri * (gw - mg - xh * mgx);
      out[j] = ::locus::detail::store<T>(overwrite ? v : ::locus::detail::load(out[j]) + v);
    }
  }
};

/// Column j of the gain's (g * xhat) or the bias's (g) gradient, summed in row order.
template <class T>
struct norm_param_column {
  using C = ::locus::detail::compute_t<T>;
  const T *x, *g;
  const C* stats;  // null: the bias (no xhat)
  T* out;
  index_t rows, cols;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t j) const {
    C s(0);
    for (index_t r = 0; r < rows; ++r) {
      const C gv = ::locus::detail::load(g[r * cols + j]);
      s += stats ? gv * (::locus::detail::load(x[r * cols + j]) - stats[2 * r]) * stats[2 * r + 1] : gv;
    }
    out[j] = ::locus::detail::store<T>(overwrite ? s : ::locus::detail::load(out[j]) + s);
  }
};

template <class T, class D, std::size_t R>
struct norm_node final : node<T, D> {
  using C = ::locus::detail::compute_t<T>;
  std::uint32_t x = 0, w = 0, b = 0, out = 0;
  bool has_gain = false, has_bias = false, center = false;
  tensor_view<const T, D, R> xv;
  tensor_view<const T, D, 1> wv, bv;
  tensor<C, D, 1> stats;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, xv.shape());
    if (g.data_handle() == nullptr) return;
    const index_t cols = xv.shape()[R - 1];
    if (cols == 0 || xv.numel() == 0) return;
    const index_t rows = xv.numel() / cols;
    if (has_gain && t.wants_grad(w)) {
      auto [gw, fresh] = t.template grad_out<1>(w, wv.shape());
      ::locus::detail::launch_n<D>(
          cols, norm_param_column<T>{xv.data_handle(), g.data_handle(), stats.data_handle(), gw.data_handle(), rows, cols, fresh},
          rows);
    }
    if (has_bias && t.wants_grad(b)) {
      auto [gb, fresh] = t.template grad_out<1>(b, bv.shape());
      ::locus::detail::launch_n<D>(
          cols, norm_param_column<T>{xv.data_handle(), g.data_handle(), nullptr, gb.data_handle(), rows, cols, fresh}, rows);
    }
    if (t.wants_grad(x)) {
      auto [gx, fresh] = t.template grad_out<R>(x, xv.shape());
      ::locus::detail::launch_n<D>(rows,
                                   norm_back_rows<T>{xv.data_handle(), has_gain ? wv.data_handle() : nullptr,
                                                     g.data_handle(), stats.data_handle(), gx.data_handle(), cols,
                                                     center, fresh},
                                   cols);
    }
  }
};

/// The checks of a gain or bias of x (owner, contiguity, length [C]) and of eps.
template <class T, class D, std::size_t R>
void check_norm_args(tape<T, D>& t, const var<T, D, R>& x, const var<T, D, 1>* w, const var<T, D, 1>* b, double eps,
                     const char* what, const char* must) {
  check_contiguous_value(x, what);
  const index_t cols = x.shape()[R - 1];
  for (const auto* p : {w, b}) {
    if (!p) continue;
    t.check_owned(*p, what);
    check_contiguous_value(*p, what);
    if (p->shape()[0] != cols)
      throw shape_error(std::string("locus: ") + what + " of x " + shape_text(x.shape()) + " with a " +
                        (p == w ? "gain " : "bias ") + shape_text(p->shape()) + ": " + must +
                        " the last extent of x, [" + std::to_string(cols) + "]");
  }
  if (!(eps >= 0.0) || !std::isfinite(eps))
    throw value_error(std::string("locus: ") + what + ": eps " + std::to_string(eps) + " is not a finite number >= 0");
}

/// Records and runs one normalisation (arguments already checked).
template <class T, class D, std::size_t R>
var<T, D, R> norm_impl(tape<T, D>& t, const var<T, D, R>& x, const var<T, D, 1>* w, const var<T, D, 1>* b, double eps,
                       bool center) {
  using C = ::locus::detail::compute_t<T>;
  const index_t cols = x.shape()[R - 1];
  const bool grad = x.requires_grad() || (w && w->requires_grad()) || (b && b->requires_grad());
  const index_t rows = cols > 0 ? x.numel() / cols : 0;
  auto out = t.template result<R>(x.shape(), grad);
  norm_node<T, D, R>* n = nullptr;
  if (grad) {
    n = &t.template record<norm_node<T, D, R>>();
    try {
      ensure_flat(n->stats, 2 * rows);
    } catch (...) {  // nothing of the call stays on the tape
      t.unrecord();
      t.unresult();
      throw;
    }
  }
  if (rows > 0)
    ::locus::detail::launch_n<D>(
        rows,
        norm_rows<T>{x.value().data_handle(), w ? w->value().data_handle() : nullptr,
                     b ? b->value().data_handle() : nullptr, t.writable(out).data_handle(),
                     n ? n->stats.data_handle() : nullptr, cols, static_cast<C>(eps), center},
        cols);
  if (n) {
    n->x = access::id(x);
    n->out = access::id(out);
    n->xv = x.value();
    n->center = center;
    n->has_gain = w != nullptr;
    n->has_bias = b != nullptr;
    if (w) {
      n->w = access::id(*w);
      n->wv = w->value();
    }
    if (b) {
      n->b = access::id(*b);
      n->bv = b->value();
    }
  }
  return out;
}

template <class T, class D, std::size_t R>
var<T, D, R> rms_norm_impl(const var<T, D, R>& x, const var<T, D, 1>* w, double eps) {
  static_assert(R >= 1, "locus: ag::rms_norm needs a value of rank 1 or more (it normalises the last axis)");
  auto& t = owner(x, "ag::rms_norm");
  check_norm_args(t, x, w, static_cast<const var<T, D, 1>*>(nullptr), eps, "ag::rms_norm", "the gain must have");
  return norm_impl(t, x, w, static_cast<const var<T, D, 1>*>(nullptr), eps, false);
}

template <class T, class D, std::size_t R>
var<T, D, R> layer_norm_impl(const var<T, D, R>& x, const var<T, D, 1>* w, const var<T, D, 1>* b, double eps) {
  static_assert(R >= 1, "locus: ag::layer_norm needs a value of rank 1 or more (it normalises the last axis)");
  auto& t = owner(x, "ag::layer_norm");
  check_norm_args(t, x, w, b, eps, "ag::layer_norm", "it must have");
  return norm_impl(t, x, w, b, eps, true);
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

/// (x - mean) / sqrt(var + eps) along the last axis (the biased variance, as PyTorch).
template <class T, class D, std::size_t R>
var<T, D, R> layer_norm(const var<T, D, R>& x, double eps) {
  return detail::layer_norm_impl(x, static_cast<const var<T, D, 1>*>(nullptr), static_cast<const var<T, D, 1>*>(nullptr),
                                 eps);
}
/// The same times `gain` [C] plus `bias` [C] (PyTorch's nn.LayerNorm with its weight and bias).
template <class T, class D, std::size_t R>
var<T, D, R> layer_norm(const var<T, D, R>& x, const var<T, D, 1>& gain, const var<T, D, 1>& bias, double eps) {
  return detail::layer_norm_impl(x, &gain, &bias, eps);
}

// Prevents: a layer_norm gain or bias of another device or dtype than x ("no matching function").
template <class X, class W, class B>
  requires(is_var_v<X> && is_var_v<W> && is_var_v<B> &&
           !(std::is_same_v<typename X::value_type, typename W::value_type> &&
             std::is_same_v<typename X::value_type, typename B::value_type> &&
             std::is_same_v<typename X::device, typename W::device> &&
             std::is_same_v<typename X::device, typename B::device>))
int layer_norm(const X&, const W&, const B&, double) {
  if constexpr (detail::check_pair<X, W>()) (void)detail::check_pair<X, B>();
  return 0;
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
