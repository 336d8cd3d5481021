// Layers and sequential models whose device and precision policy are in their types.
//
//   using P = locus::amp::bf16_mixed;
//   locus::nn::sequential model(locus::nn::linear<locus::cuda, P>(784, 256),
//                               locus::nn::relu<locus::cuda, P>(),
//                               locus::nn::linear<locus::cuda, P>(256, 10));
//
// Every layer computes on rank-2 activations [batch, features] of the policy's compute
// dtype and has
//   forward(x)    the training forward: saves what backward needs (x is kept as a view,
//                 so it must stay alive until backward);
//   backward(gy)  accumulates parameter gradients (f32 master dtype) and returns the
//                 gradient of its input;
//   infer(x)      the inference forward, which saves nothing (PyTorch's no_grad).
// Activations and gradients are buffers the layer owns and reuses from step to step.
// sequential fuses a linear layer with the activation after it: relu runs in the GEMM's
// epilogue (cuBLASLt's on cuda), and the activation's derivative and the bias gradient
// are one pass in backward. Parameters are named as PyTorch's nn.Sequential names them
// ("0.weight", "0.bias", "2.weight", ...), live in one parameter_store, and are
// initialised as PyTorch initialises nn.Linear (Kaiming-uniform, bound 1/sqrt(fan_in)).
//
// Length (over 600 lines): linear, the activations, dropout and nn::sequential share
// the layer protocol (hooks, buffers, the parameter store's slots) that sequential
// computes ranks and fusion over; split, the protocol would be read apart from its only
// users.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../amp/policy.hpp"
#include "../ops/matmul.hpp"
#include "kernels.hpp"
#include "parameters.hpp"

/// The message for a reference into a temporary model (a macro: a static_assert message
/// must be a string literal).
#define LOCUS_TEMPORARY_MODEL_MESSAGE(what)                                                    \
  "locus: " what " of a temporary model would dangle: the model is destroyed at the end of "   \
  "the statement; keep it in a variable first: auto model = ...; then model." what

namespace locus::nn {

namespace detail {
using locus::detail::act_kind;

template <class T, class D, std::size_t R>
void ensure_shape(tensor<T, D, R>& t, const extents<R>& shape) {
  if (t.shape() != shape || t.data_handle() == nullptr) {
    t = tensor<T, D, R>();  // free first: the peak holds one buffer, not two
    t = tensor<T, D, R>(shape);
  }
}

/// Hooks: pre(x) before forward, post(x, y) after it (training and inference forward).
/// R is the rank of the views the hooks see: the layer's own rank (2 for linear, 4 for
/// conv2d and pooling); layers that take any rank (activations, dropout) show their
/// activations as rank 2, [batch, every other extent multiplied].
template <class D, class C, std::size_t R = 2>
class hooks {
 public:
  using view = tensor_view<const C, D, R>;
  using pre_hook = std::function<void(const view& x)>;
  using post_hook = std::function<void(const view& x, const view& y)>;

  /// Called with the input before every forward; returns the hook's index.
  std::size_t add_forward_pre_hook(pre_hook h) {
    pre_.push_back(std::move(h));
    return pre_.size() - 1;
  }
  /// Called with the input and the output after every forward.
  std::size_t add_forward_hook(post_hook h) {
    post_.push_back(std::move(h));
    return post_.size() - 1;
  }
  void clear_hooks() noexcept {
    pre_.clear();
    post_.clear();
  }
  [[nodiscard]] bool has_hooks() const noexcept { return !pre_.empty() || !post_.empty(); }

 protected:
  void run_pre(const view& x) const {
    for (const auto& h : pre_) h(x);
  }
  void run_post(const view& x, const view& y) const {
    for (const auto& h : post_) h(x, y);
  }

 private:
  std::vector<pre_hook> pre_;
  std::vector<post_hook> post_;
};

/// x as [batch, the other extents multiplied] (contiguous x): what the hooks of a
/// layer that takes any rank see.
template <class T, class D, std::size_t R>
tensor_view<T, D, 2> as_rows(const tensor_view<T, D, R>& x) noexcept {
  if constexpr (R == 2) {
    return x;
  } else {
    const index_t b = R == 0 ? 1 : x.shape()[0];
    const index_t rest = b == 0 ? 0 : x.numel() / b;
    return {::locus::detail::raw_view_key{}, x.data_handle(), extents<2>{b, rest}, x.device_index()};
  }
}
/// A flat buffer of at least n elements (reallocated only when it is too small, so a
/// layer whose calls need different sizes stops allocating after the largest).
template <class T, class D>
void ensure_numel(tensor<T, D, 1>& t, index_t n) {
  if (t.numel() < n || t.data_handle() == nullptr) {
    t = tensor<T, D, 1>();
    t = tensor<T, D, 1>(extents<1>{n});
  }
}
/// The first numel(shape) elements of a flat buffer as a view of that shape.
template <class T, class D, std::size_t R>
tensor_view<const T, D, R> shaped(const tensor<T, D, 1>& t, const extents<R>& shape) noexcept {
  return {::locus::detail::raw_view_key{}, t.data_handle(), shape, t.device_index()};
}
template <class T, class D, std::size_t R>
tensor_view<T, D, R> shaped_mut(tensor<T, D, 1>& t, const extents<R>& shape) noexcept {
  return {::locus::detail::raw_view_key{}, t.data_handle(), shape, t.device_index()};
}
inline std::string shape_list(const std::vector<index_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// Element-wise layers index their input linearly: a strided view is refused.
template <class V>
void check_contiguous(const V& x) {
  if (!x.is_contiguous())
    throw shape_error("locus: an element-wise layer (activation, dropout) got a non-contiguous view of shape " +
                      locus::detail::shape_string(x.shape()) + "; pass a contiguous tensor (x.clone())");
}

template <class D>
void check_features(const char* layer, index_t expected, index_t got) {
  if (expected != got)
    throw shape_error(std::string("locus: ") + layer + " expects " + std::to_string(expected) +
                      " input features but the input has " + std::to_string(got));
}
}  // namespace detail

/// Whether a linear layer has a bias.
enum class bias { with, without };

/// y = x w^T + b, w [out, in] (PyTorch's layout), b [out].
template <Device D, class Policy>
class linear : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute> {
 public:
  /// forward(x, act) and infer(x, act) fuse an activation (nn::layer's fc(x, ag::fused::relu)).
  static constexpr bool fuses_activation = true;
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;  // checks Policy (amp/policy.hpp)
  using C = typename policy::compute;
  using M = typename policy::master;
  using view = tensor_view<const C, D, 2>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 2, output_rank = 2;  // [batch, features]
  static constexpr const char* layer_name = "linear";

  linear(index_t in_features, index_t out_features, bias b = bias::with)
      : in_(in_features), out_(out_features), bias_(b == bias::with) {
    if (in_ <= 0 || out_ <= 0)
      throw shape_error("locus: linear(" + std::to_string(in_) + ", " + std::to_string(out_) +
                        ") needs positive feature counts");
  }

  [[nodiscard]] index_t in_features() const noexcept { return in_; }
  [[nodiscard]] index_t out_features() const noexcept { return out_; }
  [[nodiscard]] bool has_bias() const noexcept { return bias_; }
  /// For sequential::summary: the layer as written, its output width and parameters.
  [[nodiscard]] std::string describe() const {
    return "linear(" + std::to_string(in_) + ", " + std::to_string(out_) + (bias_ ? ")" : ", bias::without)");
  }
  [[nodiscard]] index_t output_features(index_t in) const {
    if (in != in_)
      throw shape_error("locus: " + describe() + " takes " + std::to_string(in_) + " features, but its input has " +
                        std::to_string(in));
    return out_;
  }
  /// The output width for an input width (-1: not known before the first batch).
  [[nodiscard]] index_t output_width(index_t in) const { return in < 0 ? out_ : output_features(in); }
  [[nodiscard]] index_t parameter_count() const noexcept { return out_ * in_ + (bias_ ? out_ : 0); }
  /// The same layer (configuration, not parameters) on device D2: sequential::to<D2>().
  template <Device D2>
  [[nodiscard]] linear<D2, Policy> on() const {
    return linear<D2, Policy>(in_, out_, bias_ ? bias::with : bias::without);
  }

  void declare(parameter_store<D, policy>& s, const std::string& prefix) {
    w_ = s.add(prefix + "weight", {out_, in_});
    if (bias_) b_ = s.add(prefix + "bias", {out_});
  }
  void bind(parameter_store<D, policy>& s) { store_ = &s; }

  /// PyTorch's nn.Linear initialisation: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
  void reset_parameters(std::uint64_t seed) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    fill_uniform(store_->master_flat(w_), seed, w_ + 1, bound);
    if (bias_) fill_uniform(store_->master_flat(b_), seed, b_ + 1, bound);
  }

  /// Training forward with an optional fused activation (sequential passes it).
  view forward(const view& x, detail::act_kind act = detail::act_kind::none) {
    this->run_pre(x);
    detail::check_features<D>("linear", in_, x.shape()[1]);
    x_ = x;
    act_ = act;
    const extents<2> ys{x.shape()[0], out_};
    detail::ensure_shape(y_, ys);
    const auto w = weight();
    if (act == detail::act_kind::none || act == detail::act_kind::relu) {
      const activation a = act == detail::act_kind::relu ? activation::relu : activation::none;
      if (bias_) linear_into(y_, x, w, bias_compute(), a);
      else linear_into(y_, x, w, a);
    } else {  // the derivative needs z = x w^T + b
      detail::ensure_shape(z_, ys);
      if (bias_) linear_into(z_, x, w, bias_compute());
      else linear_into(z_, x, w);
      locus::detail::launch_n<D>(y_.numel(),
                                 locus::detail::act_forward_kernel<C>{z_.data_handle(), y_.data_handle(), act});
    }
    view y = std::as_const(y_).view();
    this->run_post(x, y);
    return y;
  }

  /// Accumulates dL/dw and dL/db from dL/dy; returns dL/dx (an empty view when
  /// need_input_grad is false: the first layer's input needs none).
  view backward(const view& gy, bool need_input_grad = true) {
    if (gy.shape() != y_.shape())
      throw shape_error("locus: linear backward got a gradient of shape " +
                        locus::detail::shape_string(gy.shape()) + " for an output of shape " +
                        locus::detail::shape_string(y_.shape()));
    const index_t n = gy.shape()[0];
    view dz = gy;
    const bool need_dz = act_ != detail::act_kind::none;
    if (need_dz) detail::ensure_shape(dz_, gy.shape());
    if (need_dz || bias_) {
      const bool uses_z = act_ == detail::act_kind::gelu || act_ == detail::act_kind::gelu_tanh;
      M* db = nullptr;
      bool db_overwrite = false;
      if (bias_) {
        auto [g, fresh] = store_->grad_flat_out(b_);
        db = g.data_handle();
        db_overwrite = fresh;
      }
      locus::detail::bias_act_grad_kernel<C, M> k{gy.data_handle(), uses_z ? z_.data_handle() : nullptr,
                                                  uses_z ? nullptr : y_.data_handle(),
                                                  need_dz ? dz_.data_handle() : nullptr, db, n, out_, act_};
      k.overwrite = db_overwrite;
      locus::detail::run_bias_act_grad<D>(k);
    }
    if (need_dz) dz = std::as_const(dz_).view();
    // dL/dw: stored when the store discarded the old gradient, added otherwise
    // (gradient accumulation over micro-batches).
    if (auto [gw, fresh] = store_->template grad_out<2>(w_); fresh) matmul_into(gw, transpose(dz), x_);
    else matmul_into(gw, transpose(dz), x_, locus::accumulate);
    if (!need_input_grad) return {};
    detail::ensure_shape(gx_, x_.shape());
    matmul_into(gx_, dz, weight());
    return std::as_const(gx_).view();
  }

  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; z_ = {}; dz_ = {}; gx_ = {}; }

  /// Inference forward: nothing saved.
  tensor<C, D, 2> infer(const view& x, detail::act_kind act = detail::act_kind::none) const {
    this->run_pre(x);
    detail::check_features<D>("linear", in_, x.shape()[1]);
    const auto w = weight();
    tensor<C, D, 2> y;
    if (act == detail::act_kind::none || act == detail::act_kind::relu) {
      const activation a = act == detail::act_kind::relu ? activation::relu : activation::none;
      y = bias_ ? locus::linear(x, w, bias_compute(), a) : locus::linear(x, w, a);
    } else {
      tensor<C, D, 2> z = bias_ ? locus::linear(x, w, bias_compute()) : locus::linear(x, w);
      y = tensor<C, D, 2>(z.shape());
      locus::detail::launch_n<D>(y.numel(),
                                 locus::detail::act_forward_kernel<C>{z.data_handle(), y.data_handle(), act});
    }
    this->run_post(x, std::as_const(y).view());
    return y;
  }

  [[nodiscard]] tensor_view<const C, D, 2> weight() const { return store_->template compute<2>(w_); }
  [[nodiscard]] tensor_view<const C, D, 1> bias_compute() const { return store_->template compute<1>(b_); }
  [[nodiscard]] std::size_t weight_index() const noexcept { return w_; }
  [[nodiscard]] std::size_t bias_index() const noexcept { return b_; }

 private:
  void fill_uniform(tensor_view<M, D, 1> v, std::uint64_t seed, std::uint64_t stream, double bound) {
    locus::detail::launch_n<D>(v.numel(), locus::detail::uniform_init_kernel<M>{v.data_handle(), seed, stream,
                                                                                 -bound, bound});
  }

  index_t in_, out_;
  bool bias_;
  std::size_t w_ = 0, b_ = 0;
  parameter_store<D, policy>* store_ = nullptr;
  view x_;
  detail::act_kind act_ = detail::act_kind::none;
  tensor<C, D, 2> y_, z_, dz_, gx_;
};

namespace detail {
/// An element-wise activation layer. It takes activations of any rank (rank 2 after a
/// linear layer, rank 4 after a convolution) and returns the same shape.
template <Device D, class Policy, act_kind Kind>
class activation_layer : public hooks<D, typename locus::detail::checked_policy_t<Policy>::compute> {

 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;  // checks Policy (amp/policy.hpp)
  using C = typename policy::compute;
  template <std::size_t R>
  using view_of = tensor_view<const C, D, R>;
  using view = view_of<2>;
  static constexpr bool is_activation = true;
  static constexpr act_kind kind = Kind;
  static constexpr std::size_t input_rank = 0, output_rank = 0;  // any rank, kept
  static constexpr const char* layer_name = "activation";

  [[nodiscard]] std::string describe() const {
    switch (Kind) {
      case act_kind::relu: return "relu";
      case act_kind::gelu: return "gelu";
      case act_kind::gelu_tanh: return "gelu_tanh";
      case act_kind::tanh: return "tanh";
      case act_kind::sigmoid: return "sigmoid";
      case act_kind::none: break;
    }
    return "identity";
  }
  [[nodiscard]] index_t output_features(index_t in) const noexcept { return in; }
  [[nodiscard]] index_t output_width(index_t in) const noexcept { return in; }
  [[nodiscard]] index_t parameter_count() const noexcept { return 0; }

  void declare(parameter_store<D, policy>&, const std::string&) {}
  void bind(parameter_store<D, policy>&) {}
  void reset_parameters(std::uint64_t) {}

  template <std::size_t R>
  view_of<R> forward(const view_of<R>& x) {
    check_contiguous(x);
    if (this->has_hooks()) this->run_pre(as_rows(x));
    fused_ = false;
    x_ = x.data_handle();
    ensure_numel(y_, x.numel());
    locus::detail::launch_n<D>(x.numel(), locus::detail::act_forward_kernel<C>{x.data_handle(), y_.data_handle(), Kind});
    const view_of<R> y = shaped(y_, x.shape());
    if (this->has_hooks()) this->run_post(as_rows(x), as_rows(y));
    return y;
  }
  /// sequential ran this activation inside the preceding linear layer.
  void mark_fused() noexcept { fused_ = true; }
  [[nodiscard]] bool fused() const noexcept { return fused_; }

  template <std::size_t R>
  view_of<R> backward(const view_of<R>& gy, bool = true) {
    ensure_numel(gx_, gy.numel());
    const bool uses_z = Kind == act_kind::gelu || Kind == act_kind::gelu_tanh;
    locus::detail::launch_n<D>(gy.numel(), locus::detail::act_backward_kernel<C>{
                                               gy.data_handle(), uses_z ? x_ : nullptr,
                                               uses_z ? nullptr : y_.data_handle(), gx_.data_handle(), Kind});
    return shaped(gx_, gy.shape());
  }

  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  template <std::size_t R>
  tensor<C, D, R> infer(const view_of<R>& x) const {
    check_contiguous(x);
    if (this->has_hooks()) this->run_pre(as_rows(x));
    tensor<C, D, R> y(x.shape());
    locus::detail::launch_n<D>(x.numel(), locus::detail::act_forward_kernel<C>{x.data_handle(), y.data_handle(), Kind});
    if (this->has_hooks()) this->run_post(as_rows(x), as_rows(std::as_const(y).view()));
    return y;
  }

 private:
  bool fused_ = false;
  const C* x_ = nullptr;
  tensor<C, D, 1> y_, gx_;
};
}  // namespace detail

/// max(x, 0)
template <Device D, class Policy>
class relu : public detail::activation_layer<D, Policy, detail::act_kind::relu> {
 public:
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] relu<D2, Policy> on() const {
    return {};
  }
};
/// GELU; exact (erf) by default, or the tanh approximation (PyTorch's approximate="tanh").
template <Device D, class Policy>
class gelu : public detail::activation_layer<D, Policy, detail::act_kind::gelu> {
 public:
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] gelu<D2, Policy> on() const {
    return {};
  }
};
template <Device D, class Policy>
class gelu_tanh : public detail::activation_layer<D, Policy, detail::act_kind::gelu_tanh> {
 public:
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] gelu_tanh<D2, Policy> on() const {
    return {};
  }
};
template <Device D, class Policy>
class tanh : public detail::activation_layer<D, Policy, detail::act_kind::tanh> {
 public:
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] tanh<D2, Policy> on() const {
    return {};
  }
};
template <Device D, class Policy>
class sigmoid : public detail::activation_layer<D, Policy, detail::act_kind::sigmoid> {
 public:
  /// The same layer on device D2 (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] sigmoid<D2, Policy> on() const {
    return {};
  }
};

/// Dropout with probability p (training forward only; inference is the identity), on
/// activations of any rank (element-wise, as PyTorch's nn.Dropout; after a convolution
/// too). The mask comes from Philox(seed, element, stream) where the stream advances
/// with every training forward, so runs with the same seed drop the same elements on
/// every device, and backward recomputes the mask instead of saving it.
template <Device D, class Policy>
class dropout : public detail::hooks<D, typename locus::detail::checked_policy_t<Policy>::compute> {

 public:
  using device = D;
  using policy = locus::detail::checked_policy_t<Policy>;  // checks Policy (amp/policy.hpp)
  using C = typename policy::compute;
  template <std::size_t R>
  using view_of = tensor_view<const C, D, R>;
  using view = view_of<2>;
  static constexpr bool is_activation = false;
  static constexpr std::size_t input_rank = 0, output_rank = 0;  // any rank, kept
  static constexpr const char* layer_name = "dropout";

  explicit dropout(float p, std::uint64_t seed = 0) : p_(p), seed_(seed) {
    if (!(p >= 0.0f && p < 1.0f))
      throw ::locus::value_error("locus: dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  void declare(parameter_store<D, policy>&, const std::string&) {}
  void bind(parameter_store<D, policy>&) {}
  void reset_parameters(std::uint64_t) {}

  [[nodiscard]] float p() const noexcept { return p_; }
  [[nodiscard]] std::string describe() const {
    char b[48];
    std::snprintf(b, sizeof b, "dropout(%g)", static_cast<double>(p_));
    return b;
  }
  [[nodiscard]] index_t output_features(index_t in) const noexcept { return in; }
  [[nodiscard]] index_t output_width(index_t in) const noexcept { return in; }
  [[nodiscard]] index_t parameter_count() const noexcept { return 0; }
  /// Training forwards run so far: the RNG state (saved in checkpoints).
  [[nodiscard]] std::uint64_t counter() const noexcept { return counter_; }
  void set_counter(std::uint64_t c) noexcept { counter_ = c; }
  void set_seed(std::uint64_t s) noexcept { seed_ = s; }
  /// The data-parallel rank whose stream this layer draws: rank r's masks come from the
  /// key seed + r * 0x9E3779B97F4A7C15 (Philox keys are independent streams), rank 0's
  /// from the seed itself, so a world of one draws what a model outside data_parallel
  /// draws. dist::data_parallel sets it (data_parallel_options::same_dropout_on_every_rank
  /// keeps every rank at 0).
  void set_rank_stream(std::uint64_t rank) noexcept { rank_ = rank; }
  [[nodiscard]] std::uint64_t rank_stream() const noexcept { return rank_; }
  /// The same layer on device D2, its stream where this one's is (sequential::to<D2>()).
  template <Device D2>
  [[nodiscard]] dropout<D2, Policy> on() const {
    dropout<D2, Policy> d(p_, seed_);
    d.set_counter(counter_);
    d.set_rank_stream(rank_);
    return d;
  }

  template <std::size_t R>
  view_of<R> forward(const view_of<R>& x) {
    detail::check_contiguous(x);
    if (this->has_hooks()) this->run_pre(detail::as_rows(x));
    stream_ = counter_++;
    detail::ensure_numel(y_, x.numel());
    locus::detail::launch_n<D>(x.numel(), locus::detail::dropout_kernel<C>{x.data_handle(), y_.data_handle(), key(), stream_, p_});
    const view_of<R> y = detail::shaped(y_, x.shape());
    if (this->has_hooks()) this->run_post(detail::as_rows(x), detail::as_rows(y));
    return y;
  }
  template <std::size_t R>
  view_of<R> backward(const view_of<R>& gy, bool = true) {
    detail::ensure_numel(gx_, gy.numel());
    locus::detail::launch_n<D>(gy.numel(), locus::detail::dropout_kernel<C>{gy.data_handle(), gx_.data_handle(), key(), stream_, p_});
    return detail::shaped(gx_, gy.shape());
  }
  /// Frees the activations kept for backward (activation checkpointing); the next
  /// forward allocates them again.
  void release_activations() noexcept { y_ = {}; gx_ = {}; }

  template <std::size_t R>
  tensor<C, D, R> infer(const view_of<R>& x) const {
    if (this->has_hooks()) this->run_pre(detail::as_rows(x));
    tensor<C, D, R> y(x.shape());
    copy(x, y);
    if (this->has_hooks()) this->run_post(detail::as_rows(x), detail::as_rows(std::as_const(y).view()));
    return y;
  }

 private:
  std::uint64_t key() const noexcept { return seed_ + rank_ * 0x9E3779B97F4A7C15ull; }
  float p_;
  std::uint64_t seed_, stream_ = 0, counter_ = 0, rank_ = 0;
  tensor<C, D, 1> y_, gx_;
};

namespace detail {
template <class L>
struct layer_traits {
  static constexpr bool is_linear = false;
};
template <class D, class P>
struct layer_traits<linear<D, P>> {
  static constexpr bool is_linear = true;
};
template <class First, class... Rest>
constexpr bool check_layers() {
  using D = typename First::device;
  using P = typename First::policy;
  bool ok = true;
  ((ok = ok && locus::detail::require_layers_same_device<D, typename Rest::device>()), ...);
  if constexpr ((std::is_same_v<P, typename Rest::policy> && ...)) {
    return ok;
  } else {
    static_assert(locus::detail::always_false<P>,
                  "locus: a sequential model mixes precision policies; build every layer with "
                  "the same policy (amp::fp32, amp::bf16_mixed or amp::fp16_mixed)");
    return false;
  }
}

/// The rank a layer returns for an input of rank R (0 in output_rank: the input's).
template <class L, std::size_t R>
constexpr std::size_t rank_out() {
  if constexpr (L::output_rank == 0) return R;
  else return L::output_rank;
}

/// Whether layer number Layer (from 0), which takes rank Takes (0: any), can follow
/// an activation of rank Gets. The instantiation's arguments name the layer's position
/// and both ranks in the compiler's notes under the message.
template <std::size_t Layer, std::size_t Takes, std::size_t Gets>
constexpr bool layer_takes_rank() {
  if constexpr (Takes == 0 || Takes == Gets) {
    return true;
  } else if constexpr (Takes == 2 && Gets == 4) {
    static_assert(Takes != 2,
                  "locus: a sequential model feeds a rank-4 activation [batch, channels, height, width] into a layer "
                  "that takes rank 2 [batch, features] (such as linear); insert locus::nn::flatten<D, P>() before "
                  "that layer (its position, counted from 0, is 'Layer' in the compiler's instantiation note)");
    return false;
  } else if constexpr (Takes == 4 && Gets == 2) {
    static_assert(Takes != 4,
                  "locus: a sequential model feeds a rank-2 activation [batch, features] into a layer that takes "
                  "rank 4 [batch, channels, height, width] (conv2d, pooling, batch_norm2d, flatten); put it before "
                  "the flatten, or start the model with it (its input is then [batch, channels, height, width]); "
                  "its position, counted from 0, is 'Layer' in the compiler's instantiation note");
    return false;
  } else {
    static_assert(Takes == Gets,
                  "locus: a sequential model feeds an activation of one rank into a layer that takes another "
                  "('Gets' and 'Takes' in the compiler's instantiation note; 'Layer' is its position, counted from 0); insert a "
                  "layer that changes the rank (locus::nn::flatten<D, P>() for rank 4 to rank 2)");
    return false;
  }
}

template <std::size_t I, std::size_t R, class... Layers>
constexpr bool check_ranks() {
  if constexpr (I == sizeof...(Layers)) {
    return true;
  } else {
    using L = std::tuple_element_t<I, std::tuple<Layers...>>;
    if constexpr (!layer_takes_rank<I, L::input_rank, R>()) return false;
    else return check_ranks<I + 1, rank_out<L, R>(), Layers...>();
  }
}

/// The rank a model of these layers takes: the first layer's that is not "any" (2 when
/// every layer takes any rank).
template <class... Layers>
constexpr std::size_t first_input_rank() {
  std::size_t r = 0;
  ((r = r == 0 ? Layers::input_rank : r), ...);
  return r == 0 ? 2 : r;
}
template <std::size_t I, std::size_t R, class... Layers>
constexpr std::size_t rank_after() {
  if constexpr (I == 0) {
    return R;
  } else {
    using L = std::tuple_element_t<I - 1, std::tuple<Layers...>>;
    return rank_out<L, rank_after<I - 1, R, Layers...>()>();
  }
}

template <class L>
struct is_dropout : std::false_type {};
template <Device D, class P>
struct is_dropout<dropout<D, P>> : std::true_type {};

/// A layer's output shape for an input shape (layers without output_shape() keep every
/// extent but the last, which output_features maps).
template <class L>
std::vector<index_t> layer_output_shape(const L& l, std::vector<index_t> in) {
  if constexpr (requires { l.output_shape(in); }) {
    return l.output_shape(in);
  } else {
    if (in.empty()) throw shape_error("locus: " + l.describe() + " got an input of rank 0");
    in.back() = l.output_features(in.back());
    return in;
  }
}
}  // namespace detail

/// Layers applied in order. Owns the parameter store of all of them.
///
/// Ranks are part of the model's type: each layer takes rank 2 [batch, features]
/// (linear), rank 4 [batch, channels, height, width] (conv2d, pooling, batch_norm2d,
/// flatten) or any rank (activations, dropout), and a layer fed a rank it does not take
/// is a compile error that names its position and says what to insert. The model takes
/// input_rank and returns output_rank. Channel and feature counts are checked when the
/// model is built (shape_error naming the layer's position), as far as they are known
/// without an input: a linear layer after a flatten is checked at the first batch, or
/// at once by output_shape() / summary() with the input's shape.
template <class... Layers>
class sequential {
  static_assert(sizeof...(Layers) > 0,
                "locus: a sequential model needs at least one layer, but it was given none; pass "
                "the layers to its constructor: sequential m(linear<D, P>(in, out), relu<D, P>(), ...)");
  // Without layers a placeholder stands in for the first one, so that the message above
  // is the only error.
  using first = std::tuple_element_t<0, std::tuple<Layers..., relu<cpu, amp::fp32>>>;

 public:
  using device = typename first::device;
  using policy = typename first::policy;
  using C = typename policy::compute;
  using M = typename policy::master;
  static constexpr std::size_t size = sizeof...(Layers);
  /// The rank of the model's input and of its output.
  static constexpr std::size_t input_rank = detail::first_input_rank<Layers...>();
  static constexpr std::size_t output_rank = detail::rank_after<size, input_rank, Layers...>();
  using input_view = tensor_view<const C, device, input_rank>;
  using output_view = tensor_view<const C, device, output_rank>;
  using view = output_view;
  using store_type = parameter_store<device, policy>;
  /// Whether a layer is a dropout (the trainer's graph mode refuses such models: a
  /// replay would repeat the captured mask).
  static constexpr bool has_dropout = (detail::is_dropout<Layers>::value || ...);
  static_assert(detail::check_layers<first, Layers...>());
  static_assert(detail::check_ranks<0, input_rank, Layers...>());

  /// Takes the layers, checks their channel and feature counts, allocates their
  /// parameters and initialises them from seed 0.
  explicit sequential(Layers... layers) : layers_(std::move(layers)...) {
    check_widths();
    setup(0);
  }

  // Layers point at the store: a move re-points them.
  sequential(sequential&& other) noexcept
      : layers_(std::move(other.layers_)), store_(std::move(other.store_)), seed_(other.seed_),
        first_entry_(other.first_entry_), has_params_(other.has_params_) {
    rebind();
  }
  sequential& operator=(sequential&& other) noexcept {
    layers_ = std::move(other.layers_);
    store_ = std::move(other.store_);
    seed_ = other.seed_;
    first_entry_ = other.first_entry_;
    has_params_ = other.has_params_;
    rebind();
    return *this;
  }
  sequential(const sequential&) = delete;
  template <class...>
  friend class sequential;  // to<D2>() sets the moved model's store and seed
  sequential& operator=(const sequential&) = delete;

  /// Re-draws every parameter as PyTorch initialises it, from Philox(seed), and resets
  /// the buffers (batch norm's running statistics).
  void reset_parameters(std::uint64_t seed) {
    seed_ = seed;
    std::apply([&](auto&... l) { (l.reset_parameters(seed), ...); }, layers_);
    store_.sync_compute();
  }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  template <std::size_t I>
  auto& get() & noexcept {
    return std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& get() const& noexcept {
    return std::get<I>(layers_);
  }
  // Prevents: a reference into a model destroyed at the end of the statement
  // (make_model().get<0>(), make_model().parameters()).
  template <std::size_t I>
  const auto& get() const&& {  // (deduced: the message comes before any use of the result)
    static_assert(locus::detail::always_false_v<I>, LOCUS_TEMPORARY_MODEL_MESSAGE("get<I>()"));
    return std::get<I>(layers_);
  }

  /// Calls f(index, layer) for every layer, in order.
  template <class F>
  void for_each_layer(F&& f) {
    std::size_t i = 0;
    std::apply([&](auto&... l) { (f(i++, l), ...); }, layers_);
  }
  template <class F>
  void for_each_layer(F&& f) const {
    std::size_t i = 0;
    std::apply([&](const auto&... l) { (f(i++, l), ...); }, layers_);
  }

  /// Calls f(name, view) for every buffer: state that is not a parameter (no gradient,
  /// no optimizer), such as batch norm's running statistics, named as PyTorch names it
  /// ("1.running_mean", "1.running_var", "1.num_batches_tracked"); view is a rank-1
  /// tensor_view of the master dtype or of i64.
  template <class F>
  void for_each_buffer(F&& f) {
    std::size_t i = 0;
    const auto one = [&](auto& l) {
      if constexpr (requires { l.for_each_buffer(std::string{}, f); }) l.for_each_buffer(std::to_string(i) + ".", f);
      ++i;
    };
    std::apply([&](auto&... l) { (one(l), ...); }, layers_);
  }
  template <class F>
  void for_each_buffer(F&& f) const {
    std::size_t i = 0;
    const auto one = [&](const auto& l) {
      if constexpr (requires { l.for_each_buffer(std::string{}, f); }) l.for_each_buffer(std::to_string(i) + ".", f);
      ++i;
    };
    std::apply([&](const auto&... l) { (one(l), ...); }, layers_);
  }

  /// Every dropout layer draws rank `rank`'s stream (dropout::set_rank_stream).
  void set_dropout_rank(std::uint64_t rank) noexcept {
    std::apply([&](auto&... l) { (set_rank_of(l, rank), ...); }, layers_);
  }

  /// This model on device D2 (PyTorch's model.to(device)): the same layers, with its
  /// parameters (master weights, then the compute copy made from them), its buffers
  /// (batch norm's running statistics and counts), its seed and its dropout streams.
  /// Blocking, like to<D2>() of a tensor; the model itself is unchanged. A model for
  /// cuda is built on the current GPU (locus::device_guard g(1); auto m1 = m.to<cuda>();
  /// for GPU 1). Hooks are not carried: they were written for views of this device.
  /// An optimizer, grad scaler and trainer belong to the model they were built for:
  /// build new ones for the moved model (its optimizer state starts fresh; a checkpoint
  /// carries the state across devices).
  template <Device D2>
  [[nodiscard]] sequential<decltype(std::declval<const Layers&>().template on<D2>())...> to() const {
    using moved = sequential<decltype(std::declval<const Layers&>().template on<D2>())...>;
    moved out = std::apply([](const auto&... l) { return moved(l.template on<D2>()...); }, layers_);
    ::locus::copy(store_.master(), out.store_.master());
    out.store_.sync_compute();
    out.for_each_buffer([&](const std::string& name, auto dst) {
      bool copied = false;
      for_each_buffer([&](const std::string& source_name, auto src) {
        if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(src)>::value_type,
                                     typename std::remove_cvref_t<decltype(dst)>::value_type>) {
          if (!copied && source_name == name) {
            ::locus::copy(src, dst);
            copied = true;
          }
        }
      });
      if (!copied) throw ::locus::error("locus: sequential::to found no buffer '" + name + "' to copy (a layer's on<D2>() "
                                        "changed its buffers)");
    });
    out.seed_ = seed_;
    return out;
  }

  store_type& parameters() & noexcept { return store_; }
  const store_type& parameters() const& noexcept { return store_; }
  template <class Model = sequential>
  const auto& parameters() const&& {
    static_assert(locus::detail::always_false<Model>, LOCUS_TEMPORARY_MODEL_MESSAGE("parameters()"));
    return store_;
  }

  /// The output shape for an input of this shape ([batch, features] or [batch, channels,
  /// height, width]); a shape a layer cannot take is a shape_error naming the layer's
  /// position, the layer and both shapes.
  [[nodiscard]] std::vector<index_t> output_shape(std::vector<index_t> shape) const {
    walk_shapes(std::move(shape), [](std::size_t, const auto&, const std::vector<index_t>&) {});
    return last_shape_;
  }

  /// Each layer's output shape for an input of this shape, in order.
  [[nodiscard]] std::vector<std::vector<index_t>> layer_shapes(std::vector<index_t> shape) const {
    std::vector<std::vector<index_t>> out;
    walk_shapes(std::move(shape), [&](std::size_t, const auto&, const std::vector<index_t>& s) { out.push_back(s); });
    return out;
  }

  /// A table of the layers for an input of [batch, features]: each layer as written, its
  /// output shape and parameter count, then the total and the bytes of master weights.
  /// An input width that the first layer does not take is a shape_error naming the layer.
  [[nodiscard]] std::string summary(index_t batch, index_t features) const { return summary({batch, features}); }
  /// The same for an input of any shape, e.g. summary({128, 1, 28, 28}) for images.
  [[nodiscard]] std::string summary(std::vector<index_t> input_shape) const {
    std::string out = "  #  layer                         output                 parameters\n";
    index_t total = 0;
    char line[200];
    walk_shapes(std::move(input_shape), [&](std::size_t i, const auto& l, const std::vector<index_t>& shape) {
      std::snprintf(line, sizeof line, "%3zu  %-28s  %-21s  %12lld\n", i, l.describe().c_str(),
                    detail::shape_list(shape).c_str(), static_cast<long long>(l.parameter_count()));
      out += line;
      total += l.parameter_count();
    });
    std::snprintf(line, sizeof line, "     total: %lld parameters, %s of %s master weights on %s\n",
                  static_cast<long long>(total),
                  out_of_memory::format_bytes(static_cast<std::size_t>(total) * sizeof(M)).c_str(),
                  sizeof(M) == 8 ? "f64" : "f32", std::string(device::name).c_str());
    out += line;
    return out;
  }

  /// The training forward (saves what backward needs; x must stay alive until then).
  output_view forward(const input_view& x) { return forward_from<0>(x); }

  /// Backpropagates dL/d(output); parameter gradients accumulate into the store.
  /// Returns dL/d(input) when need_input_grad (an empty view otherwise: the first layer
  /// then skips that GEMM).
  input_view backward(const output_view& gy, bool need_input_grad = false) {
    return backward_from<size - 1>(gy, need_input_grad);
  }

  /// The inference forward: saves nothing (batch norm uses its running statistics).
  tensor<C, device, output_rank> infer(const input_view& x) const { return infer_from<0>(x); }

  /// Called during backward each time a layer with parameters has written its
  /// gradients, with the flat-buffer offset from which every gradient is now final
  /// (backward runs from the last layer to the first, and the store holds the layers'
  /// parameters in order): where data-parallel training starts reducing a bucket while
  /// the earlier layers are still differentiated. Empty: nothing (the default).
  void set_gradients_final(std::function<void(index_t first_final)> f) { grads_final_ = std::move(f); }

 private:
  template <class L>
  static void set_rank_of(L& l, std::uint64_t rank) noexcept {
    if constexpr (detail::is_dropout<L>::value) l.set_rank_stream(rank);
  }
  static std::string position(std::size_t i) { return "locus: sequential layer " + std::to_string(i) + ": "; }
  static std::string without_prefix(const char* m) {
    const std::string s = m;
    return s.rfind("locus: ", 0) == 0 ? s.substr(7) : s;
  }

  /// The channel and feature counts, layer to layer, as far as they are known without an
  /// input (output_width(-1): unknown, e.g. after a flatten).
  /// The width is the channels at rank 4 and the features at rank 2; a layer that takes
  /// any rank and reads the last axis (layer_norm) is checked only where that axis is
  /// the width (rank 2), and keeps the channels elsewhere.
  void check_widths() const { check_widths_from<0>(-1); }
  template <std::size_t I>
  void check_widths_from(index_t w) const {
    if constexpr (I < size) {
      const auto& l = std::get<I>(layers_);
      index_t next = w;
      if (layer_t<I>::input_rank != 0 || rank_at<I> == 2) {
        try {
          next = l.output_width(w);
        } catch (const shape_error& e) {
          throw shape_error(position(I) + without_prefix(e.what()) + (I > 0 ? " (the output of the layer before it)" : ""));
        }
      }
      check_widths_from<I + 1>(next);
    }
  }

  template <class F>
  void walk_shapes(std::vector<index_t> shape, F&& f) const {
    std::size_t i = 0;
    const auto one = [&](const auto& l) {
      try {
        shape = detail::layer_output_shape(l, shape);
      } catch (const shape_error& e) {
        throw shape_error(position(i) + without_prefix(e.what()));
      }
      f(i, l, shape);
      ++i;
    };
    if (shape.size() != input_rank)
      throw shape_error("locus: this model takes rank-" + std::to_string(input_rank) + " input, but the shape " +
                        detail::shape_list(shape) + " has rank " + std::to_string(shape.size()));
    for (const index_t e : shape)
      if (e < 0) throw shape_error("locus: the input shape " + detail::shape_list(shape) + " has a negative extent");
    std::apply([&](const auto&... l) { (one(l), ...); }, layers_);
    last_shape_ = shape;
  }

  void rebind() noexcept {
    std::apply([&](auto&... l) { (l.bind(store_), ...); }, layers_);
  }

  void setup(std::uint64_t seed) {
    std::size_t i = 0;
    const auto declare = [&](auto& l) {
      first_entry_[i] = store_.count();
      l.declare(store_, std::to_string(i) + ".");
      has_params_[i] = store_.count() > first_entry_[i];
      ++i;
    };
    std::apply([&](auto&... l) { (declare(l), ...); }, layers_);
    store_.allocate();
    std::apply([&](auto&... l) { (l.bind(store_), ...); }, layers_);
    reset_parameters(seed);
  }

  template <std::size_t I>
  using layer_t = std::tuple_element_t<I, std::tuple<Layers...>>;
  template <std::size_t I>
  static constexpr std::size_t rank_at = detail::rank_after<I, input_rank, Layers...>();  // layer I's input

  template <std::size_t I>
  static constexpr bool fuses_next() {
    if constexpr (I + 1 < size) {
      using L = layer_t<I>;
      using N = layer_t<I + 1>;
      if constexpr (detail::layer_traits<L>::is_linear && N::is_activation) return true;
      else if constexpr (requires { L::fuses_relu; } && N::is_activation) return N::kind == detail::act_kind::relu;
      else return false;
    } else {
      return false;
    }
  }

  template <std::size_t I>
  output_view forward_from(const tensor_view<const C, device, rank_at<I>>& x) {
    if constexpr (I == size) {
      return x;
    } else {
      auto& l = std::get<I>(layers_);
      if constexpr (fuses_next<I>()) {
        auto& a = std::get<I + 1>(layers_);
        if (!l.has_hooks() && !a.has_hooks()) {
          a.mark_fused();
          return forward_from<I + 2>(l.forward(x, std::remove_reference_t<decltype(a)>::kind));
        }
      }
      if constexpr (detail::layer_traits<layer_t<I>>::is_linear)
        return forward_from<I + 1>(l.forward(x, detail::act_kind::none));
      else
        return forward_from<I + 1>(l.forward(x));
    }
  }

  template <std::size_t I>
  input_view backward_from(const tensor_view<const C, device, rank_at<I + 1>>& gy, bool need_input_grad) {
    auto& l = std::get<I>(layers_);
    if constexpr (layer_t<I>::is_activation) {
      if (l.fused()) {  // the linear layer before it differentiates both
        if constexpr (I > 0) return backward_from<I - 1>(gy, need_input_grad);
        else return gy;
      }
    }
    const tensor_view<const C, device, rank_at<I>> g = l.backward(gy, I > 0 || need_input_grad);
    if (grads_final_ && has_params_[I]) grads_final_(store_.entries()[first_entry_[I]].offset);
    if constexpr (I > 0) return backward_from<I - 1>(g, need_input_grad);
    else return g;
  }

  template <std::size_t I>
  tensor<C, device, output_rank> infer_from(const tensor_view<const C, device, rank_at<I>>& x) const {
    const auto& l = std::get<I>(layers_);
    if constexpr (fuses_next<I>()) {
      const auto& a = std::get<I + 1>(layers_);
      if (!l.has_hooks() && !a.has_hooks()) {
        tensor<C, device, rank_at<I + 2>> y = l.infer(x, std::remove_reference_t<decltype(a)>::kind);
        if constexpr (I + 2 < size) return infer_from<I + 2>(std::as_const(y).view());
        else return y;
      }
    }
    tensor<C, device, rank_at<I + 1>> y = l.infer(x);
    if constexpr (I + 1 < size) return infer_from<I + 1>(std::as_const(y).view());
    else return y;
  }

  std::tuple<Layers...> layers_;
  store_type store_;
  std::uint64_t seed_ = 0;
  std::array<std::size_t, size> first_entry_{};  // each layer's first parameter in the store
  std::array<bool, size> has_params_{};
  std::function<void(index_t)> grads_final_;
  mutable std::vector<index_t> last_shape_;
};

template <class... Layers>
sequential(Layers...) -> sequential<Layers...>;

}  // namespace locus::nn
