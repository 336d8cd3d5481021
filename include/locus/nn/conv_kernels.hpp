// The kernels of convolutional networks (NCHW): im2col / col2im for conv2d, pooling and
// batch normalisation. Each is one functor per index, called through
// detail::launch_n on every device (the same source on the host and on the GPU); conv2d
// adds a host path that walks rows (im2col into a per-thread buffer, a GEMM per sample,
// OpenMP over the batch), which the tests check against the per-index functors.
//
// Every backward here is a gather: each input element sums what the outputs that read
// it send back, in a fixed order, so no kernel needs atomics and every result is the
// same bits at any thread count and on every run.
//
// Length (over 600 lines): the per-index kernels of the NCHW layers (im2col, col2im,
// pooling, batch norm) and their geometry checks, one source for every device, beside
// the host forms the tests compare them with.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../backend/host_simd.hpp"
#include "../backend/launch.hpp"
#include "../core/config.hpp"
#include "../ops/math.hpp"

namespace locus::detail {

/// The shape of one conv2d call: input [n, c, h, w], weight [k, c / groups, kh, kw],
/// output [n, k, ho, wo].
struct conv_geometry {
  index_t n = 0, c = 0, h = 0, w = 0;
  index_t k = 0, kh = 0, kw = 0;
  index_t stride = 1, pad = 0, dil = 1, groups = 1;
  index_t ho = 0, wo = 0;
  [[nodiscard]] LOCUS_HOST_DEVICE index_t cg() const noexcept { return c / groups; }  // input channels per group
  [[nodiscard]] LOCUS_HOST_DEVICE index_t kg() const noexcept { return k / groups; }  // output channels per group
  [[nodiscard]] LOCUS_HOST_DEVICE index_t depth() const noexcept { return cg() * kh * kw; }  // the GEMM's k
  [[nodiscard]] LOCUS_HOST_DEVICE index_t hw() const noexcept { return ho * wo; }
};

/// One axis of a convolution or pooling window, in overflow-checked arithmetic: the
/// padded input in + 2 * pad, the dilated window dil * (kernel - 1) + 1 and the output
/// extent (padded - span) / stride + 1 (PyTorch's formula; 0 when the window does not
/// fit). ok is false when one of them does not fit in index_t (the caller raises a
/// shape_error). Needs in >= 0, kernel >= 1, stride >= 1, pad >= 0, dil >= 1 (checked
/// when the layer is built). Once ok, every index the kernels form (oh * stride - pad +
/// ky * dil and the like) lies within [-pad, padded) and cannot overflow.
struct window_axis {
  index_t padded = 0, span = 0, out = 0;
  bool ok = false;
};
inline window_axis window_extent(index_t in, index_t kernel, index_t stride, index_t pad, index_t dil) noexcept {
  window_axis a;
  index_t two_pad = 0, reach = 0;
  if (__builtin_mul_overflow(pad, index_t{2}, &two_pad) || __builtin_add_overflow(in, two_pad, &a.padded) ||
      __builtin_mul_overflow(dil, kernel - 1, &reach) || __builtin_add_overflow(reach, index_t{1}, &a.span))
    return a;
  a.out = a.padded < a.span ? 0 : (a.padded - a.span) / stride + 1;
  a.ok = true;
  return a;
}

/// a * b * ... for non-negative factors; false when the product does not fit in index_t.
template <class... I>
inline bool checked_product(index_t& out, index_t first, I... rest) noexcept {
  out = first;
  bool overflow = false;
  ((overflow = overflow || __builtin_mul_overflow(out, static_cast<index_t>(rest), &out)), ...);
  return !overflow;
}

/// The sums of a(j) and b(j) over j in [0, n) in eight interleaved partial sums, added
/// in a fixed order: eight independent chains instead of one (which a compiler may not
/// reorder without -ffast-math), the same bits on every run, thread count and device.
template <class V, class F>
LOCUS_HOST_DEVICE inline void sum_pairs(index_t n, F&& f, V& sa, V& sb) {
  V a[8] = {V(0), V(0), V(0), V(0), V(0), V(0), V(0), V(0)};
  V b[8] = {V(0), V(0), V(0), V(0), V(0), V(0), V(0), V(0)};
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int u = 0; u < 8; ++u) {
      V x, y;
      f(j + u, x, y);
      a[u] += x;
      b[u] += y;
    }
  }
  V ta = V(0), tb = V(0);
  for (; j < n; ++j) {
    V x, y;
    f(j, x, y);
    ta += x;
    tb += y;
  }
  for (int u = 0; u < 8; ++u) {
    ta += a[u];
    tb += b[u];
  }
  sa = ta;
  sb = tb;
}

// The host form of sum_pairs for f32 and f64 planes: the eight partial sums as the lanes
// of one lanes8 vector (backend/host_simd.hpp; lane u sums the elements j = u mod 8,
// exactly as sum_pairs's a[u]), so the compiler emits vector adds where the scalar form
// stays scalar. Same operations in the same order: the same bits as sum_pairs.
#if defined(LOCUS_HOST_LANES8)
/// sum_pairs with f8(j, x, y) filling lanes j..j+7 and f(j, x, y) one element (the tail).
template <class V, class F8, class F>
inline void sum_pairs8(index_t n, F8&& f8, F&& f, V& sa, V& sb) {
  using L = typename lanes8_of<V>::type;
  L a{}, b{};
  index_t j = 0;
  for (; j + 8 <= n; j += 8) {
    L x, y;
    f8(j, x, y);
    a += x;
    b += y;
  }
  V ta = V(0), tb = V(0);
  for (; j < n; ++j) {
    V x, y;
    f(j, x, y);
    ta += x;
    tb += y;
  }
  for (int u = 0; u < 8; ++u) {
    ta += a[u];
    tb += b[u];
  }
  sa = ta;
  sb = tb;
}
#endif

/// The sums of a plane's pairs (sum_pairs): over lanes of eight on the host for f32 and
/// f64 planes (f8 fills them; the same bits), element by element otherwise (f).
template <class T, class V, class F8, class F>
LOCUS_HOST_DEVICE inline void plane_sums(index_t n, F8&& f8, F&& f, V& sa, V& sb) {
#if defined(LOCUS_HOST_LANES8)
  if constexpr (has_lanes8<T> && std::is_same_v<T, V>) {
    sum_pairs8<V>(n, f8, f, sa, sb);
  } else {
    sum_pairs<V>(n, f, sa, sb);
  }
#else
  (void)f8;
  sum_pairs<V>(n, f, sa, sb);
#endif
}

/// col[r, p] = x[c, ih, iw] (0 outside the input) for one sample's group: r = (c, ky, kx)
/// over depth(), p = (oh, ow) over hw(). x points at the group's first channel.
template <class In, class Out>
struct im2col_kernel {
  const In* x;
  Out* col;
  conv_geometry g;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t ow = i % g.wo;
    index_t t = i / g.wo;
    const index_t oh = t % g.ho;
    t /= g.ho;
    const index_t kx = t % g.kw;
    t /= g.kw;
    const index_t ky = t % g.kh;
    const index_t c = t / g.kh;
    const index_t ih = oh * g.stride - g.pad + ky * g.dil, iw = ow * g.stride - g.pad + kx * g.dil;
    using V = compute_t<Out>;
    col[i] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? store<Out>(static_cast<V>(load(x[(c * g.h + ih) * g.w + iw])))
                                                         : store<Out>(V(0));
  }
};

/// dx[c, ih, iw] = the sum of col[r, p] over every (r, p) that im2col read it from: the
/// gather form of col2im, one input element per call, for one sample's group.
template <class In, class Out>
struct col2im_kernel {
  const In* col;
  Out* dx;
  conv_geometry g;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t iw = i % g.w;
    index_t t = i / g.w;
    const index_t ih = t % g.h;
    const index_t c = t / g.h;
    using V = compute_t<In>;
    V sum = V(0);
    for (index_t ky = 0; ky < g.kh; ++ky) {
      const index_t y = ih + g.pad - ky * g.dil;  // = oh * stride
      if (y < 0 || y % g.stride != 0) continue;
      const index_t oh = y / g.stride;
      if (oh >= g.ho) continue;
      for (index_t kx = 0; kx < g.kw; ++kx) {
        const index_t x = iw + g.pad - kx * g.dil;
        if (x < 0 || x % g.stride != 0) continue;
        const index_t ow = x / g.stride;
        if (ow >= g.wo) continue;
        sum += load(col[((c * g.kh + ky) * g.kw + kx) * g.hw() + oh * g.wo + ow]);
      }
    }
    dx[i] = store<Out>(static_cast<compute_t<Out>>(sum));
  }
};

/// y[i] = o[i] + bias[channel of i] (o and y may alias), over [n, k, hw].
template <class O, class T>
struct add_channel_bias_kernel {
  const O* o;
  const T* bias;  // nullptr: none
  T* y;
  index_t k, hw;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    using V = compute_t<O>;
    V v = load(o[i]);
    if (bias) v += static_cast<V>(load(bias[(i / hw) % k]));
    y[i] = store<T>(static_cast<compute_t<T>>(v));
  }
};

/// db[c] (+)= the sum of gy[n, c, :] over n and the plane: a conv2d bias gradient, one
/// channel per call: each plane in the compute dtype (sum_pairs), the planes in f64.
template <class T, class M>
struct channel_sum_kernel {
  const T* gy;
  M* db;
  index_t n, k, hw;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t c) const {
    using V = compute_t<T>;
    double s = 0.0;
    for (index_t b = 0; b < n; ++b) {
      const T* p = gy + (b * k + c) * hw;
      V part = V(0), unused = V(0);
      sum_pairs<V>(hw, [&](index_t j, V& x, V& y) { x = load(p[j]); y = V(0); }, part, unused);
      s += static_cast<double>(part);
    }
    db[c] = overwrite ? static_cast<M>(s) : static_cast<M>(static_cast<double>(db[c]) + s);
  }
};

// ---- pooling ------------------------------------------------------------------------------

/// A pooling window: kernel, stride, padding (square), on planes of h x w -> ho x wo.
struct pool_geometry {
  index_t h = 0, w = 0, ho = 0, wo = 0;
  index_t k = 1, stride = 1, pad = 0;
  /// The output rows (or columns) whose window holds input row i: [first, last].
  LOCUS_HOST_DEVICE void windows_of(index_t i, index_t out, index_t& first, index_t& last) const noexcept {
    const index_t lo = i + pad - k + 1;  // oh * stride >= lo
    first = lo <= 0 ? 0 : (lo - 1) / stride + 1;  // ceil(lo / stride), no lo + stride to overflow
    last = (i + pad) / stride;
    if (last > out - 1) last = out - 1;
  }
};

/// y = the maximum of each window (NaN when the window holds one, as PyTorch); idx =
/// the maximum's position in its plane (ih * w + iw), for backward.
template <class T>
struct max_pool_forward_kernel {
  const T* x;
  T* y;
  std::int32_t* idx;  // nullptr: inference
  pool_geometry g;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (g.ho * g.wo), r = i % (g.ho * g.wo);
    const index_t oh = r / g.wo, ow = r % g.wo;
    using V = compute_t<T>;
    V best = -std::numeric_limits<V>::infinity();
    index_t at = -1;
    const T* xp = x + plane * g.h * g.w;
    for (index_t ky = 0; ky < g.k; ++ky) {
      const index_t ih = oh * g.stride - g.pad + ky;
      if (ih < 0 || ih >= g.h) continue;
      for (index_t kx = 0; kx < g.k; ++kx) {
        const index_t iw = ow * g.stride - g.pad + kx;
        if (iw < 0 || iw >= g.w) continue;
        const V v = load(xp[ih * g.w + iw]);
        if (at < 0 || v > best || v != v) {
          best = v;
          at = ih * g.w + iw;
          if (v != v) {
            ky = g.k;  // NaN: it stays the maximum
            break;
          }
        }
      }
    }
    y[i] = store<T>(best);
    if (idx) idx[i] = static_cast<std::int32_t>(at);
  }
};

/// gx[i] = the sum of gy over the windows whose maximum was input element i.
template <class T>
struct max_pool_backward_kernel {
  const T* gy;
  const std::int32_t* idx;
  T* gx;
  pool_geometry g;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (g.h * g.w), pos = i % (g.h * g.w);
    const index_t ih = pos / g.w, iw = pos % g.w;
    index_t oh0, oh1, ow0, ow1;
    g.windows_of(ih, g.ho, oh0, oh1);
    g.windows_of(iw, g.wo, ow0, ow1);
    using V = compute_t<T>;
    V sum = V(0);
    const index_t base = plane * g.ho * g.wo;
    for (index_t oh = oh0; oh <= oh1; ++oh)
      for (index_t ow = ow0; ow <= ow1; ++ow)
        if (idx[base + oh * g.wo + ow] == pos) sum += load(gy[base + oh * g.wo + ow]);
    gx[i] = store<T>(sum);
  }
};

/// The divisor of average-pooling window (oh, ow): PyTorch's, with count_include_pad
/// (the padding inside the window counts, what lies beyond it does not) or without.
LOCUS_HOST_DEVICE inline index_t avg_pool_divisor(const pool_geometry& g, index_t oh, index_t ow, bool include_pad) {
  index_t h0 = oh * g.stride - g.pad, w0 = ow * g.stride - g.pad;
  index_t h1 = h0 + g.k < g.h + g.pad ? h0 + g.k : g.h + g.pad;
  index_t w1 = w0 + g.k < g.w + g.pad ? w0 + g.k : g.w + g.pad;
  if (include_pad) return (h1 - h0) * (w1 - w0);
  h0 = h0 < 0 ? 0 : h0;
  w0 = w0 < 0 ? 0 : w0;
  h1 = h1 > g.h ? g.h : h1;
  w1 = w1 > g.w ? g.w : w1;
  return (h1 - h0) * (w1 - w0);
}

template <class T>
struct avg_pool_forward_kernel {
  const T* x;
  T* y;
  pool_geometry g;
  bool include_pad;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (g.ho * g.wo), r = i % (g.ho * g.wo);
    const index_t oh = r / g.wo, ow = r % g.wo;
    using V = compute_t<T>;
    V sum = V(0);
    const T* xp = x + plane * g.h * g.w;
    for (index_t ky = 0; ky < g.k; ++ky) {
      const index_t ih = oh * g.stride - g.pad + ky;
      if (ih < 0 || ih >= g.h) continue;
      for (index_t kx = 0; kx < g.k; ++kx) {
        const index_t iw = ow * g.stride - g.pad + kx;
        if (iw >= 0 && iw < g.w) sum += load(xp[ih * g.w + iw]);
      }
    }
    y[i] = store<T>(sum / static_cast<V>(avg_pool_divisor(g, oh, ow, include_pad)));
  }
};

template <class T>
struct avg_pool_backward_kernel {
  const T* gy;
  T* gx;
  pool_geometry g;
  bool include_pad;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (g.h * g.w), pos = i % (g.h * g.w);
    const index_t ih = pos / g.w, iw = pos % g.w;
    index_t oh0, oh1, ow0, ow1;
    g.windows_of(ih, g.ho, oh0, oh1);
    g.windows_of(iw, g.wo, ow0, ow1);
    using V = compute_t<T>;
    V sum = V(0);
    const index_t base = plane * g.ho * g.wo;
    for (index_t oh = oh0; oh <= oh1; ++oh)
      for (index_t ow = ow0; ow <= ow1; ++ow)
        sum += load(gy[base + oh * g.wo + ow]) / static_cast<V>(avg_pool_divisor(g, oh, ow, include_pad));
    gx[i] = store<T>(sum);
  }
};

/// Adaptive average pooling's window along one axis: [floor(o * in / out),
/// ceil((o + 1) * in / out)), as PyTorch's.
LOCUS_HOST_DEVICE inline index_t adaptive_start(index_t o, index_t in, index_t out) { return (o * in) / out; }
LOCUS_HOST_DEVICE inline index_t adaptive_end(index_t o, index_t in, index_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <class T>
struct adaptive_avg_forward_kernel {
  const T* x;
  T* y;
  index_t h, w, ho, wo;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (ho * wo), r = i % (ho * wo);
    const index_t oh = r / wo, ow = r % wo;
    const index_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
    const index_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
    using V = compute_t<T>;
    V sum = V(0);
    for (index_t ih = h0; ih < h1; ++ih)
      for (index_t iw = w0; iw < w1; ++iw) sum += load(x[(plane * h + ih) * w + iw]);
    y[i] = store<T>(sum / static_cast<V>((h1 - h0) * (w1 - w0)));
  }
};

template <class T>
struct adaptive_avg_backward_kernel {
  const T* gy;
  T* gx;
  index_t h, w, ho, wo;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t plane = i / (h * w), pos = i % (h * w);
    const index_t ih = pos / w, iw = pos % w;
    using V = compute_t<T>;
    V sum = V(0);
    for (index_t oh = 0; oh < ho; ++oh) {
      const index_t h0 = adaptive_start(oh, h, ho), h1 = adaptive_end(oh, h, ho);
      if (ih < h0 || ih >= h1) continue;
      for (index_t ow = 0; ow < wo; ++ow) {
        const index_t w0 = adaptive_start(ow, w, wo), w1 = adaptive_end(ow, w, wo);
        if (iw < w0 || iw >= w1) continue;
        sum += load(gy[(plane * ho + oh) * wo + ow]) / static_cast<V>((h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = store<T>(sum);
  }
};

// ---- batch normalisation ----------------------------------------------------------------

/// Training-mode batch norm of one channel per call over [n, c, hw]: the batch's mean
/// and biased variance, y = (x - mean) / sqrt(var + eps) * gamma + beta (then max(y, 0)
/// with relu: sequential fuses a relu that follows), the saved mean and 1 / sqrt(var +
/// eps) for backward, and the running statistics' update (PyTorch's: the unbiased
/// variance, weight `momentum`). The statistics take one pass: each row's sums of
/// d = x - K and d * d in the compute dtype (K, the mean of the channel's first plane,
/// keeps d small whatever the mean), the rows' sums in f64.
template <class T, class M>
struct batch_norm_train_kernel {
  const T* x;
  T* y;
  const M* gamma;  // nullptr: not affine
  const M* beta;
  M* mean_out;
  M* invstd_out;
  M* running_mean;  // nullptr: no running statistics
  M* running_var;
  index_t n, c, hw;
  double eps, momentum;
  bool relu = false;
  LOCUS_HOST_DEVICE void operator()(index_t ch) const {
    using V = compute_t<T>;
    const double count = static_cast<double>(n * hw);
    // the shift: the mean of the channel's first plane (a typical value, not one outlier)
    V k0, unused;
    plane_sums<T>(hw, [&](index_t j, auto& u, auto& v) { load8(u, x + ch * hw + j); v = std::remove_reference_t<decltype(v)>{}; },
               [&](index_t j, V& u, V& v) { u = load(x[ch * hw + j]); v = V(0); }, k0, unused);
    const V k = hw > 0 ? k0 / static_cast<V>(hw) : V(0);
    double s1 = 0.0, s2 = 0.0;
    for (index_t b = 0; b < n; ++b) {
      const T* p = x + (b * c + ch) * hw;
      V r1, r2;
      plane_sums<T>(hw, [&](index_t j, auto& u, auto& v) {
        load8(u, p + j);
        u -= k;
        v = u * u;
      }, [&](index_t j, V& u, V& v) {
        const V d = load(p[j]) - k;
        u = d;
        v = d * d;
      }, r1, r2);
      s1 += static_cast<double>(r1);
      s2 += static_cast<double>(r2);
    }
    const double md = s1 / count;
    const double mean = static_cast<double>(k) + md;
    double var = s2 / count - md * md;
    var = var < 0.0 ? 0.0 : var;  // rounding below zero; NaN stays NaN
    const double invstd = 1.0 / ::sqrt(var + eps);
    const double gm = gamma ? static_cast<double>(gamma[ch]) : 1.0, bt = beta ? static_cast<double>(beta[ch]) : 0.0;
    const V scale = static_cast<V>(invstd * gm), shift = static_cast<V>(bt - mean * invstd * gm);
    for (index_t b = 0; b < n; ++b) {
      const T* p = x + (b * c + ch) * hw;
      T* o = y + (b * c + ch) * hw;
      if (relu) {
        for (index_t j = 0; j < hw; ++j) {
          const V v = load(p[j]) * scale + shift;
          o[j] = store<T>(v < V(0) ? V(0) : v);  // op::relu's: NaN stays NaN
        }
      } else {
        for (index_t j = 0; j < hw; ++j) o[j] = store<T>(load(p[j]) * scale + shift);
      }
    }
    mean_out[ch] = static_cast<M>(mean);
    invstd_out[ch] = static_cast<M>(invstd);
    if (running_mean) {
      const double unbiased = count > 1.0 ? var * count / (count - 1.0) : var;
      running_mean[ch] = static_cast<M>((1.0 - momentum) * static_cast<double>(running_mean[ch]) + momentum * mean);
      running_var[ch] = static_cast<M>((1.0 - momentum) * static_cast<double>(running_var[ch]) + momentum * unbiased);
    }
  }
};

/// Inference-mode batch norm, one element per call: the running statistics.
template <class T, class M>
struct batch_norm_infer_kernel {
  const T* x;
  T* y;
  const M* gamma;
  const M* beta;
  const M* mean;
  const M* var;
  index_t c, hw;
  double eps;
  bool relu = false;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const index_t ch = (i / hw) % c;
    const double invstd = 1.0 / ::sqrt(static_cast<double>(var[ch]) + eps);
    const double gm = gamma ? static_cast<double>(gamma[ch]) : 1.0, bt = beta ? static_cast<double>(beta[ch]) : 0.0;
    double v = (static_cast<double>(load(x[i])) - static_cast<double>(mean[ch])) * invstd * gm + bt;
    if (relu && v < 0.0) v = 0.0;  // op::relu's: NaN stays NaN
    y[i] = store<T>(static_cast<compute_t<T>>(v));
  }
};

/// Training-mode batch norm's backward, one channel per call: with xhat = (x - mean) *
/// invstd, dgamma = sum(dy * xhat), dbeta = sum(dy), and dx = gamma * invstd * (dy -
/// mean(dy) - xhat * mean(dy * xhat)); with y (a fused relu's output) dy counts only
/// where y > 0. Row sums in the compute dtype, their totals in f64.
template <class T, class M>
struct batch_norm_backward_kernel {
  const T* x;
  const T* gy;
  T* gx;  // nullptr: not needed
  const M* gamma;
  const M* mean;
  const M* invstd;
  M* dgamma;  // nullptr: not affine
  M* dbeta;
  bool dgamma_overwrite, dbeta_overwrite;
  index_t n, c, hw;
  const T* y = nullptr;  // the fused relu's output (nullptr: no relu)
  LOCUS_HOST_DEVICE void operator()(index_t ch) const {
    using V = compute_t<T>;
    const V mu = static_cast<V>(mean[ch]), is = static_cast<V>(invstd[ch]);
    double sdy = 0.0, sdyx = 0.0;
    for (index_t b = 0; b < n; ++b) {
      const T* p = x + (b * c + ch) * hw;
      const T* d = gy + (b * c + ch) * hw;
      const T* yo = y ? y + (b * c + ch) * hw : nullptr;
      V r1, r2;
      if (yo) {
        plane_sums<T>(hw, [&](index_t j, auto& u, auto& v) {
          std::remove_reference_t<decltype(u)> yl, dl, xl;
          load8(yl, yo + j);
          load8(dl, d + j);
          load8(xl, p + j);
          const std::remove_reference_t<decltype(u)> zero{};
          u = yl > V(0) ? dl : zero;  // 0 where the relu's output is not positive (a NaN dy too, as below)
          v = u * (xl - mu);
        }, [&](index_t j, V& u, V& v) {
          const V dv = load(d[j]);
          const V dy = load(yo[j]) > V(0) ? dv : V(0);
          u = dy;
          v = dy * (load(p[j]) - mu);
        }, r1, r2);
      } else {
        plane_sums<T>(hw, [&](index_t j, auto& u, auto& v) {
          std::remove_reference_t<decltype(u)> xl;
          load8(u, d + j);
          load8(xl, p + j);
          v = u * (xl - mu);
        }, [&](index_t j, V& u, V& v) {
          const V dy = load(d[j]);
          u = dy;
          v = dy * (load(p[j]) - mu);
        }, r1, r2);
      }
      sdy += static_cast<double>(r1);
      sdyx += static_cast<double>(r2) * static_cast<double>(is);
    }
    if (dgamma) dgamma[ch] = dgamma_overwrite ? static_cast<M>(sdyx) : static_cast<M>(static_cast<double>(dgamma[ch]) + sdyx);
    if (dbeta) dbeta[ch] = dbeta_overwrite ? static_cast<M>(sdy) : static_cast<M>(static_cast<double>(dbeta[ch]) + sdy);
    if (!gx) return;
    const double count = static_cast<double>(n * hw);
    const double gm = gamma ? static_cast<double>(gamma[ch]) : 1.0;
    const double mdy = sdy / count, mdyx = sdyx / count;
    // dx = a * dy + b * (x - mean) + c0, with a = gamma * invstd, b = -a * invstd * mean(dy * xhat)
    const V a = static_cast<V>(gm * static_cast<double>(is));
    const V bb = static_cast<V>(-gm * static_cast<double>(is) * static_cast<double>(is) * mdyx);
    const V c0 = static_cast<V>(-gm * static_cast<double>(is) * mdy);
    for (index_t b = 0; b < n; ++b) {
      const T* p = x + (b * c + ch) * hw;
      const T* d = gy + (b * c + ch) * hw;
      const T* yo = y ? y + (b * c + ch) * hw : nullptr;
      T* o = gx + (b * c + ch) * hw;
      if (yo) {
        for (index_t j = 0; j < hw; ++j) {
          const V dv = load(d[j]);  // loaded whatever yo[j] is: the loop vectorises
          const V dy = load(yo[j]) > V(0) ? dv : V(0);
          o[j] = store<T>(a * dy + bb * (load(p[j]) - mu) + c0);
        }
      } else {
        for (index_t j = 0; j < hw; ++j) o[j] = store<T>(a * load(d[j]) + bb * (load(p[j]) - mu) + c0);
      }
    }
  }
};

// ---- layer normalisation (over the last axis) ---------------------------------------

/// One row per call: mean and biased variance over its f features (two passes in f64:
/// a row is short and in cache), y = (x - mean) / sqrt(var + eps) * gamma + beta, the
/// saved mean and 1 / sqrt(var + eps).
template <class T, class M>
struct layer_norm_forward_kernel {
  const T* x;
  T* y;
  const M* gamma;  // nullptr: no affine parameters
  const M* beta;
  M* mean_out;     // nullptr: inference
  M* invstd_out;
  index_t f;
  double eps;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    using V = compute_t<T>;
    const T* p = x + r * f;
    double s1 = 0.0;
    for (index_t j = 0; j < f; ++j) s1 += static_cast<double>(load(p[j]));
    const double mean = s1 / static_cast<double>(f);
    double s2 = 0.0;
    for (index_t j = 0; j < f; ++j) {
      const double d = static_cast<double>(load(p[j])) - mean;
      s2 += d * d;
    }
    const double var = s2 / static_cast<double>(f);
    const double invstd = 1.0 / ::sqrt(var + eps);
    T* o = y + r * f;
    for (index_t j = 0; j < f; ++j) {
      double v = (static_cast<double>(load(p[j])) - mean) * invstd;
      if (gamma) v = v * static_cast<double>(gamma[j]) + static_cast<double>(beta[j]);
      o[j] = store<T>(static_cast<V>(v));
    }
    if (mean_out) {
      mean_out[r] = static_cast<M>(mean);
      invstd_out[r] = static_cast<M>(invstd);
    }
  }
};

/// dx of one row per call: with g = dy * gamma and xhat = (x - mean) * invstd,
/// dx = invstd * (g - mean(g) - xhat * mean(g * xhat)).
template <class T, class M>
struct layer_norm_backward_kernel {
  const T* x;
  const T* gy;
  T* gx;
  const M* gamma;
  const M* mean;
  const M* invstd;
  index_t f;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    const double mu = static_cast<double>(mean[r]), is = static_cast<double>(invstd[r]);
    const T* p = x + r * f;
    const T* d = gy + r * f;
    double sg = 0.0, sgx = 0.0;
    for (index_t j = 0; j < f; ++j) {
      const double g = static_cast<double>(load(d[j])) * (gamma ? static_cast<double>(gamma[j]) : 1.0);
      sg += g;
      sgx += g * (static_cast<double>(load(p[j])) - mu) * is;
    }
    const double mg = sg / static_cast<double>(f), mgx = sgx / static_cast<double>(f);
    T* o = gx + r * f;
    for (index_t j = 0; j < f; ++j) {
      const double g = static_cast<double>(load(d[j])) * (gamma ? static_cast<double>(gamma[j]) : 1.0);
      const double xhat = (static_cast<double>(load(p[j])) - mu) * is;
      o[j] = store<T>(static_cast<compute_t<T>>(is * (g - mg - xhat * mgx)));
    }
  }
};

/// dgamma[j] and dbeta[j] of one feature per call: sums over the rows, in order.
template <class T, class M>
struct layer_norm_param_grad_kernel {
  const T* x;
  const T* gy;
  const M* mean;
  const M* invstd;
  M* dgamma;
  M* dbeta;
  bool dgamma_overwrite, dbeta_overwrite;
  index_t rows, f;
  LOCUS_HOST_DEVICE void operator()(index_t j) const {
    double sg = 0.0, sb = 0.0;
    for (index_t r = 0; r < rows; ++r) {
      const double dy = static_cast<double>(load(gy[r * f + j]));
      sb += dy;
      sg += dy * (static_cast<double>(load(x[r * f + j])) - static_cast<double>(mean[r])) * static_cast<double>(invstd[r]);
    }
    dgamma[j] = dgamma_overwrite ? static_cast<M>(sg) : static_cast<M>(static_cast<double>(dgamma[j]) + sg);
    dbeta[j] = dbeta_overwrite ? static_cast<M>(sb) : static_cast<M>(static_cast<double>(dbeta[j]) + sb);
  }
};

/// dst[i] = v (parameter and buffer initialisation).
template <class T>
struct fill_kernel {
  T* dst;
  T v;
  LOCUS_HOST_DEVICE void operator()(index_t i) const { dst[i] = v; }
};

/// *counter += 1 (batch norm's num_batches_tracked, one thread).
struct increment_kernel {
  std::int64_t* counter;
  LOCUS_HOST_DEVICE void operator()(index_t) const { *counter += 1; }
};

}  // namespace locus::detail
