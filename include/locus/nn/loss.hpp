// Losses. A loss is a small options object (nn::cross_entropy{.label_smoothing = 0.1f},
// nn::mse{}); its state<D, Policy> does the work on the model's device:
//   forward(out, target, scale)  the mean loss as a rank-0 tensor on D (f32, or f64 for
//                                amp::fp64) and, in the same kernel, the gradient of
//                                scale * loss with respect to out (scale: the grad
//                                scaler's device-side loss scale, nullptr for 1);
//   grad()                       that gradient;
//   evaluate(out, target)        summed loss and correct predictions of a batch, on D.
// The loss stays on the device: nothing is copied to the host until someone asks.
//
// cross_entropy takes logits [N, K] and i64 labels [N]: a numerically stable log-softmax
// fused with the negative log-likelihood (label smoothing eps spreads eps over the K
// classes, as torch.nn.CrossEntropyLoss(label_smoothing=eps) does). A label outside
// [0, K) throws locus::index_error naming the sample and the value: at once on host
// devices, at the next check_labels() (the trainer's next report) on cuda.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "../amp/policy.hpp"
#include "../core/error.hpp"
#include "../ops/reduce.hpp"
#include "../tensor/factories.hpp"
#include "../transfer/copy.hpp"
#include "kernels.hpp"

namespace locus::nn {

template <Device D, class Policy>
class cross_entropy_state;
template <Device D, class Policy>
class mse_state;

/// Cross-entropy from logits with mean reduction and optional label smoothing.
struct cross_entropy {
  float label_smoothing = 0.0f;
  template <Device D, class Policy>
  using state = cross_entropy_state<D, Policy>;
};

/// Mean squared error between outputs and targets of the same shape.
struct mse {
  template <Device D, class Policy>
  using state = mse_state<D, Policy>;
};

template <Device D, class Policy>
class cross_entropy_state {
 public:
  using C = typename Policy::compute;
  using A = locus::detail::compute_t<C>;
  using view = tensor_view<const C, D, 2>;
  using target_view = tensor_view<const std::int64_t, D, 1>;
  static constexpr bool classifies = true;

  explicit cross_entropy_state(cross_entropy o) : eps_(static_cast<A>(o.label_smoothing)) {
    if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f))
      throw ::locus::value_error("locus: label_smoothing must be in [0, 1], got " +
                                  std::to_string(o.label_smoothing));
    bad_ = zeros<std::int64_t, D>(extents<1>{3});
  }

  /// The mean loss (rank 0, on D); the gradient of scale * loss goes to grad().
  tensor<A, D, 0> forward(const view& logits, const target_view& labels, const float* scale = nullptr,
                          double factor = 1.0) {
    tensor<A, D, 0> out(extents<0>{});
    forward_into(out, logits, labels, scale, factor);
    return out;
  }
  /// forward writing the mean loss into `out` (what the trainer calls: no allocation).
  void forward_into(tensor<A, D, 0>& out, const view& logits, const target_view& labels, const float* scale = nullptr,
                    double factor = 1.0) {
    factor_ = static_cast<A>(factor);
    run(logits, labels, true, scale, false);
    locus::detail::reduce_all_into<locus::detail::reduce_kind::mean>(locus::detail::to_expr(rows(row_loss_)), out, 0.0);
  }
  [[nodiscard]] view grad() const { return std::as_const(gx_).view(); }

  /// Summed loss and number of correct predictions of one batch (rank 0, on D).
  std::pair<tensor<A, D, 0>, tensor<A, D, 0>> evaluate(const view& logits, const target_view& labels) {
    run(logits, labels, false, nullptr, true);
    return {locus::sum(rows(row_loss_)), locus::sum(rows(row_correct_))};
  }

  /// Throws index_error if a label seen since the last check was outside [0, K)
  /// (reads three integers back from D).
  void check_labels() {
    std::int64_t h[3];
    if constexpr (D::host_accessible) {  // every step on the host: no copy
      std::memcpy(h, bad_.data_handle(), sizeof h);
    } else {
      const auto host = to<cpu>(bad_);
      std::memcpy(h, host.data_handle(), sizeof h);
    }
    if (h[0] != 0) {
      const std::int64_t tag = h[0] - 2, row = h[1], value = h[2];
      locus::detail::zero_bytes<D>(bad_.data_handle(), bad_.size_bytes());
      throw index_error("locus: cross_entropy: label " + std::to_string(value) + " of sample " +
                        std::to_string(row) + " in " +
                        (tag >= 0 ? "micro-batch " + std::to_string(tag) + " (the trainer's micro-steps, counted from 0)"
                                  : std::string("the batch")) +
                        " is outside [0, " + std::to_string(classes_) + "); labels must be class indices");
    }
  }

  /// Names the batches that follow in label errors (the trainer passes its micro-step;
  /// -1: unnamed).
  void set_batch_tag(std::int64_t tag) noexcept { tag_ = tag; }

 private:
  void run(const view& logits, const target_view& labels, bool with_grad, const float* scale, bool correct) {
    const index_t n = logits.shape()[0], k = logits.shape()[1];
    if (labels.shape()[0] != n)
      throw shape_error("locus: cross_entropy got logits of shape " + locus::detail::shape_string(logits.shape()) +
                        " and " + std::to_string(labels.shape()[0]) + " labels; expected one label per row");
    if (!logits.is_contiguous() || !labels.is_contiguous())
      throw shape_error("locus: cross_entropy needs contiguous logits and labels");
    classes_ = k;
    rows_ = n;
    if (row_loss_.numel() < n) {  // grow only: training and evaluation batches share them
      row_loss_ = tensor<A, D, 1>();
      row_correct_ = tensor<A, D, 1>();
      row_loss_ = tensor<A, D, 1>(extents<1>{n});
      row_correct_ = tensor<A, D, 1>(extents<1>{n});
    }
    if (with_grad && gx_.shape() != logits.shape()) gx_ = tensor<C, D, 2>(logits.shape());
    locus::detail::run_cross_entropy<D>(locus::detail::cross_entropy_kernel<C, std::int64_t, A>{
        logits.data_handle(), labels.data_handle(), with_grad ? gx_.data_handle() : nullptr, row_loss_.data_handle(),
        correct ? row_correct_.data_handle() : nullptr, bad_.data_handle(), scale, n, k, eps_, factor_, tag_});
    if constexpr (D::host_accessible) check_labels();
  }

  /// The first rows_ entries of a per-row buffer (the batch's).
  [[nodiscard]] tensor_view<const A, D, 1> rows(const tensor<A, D, 1>& t) const {
    return std::as_const(t).view().slice(0, rows_);
  }

  A eps_;
  A factor_ = A(1);
  std::int64_t tag_ = -1;
  index_t classes_ = 0;
  index_t rows_ = 0;
  tensor<A, D, 1> row_loss_, row_correct_;
  tensor<C, D, 2> gx_;
  tensor<std::int64_t, D, 1> bad_;
};

template <Device D, class Policy>
class mse_state {
 public:
  using C = typename Policy::compute;
  using A = locus::detail::compute_t<C>;
  using view = tensor_view<const C, D, 2>;
  using target_view = tensor_view<const C, D, 2>;
  static constexpr bool classifies = false;

  explicit mse_state(mse) {}

  /// The mean loss (rank 0, on D); the gradient of scale * loss goes to grad().
  tensor<A, D, 0> forward(const view& out, const target_view& target, const float* scale = nullptr,
                          double factor = 1.0) {
    tensor<A, D, 0> l(extents<0>{});
    forward_into(l, out, target, scale, factor);
    return l;
  }
  /// forward writing the mean loss into `l` (what the trainer calls: no allocation).
  void forward_into(tensor<A, D, 0>& l, const view& out, const target_view& target, const float* scale = nullptr,
                    double factor = 1.0) {
    factor_ = static_cast<A>(factor);
    run(out, target, true, scale);
    locus::detail::reduce_all_into<locus::detail::reduce_kind::mean>(
        locus::detail::to_expr(std::as_const(d2_).view()), l, 0.0);
  }
  [[nodiscard]] view grad() const { return std::as_const(gx_).view(); }

  /// Summed squared error over the batch divided by the features (the per-sample mean,
  /// summed), and zero correct predictions.
  std::pair<tensor<A, D, 0>, tensor<A, D, 0>> evaluate(const view& out, const target_view& target) {
    run(out, target, false, nullptr);
    auto s = locus::sum(std::as_const(d2_).view());
    const index_t k = out.shape()[1];
    tensor<A, D, 0> per_sample = s * static_cast<A>(1.0 / static_cast<double>(k));
    return {std::move(per_sample), zeros<A, D>(extents<0>{})};
  }
  void check_labels() {}

 private:
  void run(const view& out, const target_view& target, bool with_grad, const float* scale) {
    if (out.shape() != target.shape())
      throw shape_error("locus: mse got outputs of shape " + locus::detail::shape_string(out.shape()) +
                        " and targets of shape " + locus::detail::shape_string(target.shape()));
    if (!out.is_contiguous() || !target.is_contiguous())
      throw shape_error("locus: mse needs contiguous outputs and targets");
    const index_t n = out.numel();
    if (d2_.numel() != n) d2_ = tensor<A, D, 1>(extents<1>{n});
    if (with_grad && gx_.shape() != out.shape()) gx_ = tensor<C, D, 2>(out.shape());
    locus::detail::launch_n<D>(n, locus::detail::mse_kernel<C, A>{out.data_handle(), target.data_handle(),
                                                                 with_grad ? gx_.data_handle() : nullptr,
                                                                 d2_.data_handle(), scale, n, factor_});
  }
  A factor_ = A(1);
  tensor<A, D, 1> d2_;
  tensor<C, D, 2> gx_;
};

}  // namespace locus::nn
