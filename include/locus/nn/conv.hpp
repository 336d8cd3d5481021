// Layers of convolutional networks, on rank-4 activations [batch, channels, height,
// width] (NCHW, PyTorch's layout), for every device and precision policy:
//
//   using D = locus::cpu; using P = locus::amp::fp32;
//   locus::nn::sequential model(
//       locus::nn::conv2d<D, P>(1, 32, 3, {.padding = 1}), locus::nn::batch_norm2d<D, P>(32),
//       locus::nn::relu<D, P>(), locus::nn::max_pool2d<D, P>(2),
//       locus::nn::flatten<D, P>(), locus::nn::linear<D, P>(32 * 14 * 14, 10));
//
// conv2d: weight [out, in / groups, k, k] and bias [out], initialised as PyTorch's
// nn.Conv2d (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * k * k); stride,
// padding, dilation and groups as PyTorch's. The GEMM is the device's (host BLAS or
// oneDNN, cuBLASLt on cuda) on im2col columns: on host devices a sample per OpenMP
// task (its columns in that thread's buffer, a single-threaded GEMM per group; the code
// can put several samples side by side, which measured slower here; the weight
// gradient summed per thread and then in thread order), with every buffer owned
// by the layer and reused, so a steady-state step allocates nothing; on cuda (and on the
// host through detail::conv_generic_path, which the tests use) a loop over samples of
// the one-source im2col and col2im kernels around matmul_into. cuDNN is not used.
//
// Pooling: max_pool2d (NaN propagates, as PyTorch), avg_pool2d (count_include_pad as
// PyTorch, on by default), adaptive_avg_pool2d. batch_norm2d: batch statistics in
// training (forward), running statistics in inference (infer), statistics and the
// affine parameters in the master dtype (f32 under mixed precision), running_mean,
// running_var and num_batches_tracked as buffers under PyTorch's names. flatten: rank 4
// to rank 2 [batch, channels * height * width], a view (no copy) in training.
//
// Batch norm updates its running statistics in every training forward, also in a step the
// trainer then refuses (a non-finite gradient) or a grad scaler skips, as PyTorch's does:
// the weights are those before such a step, the running statistics are not.
//
// Bad input: a channel count that does not match is a shape_error naming the layer and
// both counts (at construction when the previous layer's width is known, otherwise at
// the first batch); a kernel larger than the padded input, a zero stride, groups that
// do not divide the channels, a padding over half the pooling window, and batch norm
// over a single value per channel are errors that change nothing.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../backend/blas.hpp"
#include "conv_kernels.hpp"
#include "layers.hpp"

namespace locus::nn {

namespace detail {
/// Tests: run the device-generic path of conv2d (per-sample matmul_into around the
/// im2col and col2im kernels) and of pooling (the per-index kernels), what cuda runs, on
/// host devices too.
inline std::atomic<bool>& conv_generic_path() noexcept {
  static std::atomic<bool> on{false};
  return on;
}

/// Samples per task on conv2d's host path (default 1; tests set more).
inline std::atomic<index_t>& conv_host_chunk() noexcept {
  static std::atomic<index_t> chunk{1};
  return chunk;
}

template <class D>
bool host_path() noexcept {
  if constexpr (std::is_same_v<typename D::execution, locus::detail::host_execution>)
    return !conv_generic_path().load(std::memory_order_relaxed);
  else
    return false;
}

inline int host_threads() noexcept {
#if defined(_OPENMP)
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}
inline int host_thread_id() noexcept {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline std::string dims4(const extents<4>& s) {
  return "[" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ", " +
         std::to_string(s[3]) + "]";
}

/// A rank-4 shape with no negative extent whose element count, and every partial product
/// (h * w of an empty batch too), fits in index_t: output_shape takes any numbers.
inline void check_countable(const std::string& layer, const char* what, const extents<4>& s) {
  index_t n = 0;
  const auto at_least_1 = [](index_t v) { return v < 1 ? index_t{1} : v; };
  if (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0 ||
      !locus::detail::checked_product(n, at_least_1(s[0]), at_least_1(s[1]), at_least_1(s[2]), at_least_1(s[3])))
    throw shape_error("locus: " + layer + ": the " + what + " " + dims4(s) +
                      (s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0 ? " has a negative extent"
                                                                      : " has more elements than fit in 64 bits"));
}

/// Checks a rank-4 input's channels; throws shape_error naming the layer.
inline void check_channels(const std::string& layer, index_t expected, const extents<4>& s) {
  if (s[1] != expected)
    throw shape_error("locus: " + layer + " takes " + std::to_string(expected) + " channels, but its input " +
                      dims4(s) + " has " + std::to_string(s[1]));
}
inline std::vector<index_t> check_rank4(const std::string& layer, const std::vector<index_t>& in) {
  if (in.size() != 4)
    throw shape_error("locus: " + layer + " takes [batch, channels, height, width], but its input is " +
                      shape_list(in));
  return in;
}

/// Host im2col of one sample's group into col [depth, ho * wo] (row by row); row r
/// starts at col + r * ld (ld = ho * wo, or more when samples sit side by side).
template <class In, class G>
void im2col_host(const In* x, G* col, const locus::detail::conv_geometry& g, index_t ld) {
  const index_t hw = ld;
  for (index_t c = 0; c < g.cg(); ++c) {
    const In* xc = x + c * g.h * g.w;
    for (index_t ky = 0; ky < g.kh; ++ky) {
      for (index_t kx = 0; kx < g.kw; ++kx) {
        G* row = col + ((c * g.kh + ky) * g.kw + kx) * hw;
        const index_t off_x = kx * g.dil - g.pad;
        // the output columns whose input column lies inside [0, w)
        index_t ow0 = 0, ow1 = g.wo;
        while (ow0 < g.wo && ow0 * g.stride + off_x < 0) ++ow0;
        while (ow1 > ow0 && (ow1 - 1) * g.stride + off_x >= g.w) --ow1;
        for (index_t oh = 0; oh < g.ho; ++oh) {
          G* r = row + oh * g.wo;
          const index_t ih = oh * g.stride - g.pad + ky * g.dil;
          if (ih < 0 || ih >= g.h) {
            for (index_t ow = 0; ow < g.wo; ++ow) r[ow] = G(0);
            continue;
          }
          const In* xr = xc + ih * g.w + off_x;
          for (index_t ow = 0; ow < ow0; ++ow) r[ow] = G(0);
          if (g.stride == 1) {
            for (index_t ow = ow0; ow < ow1; ++ow) r[ow] = static_cast<G>(locus::detail::load(xr[ow]));
          } else {
            for (index_t ow = ow0; ow < ow1; ++ow) r[ow] = static_cast<G>(locus::detail::load(xr[ow * g.stride]));
          }
          for (index_t ow = ow1; ow < g.wo; ++ow) r[ow] = G(0);
        }
      }
    }
  }
}

/// Host col2im of one sample's group: dx [cg, h, w] += the columns (dx zeroed by the
/// caller), rows in order; row r of the columns starts at col + r * ld.
template <class G>
void col2im_host(const G* col, G* dx, const locus::detail::conv_geometry& g, index_t ld) {
  const index_t hw = ld;
  for (index_t c = 0; c < g.cg(); ++c) {
    G* dc = dx + c * g.h * g.w;
    for (index_t ky = 0; ky < g.kh; ++ky) {
      for (index_t kx = 0; kx < g.kw; ++kx) {
        const G* row = col + ((c * g.kh + ky) * g.kw + kx) * hw;
        const index_t off_x = kx * g.dil - g.pad;
        index_t ow0 = 0, ow1 = g.wo;
        while (ow0 < g.wo && ow0 * g.stride + off_x < 0) ++ow0;
        while (ow1 > ow0 && (ow1 - 1) * g.stride + off_x >= g.w) --ow1;
        for (index_t oh = 0; oh < g.ho; ++oh) {
          const index_t ih = oh * g.stride - g.pad + ky * g.dil;
          if (ih < 0 || ih >= g.h) continue;
          const G* r = row + oh * g.wo;
          G* dr = dc + ih * g.w + off_x;
          if (g.stride == 1) {
            for (index_t ow = ow0; ow < ow1; ++ow) dr[ow] += r[ow];
          } else {
            for (index_t ow = ow0; ow < ow1; ++ow) dr[ow * g.stride] += r[ow];
          }
        }
      }
    }
  }
}

template <class G>
locus::detail::gemm_operand<const G> op(const G* p, index_t rs, index_t cs) {
  return {p, 0, rs, cs};
}
/// A thread's reusable buffer of at least n values (host pooling's accumulators).
template <class V>
std::vector<V>& scratch_of(index_t n) {
  thread_local std::vector<V> buf;
  if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
  return buf;
}

/// Host pooling: a plane per task (OpenMP over planes), loops without divisions. The
/// backward passes scatter each output's gradient in output order, which adds, for every
/// input element, the same terms in the same order as the per-index gather kernels: the
/// same bits.
template <class F>
void for_planes(index_t planes, index_t work_per_plane, F&& f) {
  [[maybe_unused]] const bool parallel = planes > 1 && planes * work_per_plane >= locus::detail::host_parallel_threshold;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (index_t p = 0; p < planes; ++p) f(p);
}

template <class T>
void max_pool_forward_host(const T* x, T* y, std::int32_t* idx, const locus::detail::pool_geometry& g, index_t planes) {
  using V = locus::detail::compute_t<T>;
  for_planes(planes, g.h * g.w, [&](index_t p) {
    const T* xp = x + p * g.h * g.w;
    T* yp = y + p * g.ho * g.wo;
    std::int32_t* ip = idx ? idx + p * g.ho * g.wo : nullptr;
    for (index_t oh = 0; oh < g.ho; ++oh) {
      const index_t h0 = oh * g.stride - g.pad;
      const index_t ky0 = h0 < 0 ? -h0 : 0, ky1 = h0 + g.k > g.h ? g.h - h0 : g.k;
      for (index_t ow = 0; ow < g.wo; ++ow) {
        const index_t w0 = ow * g.stride - g.pad;
        const index_t kx0 = w0 < 0 ? -w0 : 0, kx1 = w0 + g.k > g.w ? g.w - w0 : g.k;
        V best = -std::numeric_limits<V>::infinity();
        index_t at = -1;
        for (index_t ky = ky0; ky < ky1; ++ky) {
          const T* row = xp + (h0 + ky) * g.w + w0;
          for (index_t kx = kx0; kx < kx1; ++kx) {
            const V v = locus::detail::load(row[kx]);
            if (at < 0 || v > best || v != v) {
              best = v;
              at = (h0 + ky) * g.w + w0 + kx;
              if (v != v) {
                ky = ky1;
                break;
              }
            }
          }
        }
        yp[oh * g.wo + ow] = locus::detail::store<T>(best);
        if (ip) ip[oh * g.wo + ow] = static_cast<std::int32_t>(at);
      }
    }
  });
}

template <class T>
void max_pool_backward_host(const T* gy, const std::int32_t* idx, T* gx, const locus::detail::pool_geometry& g,
                            index_t planes) {
  using V = locus::detail::compute_t<T>;
  for_planes(planes, g.h * g.w, [&](index_t p) {
    T* gp = gx + p * g.h * g.w;
    if constexpr (std::is_same_v<T, V>) {
      for (index_t i = 0; i < g.h * g.w; ++i) gp[i] = V(0);
      const T* gyp = gy + p * g.ho * g.wo;
      const std::int32_t* ip = idx + p * g.ho * g.wo;
      for (index_t o = 0; o < g.ho * g.wo; ++o)
        if (ip[o] >= 0) gp[ip[o]] += gyp[o];
    } else {  // f16 / bf16: sums in f32, rounded once (as the gather kernel)
      std::vector<V>& acc = scratch_of<V>(g.h * g.w);
      for (index_t i = 0; i < g.h * g.w; ++i) acc[static_cast<std::size_t>(i)] = V(0);
      const T* gyp = gy + p * g.ho * g.wo;
      const std::int32_t* ip = idx + p * g.ho * g.wo;
      for (index_t o = 0; o < g.ho * g.wo; ++o)
        if (ip[o] >= 0) acc[static_cast<std::size_t>(ip[o])] += locus::detail::load(gyp[o]);
      for (index_t i = 0; i < g.h * g.w; ++i) gp[i] = locus::detail::store<T>(acc[static_cast<std::size_t>(i)]);
    }
  });
}

template <class T>
void avg_pool_forward_host(const T* x, T* y, const locus::detail::pool_geometry& g, bool include_pad, index_t planes) {
  using V = locus::detail::compute_t<T>;
  for_planes(planes, g.h * g.w, [&](index_t p) {
    const T* xp = x + p * g.h * g.w;
    T* yp = y + p * g.ho * g.wo;
    for (index_t oh = 0; oh < g.ho; ++oh) {
      const index_t h0 = oh * g.stride - g.pad;
      const index_t ky0 = h0 < 0 ? -h0 : 0, ky1 = h0 + g.k > g.h ? g.h - h0 : g.k;
      for (index_t ow = 0; ow < g.wo; ++ow) {
        const index_t w0 = ow * g.stride - g.pad;
        const index_t kx0 = w0 < 0 ? -w0 : 0, kx1 = w0 + g.k > g.w ? g.w - w0 : g.k;
        V sum = V(0);
        for (index_t ky = ky0; ky < ky1; ++ky)
          for (index_t kx = kx0; kx < kx1; ++kx) sum += locus::detail::load(xp[(h0 + ky) * g.w + w0 + kx]);
        yp[oh * g.wo + ow] =
            locus::detail::store<T>(sum / static_cast<V>(locus::detail::avg_pool_divisor(g, oh, ow, include_pad)));
      }
    }
  });
}

template <class T>
void avg_pool_backward_host(const T* gy, T* gx, const locus::detail::pool_geometry& g, bool include_pad,
                            index_t planes) {
  using V = locus::detail::compute_t<T>;
  for_planes(planes, g.h * g.w, [&](index_t p) {
    T* gp = gx + p * g.h * g.w;
    std::vector<V>& acc = scratch_of<V>(g.h * g.w);
    for (index_t i = 0; i < g.h * g.w; ++i) acc[static_cast<std::size_t>(i)] = V(0);
    const T* gyp = gy + p * g.ho * g.wo;
    for (index_t oh = 0; oh < g.ho; ++oh) {
      const index_t h0 = oh * g.stride - g.pad;
      const index_t ky0 = h0 < 0 ? -h0 : 0, ky1 = h0 + g.k > g.h ? g.h - h0 : g.k;
      for (index_t ow = 0; ow < g.wo; ++ow) {
        const index_t w0 = ow * g.stride - g.pad;
        const index_t kx0 = w0 < 0 ? -w0 : 0, kx1 = w0 + g.k > g.w ? g.w - w0 : g.k;
        const V v = locus::detail::load(gyp[oh * g.wo + ow]) /
                    static_cast<V>(locus::detail::avg_pool_divisor(g, oh, ow, include_pad));
        for (index_t ky = ky0; ky < ky1; ++ky)
          for (index_t kx = kx0; kx < kx1; ++kx) acc[static_cast<std::size_t>((h0 + ky) * g.w + w0 + kx)] += v;
      }
    }
    for (index_t i = 0; i < g.h * g.w; ++i) gp[i] = locus::detail::store<T>(acc[static_cast<std::size_t>(i)]);
  });
}

}  // namespace detail

/// conv2d's options (PyTorch's nn.Conv2d arguments; square kernels and windows).
struct conv2d_options {
  index_t stride = 1;
  index_t padding = 0;
  index_t dilation = 1;
  index_t groups = 1;
  bool bias = true;
};

/// y = conv(x, w) + b over NCHW: x [n, in, h, w] -> y [n, out, ho, wo].
template <Device D, class Policy>
class conv2d : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute, 4> {
 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using M = typename policy::master;
  using view = tensor_view<const C, D, 4>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 4, output_rank = 4;
  static constexpr const char* layer_name = "conv2d";
  /// The same layer (configuration, not parameters) on device D2: sequential::to<D2>().
  template <Device D2>
  [[nodiscard]] conv2d<D2, Policy> on() const {
    return conv2d<D2, Policy>(in_, out_, k_, o_);
  }

  conv2d(index_t in_channels, index_t out_channels, index_t kernel_size, conv2d_options o = {})
      : in_(in_channels), out_(out_channels), k_(kernel_size), o_(o) {
    const auto bad = [&](const std::string& why) {
      throw shape_error("locus: " + describe() + ": " + why);
    };
    if (in_ <= 0 || out_ <= 0) bad("needs positive channel counts");
    if (k_ <= 0) bad("needs a positive kernel size");
    if (o_.stride <= 0) bad("stride must be at least 1, got " + std::to_string(o_.stride));
    if (o_.padding < 0) bad("padding must not be negative, got " + std::to_string(o_.padding));
    if (o_.dilation <= 0) bad("dilation must be at least 1, got " + std::to_string(o_.dilation));
    if (o_.groups <= 0) bad("groups must be at least 1, got " + std::to_string(o_.groups));
    if (in_ % o_.groups != 0 || out_ % o_.groups != 0)
      bad("groups (" + std::to_string(o_.groups) + ") must divide both the input channels (" + std::to_string(in_) +
          ") and the output channels (" + std::to_string(out_) + ")");
    // What no input can make right: a weight or a window whose size overflows 64 bits.
    index_t count = 0;
    if (!locus::detail::checked_product(count, out_, in_ / o_.groups, k_, k_) ||
        count > std::numeric_limits<index_t>::max() - out_)
      bad("the weight [" + std::to_string(out_) + ", " + std::to_string(in_ / o_.groups) + ", " + std::to_string(k_) +
          ", " + std::to_string(k_) + "] (and bias) has more elements than fit in 64 bits");
    if (!locus::detail::window_extent(0, k_, o_.stride, o_.padding, o_.dilation).ok)
      bad("the dilated kernel dilation * (kernel_size - 1) + 1 or the padding 2 * padding overflows 64-bit indices");
  }

  [[nodiscard]] index_t in_channels() const noexcept { return in_; }
  [[nodiscard]] index_t out_channels() const noexcept { return out_; }
  [[nodiscard]] index_t kernel_size() const noexcept { return k_; }
  [[nodiscard]] const conv2d_options& options() const noexcept { return o_; }
  [[nodiscard]] bool has_bias() const noexcept { return o_.bias; }

  [[nodiscard]] std::string describe() const {
    std::string s = "conv2d(" + std::to_string(in_) + ", " + std::to_string(out_) + ", " + std::to_string(k_);
    if (o_.stride != 1) s += ", stride=" + std::to_string(o_.stride);
    if (o_.padding != 0) s += ", padding=" + std::to_string(o_.padding);
    if (o_.dilation != 1) s += ", dilation=" + std::to_string(o_.dilation);
    if (o_.groups != 1) s += ", groups=" + std::to_string(o_.groups);
    if (!o_.bias) s += ", bias=false";
    return s + ")";
  }
  [[nodiscard]] index_t output_width(index_t in) const {
    if (in >= 0 && in != in_)
      throw shape_error("locus: " + describe() + " takes " + std::to_string(in_) + " channels, but its input has " +
                        std::to_string(in));
    return out_;
  }
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    detail::check_rank4(describe(), in);
    const auto g = geometry(extents<4>{in[0], in[1], in[2], in[3]});
    return {g.n, g.k, g.ho, g.wo};
  }
  [[nodiscard]] index_t parameter_count() const noexcept {
    return out_ * (in_ / o_.groups) * k_ * k_ + (o_.bias ? out_ : 0);
  }

  void declare(parameter_store<D, policy>& s, const std::string& prefix) {
    w_ = s.add(prefix + "weight", {out_, in_ / o_.groups, k_, k_});
    if (o_.bias) b_ = s.add(prefix + "bias", {out_});
  }
  void bind(parameter_store<D, policy>& s) { store_ = &s; }

  /// PyTorch's nn.Conv2d initialisation: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  void reset_parameters(std::uint64_t seed) {
    const double bound = 1.0 / std::sqrt(static_cast<double>((in_ / o_.groups) * k_ * k_));
    fill_uniform(store_->master_flat(w_), seed, w_ + 1, bound);
    if (o_.bias) fill_uniform(store_->master_flat(b_), seed, b_ + 1, bound);
  }

  /// The geometry of a call on input shape s (shape_error when the channels differ or the
  /// kernel does not fit the padded input).
  [[nodiscard]] locus::detail::conv_geometry geometry(const extents<4>& s) const {
    detail::check_channels(describe(), in_, s);
    locus::detail::conv_geometry g;
    g.n = s[0];
    g.c = s[1];
    g.h = s[2];
    g.w = s[3];
    g.k = out_;
    g.kh = g.kw = k_;
    g.stride = o_.stride;
    g.pad = o_.padding;
    g.dil = o_.dilation;
    g.groups = o_.groups;
    detail::check_countable(describe(), "input", s);
    if (g.h <= 0 || g.w <= 0)
      throw shape_error("locus: " + describe() + " got an empty input plane " + detail::dims4(s));
    // PyTorch's output size, (in + 2 * padding - dilation * (k - 1) - 1) / stride + 1,
    // with every step overflow-checked (UBSan found the unchecked form overflowing)
    const auto ah = locus::detail::window_extent(g.h, k_, g.stride, g.pad, g.dil);
    const auto aw = locus::detail::window_extent(g.w, k_, g.stride, g.pad, g.dil);
    if (!ah.ok || !aw.ok)
      throw shape_error("locus: " + describe() + ": the input " + detail::dims4(s) + " with padding " +
                        std::to_string(g.pad) + " has more rows or columns than 64-bit indices reach");
    g.ho = ah.out;
    g.wo = aw.out;
    if (g.ho <= 0 || g.wo <= 0)
      throw shape_error("locus: " + describe() + ": the kernel (" + std::to_string(ah.span) +
                        " wide with dilation) is larger than the padded input " + detail::dims4(s) + " (padding " +
                        std::to_string(g.pad) + ")");
    index_t count = 0;
    if (!locus::detail::checked_product(count, g.n, g.k, g.ho, g.wo) ||
        !locus::detail::checked_product(count, g.depth(), g.ho, g.wo))
      throw shape_error("locus: " + describe() + ": the output of input " + detail::dims4(s) + " ([" +
                        std::to_string(g.n) + ", " + std::to_string(g.k) + ", " + std::to_string(g.ho) + ", " +
                        std::to_string(g.wo) + "], or its im2col columns) has more elements than fit in 64 bits");
    return g;
  }

  view forward(const view& x) {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    x_ = x;
    detail::ensure_numel(y_, g.n * g.k * g.hw());
    run_forward(g, x.data_handle(), y_.data_handle(), buf_);
    const view y = detail::shaped(y_, extents<4>{g.n, g.k, g.ho, g.wo});
    this->run_post(x, y);
    return y;
  }

  /// Accumulates dL/dw and dL/db; returns dL/dx (empty when need_input_grad is false).
  view backward(const view& gy, bool need_input_grad = true) {
    const auto g = geometry(x_.shape());
    if (gy.shape() != extents<4>{g.n, g.k, g.ho, g.wo})
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " + detail::dims4(gy.shape()) +
                        " for an output of shape " + detail::dims4(extents<4>{g.n, g.k, g.ho, g.wo}));
    if (need_input_grad) detail::ensure_numel(gx_, x_.numel());
    C* gx = need_input_grad ? gx_.data_handle() : nullptr;
    if (o_.bias) {
      auto [db, fresh] = store_->grad_flat_out(b_);
      locus::detail::launch_n<D>(out_, locus::detail::channel_sum_kernel<C, M>{gy.data_handle(), db.data_handle(), g.n,
                                                                            g.k, g.hw(), fresh},
                                 g.n * g.hw());
    }
    auto [gw, fresh] = store_->grad_flat_out(w_);
    if (g.n == 0 || g.hw() == 0) {  // nothing to sum: the gradient is zero
      if (fresh) locus::detail::zero_bytes<D>(gw.data_handle(), static_cast<std::size_t>(gw.numel()) * sizeof(M));
    } else if (use_host_path()) {
      backward_host(g, gy.data_handle(), gw.data_handle(), fresh, gx, buf_);
    } else {
      backward_generic(g, gy, gw, fresh, gx, buf_);
    }
    if (!need_input_grad) return {};
    return detail::shaped(gx_, x_.shape());
  }

  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; buf_ = {}; }

  tensor<C, D, 4> infer(const view& x) const {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    tensor<C, D, 4> y(extents<4>{g.n, g.k, g.ho, g.wo});
    buffers b;  // its own: infer is const, and may run on several threads at once
    run_forward(g, x.data_handle(), y.data_handle(), b);
    this->run_post(x, std::as_const(y).view());
    return y;
  }

  [[nodiscard]] tensor_view<const C, D, 4> weight() const { return store_->template compute<4>(w_); }
  [[nodiscard]] std::size_t weight_index() const noexcept { return w_; }
  [[nodiscard]] std::size_t bias_index() const noexcept { return b_; }

 private:
  // The host GEMMs compute in f64 for f64 and in f32 otherwise (f16 / bf16 widened).
  using G = std::conditional_t<std::is_same_v<C, double>, double, float>;
  static constexpr bool host_device = std::is_same_v<typename D::execution, locus::detail::host_execution>;
  using O = std::conditional_t<is_half_v<C>, float, C>;  // the generic path's GEMM output dtype
  /// The buffers of one call: host per-thread scratch and widened weights; the generic
  /// path's columns, GEMM output and column gradient.
  struct buffers {
    tensor<G, D, 1> scratch, wg;
    tensor<C, D, 1> col;
    tensor<O, D, 1> out, dcol;
  };

  static bool use_host_path() noexcept { return detail::host_path<D>(); }

  void fill_uniform(tensor_view<M, D, 1> v, std::uint64_t seed, std::uint64_t stream, double bound) {
    locus::detail::launch_n<D>(v.numel(), locus::detail::uniform_init_kernel<M>{v.data_handle(), seed, stream,
                                                                                 -bound, bound});
  }

  const C* bias_ptr() const { return o_.bias ? store_->template compute<1>(b_).data_handle() : nullptr; }

  /// The compute weights as G (a widened copy for f16 / bf16, the weights themselves otherwise).
  const G* weights_g(buffers& b) const {
    const C* w = weight().data_handle();
    if constexpr (std::is_same_v<C, G>) {
      return w;
    } else {
      const index_t n = store_->entries()[w_].numel;
      detail::ensure_numel(b.wg, n);
      for (index_t i = 0; i < n; ++i) b.wg.data_handle()[i] = static_cast<G>(locus::detail::load(w[i]));
      return b.wg.data_handle();
    }
  }

  void run_forward(const locus::detail::conv_geometry& g, const C* x, C* y, buffers& b) const {
    if (g.n == 0) return;
    if (use_host_path()) forward_host(g, x, y, b);
    else forward_generic(g, x, y, b);
  }

  // ---- host: a chunk of samples per task, side by side in one GEMM per group ----
  // The columns of `chunk` samples sit side by side (row r of sample s at r * ld + s *
  // hw, ld = chunk * hw), so each group's GEMM has chunk * hw columns (and the weight
  // gradient's GEMM that depth) instead of hw: small planes still make GEMMs large
  // enough to run near the library's speed. Each thread owns its buffers; chunks are
  // split over threads statically (the same split, and bits, for the same thread count).
  // Measured (bench/cnn-run, 2 cores): chunks of about 1024 columns made the 3x3 64-channel
  // layer 10-20% slower than one sample per task (the columns outgrow L2, and backward
  // gathers dy), so the chunk is one sample until a shape shows otherwise.
  [[nodiscard]] static index_t chunk_of(const locus::detail::conv_geometry& g) noexcept {
    const index_t c = detail::conv_host_chunk().load(std::memory_order_relaxed);
    return c <= 1 ? 1 : c > g.n ? (g.n < 1 ? 1 : g.n) : c;
  }
  template <class F>
  static void over_chunks(const locus::detail::conv_geometry& g, index_t chunk, int threads, F&& f) {
    const index_t chunks = (g.n + chunk - 1) / chunk;
    if (threads > 1) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
      for (index_t q = 0; q < chunks; ++q) f(q * chunk, q * chunk + chunk < g.n ? chunk : g.n - q * chunk, detail::host_thread_id());
    } else {
      for (index_t q = 0; q < chunks; ++q) f(q * chunk, q * chunk + chunk < g.n ? chunk : g.n - q * chunk, 0);
    }
  }
  [[nodiscard]] static int threads_for(index_t chunks) noexcept {
    const int t = detail::host_threads();
    return chunks >= 2 ? (chunks < t ? static_cast<int>(chunks) : t) : 1;
  }

  void forward_host(const locus::detail::conv_geometry& g, const C* x, C* y, buffers& b) const {
    if constexpr (host_device) {
      const G* w = weights_g(b);
      const C* bias = bias_ptr();
      const index_t depth = g.depth(), hw = g.hw(), kg = g.kg();
      const index_t chunk = chunk_of(g), ld = chunk * hw;
      const int threads = threads_for((g.n + chunk - 1) / chunk);
      const index_t per = depth * ld + kg * ld;
      detail::ensure_numel(b.scratch, per * threads);
      G* const scratch = b.scratch.data_handle();
      over_chunks(g, chunk, threads, [&](index_t n0, index_t count, int t) {
        G* col = scratch + per * t;
        G* out = col + depth * ld;
        const index_t cols = count * hw;
        for (index_t grp = 0; grp < g.groups; ++grp) {
          for (index_t s = 0; s < count; ++s)
            detail::im2col_host(x + ((n0 + s) * g.c + grp * g.cg()) * g.h * g.w, col + s * hw, g, ld);
          locus::detail::host_gemm<G>(1, kg, cols, depth, detail::op(w + grp * kg * depth, depth, 1),
                                      detail::op<G>(col, ld, 1), {out, 0, ld, 1});
          for (index_t s = 0; s < count; ++s)
            for (index_t co = 0; co < kg; ++co) {
              const G bv = bias ? static_cast<G>(locus::detail::load(bias[grp * kg + co])) : G(0);
              const G* o = out + co * ld + s * hw;
              C* yo = y + ((n0 + s) * g.k + grp * kg + co) * hw;
              for (index_t j = 0; j < hw; ++j) yo[j] = locus::detail::store<C>(o[j] + bv);
            }
        }
      });
    }
  }

  void backward_host(const locus::detail::conv_geometry& g, const C* gy, M* gw, bool fresh, C* gx, buffers& b) {
    if constexpr (host_device) {
      const G* w = weights_g(b);
      const C* x = x_.data_handle();
      const index_t depth = g.depth(), hw = g.hw(), kg = g.kg();
      const index_t wsize = g.k * depth, plane = g.cg() * g.h * g.w;
      const index_t chunk = chunk_of(g), ld = chunk * hw;
      const int threads = threads_for((g.n + chunk - 1) / chunk);
      constexpr bool direct = std::is_same_v<C, G>;
      // per thread: its weight gradient, the columns, their gradient, dy side by side,
      // dx of one group (f16 / bf16)
      const index_t per = wsize + depth * ld + (gx ? depth * ld : 0) + kg * ld + (direct ? 0 : plane);
      detail::ensure_numel(b.scratch, per * threads);
      G* const scratch = b.scratch.data_handle();
      for (int t = 0; t < threads; ++t)
        for (index_t j = 0; j < wsize; ++j) scratch[per * t + j] = G(0);
      over_chunks(g, chunk, threads, [&](index_t n0, index_t count, int t) {
        G* dw = scratch + per * t;
        G* col = dw + wsize;
        G* dcol = col + depth * ld;
        G* dyc = dcol + (gx ? depth * ld : 0);
        G* dxb = dyc + kg * ld;
        const index_t cols = count * hw;
        for (index_t grp = 0; grp < g.groups; ++grp) {
          // one sample in f32 / f64: dy_g is already [kg, hw] in place, no gather
          const bool in_place = direct && ld == hw;  // one sample per task
          const G* dyg = nullptr;
          for (index_t s = 0; s < count; ++s) {
            detail::im2col_host(x + ((n0 + s) * g.c + grp * g.cg()) * g.h * g.w, col + s * hw, g, ld);
            if (in_place) continue;
            for (index_t co = 0; co < kg; ++co) {
              const C* d = gy + ((n0 + s) * g.k + grp * kg + co) * hw;
              G* r = dyc + co * ld + s * hw;
              for (index_t j = 0; j < hw; ++j) r[j] = static_cast<G>(locus::detail::load(d[j]));
            }
          }
          if (in_place) {
            if constexpr (direct) dyg = gy + (n0 * g.k + grp * kg) * hw;
          } else {
            dyg = dyc;
          }
          // dw_g += dy_g [kg, cols] x col^T [cols, depth]
          locus::detail::host_gemm<G>(1, kg, depth, cols, detail::op<G>(dyg, ld, 1), detail::op<G>(col, 1, ld),
                                      {dw + grp * kg * depth, 0, depth, 1}, true);
          if (!gx) continue;
          // dcol = w_g^T [depth, kg] x dy_g [kg, cols], then col2im into each sample's dx
          locus::detail::host_gemm<G>(1, depth, cols, kg, detail::op(w + grp * kg * depth, 1, depth),
                                      detail::op<G>(dyg, ld, 1), {dcol, 0, ld, 1});
          for (index_t s = 0; s < count; ++s) {
            C* dxc = gx + ((n0 + s) * g.c + grp * g.cg()) * g.h * g.w;
            if constexpr (direct) {
              for (index_t j = 0; j < plane; ++j) dxc[j] = G(0);
              detail::col2im_host<G>(dcol + s * hw, dxc, g, ld);
            } else {
              for (index_t j = 0; j < plane; ++j) dxb[j] = G(0);
              detail::col2im_host<G>(dcol + s * hw, dxb, g, ld);
              for (index_t j = 0; j < plane; ++j) dxc[j] = locus::detail::store<C>(dxb[j]);
            }
          }
        }
      });
      // the threads' sums in thread order (the same bits for the same thread count)
      for (index_t j = 0; j < wsize; ++j) {
        G s = scratch[j];
        for (int t = 1; t < threads; ++t) s += scratch[per * t + j];
        gw[j] = fresh ? static_cast<M>(s) : static_cast<M>(gw[j] + static_cast<M>(s));
      }
    } else {
      (void)g, (void)gy, (void)gw, (void)fresh, (void)gx;
    }
  }

  // ---- every device: per-sample matmul_into around the im2col / col2im kernels ----
  template <class T, std::size_t R>
  static tensor_view<T, D, R> raw(T* p, const extents<R>& s, const extents<R>& st) {
    return {locus::detail::raw_view_key{}, p, s, st};
  }

  void forward_generic(const locus::detail::conv_geometry& g, const C* x, C* y, buffers& b) const {
    const index_t depth = g.depth(), hw = g.hw(), kg = g.kg();
    detail::ensure_numel(b.col, depth * hw);
    constexpr bool direct = std::is_same_v<C, O>;
    O* out = nullptr;
    if constexpr (direct) {
      out = y;
    } else {
      detail::ensure_numel(b.out, g.n * g.k * hw);
      out = b.out.data_handle();
    }
    const C* w = weight().data_handle();
    for (index_t n = 0; n < g.n; ++n) {
      for (index_t grp = 0; grp < g.groups; ++grp) {
        locus::detail::launch_n<D>(depth * hw, locus::detail::im2col_kernel<C, C>{
                                                   x + (n * g.c + grp * g.cg()) * g.h * g.w, b.col.data_handle(), g});
        const auto wv = raw<const C, 2>(w + grp * kg * depth, {kg, depth}, {depth, 1});
        const auto cv = raw<const C, 2>(b.col.data_handle(), {depth, hw}, {hw, 1});
        matmul_into(raw<O, 2>(out + (n * g.k + grp * kg) * hw, {kg, hw}, {hw, 1}), wv, cv);
      }
    }
    const C* bias = bias_ptr();
    if (bias || !direct)
      locus::detail::launch_n<D>(g.n * g.k * hw, locus::detail::add_channel_bias_kernel<O, C>{out, bias, y, g.k, hw});
  }

  void backward_generic(const locus::detail::conv_geometry& g, const view& gy, tensor_view<M, D, 1> gw, bool fresh,
                        C* gx, buffers& b) {
    static_assert(std::is_same_v<O, M>, "locus: conv2d's weight gradient is the GEMM's output dtype");
    const index_t depth = g.depth(), hw = g.hw(), kg = g.kg();
    detail::ensure_numel(b.col, depth * hw);
    if (gx) detail::ensure_numel(b.dcol, depth * hw);
    const C* w = weight().data_handle();
    const C* x = x_.data_handle();
    bool first = fresh;
    for (index_t n = 0; n < g.n; ++n) {
      for (index_t grp = 0; grp < g.groups; ++grp) {
        locus::detail::launch_n<D>(depth * hw, locus::detail::im2col_kernel<C, C>{
                                                   x + (n * g.c + grp * g.cg()) * g.h * g.w, b.col.data_handle(), g});
        const auto dy = raw<const C, 2>(gy.data_handle() + (n * g.k + grp * kg) * hw, {kg, hw}, {hw, 1});
        const auto colt = raw<const C, 2>(b.col.data_handle(), {hw, depth}, {1, hw});  // col^T
        auto dw = raw<M, 2>(gw.data_handle() + grp * kg * depth, {kg, depth}, {depth, 1});
        if (first) matmul_into(dw, dy, colt);
        else matmul_into(dw, dy, colt, locus::accumulate);
        if (gx) {
          const auto wt = raw<const C, 2>(w + grp * kg * depth, {depth, kg}, {1, depth});  // w_g^T
          matmul_into(raw<O, 2>(b.dcol.data_handle(), {depth, hw}, {hw, 1}), wt, dy);
          locus::detail::launch_n<D>(g.cg() * g.h * g.w, locus::detail::col2im_kernel<O, C>{
                                                              b.dcol.data_handle(),
                                                              gx + (n * g.c + grp * g.cg()) * g.h * g.w, g});
        }
      }
      first = false;
    }
  }

  index_t in_, out_, k_;
  conv2d_options o_;
  std::size_t w_ = 0, b_ = 0;
  parameter_store<D, policy>* store_ = nullptr;
  view x_;
  tensor<C, D, 1> y_, gx_;
  buffers buf_;  // forward's and backward's (infer makes its own)
};

/// pooling's options: the stride (-1: the kernel size, PyTorch's default) and padding
/// (at most half the kernel).
struct pool2d_options {
  index_t stride = -1;
  index_t padding = 0;
};

namespace detail {
template <class Derived, Device D, class Policy>
class pool_base : public hooks<D, typename locus::detail::checked_policy_t<Policy>::compute, 4> {
 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using view = tensor_view<const C, D, 4>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 4, output_rank = 4;

  void declare(parameter_store<D, policy>&, const std::string&) {}
  void bind(parameter_store<D, policy>&) {}
  void reset_parameters(std::uint64_t) {}
  [[nodiscard]] index_t output_width(index_t in) const noexcept { return in; }
  [[nodiscard]] index_t parameter_count() const noexcept { return 0; }
};

/// What max and average pooling share: a k x k window with stride and padding, checked
/// once (validate(), from the derived constructor: the messages use its describe()), and
/// the geometry of an input.
template <class Derived, Device D, class Policy>
class window_pool : public pool_base<Derived, D, Policy> {
 public:
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    check_rank4(self().describe(), in);
    const auto g = geometry(extents<4>{in[0], in[1], in[2], in[3]});
    return {in[0], in[1], g.ho, g.wo};
  }
  [[nodiscard]] locus::detail::pool_geometry geometry(const extents<4>& s) const {
    locus::detail::pool_geometry g = g_;
    check_countable(self().describe(), "input", s);
    g.h = s[2];
    g.w = s[3];
    if (g.h <= 0 || g.w <= 0)
      throw shape_error("locus: " + self().describe() + " got an empty input plane " + dims4(s));
    if (Derived::positions_32bit && g.h * g.w > static_cast<index_t>(std::numeric_limits<std::int32_t>::max()))
      throw shape_error("locus: " + self().describe() + ": planes of more than 2^31 - 1 elements are not supported "
                        "(the maximum's position is kept as a 32-bit index), but the input is " + dims4(s));
    // PyTorch's (in + 2 * padding - kernel_size) / stride + 1, overflow-checked
    const auto ah = locus::detail::window_extent(g.h, g.k, g.stride, g.pad, 1);
    const auto aw = locus::detail::window_extent(g.w, g.k, g.stride, g.pad, 1);
    if (!ah.ok || !aw.ok)
      throw shape_error("locus: " + self().describe() + ": the input " + dims4(s) +
                        " with its padding has more rows or columns than 64-bit indices reach");
    g.ho = ah.out;
    g.wo = aw.out;
    if (g.ho <= 0 || g.wo <= 0)
      throw shape_error("locus: " + self().describe() + ": the window is larger than the padded input " + dims4(s) +
                        " (calculated output size " + std::to_string(g.ho) + " x " + std::to_string(g.wo) +
                        " is too small)");
    index_t count = 0;
    if (!locus::detail::checked_product(count, s[0], s[1], g.ho, g.wo))
      throw shape_error("locus: " + self().describe() + ": the output of input " + dims4(s) +
                        " has more elements than fit in 64 bits");
    return g;
  }

 protected:
  window_pool(index_t kernel_size, index_t stride, index_t padding) : g_{} {
    g_.k = kernel_size;
    g_.stride = stride == -1 ? kernel_size : stride;
    g_.pad = padding;
  }
  void validate() const {
    const std::string d = self().describe();
    if (g_.k <= 0) throw shape_error("locus: " + d + ": needs a positive kernel size");
    if (g_.stride <= 0) throw shape_error("locus: " + d + ": stride must be at least 1, got " + std::to_string(g_.stride));
    // PyTorch's rule (pad should be at most half of effective kernel size): no window
    // then lies entirely in the padding, where max pooling would give -inf and average
    // pooling without the padding would divide by 0. Written without 2 * pad, which
    // overflows for a huge padding.
    if (g_.pad < 0 || g_.pad > g_.k / 2)
      throw shape_error("locus: " + d + ": padding must be in [0, kernel_size / 2], got " + std::to_string(g_.pad));
    index_t area = 0;  // the divisor of average pooling, k * k
    if (!locus::detail::checked_product(area, g_.k, g_.k) || !locus::detail::window_extent(0, g_.k, g_.stride, g_.pad, 1).ok)
      throw shape_error("locus: " + d + ": a " + std::to_string(g_.k) + " x " + std::to_string(g_.k) +
                        " window has more elements than fit in 64 bits");
  }
  /// "name(k[, stride=s][, padding=p]" (the caller closes it).
  [[nodiscard]] std::string window_text(const char* name) const {
    std::string s = std::string(name) + "(" + std::to_string(g_.k);
    if (g_.stride != g_.k) s += ", stride=" + std::to_string(g_.stride);
    if (g_.pad) s += ", padding=" + std::to_string(g_.pad);
    return s;
  }
  locus::detail::pool_geometry g_;

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};
}  // namespace detail

/// Max pooling over k x k windows (PyTorch's nn.MaxPool2d without dilation or ceil_mode).
template <Device D, class Policy>
class max_pool2d : public detail::window_pool<max_pool2d<D, Policy>, D, Policy> {
  using base = detail::window_pool<max_pool2d<D, Policy>, D, Policy>;

 public:
  using typename base::C;
  using typename base::view;
  using base::geometry;
  static constexpr const char* layer_name = "max_pool2d";
  static constexpr bool positions_32bit = true;  // the maximum's position is an int32

  explicit max_pool2d(index_t kernel_size, pool2d_options o = {}) : base(kernel_size, o.stride, o.padding) {
    this->validate();
  }
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] max_pool2d<D2, Policy> on() const {
    return max_pool2d<D2, Policy>(this->g_.k, pool2d_options{.stride = this->g_.stride, .padding = this->g_.pad});
  }
  [[nodiscard]] std::string describe() const { return this->window_text("max_pool2d") + ")"; }

  view forward(const view& x) {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    xs_ = x.shape();
    const index_t n = x.shape()[0] * x.shape()[1] * g.ho * g.wo;
    detail::ensure_numel(y_, n);
    detail::ensure_numel(idx_, n);
    if (detail::host_path<D>())
      detail::max_pool_forward_host(x.data_handle(), y_.data_handle(), idx_.data_handle(), g, xs_[0] * xs_[1]);
    else
      locus::detail::launch_n<D>(n, locus::detail::max_pool_forward_kernel<C>{x.data_handle(), y_.data_handle(),
                                                                              idx_.data_handle(), g});
    const view y = detail::shaped(y_, extents<4>{x.shape()[0], x.shape()[1], g.ho, g.wo});
    this->run_post(x, y);
    return y;
  }
  view backward(const view& gy, bool = true) {
    const auto g = geometry(xs_);
    if (gy.shape() != extents<4>{xs_[0], xs_[1], g.ho, g.wo})
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " + detail::dims4(gy.shape()));
    const index_t n = xs_[0] * xs_[1] * xs_[2] * xs_[3];
    detail::ensure_numel(gx_, n);
    if (detail::host_path<D>())
      detail::max_pool_backward_host(gy.data_handle(), idx_.data_handle(), gx_.data_handle(), g, xs_[0] * xs_[1]);
    else
      locus::detail::launch_n<D>(n, locus::detail::max_pool_backward_kernel<C>{gy.data_handle(), idx_.data_handle(),
                                                                               gx_.data_handle(), g});
    return detail::shaped(gx_, xs_);
  }
  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; idx_ = {}; }

  tensor<C, D, 4> infer(const view& x) const {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    tensor<C, D, 4> y(extents<4>{x.shape()[0], x.shape()[1], g.ho, g.wo});
    if (detail::host_path<D>())
      detail::max_pool_forward_host(x.data_handle(), y.data_handle(), static_cast<std::int32_t*>(nullptr), g,
                                    x.shape()[0] * x.shape()[1]);
    else
      locus::detail::launch_n<D>(y.numel(),
                                 locus::detail::max_pool_forward_kernel<C>{x.data_handle(), y.data_handle(), nullptr, g});
    this->run_post(x, std::as_const(y).view());
    return y;
  }

 private:
  extents<4> xs_{};
  tensor<C, D, 1> y_, gx_;
  tensor<std::int32_t, D, 1> idx_;
};

/// avg_pool2d's options: PyTorch's nn.AvgPool2d (count_include_pad on by default).
struct avg_pool2d_options {
  index_t stride = -1;
  index_t padding = 0;
  bool count_include_pad = true;
};

/// Average pooling over k x k windows (PyTorch's nn.AvgPool2d without ceil_mode).
template <Device D, class Policy>
class avg_pool2d : public detail::window_pool<avg_pool2d<D, Policy>, D, Policy> {
  using base = detail::window_pool<avg_pool2d<D, Policy>, D, Policy>;

 public:
  using typename base::C;
  using typename base::view;
  using base::geometry;
  static constexpr const char* layer_name = "avg_pool2d";
  static constexpr bool positions_32bit = false;

  explicit avg_pool2d(index_t kernel_size, avg_pool2d_options o = {})
      : base(kernel_size, o.stride, o.padding), include_pad_(o.count_include_pad) {
    this->validate();
  }
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] avg_pool2d<D2, Policy> on() const {
    return avg_pool2d<D2, Policy>(
        this->g_.k, avg_pool2d_options{.stride = this->g_.stride, .padding = this->g_.pad, .count_include_pad = include_pad_});
  }
  [[nodiscard]] std::string describe() const {
    return this->window_text("avg_pool2d") + (include_pad_ ? ")" : ", count_include_pad=false)");
  }

  view forward(const view& x) {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    xs_ = x.shape();
    const index_t n = x.shape()[0] * x.shape()[1] * g.ho * g.wo;
    detail::ensure_numel(y_, n);
    if (detail::host_path<D>())
      detail::avg_pool_forward_host(x.data_handle(), y_.data_handle(), g, include_pad_, xs_[0] * xs_[1]);
    else
      locus::detail::launch_n<D>(n, locus::detail::avg_pool_forward_kernel<C>{x.data_handle(), y_.data_handle(), g,
                                                                              include_pad_});
    const view y = detail::shaped(y_, extents<4>{x.shape()[0], x.shape()[1], g.ho, g.wo});
    this->run_post(x, y);
    return y;
  }
  view backward(const view& gy, bool = true) {
    const auto g = geometry(xs_);
    if (gy.shape() != extents<4>{xs_[0], xs_[1], g.ho, g.wo})
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " + detail::dims4(gy.shape()));
    const index_t n = xs_[0] * xs_[1] * xs_[2] * xs_[3];
    detail::ensure_numel(gx_, n);
    if (detail::host_path<D>())
      detail::avg_pool_backward_host(gy.data_handle(), gx_.data_handle(), g, include_pad_, xs_[0] * xs_[1]);
    else
      locus::detail::launch_n<D>(n, locus::detail::avg_pool_backward_kernel<C>{gy.data_handle(), gx_.data_handle(), g,
                                                                               include_pad_});
    return detail::shaped(gx_, xs_);
  }
  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  tensor<C, D, 4> infer(const view& x) const {
    this->run_pre(x);
    const auto g = geometry(x.shape());
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    tensor<C, D, 4> y(extents<4>{x.shape()[0], x.shape()[1], g.ho, g.wo});
    if (detail::host_path<D>())
      detail::avg_pool_forward_host(x.data_handle(), y.data_handle(), g, include_pad_, x.shape()[0] * x.shape()[1]);
    else
      locus::detail::launch_n<D>(y.numel(), locus::detail::avg_pool_forward_kernel<C>{
                                                x.data_handle(), y.data_handle(), g, include_pad_});
    this->run_post(x, std::as_const(y).view());
    return y;
  }

 private:
  bool include_pad_;
  extents<4> xs_{};
  tensor<C, D, 1> y_, gx_;
};

/// Average pooling to a fixed output size (PyTorch's nn.AdaptiveAvgPool2d).
template <Device D, class Policy>
class adaptive_avg_pool2d : public detail::pool_base<adaptive_avg_pool2d<D, Policy>, D, Policy> {
  using base = detail::pool_base<adaptive_avg_pool2d<D, Policy>, D, Policy>;

 public:
  using typename base::C;
  using typename base::view;
  static constexpr const char* layer_name = "adaptive_avg_pool2d";

  adaptive_avg_pool2d(index_t out_h, index_t out_w) : ho_(out_h), wo_(out_w) {
    if (ho_ <= 0 || wo_ <= 0 || ho_ == std::numeric_limits<index_t>::max() || wo_ == std::numeric_limits<index_t>::max())
      throw shape_error("locus: " + describe() + ": needs a positive output size below 2^63 - 1");
  }
  explicit adaptive_avg_pool2d(index_t out) : adaptive_avg_pool2d(out, out) {}
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] adaptive_avg_pool2d<D2, Policy> on() const {
    return adaptive_avg_pool2d<D2, Policy>(ho_, wo_);
  }
  [[nodiscard]] std::string describe() const {
    return "adaptive_avg_pool2d(" + std::to_string(ho_) + (ho_ == wo_ ? "" : ", " + std::to_string(wo_)) + ")";
  }
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    detail::check_rank4(describe(), in);
    check_input(extents<4>{in[0], in[1], in[2], in[3]});
    return {in[0], in[1], ho_, wo_};
  }

  view forward(const view& x) {
    this->run_pre(x);
    check_input(x.shape());
    xs_ = x.shape();
    const index_t n = x.shape()[0] * x.shape()[1] * ho_ * wo_;
    detail::ensure_numel(y_, n);
    locus::detail::launch_n<D>(n, locus::detail::adaptive_avg_forward_kernel<C>{x.data_handle(), y_.data_handle(),
                                                                                xs_[2], xs_[3], ho_, wo_});
    const view y = detail::shaped(y_, extents<4>{xs_[0], xs_[1], ho_, wo_});
    this->run_post(x, y);
    return y;
  }
  view backward(const view& gy, bool = true) {
    if (gy.shape() != extents<4>{xs_[0], xs_[1], ho_, wo_})
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " + detail::dims4(gy.shape()));
    const index_t n = xs_[0] * xs_[1] * xs_[2] * xs_[3];
    detail::ensure_numel(gx_, n);
    locus::detail::launch_n<D>(n, locus::detail::adaptive_avg_backward_kernel<C>{gy.data_handle(), gx_.data_handle(),
                                                                                 xs_[2], xs_[3], ho_, wo_});
    return detail::shaped(gx_, xs_);
  }
  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  tensor<C, D, 4> infer(const view& x) const {
    this->run_pre(x);
    check_input(x.shape());
    tensor<C, D, 4> y(extents<4>{x.shape()[0], x.shape()[1], ho_, wo_});
    locus::detail::launch_n<D>(y.numel(), locus::detail::adaptive_avg_forward_kernel<C>{
                                              x.data_handle(), y.data_handle(), x.shape()[2], x.shape()[3], ho_, wo_});
    this->run_post(x, std::as_const(y).view());
    return y;
  }

 private:
  void check_input(const extents<4>& s) const {
    detail::check_countable(describe(), "input", s);
    if (s[2] <= 0 || s[3] <= 0)
      throw shape_error("locus: " + describe() + " got an empty input plane " + detail::dims4(s));
    // the windows' ends ((o + 1) * in + out - 1) / out and the output's element count
    index_t t = 0;
    const bool ok = locus::detail::checked_product(t, ho_ + 1, s[2]) && !__builtin_add_overflow(t, ho_, &t) &&
                    locus::detail::checked_product(t, wo_ + 1, s[3]) && !__builtin_add_overflow(t, wo_, &t) &&
                    locus::detail::checked_product(t, s[0], s[1], ho_, wo_);
    if (!ok)
      throw shape_error("locus: " + describe() + ": the input " + detail::dims4(s) +
                        " and the output size give more elements or window positions than fit in 64 bits");
  }
  index_t ho_, wo_;
  extents<4> xs_{};
  tensor<C, D, 1> y_, gx_;
};

/// [batch, channels, height, width] -> [batch, channels * height * width] (PyTorch's
/// nn.Flatten): a view of the input in training, a copy in inference. Its hooks see
/// rank-2 views: the input as [batch, channels * height * width], and the output.
template <Device D, class Policy>
class flatten : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute, 2> {
 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using view = tensor_view<const C, D, 4>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 4, output_rank = 2;
  static constexpr const char* layer_name = "flatten";
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] flatten<D2, Policy> on() const {
    return flatten<D2, Policy>{};
  }

  void declare(parameter_store<D, policy>&, const std::string&) {}
  void bind(parameter_store<D, policy>&) {}
  void reset_parameters(std::uint64_t) {}
  [[nodiscard]] std::string describe() const { return "flatten"; }
  [[nodiscard]] index_t output_width(index_t) const noexcept { return -1; }  // needs height and width
  [[nodiscard]] index_t parameter_count() const noexcept { return 0; }
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    detail::check_rank4(describe(), in);
    detail::check_countable(describe(), "input", extents<4>{in[0], in[1], in[2], in[3]});
    return {in[0], in[1] * in[2] * in[3]};
  }

  tensor_view<const C, D, 2> forward(const view& x) {
    if (!x.is_contiguous()) throw shape_error("locus: flatten needs a contiguous input");
    detail::check_countable(describe(), "input", x.shape());  // an empty batch of huge images too
    xs_ = x.shape();
    const tensor_view<const C, D, 2> y = x.reshape(extents<2>{xs_[0], xs_[1] * xs_[2] * xs_[3]});
    this->run_pre(y);
    this->run_post(y, y);
    return y;
  }
  view backward(const tensor_view<const C, D, 2>& gy, bool = true) {
    if (gy.shape() != extents<2>{xs_[0], xs_[1] * xs_[2] * xs_[3]})
      throw shape_error("locus: flatten backward got a gradient of shape " +
                        locus::detail::shape_string(gy.shape()) + " for an input of shape " + detail::dims4(xs_));
    return gy.reshape(xs_);
  }
  /// Keeps nothing for backward but the input's shape.
  void release_activations() noexcept {}

  tensor<C, D, 2> infer(const view& x) const {
    if (!x.is_contiguous()) throw shape_error("locus: flatten needs a contiguous input");
    detail::check_countable(describe(), "input", x.shape());
    tensor<C, D, 2> y(extents<2>{x.shape()[0], x.shape()[1] * x.shape()[2] * x.shape()[3]});
    const auto rows = x.reshape(y.shape());
    this->run_pre(rows);
    copy(rows, y);
    this->run_post(rows, std::as_const(y).view());
    return y;
  }

 private:
  extents<4> xs_{};
};

/// batch_norm2d's options (PyTorch's nn.BatchNorm2d arguments).
struct batch_norm_options {
  double eps = 1e-5;
  double momentum = 0.1;  ///< the running statistics' update weight, in [0, 1]
  bool affine = true;     ///< learnable weight (init 1) and bias (init 0)
};

/// Batch normalisation over [batch, channels, height, width], per channel. forward()
/// normalises with the batch's statistics and updates the running ones (training
/// mode); infer() uses the running statistics (inference mode).
template <Device D, class Policy>
class batch_norm2d : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute, 4> {
 public:
  /// forward(x, act) and infer(x, act) fuse an activation: relu only (nn::layer checks).
  static constexpr bool fuses_activation = true;
  static constexpr bool fuses_relu_only = true;
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using M = typename policy::master;
  using view = tensor_view<const C, D, 4>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 4, output_rank = 4;
  static constexpr const char* layer_name = "batch_norm2d";
  /// The same layer (configuration; the running statistics are buffers, which
  /// sequential::to<D2>() copies) on device D2.
  template <Device D2>
  [[nodiscard]] batch_norm2d<D2, Policy> on() const {
    return batch_norm2d<D2, Policy>(c_, o_);
  }
  /// sequential runs a relu that follows inside this layer's passes (has_hooks() off).
  static constexpr bool fuses_relu = true;

  explicit batch_norm2d(index_t num_features, batch_norm_options o = {}) : c_(num_features), o_(o) {
    if (c_ <= 0) throw shape_error("locus: " + describe() + ": needs a positive channel count");
    if (!(o_.eps > 0.0) || !std::isfinite(o_.eps))
      throw value_error("locus: " + describe() + ": eps must be positive and finite");
    if (!(o_.momentum >= 0.0 && o_.momentum <= 1.0))
      throw value_error("locus: " + describe() + ": momentum must be in [0, 1]");
    running_mean_ = zeros<M, D>(extents<1>{c_});
    running_var_ = tensor<M, D, 1>(extents<1>{c_});
    tracked_ = zeros<std::int64_t, D>(extents<0>{});
    mean_ = zeros<M, D>(extents<1>{c_});
    invstd_ = zeros<M, D>(extents<1>{c_});
    reset_buffers();
  }

  [[nodiscard]] index_t num_features() const noexcept { return c_; }
  [[nodiscard]] const batch_norm_options& options() const noexcept { return o_; }
  [[nodiscard]] std::string describe() const { return "batch_norm2d(" + std::to_string(c_) + ")"; }
  [[nodiscard]] index_t output_width(index_t in) const {
    if (in >= 0 && in != c_)
      throw shape_error("locus: " + describe() + " takes " + std::to_string(c_) + " channels, but its input has " +
                        std::to_string(in));
    return c_;
  }
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    detail::check_rank4(describe(), in);
    detail::check_channels(describe(), c_, extents<4>{in[0], in[1], in[2], in[3]});
    detail::check_countable(describe(), "input", extents<4>{in[0], in[1], in[2], in[3]});
    return in;
  }
  [[nodiscard]] index_t parameter_count() const noexcept { return o_.affine ? 2 * c_ : 0; }

  void declare(parameter_store<D, policy>& s, const std::string& prefix) {
    if (!o_.affine) return;
    w_ = s.add(prefix + "weight", {c_});
    b_ = s.add(prefix + "bias", {c_});
  }
  void bind(parameter_store<D, policy>& s) { store_ = &s; }
  /// weight = 1, bias = 0, running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_parameters(std::uint64_t) {
    if (o_.affine) {
      locus::detail::launch_n<D>(c_, locus::detail::fill_kernel<M>{store_->master_flat(w_).data_handle(), M(1)});
      locus::detail::launch_n<D>(c_, locus::detail::fill_kernel<M>{store_->master_flat(b_).data_handle(), M(0)});
    }
    reset_buffers();
  }

  /// f(name, view) for running_mean, running_var (master dtype, [C]) and
  /// num_batches_tracked (i64, rank 0), PyTorch's buffer names after `prefix`.
  template <class F>
  void for_each_buffer(const std::string& prefix, F&& f) {
    f(prefix + "running_mean", running_mean_.view());
    f(prefix + "running_var", running_var_.view());
    f(prefix + "num_batches_tracked", tracked_.view());
  }
  template <class F>
  void for_each_buffer(const std::string& prefix, F&& f) const {
    f(prefix + "running_mean", running_mean_.view());
    f(prefix + "running_var", running_var_.view());
    f(prefix + "num_batches_tracked", tracked_.view());
  }
  [[nodiscard]] tensor_view<const M, D, 1> running_mean() const noexcept { return running_mean_.view(); }
  [[nodiscard]] tensor_view<const M, D, 1> running_var() const noexcept { return running_var_.view(); }

  /// act: relu when sequential fused the relu after this layer (none otherwise).
  view forward(const view& x, detail::act_kind act = detail::act_kind::none) {
    this->run_pre(x);
    const extents<4> s = x.shape();
    detail::check_channels(describe(), c_, s);
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    if (s[0] == 0) {  // an empty batch: an empty output, the statistics unchanged (as PyTorch)
      x_ = x;
      relu_ = act == detail::act_kind::relu;
      empty_ = true;
      detail::ensure_numel(y_, 0);
      const view y = detail::shaped(y_, s);
      this->run_post(x, y);
      return y;
    }
    empty_ = false;
    if (s[0] * s[2] * s[3] <= 1)
      throw shape_error("locus: " + describe() + " in training needs more than one value per channel, but the input " +
                        detail::dims4(s) + " has " + std::to_string(s[0] * s[2] * s[3]));
    x_ = x;
    relu_ = act == detail::act_kind::relu;
    detail::ensure_numel(y_, x.numel());
    const index_t hw = s[2] * s[3];
    locus::detail::launch_n<D>(c_,
                               locus::detail::batch_norm_train_kernel<C, M>{
                                   x.data_handle(), y_.data_handle(), gamma(), beta(), mean_.data_handle(),
                                   invstd_.data_handle(), running_mean_.data_handle(), running_var_.data_handle(),
                                   s[0], c_, hw, o_.eps, o_.momentum, relu_},
                               s[0] * hw);
    locus::detail::launch_n<D>(1, locus::detail::increment_kernel{tracked_.data_handle()});
    const view y = detail::shaped(y_, s);
    this->run_post(x, y);
    return y;
  }

  view backward(const view& gy, bool need_input_grad = true) {
    const extents<4> s = x_.shape();
    if (gy.shape() != s)
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " + detail::dims4(gy.shape()) +
                        " for an output of shape " + detail::dims4(s));
    if (need_input_grad) detail::ensure_numel(gx_, x_.numel());
    if (empty_) {  // no samples: zero parameter gradients
      if (o_.affine) {
        for (const std::size_t i : {w_, b_}) {
          auto [g, fresh] = store_->grad_flat_out(i);
          if (fresh) locus::detail::zero_bytes<D>(g.data_handle(), static_cast<std::size_t>(g.numel()) * sizeof(M));
        }
      }
      if (!need_input_grad) return {};
      return detail::shaped(gx_, s);
    }
    M *dg = nullptr, *db = nullptr;
    bool dg_fresh = false, db_fresh = false;
    if (o_.affine) {
      auto [g, f] = store_->grad_flat_out(w_);
      dg = g.data_handle();
      dg_fresh = f;
      auto [b, fb] = store_->grad_flat_out(b_);
      db = b.data_handle();
      db_fresh = fb;
    }
    locus::detail::launch_n<D>(c_,
                               locus::detail::batch_norm_backward_kernel<C, M>{
                                   x_.data_handle(), gy.data_handle(), need_input_grad ? gx_.data_handle() : nullptr,
                                   gamma(), mean_.data_handle(), invstd_.data_handle(), dg, db, dg_fresh, db_fresh,
                                   s[0], c_, s[2] * s[3], relu_ ? y_.data_handle() : nullptr},
                               s[0] * s[2] * s[3]);
    if (!need_input_grad) return {};
    return detail::shaped(gx_, s);
  }

  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  tensor<C, D, 4> infer(const view& x, detail::act_kind act = detail::act_kind::none) const {
    this->run_pre(x);
    const extents<4> s = x.shape();
    detail::check_channels(describe(), c_, s);
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
    tensor<C, D, 4> y(s);
    locus::detail::launch_n<D>(y.numel(), locus::detail::batch_norm_infer_kernel<C, M>{
                                              x.data_handle(), y.data_handle(), gamma(), beta(),
                                              running_mean_.data_handle(), running_var_.data_handle(), c_,
                                              s[2] * s[3], o_.eps, act == detail::act_kind::relu});
    this->run_post(x, std::as_const(y).view());
    return y;
  }

 private:
  const M* gamma() const { return o_.affine ? store_->master_flat(w_).data_handle() : nullptr; }
  const M* beta() const { return o_.affine ? store_->master_flat(b_).data_handle() : nullptr; }
  void reset_buffers() {
    locus::detail::zero_bytes<D>(running_mean_.data_handle(), running_mean_.size_bytes());
    locus::detail::launch_n<D>(c_, locus::detail::fill_kernel<M>{running_var_.data_handle(), M(1)});
    locus::detail::zero_bytes<D>(tracked_.data_handle(), sizeof(std::int64_t));
  }

  index_t c_;
  batch_norm_options o_;
  std::size_t w_ = 0, b_ = 0;
  parameter_store<D, policy>* store_ = nullptr;
  view x_;
  tensor<C, D, 1> y_, gx_;
  tensor<M, D, 1> running_mean_, running_var_, mean_, invstd_;
  tensor<std::int64_t, D, 0> tracked_;
  bool relu_ = false, empty_ = false;
};

/// layer_norm's options (PyTorch's nn.LayerNorm over the last axis).
struct layer_norm_options {
  double eps = 1e-5;
  bool elementwise_affine = true;  ///< learnable weight (init 1) and bias (init 0), [features]
};

/// Layer normalisation over the last axis of activations of any rank (rank 2 [batch,
/// features], rank 3 [batch, tokens, features], ...): PyTorch's nn.LayerNorm(features).
/// Statistics per row in f64 from the compute dtype; weight and bias in the master dtype.
template <Device D, class Policy>
class layer_norm : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute> {
 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using M = typename policy::master;
  template <std::size_t R>
  using view_of = tensor_view<const C, D, R>;
  using view = view_of<2>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 0, output_rank = 0;  // any rank, kept
  static constexpr const char* layer_name = "layer_norm";
  /// The same layer (configuration, not parameters) on device D2: sequential::to<D2>().
  template <Device D2>
  [[nodiscard]] layer_norm<D2, Policy> on() const {
    return layer_norm<D2, Policy>(f_, o_);
  }

  explicit layer_norm(index_t features, layer_norm_options o = {}) : f_(features), o_(o) {
    if (f_ <= 0) throw shape_error("locus: " + describe() + ": needs a positive feature count");
    if (!(o_.eps > 0.0) || !std::isfinite(o_.eps))
      throw value_error("locus: " + describe() + ": eps must be positive and finite");
  }
  [[nodiscard]] std::string describe() const { return "layer_norm(" + std::to_string(f_) + ")"; }
  [[nodiscard]] index_t output_features(index_t in) const {
    if (in != f_)
      throw shape_error("locus: " + describe() + " normalises " + std::to_string(f_) +
                        " features, but its input's last axis has " + std::to_string(in));
    return f_;
  }
  [[nodiscard]] index_t output_width(index_t in) const { return in < 0 ? in : output_features(in); }
  [[nodiscard]] index_t parameter_count() const noexcept { return o_.elementwise_affine ? 2 * f_ : 0; }

  void declare(parameter_store<D, policy>& s, const std::string& prefix) {
    if (!o_.elementwise_affine) return;
    w_ = s.add(prefix + "weight", {f_});
    b_ = s.add(prefix + "bias", {f_});
  }
  void bind(parameter_store<D, policy>& s) { store_ = &s; }
  void reset_parameters(std::uint64_t) {
    if (!o_.elementwise_affine) return;
    locus::detail::launch_n<D>(f_, locus::detail::fill_kernel<M>{store_->master_flat(w_).data_handle(), M(1)});
    locus::detail::launch_n<D>(f_, locus::detail::fill_kernel<M>{store_->master_flat(b_).data_handle(), M(0)});
  }

  template <std::size_t R>
  view_of<R> forward(const view_of<R>& x) {
    if (this->has_hooks()) this->run_pre(detail::as_rows(x));
    check(x);
    x_ = x.data_handle();
    rows_ = x.numel() / f_;
    detail::ensure_numel(y_, x.numel());
    detail::ensure_numel(mean_, rows_ > 0 ? rows_ : 1);
    detail::ensure_numel(invstd_, rows_ > 0 ? rows_ : 1);
    locus::detail::launch_n<D>(rows_, locus::detail::layer_norm_forward_kernel<C, M>{
                                          x.data_handle(), y_.data_handle(), gamma(), beta(), mean_.data_handle(),
                                          invstd_.data_handle(), f_, o_.eps},
                               f_);
    const view_of<R> y = detail::shaped(y_, x.shape());
    if (this->has_hooks()) this->run_post(detail::as_rows(x), detail::as_rows(y));
    return y;
  }
  template <std::size_t R>
  view_of<R> backward(const view_of<R>& gy, bool need_input_grad = true) {
    if (gy.numel() != rows_ * f_ || gy.shape()[R - 1] != f_)
      throw shape_error("locus: " + describe() + " backward got a gradient of shape " +
                        locus::detail::shape_string(gy.shape()) + " for " + std::to_string(rows_) + " rows");
    if (o_.elementwise_affine) {
      auto [g, fg] = store_->grad_flat_out(w_);
      auto [b, fb] = store_->grad_flat_out(b_);
      locus::detail::launch_n<D>(f_, locus::detail::layer_norm_param_grad_kernel<C, M>{
                                         x_, gy.data_handle(), mean_.data_handle(), invstd_.data_handle(),
                                         g.data_handle(), b.data_handle(), fg, fb, rows_, f_},
                                 rows_);
    }
    if (!need_input_grad) return {};
    detail::ensure_numel(gx_, gy.numel());
    locus::detail::launch_n<D>(rows_, locus::detail::layer_norm_backward_kernel<C, M>{
                                          x_, gy.data_handle(), gx_.data_handle(), gamma(), mean_.data_handle(),
                                          invstd_.data_handle(), f_},
                               f_);
    return detail::shaped(gx_, gy.shape());
  }
  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  template <std::size_t R>
  tensor<C, D, R> infer(const view_of<R>& x) const {
    if (this->has_hooks()) this->run_pre(detail::as_rows(x));
    check(x);
    tensor<C, D, R> y(x.shape());
    locus::detail::launch_n<D>(x.numel() / f_, locus::detail::layer_norm_forward_kernel<C, M>{
                                                   x.data_handle(), y.data_handle(), gamma(), beta(), nullptr, nullptr,
                                                   f_, o_.eps},
                               f_);
    if (this->has_hooks()) this->run_post(detail::as_rows(x), detail::as_rows(std::as_const(y).view()));
    return y;
  }

 private:
  template <std::size_t R>
  void check(const view_of<R>& x) const {
    static_assert(R >= 1, "locus: layer_norm normalises the last axis; it needs rank 1 or more");
    (void)output_features(x.shape()[R - 1]);
    if (!x.is_contiguous()) throw shape_error("locus: " + describe() + " needs a contiguous input");
  }
  const M* gamma() const { return o_.elementwise_affine ? store_->master_flat(w_).data_handle() : nullptr; }
  const M* beta() const { return o_.elementwise_affine ? store_->master_flat(b_).data_handle() : nullptr; }

  index_t f_;
  layer_norm_options o_;
  std::size_t w_ = 0, b_ = 0;
  parameter_store<D, policy>* store_ = nullptr;
  const C* x_ = nullptr;
  index_t rows_ = 0;
  tensor<C, D, 1> y_, gx_;
  tensor<M, D, 1> mean_, invstd_;
};

}  // namespace locus::nn
