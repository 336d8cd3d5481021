// Optimizers over a model's parameter_store, with their state on the model's device in
// f32, and learning-rate schedules.
//
//   locus::optim::adamw<locus::cuda> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.01});
//   locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//
// step() is one fused pass over every parameter of the model (the store is one flat
// buffer): it reads gradient, weight and state once, writes weight and state, and
// writes the compute-dtype copy of the weight for mixed policies in the same pass.
// Whether to skip the step (a grad scaler's overflow, the trainer's non-finite guard)
// and AdamW's bias corrections are decided on the device, so a step never waits for
// the GPU. The optimizer's device is a type: adamw<cpu> on a cuda model does not compile.
//
// Loss scaling in a hand-written loop: step() without a guard on a model that computes
// in f16 (or whose policy declares requires_loss_scaling) throws locus::error before
// touching anything, since such gradients have already lost what underflowed; pass a
// grad scaler's state (opt.step(scaler.state())), or opt.step(locus::optim::unscaled)
// to step without one on purpose. The policy is not part of the optimizer's type
// (adamw<D> serves every policy), so this is a run-time rule.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <string>

#include "../amp/policy.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../core/rules_train.hpp"
#include "../nn/kernels.hpp"
#include "../nn/parameters.hpp"
#include "../tensor/factories.hpp"
#include "../transfer/copy.hpp"

namespace locus::optim {

namespace detail {
using locus::detail::step_state;
using locus::detail::update_scalars;

enum class compute_kind { same, bf16, f16 };

template <class C>
constexpr compute_kind compute_kind_of() {
  if constexpr (std::is_same_v<C, ::locus::bf16>) return compute_kind::bf16;
  else if constexpr (std::is_same_v<C, ::locus::f16>) return compute_kind::f16;
  else return compute_kind::same;
}

/// Runs kernel<C> with the model's compute dtype.
template <class F>
void with_compute(compute_kind k, F&& f) {
  switch (k) {
    case compute_kind::same: f(static_cast<float*>(nullptr)); break;
    case compute_kind::bf16: f(static_cast<::locus::bf16*>(nullptr)); break;
    case compute_kind::f16: f(static_cast<::locus::f16*>(nullptr)); break;
  }
}
/// What every optimizer keeps of the model: its flat buffers and where they live.
template <Device D>
struct bound_parameters {
  float* p = nullptr;
  float* g = nullptr;
  void* pc = nullptr;  // compute copy, or nullptr
  compute_kind kind = compute_kind::same;
  bool needs_scaling = false;  // amp::needs_loss_scaling of the store's policy
  index_t n = 0;

  /// Re-derives the compute copy from the master weights (after a checkpoint load).
  void sync_compute() const {
    with_compute(kind, [&](auto* tag) {
      using C = std::remove_pointer_t<decltype(tag)>;
      if constexpr (!std::is_same_v<C, float>)
        if (pc) locus::detail::launch_n<D>(n, locus::detail::cast_kernel<float, C>{p, static_cast<C*>(pc)});
    });
  }

  template <Device MD, class Policy>
  static bound_parameters bind(nn::parameter_store<MD, Policy>& s) {
    static_assert(locus::detail::require_optimizer_on_model_device<D, MD>());
    bound_parameters b;
    if constexpr (!std::is_same_v<typename Policy::master, float>) {
      static_assert(locus::detail::always_false<Policy>,
                    "locus: optimizers update f32 master weights; amp::fp64 is for gradient checks; "
                    "train with amp::fp32, amp::bf16_mixed or amp::fp16_mixed");
    } else if constexpr (std::is_same_v<D, MD>) {
      b.p = s.master().data_handle();
      b.g = s.grad().data_handle();
      if constexpr (nn::parameter_store<MD, Policy>::separate_compute) b.pc = s.compute_data();
      b.kind = compute_kind_of<typename Policy::compute>();
      b.needs_scaling = amp::needs_loss_scaling<Policy>;
      b.n = s.size();
    }
    return b;
  }
};

/// What adamw and sgd share: the bound parameters, the options, the step counter and
/// the per-step scalars on D, and the accessors over them.
/// PyTorch's "Invalid learning rate" and friends: an option that is NaN, infinite, not
/// representable in f32 (the kernels' precision) or outside its range is a value_error
/// at construction, before any step could turn the weights into NaN.
inline void check_option(const char* name, double v, double lo, bool below_one) {
  if (!(v >= lo) || !(v <= std::numeric_limits<float>::max()) || (below_one && !(v < 1.0)))
    throw ::locus::value_error(std::string("locus: optimizer option ") + name + " = " + std::to_string(v) +
                               " is invalid; it must be a finite number " +
                               (below_one ? "in [0, 1)" : lo == 0.0 ? ">= 0" : "> 0"));
}

template <Device D, class Options>
class optimizer_base {
 public:
  using device = D;

  [[nodiscard]] double lr() const noexcept { return o_.lr; }
  /// A learning rate must be a finite number >= 0 that f32 holds (value_error).
  void set_lr(double lr) {
    check_option("lr", lr, 0.0, false);
    o_.lr = lr;
  }
  [[nodiscard]] const Options& options() const noexcept { return o_; }
  /// Steps taken (skipped ones not counted); reads one integer back from D.
  [[nodiscard]] std::int64_t steps() const { return to<cpu>(steps_)(0); }
  tensor_view<std::int64_t, D, 1> step_tensor() noexcept { return steps_.view(); }
  /// Re-derives the compute copy from the master weights (after a checkpoint load).
  void after_load() { params_.sync_compute(); }

  /// Whether this optimizer updates `store` (it was built from it): the trainer refuses
  /// an optimizer bound to another model's parameters.
  template <Device MD, class Policy>
  [[nodiscard]] bool bound_to(const nn::parameter_store<MD, Policy>& store) const noexcept {
    if constexpr (!std::is_same_v<MD, D>) {
      return false;
    } else {
      return static_cast<const void*>(params_.p) == static_cast<const void*>(store.master().data_handle()) &&
             static_cast<const void*>(params_.g) == static_cast<const void*>(store.grad().data_handle()) &&
             params_.n == store.size();
    }
  }
  /// The elements and master weights of the store it was built from (for messages).
  [[nodiscard]] index_t bound_size() const noexcept { return params_.n; }
  [[nodiscard]] const void* bound_data() const noexcept { return params_.p; }

 protected:
  template <Device MD, class Policy>
  optimizer_base(nn::parameter_store<MD, Policy>& params, const Options& o)
      : params_(bound_parameters<D>::template bind<MD, Policy>(params)),
        o_(o),
        steps_(zeros<std::int64_t, D>(extents<1>{1})),
        scalars_(zeros<std::int32_t, D>(extents<1>{4})) {}

  /// Starts a step on the device: counts it unless `guard` reports a non-finite
  /// gradient, and leaves the scalars the update kernel reads (bias corrections with
  /// beta1/beta2; 0 for optimizers without them).
  update_scalars* begin_step(locus::detail::step_state* guard, float beta1, float beta2) {
    if (guard == nullptr && params_.needs_scaling)
      throw error(
          "locus: optimizer step without loss scaling on a model whose policy needs it (it computes in f16, "
          "or declares requires_loss_scaling): f16 gradients below 6e-8 have flushed to zero; scale the loss "
          "with a locus::amp::grad_scaler<D> scaler: loss.forward(out, y, scaler.scale_ptr()), "
          "model.backward(loss.grad()), scaler.unscale(model.parameters()), opt.step(scaler.state()), "
          "scaler.update(); or, to step without it on purpose, opt.step(locus::optim::unscaled)");
    return begin_unscaled(guard, beta1, beta2);
  }
  /// begin_step without the loss-scaling rule (optim::unscaled).
  update_scalars* begin_unscaled(locus::detail::step_state* guard, float beta1, float beta2) {
    auto* sc = reinterpret_cast<update_scalars*>(scalars_.data_handle());
    locus::detail::launch_n<D>(1, locus::detail::update_begin_kernel{guard, steps_.data_handle(), sc, beta1, beta2});
    return sc;
  }

  bound_parameters<D> params_;
  Options o_;
  tensor<std::int64_t, D, 1> steps_;
  tensor<std::int32_t, D, 1> scalars_;
};

}  // namespace detail

/// The explicit opt-out of the loss-scaling rule for a hand-written loop:
/// opt.step(locus::optim::unscaled) updates a model that computes in f16 without a grad
/// scaler (opt.step() there throws locus::error, since its small gradients have
/// already flushed to zero). Nothing else differs from opt.step().
struct unscaled_t {
  explicit unscaled_t() = default;
};
inline constexpr unscaled_t unscaled{};

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  ///< decoupled, as torch.optim.AdamW (default 0.01)
};

/// AdamW (Loshchilov & Hutter), as torch.optim.AdamW computes it.
template <Device D>
class adamw : public detail::optimizer_base<D, adamw_options> {
  using base = detail::optimizer_base<D, adamw_options>;

 public:
  static constexpr const char* kind = "adamw";

  static adamw_options checked(const adamw_options& o) {
    detail::check_option("lr", o.lr, 0.0, false);
    detail::check_option("beta1", o.beta1, 0.0, true);
    detail::check_option("beta2", o.beta2, 0.0, true);
    detail::check_option("eps", o.eps, 0.0, false);
    detail::check_option("weight_decay", o.weight_decay, 0.0, false);
    return o;
  }

  template <Device MD, class Policy>
  adamw(nn::parameter_store<MD, Policy>& params, adamw_options o = {})
      : base(params, checked(o)),
        m_(zeros<float, D>(extents<1>{this->params_.n})),
        v_(zeros<float, D>(extents<1>{this->params_.n})) {}

  /// One update of every parameter; skipped (on the device) when `guard` reports a
  /// non-finite gradient. Without a guard on a model that computes in f16: locus::error
  /// (pass the grad scaler's state, or optim::unscaled).
  void step(locus::detail::step_state* guard = nullptr) {
    const auto& o = this->o_;
    update(this->begin_step(guard, static_cast<float>(o.beta1), static_cast<float>(o.beta2)));
  }
  /// One update of every parameter without loss scaling, whatever the policy.
  void step(unscaled_t) {
    const auto& o = this->o_;
    update(this->begin_unscaled(nullptr, static_cast<float>(o.beta1), static_cast<float>(o.beta2)));
  }

  /// The state tensors by name (for checkpoints): "exp_avg", "exp_avg_sq" (flat, laid out
  /// as the parameter store); the step counter is step_tensor().
  template <class F>
  void for_each_state(F&& f) {
    f("exp_avg", m_.view());
    f("exp_avg_sq", v_.view());
  }

 private:
  void update(locus::detail::update_scalars* sc) {
    const auto& o = this->o_;
    const auto& pr = this->params_;
    detail::with_compute(pr.kind, [&](auto* tag) {
      using C = std::remove_pointer_t<decltype(tag)>;
      locus::detail::run_adamw<D>(locus::detail::adamw_kernel<C>{
                                      pr.p, pr.g, m_.data_handle(), v_.data_handle(), static_cast<C*>(pr.pc), sc,
                                      static_cast<float>(o.lr), static_cast<float>(o.beta1),
                                      static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                      static_cast<float>(o.weight_decay)},
                                  pr.n);
    });
  }

  tensor<float, D, 1> m_, v_;
};

struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< L2, added to the gradient (torch.optim.SGD)
  bool nesterov = false;
};

/// SGD with optional momentum, Nesterov momentum and weight decay, as torch.optim.SGD.
template <Device D>
class sgd : public detail::optimizer_base<D, sgd_options> {
  using base = detail::optimizer_base<D, sgd_options>;

 public:
  static constexpr const char* kind = "sgd";

  static sgd_options checked(const sgd_options& o) {
    detail::check_option("lr", o.lr, 0.0, false);
    detail::check_option("momentum", o.momentum, 0.0, false);
    detail::check_option("dampening", o.dampening, 0.0, false);
    detail::check_option("weight_decay", o.weight_decay, 0.0, false);
    return o;
  }

  template <Device MD, class Policy>
  sgd(nn::parameter_store<MD, Policy>& params, sgd_options o = {}) : base(params, checked(o)) {
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
      throw ::locus::value_error("locus: Nesterov momentum needs momentum > 0 and dampening 0");
    if (o.momentum != 0.0) buf_ = zeros<float, D>(extents<1>{this->params_.n});
  }

  /// As adamw::step: without a guard on a model that computes in f16, locus::error.
  void step(locus::detail::step_state* guard = nullptr) { update(this->begin_step(guard, 0.0f, 0.0f)); }
  void step(unscaled_t) { update(this->begin_unscaled(nullptr, 0.0f, 0.0f)); }

  template <class F>
  void for_each_state(F&& f) {
    if (this->o_.momentum != 0.0) f("momentum_buffer", buf_.view());
  }

 private:
  void update(locus::detail::update_scalars* sc) {
    const auto& o = this->o_;
    const auto& pr = this->params_;
    detail::with_compute(pr.kind, [&](auto* tag) {
      using C = std::remove_pointer_t<decltype(tag)>;
      locus::detail::launch_n<D>(pr.n, locus::detail::sgd_kernel<C>{
                                           pr.p, pr.g, o.momentum != 0.0 ? buf_.data_handle() : nullptr,
                                           static_cast<C*>(pr.pc), sc, static_cast<float>(o.lr),
                                           static_cast<float>(o.momentum), static_cast<float>(o.dampening),
                                           static_cast<float>(o.weight_decay), o.nesterov});
    });
  }

  tensor<float, D, 1> buf_;
};

// ---- learning-rate schedules ---------------------------------------------------------------
// A schedule maps (optimizer step, base lr) to the lr of that step; the trainer applies
// it before every optimizer step. Steps count from 0.

/// The base lr throughout.
struct constant_lr {
  double operator()(std::int64_t, double base) const noexcept { return base; }
};

/// base * gamma^(step / step_size) (torch.optim.lr_scheduler.StepLR).
struct step_lr {
  std::int64_t step_size = 1;
  double gamma = 0.1;
  double operator()(std::int64_t step, double base) const {
    return base * std::pow(gamma, static_cast<double>(step / (step_size > 0 ? step_size : 1)));
  }
};

/// Cosine annealing from base to min_lr over total_steps, then min_lr
/// (torch.optim.lr_scheduler.CosineAnnealingLR with T_max = total_steps).
struct cosine_lr {
  std::int64_t total_steps = 1;
  double min_lr = 0.0;
  double operator()(std::int64_t step, double base) const {
    if (step >= total_steps) return min_lr;
    const double t = static_cast<double>(step) / static_cast<double>(total_steps > 0 ? total_steps : 1);
    return min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
};

/// Linear warm-up from base / warmup_steps to base over warmup_steps, then `after`
/// (counted from the end of the warm-up).
template <class After = constant_lr>
struct warmup_lr {
  std::int64_t warmup_steps = 0;
  After after{};
  double operator()(std::int64_t step, double base) const {
    if (step < warmup_steps)
      return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    return after(step - warmup_steps, base);
  }
};

/// Any schedule, type-erased.
using schedule = std::function<double(std::int64_t step, double base_lr)>;

}  // namespace locus::optim
