// Dynamic loss scaling (what torch.amp.GradScaler does, kept entirely on the device).
//
//   locus::amp::grad_scaler<locus::cuda> scaler;           // scale 65536, x2 every 2000 clean steps
//   loss.forward(logits, labels, scaler.scale_ptr());       // gradients of scale * loss
//   model.backward(loss.grad());
//   scaler.unscale(model.parameters());  // one pass: g /= scale, and a non-finite check
//   opt.step(scaler.state());            // skipped on the device if a gradient overflowed
//   scaler.update();                     // back off on overflow, grow after N clean steps
//
// The scale, the growth tracker and the overflow flag live in device memory, so none of
// these calls waits for the GPU; scale() and skipped_steps() read them back when asked.
// train::trainer makes these calls; its checkpoints hold the scaler's state.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../core/error.hpp"
#include "../core/rules_train.hpp"
#include "../nn/kernels.hpp"
#include "../nn/parameters.hpp"
#include "../tensor/factories.hpp"
#include "../transfer/copy.hpp"

namespace locus::amp {

struct grad_scaler_options {
  float init_scale = 65536.0f;  ///< 2^16, as PyTorch
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;  ///< clean steps before the scale grows
};

template <Device D>
class grad_scaler {
 public:
  using device = D;

  /// Options outside their ranges are a value_error naming the option and its value:
  /// init_scale finite and at least 2^-126 (its reciprocal divides the gradients),
  /// growth_factor finite and > 1, backoff_factor in (0, 1), growth_interval in
  /// [1, 2^24] (the clean steps are counted in an f32, exact up to 2^24).
  explicit grad_scaler(grad_scaler_options o = {}) : o_(o) {
    check_options(o);
    detail::step_state s{};
    s.scale = o.init_scale;
    state_ = tensor<std::int64_t, D, 1>(extents<1>{words});
    write(s);
  }

  /// The device-side loss scale, for losses to multiply their gradient by.
  [[nodiscard]] const float* scale_ptr() const noexcept {
    return &reinterpret_cast<const detail::step_state*>(state_.data_handle())->scale;
  }
  /// The device-side state the optimizer's step reads (skip on overflow).
  [[nodiscard]] detail::step_state* state() noexcept {
    return reinterpret_cast<detail::step_state*>(state_.data_handle());
  }

  /// Divides every gradient by the scale and checks them all for inf and NaN: one pass
  /// over the model's flat gradient buffer.
  template <Device MD, class Policy>
  void unscale(nn::parameter_store<MD, Policy>& params) {
    static_assert(detail::require_scaler_on_model_device<D, MD>());
    if constexpr (std::is_same_v<D, MD>) {
      detail::launch_n<D>(1, detail::check_begin_kernel{state()});
      detail::run_check_grads<D>(detail::check_grads_kernel<typename Policy::master>{params.grad().data_handle(), state(),
                                                                                    nullptr, nullptr, 0, true},
                                 params.size());
    }
  }

  /// After the optimizer step: halves the scale (backoff_factor) after an overflow,
  /// doubles it (growth_factor) after growth_interval clean steps.
  void update() {
    detail::launch_n<D>(1, detail::scaler_update_kernel{state(), o_.growth_factor, o_.backoff_factor,
                                                        static_cast<float>(o_.growth_interval)});
  }

  [[nodiscard]] const grad_scaler_options& options() const noexcept { return o_; }
  /// The GPU its state lives on (the one current when it was built); -1 on host devices.
  [[nodiscard]] int device_index() const noexcept { return state_.device_index(); }
  /// The current scale (reads the state back from D).
  [[nodiscard]] float scale() const { return read().scale; }
  /// Clean steps since the scale last changed.
  [[nodiscard]] int growth_tracker() const { return static_cast<int>(read().growth_tracker); }
  /// Optimizer steps skipped because of an overflow.
  [[nodiscard]] std::int64_t skipped_steps() const { return read().skipped; }

  /// Checkpoint state: [scale, growth_tracker, skipped] as f32.
  [[nodiscard]] tensor<float, cpu, 1> state_dict() const {
    const detail::step_state s = read();
    tensor<float, cpu, 1> t(extents<1>{3});
    t(0) = s.scale;
    t(1) = s.growth_tracker;
    t(2) = static_cast<float>(s.skipped);
    return t;
  }
  /// Whether load_state_dict accepts t's values (3 of them): a finite scale of at least
  /// 2^-126 (what the update keeps it to) and whole, non-negative counts that fit their
  /// types (skipped becomes an int64).
  static bool valid_state(const tensor_view<const float, cpu, 1>& t) {
    auto whole = [](float x, float limit) { return std::isfinite(x) && x >= 0.0f && x < limit && std::floor(x) == x; };
    return t.numel() == 3 && std::isfinite(t(0)) && t(0) >= detail::min_loss_scale() && whole(t(1), 2147483648.0f) &&
           whole(t(2), 9223372036854775808.0f);
  }
  void load_state_dict(const tensor_view<const float, cpu, 1>& t) {
    if (t.numel() != 3)
      throw shape_error("locus: grad_scaler state has " + std::to_string(t.numel()) + " values; expected 3");
    if (!valid_state(t))
      throw ::locus::value_error("locus: grad_scaler state [" + std::to_string(t(0)) + ", " + std::to_string(t(1)) +
                                  ", " + std::to_string(t(2)) +
                                  "] is not [scale >= 2^-126, growth tracker >= 0, skipped steps >= 0] (finite, the "
                                  "counts whole)");
    detail::step_state s{};
    s.scale = t(0);
    s.growth_tracker = t(1);
    s.skipped = static_cast<std::int64_t>(t(2));
    write(s);
  }

 private:
  static constexpr index_t words = (sizeof(detail::step_state) + 7) / 8;

  static void check_options(const grad_scaler_options& o) {
    const auto bad = [](const char* option, double value, const char* rule) {
      ::locus::detail::throw_value_error("locus: grad_scaler option %s = %s: %s", option,
                                         ::locus::detail::number_chars(value).s, rule);
    };
    if (!(std::isfinite(o.init_scale) && o.init_scale >= detail::min_loss_scale()))
      bad("init_scale", o.init_scale,
          "must be a finite number of at least 2^-126 (1.1754944e-38, f32's smallest normal value: the gradients "
          "are divided by it), e.g. 65536");
    if (!(std::isfinite(o.growth_factor) && o.growth_factor > 1.0f))
      bad("growth_factor", o.growth_factor, "must be a finite number > 1, e.g. 2");
    if (!(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f))
      bad("backoff_factor", o.backoff_factor, "must be in (0, 1), e.g. 0.5");
    if (o.growth_interval < 1 || o.growth_interval > (1 << 24))
      bad("growth_interval", o.growth_interval,
          "must be in [1, 16777216] (the clean steps are counted in an f32, exact up to 2^24), e.g. 2000");
  }

  detail::step_state read() const {
    const auto h = to<cpu>(state_);
    detail::step_state s;
    std::memcpy(&s, h.data_handle(), sizeof s);
    return s;
  }
  void write(const detail::step_state& s) {
    tensor<std::int64_t, cpu, 1> h = zeros<std::int64_t, cpu>(extents<1>{words});
    std::memcpy(h.data_handle(), &s, sizeof s);
    copy(h, state_);
  }

  grad_scaler_options o_;
  tensor<std::int64_t, D, 1> state_;
};

}  // namespace locus::amp
