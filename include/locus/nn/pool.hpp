// Pooling and flatten over rank-4 activations [batch, channels, height, width] (NCHW):
// max_pool2d (NaN propagates, as PyTorch), avg_pool2d (count_include_pad as PyTorch, on
// by default), adaptive_avg_pool2d, each beside its host kernels (a plane per OpenMP
// task; the device kernels are nn/conv_kernels.hpp); flatten: rank 4 to rank 2 [batch,
// channels * height * width], a view (no copy) in training. A padding over half the
// pooling window is an error that changes nothing.
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


#include "conv_kernels.hpp"
#include "layers.hpp"
#include "nchw.hpp"

namespace locus::nn {

namespace detail {
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

}  // namespace locus::nn
