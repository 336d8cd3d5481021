// train::trainer: the training loop of a model, an optimizer, a loss and a precision
// policy (and, for amp::fp16_mixed, a grad scaler), all on one device by type.
//
//   locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, {.accumulate = 4});
//   for (auto& [x, y] : loader) t.step(x, y);    // a micro-batch; every 4th also updates
//   auto r = t.evaluate(test_loader);             // inference forward, accuracy
//
// step(x, y) runs forward, loss and backward; gradients accumulate over `accumulate`
// micro-batches (each loss weighted 1/accumulate, so N micro-batches of B equal one
// batch of N*B), then the optimizer step runs: the grad scaler's unscale and overflow
// check, or (without one) a non-finite guard, one fused update of every parameter, and
// zero_grad. None of it reads the device back: the running loss stays on the device
// until report() (or the end of an epoch) reads it, and on cuda a bad label or a
// non-finite gradient is reported there. On host devices they are reported at once.
//
// Graph mode ({.cuda_graph = true}, cuda only): train/graph_mode.hpp, whose comment says
// how the step is captured and replayed, and what is refused.
//
// Capture safety at compile time: locus has no user-facing captured region. Graph mode
// captures only the trainer's own step, whose every operation is locus code known to be
// capture-safe; a compile-time rule for user regions would need every host read, copy,
// allocation and synchronisation in the library to take a "not capturing" token, and
// still could not see into a user function called from the region (a plain call does
// not carry the token), so it would promise more than it checks. What breaks a capture
// at run time is reported as locus::cuda_error (the runtime's capture errors).
//
// Rules checked at compile time: a batch on another device than the model, an optimizer
// or scaler built for another device, and a policy that computes in f16 (amp::fp16_mixed
// or any other) without a grad scaler. At construction: an optimizer bound to another
// model's parameters (locus::error).
//
// Length (over 600 lines): train::trainer is one class: the step, its rollback,
// accumulation, the epoch functions and evaluation share the trainer's state; graph
// mode's state is train/graph_mode.hpp and the options and progress train/progress.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#if __has_include(<unistd.h>)
#include <unistd.h>  // isatty (progress_bar)
#endif

#include "../amp/grad_scaler.hpp"
#include "../amp/policy.hpp"
#include "../core/error.hpp"
#include "../core/preflight.hpp"
#include "../memory/allocator.hpp"
#include "../nn/kernels.hpp"
#include "../nn/layers.hpp"
#include "../nn/loss.hpp"
#include "../optim/optim.hpp"
#include "graph_mode.hpp"
#include "progress.hpp"
#if LOCUS_HAS_CUDA
#include <memory>

#include "../transfer/stream.hpp"
#endif

namespace locus::train {
namespace detail {
using locus::detail::step_state;
using optim::detail::step_vars;

/// The loader's wait for data in the epoch so far (data::loader, data::images), or 0.
template <class Loader>
double loader_wait(const Loader& batches) {
  if constexpr (requires { batches.wait_seconds(); })
    return static_cast<double>(batches.wait_seconds());
  else
    return 0.0;
}

/// *acc += *v * w (one thread), noting the first micro-step whose loss was not finite;
/// the micro-step from device memory in graph mode.
template <class A>
struct accumulate_loss_kernel {
  A* acc;
  const A* v;
  A w;
  std::int64_t* first_nonfinite;
  const step_vars* vars;
  std::int64_t tag;
  LOCUS_HOST_DEVICE void operator()(index_t) const {
    const A x = *v;
    *acc += x * w;
    if (first_nonfinite && *first_nonfinite < 0 && !(x - x == A(0))) *first_nonfinite = vars ? vars->micro_step : tag;
  }
};

/// Writes a step's values into device memory (graph mode, before each replay).
struct set_vars_kernel {
  step_vars* dst;
  step_vars v;
  LOCUS_HOST_DEVICE void operator()(index_t) const { *dst = v; }
};

/// Whether a model type holds a dropout layer (graph mode would repeat its mask).
template <class M>
constexpr bool has_dropout() {
  if constexpr (requires { M::has_dropout; }) return M::has_dropout;
  else return false;
}

// The need for a scaler follows from f16 compute itself (a home-made policy with
// compute = f16 and requires_loss_scaling = false is refused too); the flag only adds
// it for other compute dtypes.
template <class Policy, class Scaler>
constexpr bool check_scaler() {
  using P = locus::detail::checked_policy_t<Policy>;  // check_policy reported a bad one
  if constexpr (std::is_same_v<Scaler, no_scaler> && std::is_same_v<typename P::compute, ::locus::f16>) {
    static_assert(locus::detail::always_false<Policy>,
                  "locus: amp::fp16_mixed needs loss scaling, and so does every policy that computes in f16 "
                  "(whatever its requires_loss_scaling says): f16 gradients below 6e-8 flush to zero and "
                  "training silently stalls or diverges; pass a locus::amp::grad_scaler<D> to the trainer "
                  "(or use amp::bf16_mixed, whose range needs no scaling)");
    return false;
  } else if constexpr (std::is_same_v<Scaler, no_scaler> && amp::needs_loss_scaling<P>) {
    static_assert(locus::detail::always_false<Policy>,
                  "locus: this precision policy declares requires_loss_scaling = true, but the trainer has no "
                  "grad scaler; pass a locus::amp::grad_scaler<D> to the trainer: "
                  "locus::train::trainer t(model, opt, loss, scaler)");
    return false;
  } else {
    return true;
  }
}

template <class Model>
constexpr std::size_t model_input_rank() {
  if constexpr (requires { Model::input_rank; }) return Model::input_rank;
  else return 2;
}
/// The element type of the model's input batches: its compute dtype, or the integer
/// dtype of a module whose forward takes token ids.
template <class Model, class = void>
struct model_input_type {
  using type = typename Model::policy::compute;
};
template <class Model>
struct model_input_type<Model, std::void_t<typename Model::input_type>> {
  using type = typename Model::input_type;
};
template <class Model>
constexpr bool check_model_output() {
  if constexpr (requires { Model::output_rank; }) {
    static_assert(Model::output_rank == 2,
                  "locus: the trainer's losses take the model's output as rank 2 [batch, outputs], but this model "
                  "ends with a rank-4 activation [batch, channels, height, width]; end it with "
                  "locus::nn::flatten<D, P>() and a linear layer (or adaptive_avg_pool2d(1) and flatten)");
    return Model::output_rank == 2;
  } else {
    return true;
  }
}

template <class Model, class Optimizer, class Scaler>
constexpr bool check_trainer() {
  if constexpr (!check_model_output<Model>()) return false;
  using D = typename Model::device;
  bool ok = locus::detail::check_policy<typename Model::policy>() &&
            locus::detail::require_optimizer_on_model_device<typename Optimizer::device, D>();
  if constexpr (!std::is_same_v<Scaler, no_scaler>)
    ok = ok && locus::detail::require_scaler_on_model_device<typename Scaler::device, D>();
  return ok && check_scaler<typename Model::policy, Scaler>();
}
}  // namespace detail

/// no_scaler, or a loss scaler such as amp::grad_scaler<D>.
template <class S>
concept scaler_or_none = std::is_same_v<S, no_scaler> || requires(S& s) {
  s.scale_ptr();
  s.update();
  s.state();
};

#define LOCUS_TRAINER_TEMPORARY_MESSAGE                                                           \
  "locus: a trainer keeps pointers to its model, optimizer and scaler, but one of them is a "     \
  "temporary, destroyed at the end of the statement; keep each in a variable first: auto model " \
  "= ...; locus::optim::adamw<D> opt(model.parameters()); locus::train::trainer t(model, opt, loss)"

namespace detail {
template <class M, class X>
constexpr auto& refuse_temporary(X& x) {
  static_assert(locus::detail::always_false<M>, LOCUS_TRAINER_TEMPORARY_MESSAGE);
  return x;
}
}  // namespace detail

template <class Model, class Optimizer, class Loss, scaler_or_none Scaler = no_scaler>
class trainer {
  static_assert(detail::check_trainer<Model, Optimizer, Scaler>());

 public:
  using device = typename Model::device;
  using policy = typename Model::policy;
  using C = typename policy::compute;
  using loss_state = typename Loss::template state<device, policy>;
  using A = typename loss_state::A;
  static constexpr bool has_scaler = !std::is_same_v<Scaler, no_scaler>;
  static constexpr const char* optimizer_kind = Optimizer::kind;
  /// The rank of the model's input batches: 2 [batch, features], or 4 [batch, channels,
  /// height, width] for a model that starts with a convolution.
  static constexpr std::size_t input_rank = detail::model_input_rank<Model>();
  /// The input batches' element type: C, or int64/int32 token ids for a module over ids.
  using input_type = typename detail::model_input_type<Model>::type;
  static constexpr bool takes_ids = std::is_integral_v<input_type>;
  using input_view = tensor_view<const input_type, device, input_rank>;

  trainer(Model& model, Optimizer& opt, Loss loss = {}, options o = {})
    requires(std::is_same_v<Scaler, no_scaler>)
      : model_(&model), opt_(&opt), loss_(loss), o_(std::move(o)) {
    init();
  }
  trainer(Model& model, Optimizer& opt, Loss loss, Scaler& scaler, options o = {})
    requires(!std::is_same_v<Scaler, no_scaler>)
      : model_(&model), opt_(&opt), loss_(loss), scaler_(&scaler), o_(std::move(o)) {
    init();
  }
  // Prevents: a trainer over a temporary model, optimizer or scaler. It keeps pointers to
  // them, so each would be destroyed at the end of the statement and every step would
  // write freed memory. (An ordinary deleted overload would say "no matching
  // constructor" or "deduction failed" instead of the reason.)
  // (The message comes from refuse_temporary's deduced return type, instantiated at the
  // call, before anything else about these constructors is looked at.)
  template <class M, class O>
    requires(!std::is_lvalue_reference_v<M> || !std::is_lvalue_reference_v<O>)
  trainer(M&& m, O&& opt, Loss loss = {}, options o = {})
      : trainer(detail::refuse_temporary<M>(m), opt, loss, std::move(o)) {}
  template <class M, class O, class S>
    requires(!std::is_lvalue_reference_v<M> || !std::is_lvalue_reference_v<O> || !std::is_lvalue_reference_v<S>)
  trainer(M&& m, O&& opt, Loss loss, S&& scaler, options o = {})
      : trainer(detail::refuse_temporary<M>(m), opt, loss, scaler, std::move(o)) {}

  /// One micro-batch: x [B, features] (f32 or the policy's compute dtype), y the loss's
  /// target (i64 labels [B] for cross_entropy), both on the model's device.
  template <class X, class Y>
  void step(const X& x, const Y& y) {
    if constexpr (!check_batch<X, Y>()) return;
    check_bound(true);
    check_gpu("trainer::step", x, y);
#if LOCUS_HAS_CUDA
    if constexpr (std::is_same_v<device, cuda>) {
      if (o_.cuda_graph) return graph_step(x, y);
    }
#endif
    auto xv = input(x);
    auto yv = target(y);
    check_nonempty(xv);
    // On host devices a stop recorded by an earlier step is raised before this one
    // counts (on cuda it surfaces at the next check, after the steps already queued).
    if constexpr (device::host_accessible) check();
    const bool update = micro_ + 1 == o_.accumulate;
    // A step that may allocate (a batch shape other than the last step's: buffers grow
    // or change shape; or every step, where steps allocate temporaries) first saves what
    // it writes before its last allocation, so that an out_of_memory leaves the trainer
    // as it was (see enqueue_step's handler).
    const bool new_shape = xv.shape() != last_shape_ || !last_shape_valid_;
    save_for_rollback(steps_allocate || new_shape || has_hooks(), new_shape);
    const double lr_before = opt_->lr();
    if (o_.schedule && update) opt_->set_lr(o_.schedule(optimizer_steps_, base_lr_));
    try {
      enqueue_step(xv, yv, update, nullptr);
    } catch (const out_of_memory&) {
      opt_->set_lr(lr_before);
      throw;
    } catch (const value_error&) {
      // a forward that refused its input (an id outside the vocabulary, a sequence past
      // the context): nothing was written to the weights, gradients or optimizer state;
      // the schedule's lr and the dropout counters go back too
      opt_->set_lr(lr_before);
      restore_counters_and_buffers();
      throw;
    } catch (const shape_error&) {
      opt_->set_lr(lr_before);
      restore_counters_and_buffers();
      throw;
    }
    rollback_armed_ = false;
    grad_saved_.values = {};  // a window's gradient backup lives for one step only
    last_shape_ = xv.shape();
    last_shape_valid_ = true;
    const auto counters = std::make_tuple(running_samples_, window_first_, micro_step_, micro_, optimizer_steps_);
    advance(yv.shape()[0], update);  // rows of the loss: samples, or a sequence model's tokens
    if constexpr (device::host_accessible) {
      try {
        check();
      } catch (const non_finite_error&) {  // the step did not happen: it does not count either
        std::tie(running_samples_, window_first_, micro_step_, micro_, optimizer_steps_) = counters;
        throw;
      }
    }
  }

  /// Forward and backward of one batch without an optimizer step, then zero_grad: what
  /// a training step of this batch size needs in memory (find_max_batch_size).
  template <class X, class Y>
  void probe(const X& x, const Y& y) {
    if constexpr (!check_batch<X, Y>()) return;
    drop_graphs();  // probe resizes the buffers the graphs point at
    last_shape_valid_ = false;
    auto xv = input(x);
    auto yv = target(y);
    // a probe trains nothing: batch norm's running statistics and the dropout counters
    // are put back afterwards, as the gradients are zeroed
    save_for_rollback(true, false);
    rollback_armed_ = false;
    try {
      auto out = model_->forward(xv);
      auto l = loss_.forward(out, yv, nullptr, 1.0);
      (void)l;
      model_->backward(loss_.grad());
    } catch (...) {
      restore_counters_and_buffers();
      model_->parameters().zero_grad();
      throw;
    }
    restore_counters_and_buffers();
    model_->parameters().zero_grad();
  }

  /// Graph mode: forgets the captured graphs (they are captured again); a no-op otherwise.
  void drop_graphs() noexcept {
#if LOCUS_HAS_CUDA
    if (graph_) graph_->drop();  // an executing graph is freed when it completes
#endif
  }

  /// Runs the optimizer on the gradients accumulated so far (an epoch's end calls it
  /// when fewer than `accumulate` micro-batches are pending).
  void flush() {
    if (micro_ == 0) return;
    if (o_.schedule) opt_->set_lr(o_.schedule(optimizer_steps_, base_lr_));
#if LOCUS_HAS_CUDA
    std::optional<locus::stream_guard> on_graph_stream;
    if constexpr (std::is_same_v<device, cuda>) {
      if (graph_) graph_->begin(on_graph_stream);
    }
#endif
    if (fused()) fused_update(nullptr, A(0), nullptr, nullptr, micro_step_ - 1, window_first_);
    else optimizer_step(micro_step_ - 1);
    micro_ = 0;
    ++optimizer_steps_;
#if LOCUS_HAS_CUDA
    if constexpr (std::is_same_v<device, cuda>) {
      if (graph_) graph_->end(on_graph_stream);
    }
#endif
  }

  /// Reads the running loss back (the one synchronisation), checks labels and the
  /// non-finite guard, and resets the running mean.
  metrics report() {
    check();
    metrics m;
    A total{};  // read where it lives (no host tensor: report() allocates nothing)
    locus::detail::copy_bytes<device, cpu>(&total, running_.data_handle(), sizeof total);
    m.samples = running_samples_;
    m.loss = running_samples_ ? static_cast<double>(total) / static_cast<double>(running_samples_) : 0.0;
    m.optimizer_steps = optimizer_steps_;
    m.peak_bytes = memory_stats<device>().peak_allocated_bytes;
    locus::detail::zero_bytes<device>(running_.data_handle(), running_.size_bytes());
    running_samples_ = 0;
    return m;
  }

  /// One epoch over a range of batches (data::loader<D>); returns the mean training
  /// loss, samples/s and peak memory. Calls on_progress every report_every batches.
  template <class Loader>
  metrics train_epoch(Loader& batches, const epoch_options& eo = {}) {
    if constexpr (requires { batches.set_epoch(std::uint64_t{}); }) batches.set_epoch(static_cast<std::uint64_t>(eo.epoch));
    std::int64_t total = 0;
    if constexpr (requires { batches.size(); }) total = static_cast<std::int64_t>(batches.size());
    report();  // start from zero
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t count = 0, samples = 0;
    double loss_sum = 0.0;
    std::int64_t loss_samples = 0;
    // the epoch's own callback, else the trainer's (options::on_progress)
    const std::function<void(const progress&)>& on_progress = eo.on_progress ? eo.on_progress : o_.on_progress;
    for (auto& b : batches) {
      step(b.x, b.y);
      samples += b.x.shape()[0];
      ++count;
      // The last batch is reported once, after the loop (with the epoch's final figures).
      if (on_progress && eo.report_every > 0 && count % eo.report_every == 0 && count != total) {
        const metrics r = report();
        loss_sum += r.loss * static_cast<double>(r.samples);
        loss_samples += r.samples;
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        on_progress({eo.epoch, count, total, loss_sum / static_cast<double>(loss_samples),
                     dt > 0 ? static_cast<double>(samples) / dt : 0.0, dt, false, detail::loader_wait(batches)});
      }
    }
    flush();
    metrics r = report();  // synchronises: the epoch's work is done
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss_sum += r.loss * static_cast<double>(r.samples);
    loss_samples += r.samples;
    r.loss = loss_samples ? loss_sum / static_cast<double>(loss_samples) : 0.0;
    r.samples = samples;
    r.seconds = dt;
    r.samples_per_s = dt > 0 ? static_cast<double>(samples) / dt : 0.0;
    r.loader_wait_seconds = detail::loader_wait(batches);
    if (on_progress) on_progress({eo.epoch, count, total, r.loss, r.samples_per_s, dt, true, r.loader_wait_seconds});
    ++epochs_done_;
    return r;
  }

  /// Inference forward over a range of batches: mean loss and accuracy.
  template <class Loader>
  metrics evaluate(Loader& batches) {
    drop_graphs();  // the loss's buffers may be resized for the test batches
    last_shape_valid_ = false;
    tensor<A, device, 1> acc = zeros<A, device>(extents<1>{2});
    std::int64_t samples = 0, rows = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (requires { loss_.set_batch_tag(std::int64_t{}); }) loss_.set_batch_tag(-1);  // not a training batch
    for (auto& b : batches) {
      check_gpu("trainer::evaluate", b.x, b.y);
      auto xv = input(b.x);
      auto yv = target(b.y);
      const tensor<C, device, 2> out = model_->infer(xv);
      auto [loss_sum, correct] = loss_.evaluate(std::as_const(out).view(), yv);
      locus::detail::launch_n<device>(1, locus::detail::accumulate_scalar_kernel<A>{acc.data_handle(),
                                                                                     loss_sum.data_handle(), A(1)});
      locus::detail::launch_n<device>(1, locus::detail::accumulate_scalar_kernel<A>{acc.data_handle() + 1,
                                                                                     correct.data_handle(), A(1)});
      samples += xv.shape()[0];
      rows += out.shape()[0];
    }
    loss_.check_labels();
    const auto h = to<cpu>(acc);
    metrics m;
    m.samples = samples;
    // per output row: a sample's (a classifier's), or a token's (a sequence model's logits
    // [batch * time, vocabulary])
    m.loss = rows ? static_cast<double>(h(0)) / static_cast<double>(rows) : 0.0;
    m.accuracy = rows ? static_cast<double>(h(1)) / static_cast<double>(rows) : 0.0;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.samples_per_s = m.seconds > 0 ? static_cast<double>(samples) / m.seconds : 0.0;
    m.peak_bytes = memory_stats<device>().peak_allocated_bytes;
    return m;
  }

  Model& model() noexcept { return *model_; }
  Optimizer& optimizer() noexcept { return *opt_; }
  /// On cuda, what the constructor's preflight of the model's GPU found that is not an
  /// error (PTX JIT, an older minor driver, fp16 without tensor cores): print its notes.
  /// Empty on host devices.
  [[nodiscard]] const preflight_result& preflight() const noexcept { return preflight_; }
  const options& opts() const noexcept { return o_; }
  /// The learning-rate schedule from now on (optimizer steps count from 0).
  /// A schedule whose options are invalid, or that gives this step a learning rate that
  /// is not a finite number >= 0, is a value_error here, before any step uses it.
  void set_schedule(optim::schedule s) {
    check_schedule(s);
    o_.schedule = std::move(s);
  }

  /// With clip_grad_norm: the global L2 norm of the (unscaled) gradients at the last
  /// optimizer step, before clipping (NaN when that step was skipped); reads it back from
  /// the device. 0 before the first step.
  [[nodiscard]] double grad_norm() const {
    if constexpr (requires { opt_->last_grad_norm(); }) return opt_->last_grad_norm();
    else return 0.0;
  }

  /// The master dtype's flat gradient buffer on the model's device.
  using gradient_view = tensor_view<typename policy::master, device, 1>;
  /// Called once per optimizer step, after the last micro-batch's backward and before
  /// anything reads the gradients (the finite check, the grad scaler, the optimizer),
  /// with every gradient as one flat buffer: where dist::data_parallel averages them
  /// over the ranks. An empty function: nothing (the default). Graph mode captures the
  /// call's device work with the step.
  void set_gradient_sync(std::function<void(gradient_view)> f) {
    drop_graphs();
    grad_sync_ = std::move(f);
  }
  /// Called during the last micro-batch's backward of each optimizer step, whenever a
  /// layer's gradients are final: f(gradients, offset), every gradient from `offset` to
  /// the end of the flat buffer is final (the model must have set_gradients_final, as
  /// nn::sequential does). Where buckets of the all-reduce start; the gradient sync
  /// above still runs after backward. When backward throws, f(gradients, -1) runs before
  /// the exception leaves the trainer (finish or drop what was started: the trainer
  /// then zeroes the gradients).
  void set_gradients_final(std::function<void(gradient_view, index_t)> f)
    requires requires(Model& m) { m.set_gradients_final(std::function<void(index_t)>{}); }
  {
    drop_graphs();
    grad_final_ = std::move(f);
  }
  loss_state& loss() noexcept { return loss_; }
  [[nodiscard]] std::int64_t micro_steps() const noexcept { return micro_step_; }
  [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }
  [[nodiscard]] std::int64_t epochs_done() const noexcept { return epochs_done_; }
  /// The lr the optimizer was built with (schedules scale from it).
  [[nodiscard]] double base_lr() const noexcept { return base_lr_; }

  Scaler* scaler() noexcept {
    if constexpr (has_scaler) return scaler_;
    else return nullptr;
  }

  /// Counters restored from a checkpoint (train/checkpoint.hpp).
  void restore_counters(std::int64_t micro, std::int64_t steps, std::int64_t epochs, double base_lr) {
    micro_step_ = micro;
    optimizer_steps_ = steps;
    epochs_done_ = epochs;
    base_lr_ = base_lr;
    micro_ = 0;
    model_->parameters().zero_grad();
    // The running loss belongs to the steps before the load: the next report() starts
    // from the checkpoint, as a run that never stopped would have.
    locus::detail::zero_bytes<device>(running_.data_handle(), running_.size_bytes());
    running_samples_ = 0;
  }

 private:
  template <class X, class Y>
  static constexpr bool check_batch() {
    return check_batch_operand<X>() && check_batch_operand<Y>();
  }
  // One batch operand (x or y): a tensor or view on the model's device. A rule reports
  // once (a failed check is not instantiated again), so step(), probe(), train_epoch()
  // and evaluate() all check through here.
  template <class X>
  static constexpr bool check_batch_operand() {
    if constexpr (!TensorLike<X>) {
      static_assert(locus::detail::always_false<X>,
                    "locus: trainer::step takes tensors or tensor_views (the input batch and the "
                    "target), but got an expression or another type; evaluate an expression first: "
                    "auto xe = locus::eval(x)");
      return false;
    } else {
      return locus::detail::require_batch_on_model_device<
          typename locus::detail::tensor_traits<std::remove_cvref_t<X>>::device, device>();
    }
  }

  /// One GPU (cuda): the model, its optimizer and scaler live on one GPU, which is
  /// current when the trainer is built and at every step, and so does every batch; a
  /// device_error naming both GPUs before anything changes otherwise. (Host devices:
  /// nothing to check, compiled away.)
  void check_gpu_parts() const {
    if constexpr (std::is_same_v<typename device::allocator, locus::detail::cuda_allocator_kind>) {
      const int m = model_->parameters().master().device_index();
      const auto part = [&](const char* what, int g) {
        if (g >= 0 && m >= 0 && g != m)
          throw device_error(locus::detail::format("locus: the trainer's model lives on GPU %d but its %s on GPU %d; "
                                                   "build the optimizer, the scaler and the trainer while the "
                                                   "model's GPU is current (locus::device_guard g(%d);)",
                                                   m, what, g, m),
                             m, g);
      };
      part("optimizer", opt_->device_index());
      if constexpr (has_scaler) {
        if constexpr (requires { scaler_->device_index(); }) part("grad scaler", scaler_->device_index());
      }
      locus::detail::check_same_gpu<device>("the trainer (its model)", model_->parameters().master());
    }
  }
  /// The schedule at the next optimizer step: its options checked (each schedule of
  /// optim/optim.hpp throws value_error for its own), and its lr finite and >= 0.
  void check_schedule(const optim::schedule& s) const {
    if (!s) return;
    const double lr = s(optimizer_steps_, base_lr_);
    if (!(lr >= 0.0) || !std::isfinite(lr))
      throw ::locus::value_error("locus: the learning-rate schedule gives step " + std::to_string(optimizer_steps_) +
                                 " an lr of " + number_text(lr) +
                                 "; a schedule must give finite learning rates >= 0 (check its options)");
  }
  /// The model's GPU against this build and the policy's compute dtype (architectures,
  /// bf16 on the card, the driver; core/preflight.hpp), before any step launches.
  void run_preflight() {
#if LOCUS_HAS_CUDA
    if constexpr (std::is_same_v<typename device::allocator, locus::detail::cuda_allocator_kind>) {
      const int m = model_->parameters().master().device_index();
      preflight_ = locus::preflight<typename policy::compute>(m >= 0 ? m : -1);
    }
#endif
  }
  template <class X, class Y>
  void check_gpu(const char* what, const X& x, const Y& y) const {
    if constexpr (std::is_same_v<typename device::allocator, locus::detail::cuda_allocator_kind>) {
      locus::detail::check_same_gpu<device>(what, model_->parameters().master(), x, y);
    } else {
      (void)what, (void)x, (void)y;
    }
  }

  /// The optimizer updates this trainer's model: at construction (another model's
  /// optimizer), and before every step (the model was assigned over or moved from after
  /// the trainer was built, which frees or replaces the buffers the optimizer writes).
  void check_bound(bool later) const {
    if (opt_->bound_to(model_->parameters())) return;
    throw error(std::string(later ? "locus: the trainer's model no longer holds the parameters its optimizer "
                                    "was built over (the model was assigned a new one or moved from after "
                                    "the trainer was built; "
                                  : "locus: the trainer's optimizer was built over another model's parameters (") +
                std::to_string(opt_->bound_size()) + " elements at " + address(opt_->bound_data()) +
                "), not this trainer's model's (" + std::to_string(model_->parameters().size()) +
                " elements at " + address(model_->parameters().master().data_handle()) +
                "): its steps would update memory this model does not own; build the optimizer (and the "
                "trainer) from the model that trains: locus::optim::adamw<D> opt(model.parameters())");
  }

  static std::string number_text(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }

  void init() {
    if (o_.accumulate < 1)
      throw ::locus::value_error("locus: trainer accumulate must be >= 1, got " + std::to_string(o_.accumulate));
    if (!(o_.clip_grad_norm == 0.0 || (o_.clip_grad_norm >= std::numeric_limits<float>::min() &&
                                        o_.clip_grad_norm <= std::numeric_limits<float>::max())))
      throw ::locus::value_error(
          "locus: trainer clip_grad_norm must be 0 (no clipping) or a finite number from 1.2e-38 to 3.4e38 (the "
          "f32 range the step computes in), got " +
          number_text(o_.clip_grad_norm));
    if (o_.clip_grad_norm > 0.0 && !fused())
      throw ::locus::value_error(
          "locus: trainer clip_grad_norm needs the fused optimizer step (adamw or sgd, with a grad scaler or "
          "check_finite = true), where the norm is taken; this trainer's step runs unfused");
    if (!(o_.clip_grad_value == 0.0 || (o_.clip_grad_value >= std::numeric_limits<float>::min() &&
                                         o_.clip_grad_value <= std::numeric_limits<float>::max())))
      throw ::locus::value_error(
          "locus: trainer clip_grad_value must be 0 (no clipping) or a finite number from 1.2e-38 to 3.4e38 (the "
          "f32 range the step computes in), got " +
          number_text(o_.clip_grad_value));
    if (o_.clip_grad_value > 0.0 && o_.clip_grad_norm > 0.0)
      throw ::locus::value_error(
          "locus: trainer clip_grad_norm and clip_grad_value are both set; choose one (PyTorch applies whichever "
          "function is called, in the caller's order, so the combination has no single meaning)");
    if (o_.clip_grad_value > 0.0 && !fused())
      throw ::locus::value_error(
          "locus: trainer clip_grad_value needs the fused optimizer step (adamw or sgd, with a grad scaler or "
          "check_finite = true), where the gradients are clipped; this trainer's step runs unfused");
    // An optimizer built over another model's parameters would update that model on
    // every step while this one never trains (and the other trains on this one's
    // gradients): refused here, before any step.
    check_bound(false);
    check_gpu_parts();
    run_preflight();
    if (o_.cuda_graph) {
      // The unfused step takes the learning rate (adamw, sgd) and the guard's step
      // numbers as kernel arguments: a graph would bake in those of the captured step and
      // replay them forever. Only the fused step reads them from device memory.
      if constexpr (!fusable()) {
        if constexpr (has_scaler)
          throw ::locus::value_error(
              "locus: trainer option cuda_graph = true needs the fused optimizer step, but this grad scaler has no "
              "options() (growth_factor, backoff_factor, growth_interval), so the step runs unfused and a replayed "
              "graph would keep the learning rate of the captured step; use locus::amp::grad_scaler, or train "
              "without cuda_graph");
        else
          throw ::locus::value_error(
              "locus: trainer option cuda_graph = true needs the fused optimizer step, but this optimizer has no "
              "fused_step, so a replayed graph would keep the learning rate of the captured step; use "
              "locus::optim::adamw or sgd, or train without cuda_graph");
      } else if (!fused()) {
        throw ::locus::value_error(
            "locus: trainer option cuda_graph = true with check_finite = false and no grad scaler: the optimizer "
            "step then runs unfused, and a replayed graph would keep the learning rate (and step numbers) of the "
            "captured step; keep check_finite = true (the fused step checks for free), or train without cuda_graph");
      }
      if constexpr (!std::is_same_v<device, cuda>)
        throw ::locus::value_error(
            "locus: trainer option cuda_graph = true needs a trainer on cuda, but this one is on a host device, "
            "which has no CUDA graphs; drop the option (a host step has no launches to save), or build the model "
            "on locus::cuda");
      if constexpr (detail::has_dropout<Model>())
        throw ::locus::value_error(
            "locus: trainer option cuda_graph = true on a model with a dropout layer: a replayed graph would drop "
            "the same elements on every step; train this model without cuda_graph");
    }
    base_lr_ = opt_->lr();
    check_schedule(o_.schedule);
    running_ = zeros<A, device>(extents<1>{1});
    const auto words = static_cast<index_t>((sizeof(locus::detail::step_state) + 7) / 8);
    guard_ = zeros<std::int64_t, device>(extents<1>{words});
    guard_flags_ = zeros<int, device>(extents<1>{static_cast<index_t>(model_->parameters().count() + 1)});
    diag_ = full<std::int64_t, device>(extents<1>{2}, std::int64_t{-1});
    {  // the guard's scale is 1
      locus::detail::step_state s{};
      s.scale = 1.0f;
      tensor<std::int64_t, cpu, 1> h = zeros<std::int64_t, cpu>(extents<1>{words});
      std::memcpy(h.data_handle(), &s, sizeof s);
      copy(h, guard_);
    }
  }

  /// A step needs samples: an empty batch has no loss to average (PyTorch's is NaN) and
  /// would leave the gradients of the step before in place.
  static void check_nonempty(const input_view& xv) {
    if (xv.shape()[0] == 0)
      throw shape_error("locus: the trainer got an empty batch (0 samples); a training step needs at least one");
    if constexpr (takes_ids) {
      if (xv.numel() == 0)
        throw shape_error("locus: the trainer got a batch of empty sequences (shape " +
                          locus::detail::shape_string(xv.shape()) + "); a sequence needs at least one token");
    }
  }

  static std::string address(const void* p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
  }

  locus::detail::step_state* guard_state() noexcept { return reinterpret_cast<locus::detail::step_state*>(guard_.data_handle()); }

  template <class X>
  input_view input(const X& x) {
    using tr = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    if constexpr (!check_batch_operand<X>()) {
      return input_view{};  // check_batch_operand() reported it
    } else if constexpr (takes_ids) {
      return input_ids(x);
    } else if constexpr (tr::rank != input_rank && input_rank == 2) {
      static_assert(locus::detail::always_false<X>,
                    "locus: the trainer's input batch is rank 2 [batch, features]; reshape images "
                    "with x.reshape({batch, rows * cols})");
      return input_view{};
    } else if constexpr (tr::rank != input_rank && input_rank == 4) {
      static_assert(locus::detail::always_false<X>,
                    "locus: this model starts with a layer that takes rank-4 images [batch, channels, height, "
                    "width], but the input batch has another rank; view a loader's batches as images with "
                    "locus::data::images(loader, channels, height, width), or x.reshape({batch, c, h, w})");
      return input_view{};
    } else if constexpr (tr::rank != input_rank) {
      static_assert(locus::detail::always_false<X>,
                    "locus: the input batch's rank is not the rank the model's first layer takes; reshape it");
      return input_view{};
    } else if constexpr (std::is_same_v<typename tr::value_type, C>) {
      return locus::detail::as_view_const(x);
    } else if constexpr (!std::is_floating_point_v<typename tr::value_type> &&
                         !is_half_v<typename tr::value_type>) {
      static_assert(locus::detail::always_false<X>,
                    "locus: the trainer's input batch holds floating-point features (f32, f64, f16 "
                    "or bf16), but this one holds integers or bool; convert it first, e.g. u8 "
                    "pixels: auto xf = locus::eval(locus::cast<float>(x) / 255.0f)");
      return input_view{};
    } else {
      return cast_batch(x_cast_, locus::detail::as_view_const(x));
    }
  }

  /// A batch of token ids for a model whose forward takes ids: of the model's integer
  /// dtype, or another integer dtype (converted; every id must fit).
  template <class X>
  input_view input_ids(const X& x) {
    using tr = locus::detail::tensor_traits<std::remove_cvref_t<X>>;
    using T = typename tr::value_type;
    if constexpr (tr::rank != input_rank) {
      static_assert(locus::detail::always_false<X>,
                    "locus: this model's forward takes token ids of another rank than the batch's (ids<2>: "
                    "[batch, time]); reshape the batch, e.g. x.reshape({batch, time})");
      return input_view{};
    } else if constexpr (std::is_same_v<T, input_type>) {
      return locus::detail::as_view_const(x);
    } else if constexpr (!std::is_integral_v<T> || std::is_same_v<T, bool>) {
      static_assert(locus::detail::always_false<X>,
                    "locus: this model's forward takes integer token ids (ids<2>: int64 [batch, time]), but the "
                    "batch holds floating-point or bool values; pass the ids themselves, e.g. "
                    "locus::eval(locus::cast<std::int64_t>(x)) of integers");
      return input_view{};
    } else if constexpr (std::cmp_less(std::numeric_limits<T>::min(), std::numeric_limits<input_type>::min()) ||
                         std::cmp_greater(std::numeric_limits<T>::max(), std::numeric_limits<input_type>::max())) {
      static_assert(locus::detail::always_false<X>,
                    "locus: the batch's integer dtype holds ids that this model's id dtype does not (int64 into "
                    "int32, uint64 into int64): a conversion could wrap an id into the vocabulary; pass ids of the "
                    "forward's dtype, or declare the forward over int64 ids: ids<2, std::int64_t>");
      return input_view{};
    } else {
      return cast_batch(x_ids_, locus::detail::as_view_const(x));
    }
  }

  /// A contiguous batch converted into `buf` (grown as needed), viewed in its shape.
  template <class U, class T>
  static tensor_view<const U, device, input_rank> cast_batch(tensor<U, device, 1>& buf,
                                                             const tensor_view<const T, device, input_rank>& v) {
    if (!v.is_contiguous()) throw shape_error("locus: the trainer needs a contiguous input batch");
    nn::detail::ensure_numel(buf, v.numel());
    locus::detail::launch_n<device>(v.numel(), locus::detail::cast_kernel<T, U>{v.data_handle(), buf.data_handle()});
    return nn::detail::shaped(buf, v.shape());
  }

  template <class Y>
  auto target(const Y& y) {
    using tr = locus::detail::tensor_traits<std::remove_cvref_t<Y>>;
    using want = typename loss_state::target_view;
    using W = std::remove_cv_t<typename want::element_type>;
    if constexpr (!check_batch_operand<Y>()) {
      return want{};  // check_batch_operand() reported it
    } else if constexpr (tr::rank != want::rank) {
      static_assert(locus::detail::always_false<Y>,
                    "locus: the target's rank does not fit the loss: cross_entropy takes labels of "
                    "rank 1 [batch], mse a target of rank 2 [batch, outputs] like the model's "
                    "output; reshape it, e.g. y.reshape({batch})");
      return want{};
    } else if constexpr (std::is_same_v<typename tr::value_type, W>) {
      return want(locus::detail::as_view_const(y));
    } else if constexpr (!((std::is_floating_point_v<typename tr::value_type> || is_half_v<typename tr::value_type>) &&
                           (std::is_floating_point_v<W> || is_half_v<W>))) {
      static_assert(locus::detail::always_false<Y>,
                    "locus: the target's dtype does not fit the loss: cross_entropy takes i64 labels "
                    "(convert with auto yl = locus::eval(locus::cast<std::int64_t>(y))), mse a "
                    "floating-point target");
      return want{};
    } else {
      using T = typename tr::value_type;
      const auto v = locus::detail::as_view_const(y);
      nn::detail::ensure_shape(y_cast_, v.shape());
      locus::detail::launch_n<device>(v.numel(), locus::detail::cast_kernel<T, W>{v.data_handle(), y_cast_.data_handle()});
      return want(std::as_const(y_cast_).view());
    }
  }

  /// Whether the optimizer step runs fused (two launches, the check and the running
  /// loss folded in: optim.hpp): an optimizer with fused_step, and a scaler or the guard.
  static constexpr bool fusable() {
    if constexpr (!requires(Optimizer& o, const optim::detail::fused_args<A>& a) { o.fused_step(a); }) return false;
    else if constexpr (has_scaler) return requires(Scaler& sc) { sc.options().growth_factor; };
    else return true;
  }
  bool fused() const noexcept { return fusable() && (has_scaler || o_.check_finite); }

  /// The device work of one micro-batch: forward, loss, backward, and (when `update`)
  /// the optimizer step and zero_grad. `vars`: the step's values in device memory
  /// (graph mode), or nullptr (they are kernel arguments). Enqueues only: no host read.
  void enqueue_step(const input_view& xv, const typename loss_state::target_view& yv, bool update,
                    const detail::step_vars* vars) {
    const std::int64_t micro = micro_step_;
    const std::int64_t window = micro_ == 0 ? micro_step_ : window_first_;
    // the running loss weighs each batch by its loss's rows (samples; tokens for a sequence
    // model's logits [batch * time, vocabulary]), as evaluate() averages
    const A weight = static_cast<A>(yv.shape()[0]);
    std::int64_t* first_bad = (!has_scaler && o_.check_finite) ? diag_.data_handle() : nullptr;
    try {
      auto out = model_->forward(xv);
      const float* scale = nullptr;
      if constexpr (has_scaler) scale = scaler_->scale_ptr();
      if constexpr (requires { loss_.set_batch_tag(std::int64_t{}); }) loss_.set_batch_tag(vars ? -1 : micro);
      // the mean loss into the trainer's own rank-0 buffer: a step allocates nothing for it
      if (!step_loss_.data_handle()) step_loss_ = tensor<A, device, 0>(extents<0>{});
      if constexpr (requires { loss_.forward_into(step_loss_, out, yv, scale, 1.0); })
        loss_.forward_into(step_loss_, out, yv, scale, 1.0 / o_.accumulate);
      else
        step_loss_ = loss_.forward(out, yv, scale, 1.0 / o_.accumulate);
      const auto& l = step_loss_;
      if constexpr (!requires { model_->set_gradients_final(std::function<void(index_t)>{}); }) {
        model_->backward(loss_.grad());
      } else if (update && grad_final_) {
        auto& store = model_->parameters();
        model_->set_gradients_final([&](index_t first) { grad_final_(store.grad_unsettled(), first); });
        try {
          model_->backward(loss_.grad());
        } catch (...) {
          model_->set_gradients_final({});
          grad_final_(store.grad_unsettled(), -1);  // -1: backward failed, finish what was started
          throw;
        }
        model_->set_gradients_final({});
      } else {
        model_->backward(loss_.grad());
      }
      // Counted once the step cannot fail any more: an out_of_memory above leaves the
      // running loss as it was, like the weights. The fp32 guard also notes the first
      // micro-step whose loss was not finite. With a fused update the optimizer's check
      // pass does this (no one-thread kernel).
      if (update && fused()) {
        fused_update(l.data_handle(), weight, first_bad, vars, micro, window);
        return;
      }
      locus::detail::launch_n<device>(
          1, detail::accumulate_loss_kernel<A>{running_.data_handle(), l.data_handle(), weight, first_bad, vars, micro});
    } catch (const out_of_memory&) {
      // The weights are untouched (only optimizer steps write them). What the step wrote
      // before the failed allocation is put back: the dropout counters always, and after
      // a step that saved them (save_for_rollback) batch norm's buffers and the window's
      // gradients, so the trainer is as it was and the same step can be retried. A step
      // that saved no gradients (its batch shape was the last step's, so it was not
      // expected to allocate) drops the window's partial gradients instead, and the next
      // step starts a new window. While capturing, a zero_grad here would only join the
      // graph that is about to be discarded: graph_step runs it after the capture ended.
      if (!capturing_) rollback();
      throw;
    }
    if (update) optimizer_step(micro);
  }

  /// Whether steps at an unchanged batch shape still request memory: on cuda (the loss's
  /// reduction takes temporary storage from the caching allocator) and for f16/bf16 on
  /// the host (the GEMMs widen their operands to f32 in temporaries). Elsewhere a step
  /// at the last step's shape allocates nothing (tests/test_faults.cpp checks it).
  static constexpr bool steps_allocate = !device::host_accessible || ::locus::is_half_v<C>;

  /// Saves what a step writes before it can fail: the dropout counters (into a buffer
  /// kept between steps: no allocation), and when `full` (the step may allocate) batch
  /// norm's buffers (backups allocated once) and the gradient state: at a window's first
  /// micro-batch only the deferred-zero flags; later in a window, at a new batch shape
  /// (`new_shape`), a copy of the gradients, allocated for this step only and skipped
  /// when memory does not allow it. Without that copy a failed step drops the window's
  /// earlier micro-batches and the next step starts a new window.
  void save_for_rollback(bool full, bool new_shape) {
    grad_saved_.with_values = false;
    grads_saved_ = false;
    rollback_armed_ = true;
    counters_saved_.clear();
    model_->for_each_layer([&](std::size_t, auto& layer) {
      if constexpr (requires { layer.counter(); }) counters_saved_.push_back(layer.counter());
    });
    rollback_full_ = full;
    if (!full) return;
    // the backups, allocated once and reused while the buffers stay where they are
    buffer_addrs_now_.clear();
    model_->for_each_buffer([&](const std::string&, auto v) { buffer_addrs_now_.push_back(v.data_handle()); });
    if (!buffers_ready_ || buffer_addrs_now_ != buffer_addrs_) {
      buffer_addrs_ = buffer_addrs_now_;
      buffers_save_.clear();
      buffers_restore_.clear();
      model_->for_each_buffer([&](const std::string&, auto v) {
        using V = decltype(v);
        auto copy = std::make_shared<tensor<std::remove_const_t<typename V::element_type>, device, V::rank>>(v.shape());
        buffers_save_.push_back([v, copy] { locus::copy(v, *copy); });
        buffers_restore_.push_back([v, copy] { locus::copy(*copy, v); });
      });
      buffers_ready_ = true;
    }
    for (auto& save : buffers_save_) save();
    if (micro_ == 0 || new_shape) {
      try {
        std::as_const(model_->parameters()).snapshot_grad(grad_saved_, micro_ > 0);
        grads_saved_ = true;
      } catch (const out_of_memory&) {
        grad_saved_.values = {};  // no room for the copy: the window restarts if the step fails
      }
    }
  }
  /// The dropout counters, and batch norm's buffers when they were saved.
  void restore_counters_and_buffers() {
    std::size_t c = 0;
    model_->for_each_layer([&](std::size_t, auto& layer) {
      if constexpr (requires { layer.counter(); })
        if (c < counters_saved_.size()) layer.set_counter(counters_saved_[c++]);
    });
    if (rollback_full_)
      for (auto& restore : buffers_restore_) restore();
  }

  /// Whether any layer has a hook (user code in the forward, which may allocate).
  bool has_hooks() const {
    bool any = false;
    std::as_const(*model_).for_each_layer([&](std::size_t, const auto& layer) {
      if constexpr (requires { layer.has_hooks(); }) any = any || layer.has_hooks();
    });
    return any;
  }
  /// Puts back what save_for_rollback saved (an out_of_memory inside a step).
  void rollback() {
    if (!rollback_armed_) {  // a step that saved nothing (graph mode's eager runs)
      model_->parameters().zero_grad();
      micro_ = 0;
      return;
    }
    rollback_armed_ = false;
    restore_counters_and_buffers();
    if (grads_saved_) {
      model_->parameters().restore_grad(grad_saved_);
    } else {
      model_->parameters().zero_grad();
      micro_ = 0;
    }
    grad_saved_.values = {};
    last_shape_valid_ = false;  // the buffers may be half grown
  }

  /// The fused optimizer step and zero_grad; `loss` (nullptr: none) is added to the
  /// running loss in the check pass.
  void fused_update(const A* loss, A weight, std::int64_t* first_bad, const detail::step_vars* vars, std::int64_t micro,
                    std::int64_t window) {
    optim::detail::fused_args<A> a;
    a.st = guard_state();
    if constexpr (has_scaler) {
      a.st = scaler_->state();
      a.scaler = true;
      const auto& so = scaler_->options();
      a.growth = so.growth_factor;
      a.backoff = so.backoff_factor;
      a.interval = static_cast<float>(so.growth_interval);
    } else {
      auto& store = model_->parameters();
      a.offsets = store.offsets_data();
      a.param_bad = guard_flags_.data_handle();
      a.count = static_cast<int>(store.count());
      a.window_out = diag_.data_handle() + 1;
    }
    if (loss) {
      a.running = running_.data_handle();
      a.loss = loss;
      a.weight = weight;
      a.first_nonfinite = first_bad;
    }
    a.vars = vars;
    a.micro_step = micro;
    a.window_first = window;
    a.clip_norm = static_cast<float>(o_.clip_grad_norm);
    a.clip_value = static_cast<float>(o_.clip_grad_value);
    sync_gradients();
    if constexpr (fusable()) opt_->fused_step(a);
    clear_grads();
  }

  /// Before every optimizer step (a step's last micro-batch or an epoch's flush): the
  /// deferred zeros written (the step reads the flat buffer through its own pointer),
  /// then the gradient sync (data-parallel ranks average what they accumulated).
  void sync_gradients() {
    auto& store = model_->parameters();
    store.settle_grad();
    if (grad_sync_) grad_sync_(store.grad());
  }

  /// After an optimizer step: on host devices the gradients are discarded, not zeroed
  /// (the next backward stores them: no memset, no read of the old values by the dW
  /// GEMMs); on cuda one memset, so that graphs capture the same kernels every step.
  void clear_grads() {
    if constexpr (device::host_accessible) model_->parameters().discard_grad();
    else model_->parameters().zero_grad();
  }

  /// The host side of a micro-batch of `rows` samples: counters (graph replays run
  /// only this).
  void advance(index_t rows, bool update) {
    running_samples_ += rows;
    if (micro_ == 0) window_first_ = micro_step_;
    ++micro_step_;
    if (update) {
      micro_ = 0;
      ++optimizer_steps_;
    } else {
      ++micro_;
    }
  }

  /// The unfused optimizer step (an optimizer without fused_step, or no check at all).
  void optimizer_step(std::int64_t micro) {
    auto& store = model_->parameters();
    sync_gradients();
    if constexpr (has_scaler) {
      scaler_->unscale(store);
      opt_->step(scaler_->state());
      scaler_->update();
    } else if (o_.check_finite) {
      locus::detail::launch_n<device>(1, locus::detail::check_begin_kernel{guard_state()});
      locus::detail::run_check_grads<device>(
          locus::detail::check_grads_kernel<typename policy::master>{store.grad().data_handle(), guard_state(),
                                                                     store.offsets_data(), guard_flags_.data_handle(),
                                                                     static_cast<int>(store.count()), false},
          store.size());
      locus::detail::launch_n<device>(
          1, locus::detail::guard_end_kernel{guard_state(), micro, diag_.data_handle() + 1,
                                             micro_ == 0 ? micro_step_ : window_first_});
      opt_->step(guard_state());
    } else {
      opt_->step(nullptr);
    }
    clear_grads();
  }

  /// Throws what the device recorded: a bad label, a non-finite gradient.
  void check() {
    loss_.check_labels();
    if constexpr (!has_scaler) {
      if (!o_.check_finite) return;
      locus::detail::step_state s;
      if constexpr (device::host_accessible) {  // no copy: read it where it lives
        std::memcpy(&s, guard_.data_handle(), sizeof s);
      } else {
        const auto h = to<cpu>(guard_);
        std::memcpy(&s, h.data_handle(), sizeof s);
      }
      if (!s.sticky) return;
      const auto flags = to<cpu>(guard_flags_);
      const auto& entries = model_->parameters().entries();
      std::string first, all;
      for (std::size_t i = entries.size(); i-- > 0;) {  // backward order: last layer first
        if (!flags(static_cast<index_t>(i))) continue;
        if (first.empty()) first = entries[i].name;
        all += (all.empty() ? "" : ", ") + entries[i].name;
      }
      const auto d = to<cpu>(diag_);
      const std::int64_t loss_step = d(0), window = d(1) >= 0 ? d(1) : s.bad_step;
      // The micro-batch to blame: the first whose loss was not finite when that is in
      // the tripping optimizer step; otherwise the step's micro-batches, whose
      // gradients were summed before the check could see them.
      const bool loss_known = loss_step >= window && loss_step <= s.bad_step;
      const std::int64_t step = loss_known ? loss_step : s.bad_step;
      std::string where;
      if (loss_known)
        where = "at step " + std::to_string(loss_step) + " (micro-batch, counted from 0; its loss was not finite)";
      else if (window == s.bad_step)
        where = "at step " + std::to_string(s.bad_step) + " (micro-batch, counted from 0)";
      else
        where = "in the micro-batches " + std::to_string(window) + " to " + std::to_string(s.bad_step) +
                " (counted from 0; accumulated into one optimizer step, their losses finite)";
      throw non_finite_error("locus: training stopped: a non-finite gradient " + where +
                                 "; it went non-finite first in '" + first + "' (all affected: " + all +
                                 "). The weights are those before that step. Lower the learning rate, check the "
                                 "inputs for inf/NaN, or train with a grad scaler.",
                             step, first);
    }
  }

#if LOCUS_HAS_CUDA
  using target_tensor = tensor<std::remove_cv_t<typename loss_state::target_view::element_type>, device,
                               loss_state::target_view::rank>;

  using graph_state = detail::graph_state<input_type, device, input_rank, target_tensor>;

  /// One step in graph mode (see the header comment).
  template <class X, class Y>
  void graph_step(const X& x, const Y& y) {
    if (!graph_) graph_ = std::make_unique<graph_state>();
    graph_state& g = *graph_;
    std::optional<locus::stream_guard> on;
    g.begin(on);
    try {
      auto xv = input(x);  // a cast to the compute dtype runs on the graph stream
      auto yv = target(y);
      check_nonempty(xv);
      if (!xv.is_contiguous() || !yv.is_contiguous())
        throw shape_error("locus: the trainer's graph mode needs contiguous batches (it copies them into its "
                          "static input buffers); pass contiguous tensors, or train without cuda_graph");
      const bool update = micro_ + 1 == o_.accumulate;
      if (o_.schedule && update) opt_->set_lr(o_.schedule(optimizer_steps_, base_lr_));
      if (g.x.shape() != xv.shape() || g.y.shape() != yv.shape() || g.x.data_handle() == nullptr) {
        g.drop();  // the graphs point at buffers this shape reallocates
        g.x = tensor<input_type, device, input_rank>(xv.shape());
        g.y = target_tensor(yv.shape());
      }
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(g.x.data_handle(), xv.data_handle(), g.x.size_bytes(),
                                       cudaMemcpyDeviceToDevice, g.stream));
      LOCUS_CUDA_CHECK(cudaMemcpyAsync(g.y.data_handle(), yv.data_handle(), g.y.size_bytes(),
                                       cudaMemcpyDeviceToDevice, g.stream));
      // The copies read the batch on the graph stream: its blocks (the loader's, the
      // caller's) are not reused before they are done, even when freed before the
      // caller's stream waits for this step.
      locus::detail::record_on_stream(xv, g.stream, g.owned.device());
      locus::detail::record_on_stream(yv, g.stream, g.owned.device());
      const detail::step_vars v{micro_step_, micro_ == 0 ? micro_step_ : window_first_, static_cast<float>(opt_->lr()), 0};
      locus::detail::launch_n<device>(1, detail::set_vars_kernel{g.vars_ptr(), v});
      const auto gx = std::as_const(g.x).view();
      const typename loss_state::target_view gy(std::as_const(g.y).view());
      const int b = update ? 1 : 0;
      // Eager steps (under the pool) until every branch of the cycle has run once, then
      // captures: with accumulate >= 3, branch 0 runs eagerly again while branch 1 has
      // not warmed up yet, instead of being captured before it.
      if (!g.exec[b] && (!g.warmed[b] || !g.all_warmed(o_.accumulate))) {
        locus::detail::graph_pool_scope scope(*g.pool);
        enqueue_step(gx, gy, update, g.vars_ptr());
        g.warmed[b] = true;
      } else {
        if (!g.exec[b]) {
          capturing_ = true;
          try {
            g.capture(b, [&] { enqueue_step(gx, gy, update, g.vars_ptr()); });
          } catch (const out_of_memory&) {
            // The capture has ended (g.capture ends it before rethrowing): now the clean-up
            // enqueue_step skipped runs for real, on the graph stream.
            capturing_ = false;
            model_->parameters().zero_grad();
            micro_ = 0;
            throw;
          } catch (...) {
            capturing_ = false;
            throw;
          }
          capturing_ = false;
        }
        LOCUS_CUDA_CHECK(cudaGraphLaunch(g.exec[b], g.stream));
      }
      advance(yv.shape()[0], update);  // rows of the loss: samples, or a sequence model's tokens
    } catch (...) {
      g.end_after_error(on);
      throw;
    }
    g.end(on);
  }

 public:
  /// Graph mode: the captured graph of branch b (0: micro-batch, 1: with the update),
  /// or nullptr before it is captured (bench and tests count its nodes).
  [[nodiscard]] cudaGraph_t captured_graph(int b) const noexcept {
    return graph_ && b >= 0 && b < 2 ? graph_->graph[b] : nullptr;
  }
  /// Graph mode: the stream the step runs on (nullptr before the first step).
  [[nodiscard]] cudaStream_t graph_stream() const noexcept { return graph_ ? graph_->stream : nullptr; }

 private:
  std::unique_ptr<graph_state> graph_;
#endif

  Model* model_;
  Optimizer* opt_;
  loss_state loss_;
  Scaler* scaler_ = nullptr;
  options o_;
  std::function<void(gradient_view)> grad_sync_;
  std::function<void(gradient_view, index_t)> grad_final_;
  double base_lr_ = 0.0;
  int micro_ = 0;
  std::int64_t micro_step_ = 0, optimizer_steps_ = 0, epochs_done_ = 0, running_samples_ = 0;
  tensor<A, device, 1> running_;
  tensor<std::int64_t, device, 1> guard_;
  tensor<int, device, 1> guard_flags_;
  // [0] the first micro-step whose loss was not finite (fp32 guard), [1] the first
  // micro-step of the optimizer step that tripped the guard; -1: none.
  tensor<std::int64_t, device, 1> diag_;
  std::int64_t window_first_ = 0;  // the first micro-step of the optimizer step being accumulated
  bool capturing_ = false;         // graph mode: enqueue_step runs inside a capture
  // The last step's batch shape (a step at another may allocate) and what a failed step
  // puts back (save_for_rollback).
  extents<input_rank> last_shape_{};
  bool last_shape_valid_ = false;
  bool rollback_armed_ = false;
  tensor<A, device, 0> step_loss_;  // the step's mean loss (enqueue_step)
  bool rollback_full_ = false;
  bool grads_saved_ = false;
  bool buffers_ready_ = false;
  std::vector<std::uint64_t> counters_saved_;
  std::vector<std::function<void()>> buffers_save_, buffers_restore_;
  std::vector<const void*> buffer_addrs_, buffer_addrs_now_;
  typename Model::store_type::grad_snapshot grad_saved_;
  preflight_result preflight_;  // cuda: what the constructor's preflight noted
  tensor<C, device, 1> x_cast_;
  tensor<input_type, device, 1> x_ids_;  // a batch of ids of another integer dtype, converted
  tensor<std::remove_cv_t<typename loss_state::target_view::element_type>, device, loss_state::target_view::rank> y_cast_;
};

template <class Model, class Optimizer, class Loss>
trainer(Model&, Optimizer&, Loss, options = {}) -> trainer<Model, Optimizer, Loss, no_scaler>;
// Temporaries deduce the trainer they meant, whose constructor then says why not.
template <class Model, class Optimizer, class Loss>
  requires(!std::is_lvalue_reference_v<Model> || !std::is_lvalue_reference_v<Optimizer>)
trainer(Model&&, Optimizer&&, Loss, options = {})
    -> trainer<std::remove_cvref_t<Model>, std::remove_cvref_t<Optimizer>, Loss, no_scaler>;
template <class Model, class Optimizer, class Loss, class Scaler>
  requires(!std::is_same_v<std::remove_cvref_t<Scaler>, no_scaler> &&
           !std::is_same_v<std::remove_cvref_t<Scaler>, options> &&
           (!std::is_lvalue_reference_v<Model> || !std::is_lvalue_reference_v<Optimizer> ||
            !std::is_lvalue_reference_v<Scaler>))
trainer(Model&&, Optimizer&&, Loss, Scaler&&, options = {})
    -> trainer<std::remove_cvref_t<Model>, std::remove_cvref_t<Optimizer>, Loss, std::remove_cvref_t<Scaler>>;
template <class Model, class Optimizer, class Loss, scaler_or_none Scaler>
  requires(!std::is_same_v<Scaler, no_scaler>)
trainer(Model&, Optimizer&, Loss, Scaler&, options = {}) -> trainer<Model, Optimizer, Loss, Scaler>;

/// The largest batch size in [1, limit] whose training step fits in memory: doubles from
/// `start` while probe() succeeds, then bisects between the last fit and the first
/// out_of_memory (what the PyTorch guides' find_max_batch_size does). make(b) returns
/// an (x, y) pair of b samples on the model's device. Returns 0 if not even 1 fits.
template <class Trainer, class Make>
index_t find_max_batch_size(Trainer& t, Make&& make, index_t start = 16, index_t limit = index_t{1} << 16) {
  auto fits = [&](index_t b) {
    try {
      auto [x, y] = make(b);
      t.probe(x, y);
      return true;
    } catch (const out_of_memory&) {
      return false;
    }
  };
  if (start < 1) start = 1;
  if (start > limit) start = limit;
  index_t good = 0, bad = limit + 1;
  index_t b = start;
  while (b <= limit) {
    if (fits(b)) {
      good = b;
      if (b == limit) break;
      b = b * 2 > limit ? limit : b * 2;
    } else {
      bad = b;
      break;
    }
  }
  if (good == 0) {  // even start failed: search below it
    bad = start;
    index_t lo = 0;
    while (bad - lo > 1) {
      const index_t mid = lo + (bad - lo) / 2;
      if (fits(mid)) lo = mid;
      else bad = mid;
    }
    return lo;
  }
  while (bad - good > 1) {
    const index_t mid = good + (bad - good) / 2;
    if (fits(mid)) good = mid;
    else bad = mid;
  }
  return good;
}

}  // namespace locus::train
