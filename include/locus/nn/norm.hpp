// Normalisation layers: batch_norm2d over NCHW activations and layer_norm over the
// innermost axes.
//
// batch_norm2d: batch statistics in training (forward), running statistics in inference
// (infer), statistics and the affine parameters in the master dtype (f32 under mixed
// precision), running_mean, running_var and num_batches_tracked as buffers under
// PyTorch's names.
//
// Batch norm updates its running statistics in every training forward, also in a step the
// trainer then refuses (a non-finite gradient) or a grad scaler skips, as PyTorch's does:
// the weights are those before such a step, the running statistics are not.
//
// Bad input: a channel count that does not match is a shape_error naming the layer and
// both counts; batch norm over a single value per channel is an error that changes nothing.
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

namespace locus::nn {

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
