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
// Pooling and flatten are nn/pool.hpp, batch_norm2d and layer_norm nn/norm.hpp (this
// header includes both, so <locus/nn/conv.hpp> gives every layer of a CNN); what they
// share (shape checks, the host-path switch, per-plane tasks) nn/nchw.hpp.
//
// Bad input: a channel count that does not match is a shape_error naming the layer and
// both counts (at construction when the previous layer's width is known, otherwise at
// the first batch); a kernel larger than the padded input, a zero stride, groups that
// do not divide the channels are errors that change nothing.
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
#include "nchw.hpp"
#include "norm.hpp"
#include "pool.hpp"

namespace locus::nn {

namespace detail {
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

}  // namespace locus::nn
