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
// the GPU.
//
// fused_step (what train::trainer calls): the whole optimizer step in two launches.
// Pass 1 (check_pass) reads every gradient once and raises found_inf for a non-finite
// one (for the grad scaler it tests g * (1 / scale), the value the update will use, and
// writes nothing back); its last() (the last block to finish, see backend/launch.hpp)
// does what were one-thread kernels: the trainer's running loss, the fp32 guard's trip,
// and the skip decision with the step counter and bias corrections. Pass 2
// (update_pass) applies the update with the unscale folded in (g * inv_scale), and its
// last() does the grad scaler's update or resets found_inf for the next step. The skip
// is exact: pass 2 reads the decision pass 1 made after seeing every gradient, so a step
// with an inf/NaN gradient writes no parameter, no compute copy and no optimizer state.
// The check cannot go inside the update itself: an element cannot know whether an
// element another block has not read yet is finite. On the host the same functors run
// (vectorised loops in host()). The optimizer's device is a type: adamw<cpu> on a cuda model does not compile.
//
// Loss scaling in a hand-written loop: step() without a guard on a model that computes
// in f16 (or whose policy declares requires_loss_scaling) throws locus::error before
// touching anything, since such gradients have already lost what underflowed; pass a
// grad scaler's state (opt.step(scaler.state())), or opt.step(locus::optim::unscaled)
// to step without one on purpose. The policy is not part of the optimizer's type
// (adamw<D> serves every policy), so this is a run-time rule.
//
// Length (over 600 lines): AdamW, SGD and the schedules share the fused step protocol
// (the check pass, the skip flag, the device-resident step values) that the trainer and
// graph mode drive.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../amp/policy.hpp"
#include "../core/error.hpp"
#include "../core/rules.hpp"
#include "../core/rules_train.hpp"
#include "../nn/kernels.hpp"
#include "../nn/parameters.hpp"
#include "../ops/reduce.hpp"  // clipping's reduction on cuda (cub_reduce)
#include "../tensor/factories.hpp"
#include "../transfer/copy.hpp"

namespace locus::optim {

/// A parameter group (PyTorch's param_groups): the parameters it names (the store's
/// names, "h.0.ln_1.weight") and their weight decay. Parameters in no group have the
/// optimizer's weight_decay option. See no_decay_group for the transformer recipe.
struct param_group {
  std::vector<std::string> names;
  double weight_decay = 0.0;
};

/// The transformer recipe's group without weight decay (GPT-2, nanoGPT, Hugging Face's
/// Trainer): every parameter of rank 1 (biases, norms' gains) and every embedding table
/// (nn::embedding's, nn::positional_embedding's). The rest (linear and convolution
/// weights) keeps the optimizer's weight_decay:
///   optim::adamw<D> opt(m.parameters(), {.lr = 3e-4, .weight_decay = 0.1}, {optim::no_decay_group(m.parameters())});
template <Device D, class Policy>
param_group no_decay_group(const nn::parameter_store<D, Policy>& store) {
  param_group g;
  for (const auto& e : store.entries())
    if (e.shape.size() <= 1 || e.embedding) g.names.push_back(e.name);
  return g;
}

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
/// The device scalars of a fused step, in the optimizer's scalars buffer.
struct fused_scalars {
  update_scalars u;          // skip, first, bias1, rsqrt_bias2 (what the classic kernels read)
  float inv_scale;           // the update multiplies g by it (1 / scale, times the clip factor)
  float grad_norm;           // clipping: the gradients' global L2 norm (unscaled; NaN: skipped)
  double grad_sq;            // clipping: pass 1's sum of the unscaled squares
  unsigned int tickets[2];   // launch_n_then's counters: check pass, update pass
};
static_assert(sizeof(fused_scalars) == 40);

/// Per-step values the device reads from memory instead of kernel arguments (the
/// trainer's graph mode writes them before each replay). nullptr: the values passed.
struct step_vars {
  std::int64_t micro_step;    // this micro-batch (counted from 0)
  std::int64_t window_first;  // the first micro-batch of this optimizer step
  float lr;                   // the scheduled learning rate
  std::int32_t unused;
};

/// What the trainer asks of one fused optimizer step.
template <class A>
struct fused_args {
  step_state* st = nullptr;  // the grad scaler's state or the trainer's guard (required)
  bool scaler = false;       // true: unscale by st->scale, then dynamic loss scaling
  float growth = 2.0f, backoff = 0.5f, interval = 2000.0f;  // the scaler's options
  // fp32 guard only: the first parameter to go non-finite (offsets: count + 1 starts)
  const index_t* offsets = nullptr;
  int* param_bad = nullptr;
  int count = 0;
  std::int64_t* window_out = nullptr;  // gets the window's first micro-step when the guard trips
  // The running loss, folded in: *running += *loss * weight, and the fp32 guard's
  // first micro-step whose loss was not finite (nullptr: none).
  A* running = nullptr;
  const A* loss = nullptr;
  A weight = A(0);
  std::int64_t* first_nonfinite = nullptr;
  const step_vars* vars = nullptr;  // device-resident micro step, window and lr
  std::int64_t micro_step = 0, window_first = 0;
  // Clipping by global norm (torch.nn.utils.clip_grad_norm_): when > 0 the update uses
  // g * min(1, clip_norm / (norm + 1e-6)), norm the L2 norm of every (unscaled) gradient.
  float clip_norm = 0.0f;
  // Clipping by value (torch.nn.utils.clip_grad_value_): when > 0 the update uses each
  // (unscaled) gradient limited to [-clip_value, clip_value].
  float clip_value = 0.0f;
};

/// Pass 1: the finite check of every gradient (see the header comment).
template <class A>
struct check_pass {
  const float* g;
  step_state* st;
  fused_scalars* fs;
  std::int64_t* steps;
  fused_args<A> a;
  float beta1, beta2;

  LOCUS_HOST_DEVICE float value(index_t i) const {
    float v = g[i];
    if (a.scaler) v *= 1.0f / st->scale;
    return v;
  }
  LOCUS_HOST_DEVICE void mark(index_t i) const {
    locus::detail::raise_flag(&st->found_inf);
    if (a.param_bad) {
      int p = 0;
      while (p + 1 < a.count && a.offsets[p + 1] <= i) ++p;
      locus::detail::raise_flag(&a.param_bad[p]);
    }
  }
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (st->sticky) return;
    if (!locus::detail::finite(value(i))) mark(i);
  }
  /// The host form: one vectorised pass that only detects, the marking pass only when
  /// something was not finite.
  void host(index_t n) const {
    if (st->sticky) return;
    const float* __restrict gp = g;
    const float inv = a.scaler ? 1.0f / st->scale : 1.0f;
    const bool scaled = a.scaler;
    // clipping: the norm's squares in the same pass (the cuda path reduces them first)
    double* sq = a.clip_norm > 0 ? &fs->grad_sq : nullptr;
    if (locus::detail::host_all_finite<false>(n, gp, inv, scaled, sq)) return;
    for (index_t i = 0; i < n; ++i)
      if (!locus::detail::finite(value(i))) mark(i);
  }
  LOCUS_HOST_DEVICE void last() const {
    using locus::detail::fresh;
    const std::int64_t micro = a.vars ? fresh(&a.vars->micro_step) : a.micro_step;
    if (a.running) {  // the trainer's running loss of this micro-batch
      const A x = fresh(a.loss);
      *a.running = fresh(a.running) + x * a.weight;
      if (a.first_nonfinite && fresh(a.first_nonfinite) < 0 && !(x - x == A(0))) *a.first_nonfinite = micro;
    }
    const int found = fresh(&st->found_inf);
    if (!a.scaler && found && !fresh(&st->sticky)) {  // the fp32 guard trips
      st->sticky = 1;
      st->bad_step = micro;
      if (a.window_out) *a.window_out = a.vars ? fresh(&a.vars->window_first) : a.window_first;
    }
    const bool skip = found || fresh(&st->sticky);
    fs->u.skip = skip ? 1 : 0;
    float inv = a.scaler ? 1.0f / fresh(&st->scale) : 1.0f;
    if (a.clip_norm > 0) {  // PyTorch's clip_grad_norm_: coefficient max / (norm + 1e-6), at most 1
      const double norm = ::sqrt(fresh(&fs->grad_sq));
      fs->grad_norm = skip ? static_cast<float>(::nan("")) : static_cast<float>(norm);
      const double coef = static_cast<double>(a.clip_norm) / (norm + 1e-6);
      if (coef < 1.0) inv = static_cast<float>(static_cast<double>(inv) * coef);
    }
    fs->inv_scale = inv;
    if (skip) {
      st->skipped = fresh(&st->skipped) + 1;
      return;
    }
    const std::int64_t t = fresh(steps) + 1;
    *steps = t;
    fs->u.first = t == 1 ? 1 : 0;
    fs->u.bias1 = static_cast<float>(1.0 - ::pow(static_cast<double>(beta1), static_cast<double>(t)));
    fs->u.rsqrt_bias2 = locus::detail::adam_rsqrt_bias2(static_cast<double>(beta2), static_cast<double>(t));
  }
};

/// Pass 2: the update U (U(i, g, scalars) for one element, U::host for the host loop)
/// with the unscale folded in; last(): the grad scaler's update, or found_inf reset.
template <class U>
struct update_pass {
  U u;
  const float* g;
  const fused_scalars* fs;
  step_state* st;
  bool scaler;
  float growth, backoff, interval;
  bool scaled = false;  // g * inv_scale (a scaler's unscale and/or clipping by norm)
  float clip = 0.0f;    // > 0: then limited to [-clip, clip] (clipping by value)

  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    if (fs->u.skip) return;
    const float gi = locus::detail::clamp_abs_if(scaled ? g[i] * fs->inv_scale : g[i], clip);
    u(i, gi, fs->u);
  }
  void host(index_t n) const {
    if (fs->u.skip) return;
    u.host(n, g, scaled ? fs->inv_scale : 1.0f, scaled, clip, fs->u);
  }
  LOCUS_HOST_DEVICE void last() const {
    using locus::detail::fresh;
    if (scaler) {  // scaler_update_kernel's update: the scale stays finite and positive
      const locus::detail::loss_scale_state n = locus::detail::next_loss_scale(
          fresh(&st->scale), fresh(&st->growth_tracker), fresh(&st->found_inf) != 0, growth, backoff, interval);
      st->scale = n.scale;
      st->growth_tracker = n.tracker;
      st->found_inf = 0;
    } else if (!fresh(&st->sticky)) {
      st->found_inf = 0;  // ready for the next step's check (check_begin_kernel's work)
    }
  }
};

/// (g[i] / scale)^2 in f64 (the scale only with a grad scaler): clipping's reduction on cuda.
struct square_of_unscaled {
  const float* g;
  const step_state* st;
  bool scaler;
  LOCUS_HOST_DEVICE double operator()(index_t i) const {
    float v = g[i];
    if (scaler) v *= 1.0f / st->scale;
    return static_cast<double>(v) * v;
  }
};

/// Parameter groups' weight decay over the flat buffer (on the optimizer's device): n
/// segments, segment k from begin[k] to begin[k + 1] (the last to the end) with decay
/// wd[k]. n = 0: every element has the optimizer's weight_decay.
struct decay_segments {
  const index_t* begin = nullptr;
  const float* wd = nullptr;
  int n = 0;
  /// The segment of element i (binary search: the last k with begin[k] <= i).
  LOCUS_HOST_DEVICE int find(index_t i) const {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (begin[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
  LOCUS_HOST_DEVICE float at(index_t i, float uniform) const { return n == 0 ? uniform : wd[find(i)]; }
  /// f(first, count, wd) for each segment of [0, total) (one call with `uniform` when n = 0).
  /// Host only: begin and wd are read directly (host memory).
  template <class F>
  void each(index_t total, float uniform, F&& f) const {
    if (n == 0) return f(index_t{0}, total, uniform);
    for (int k = 0; k < n; ++k) {
      const index_t b = begin[k], e = k + 1 < n ? begin[k + 1] : total;
      if (e > b) f(b, e - b, wd[k]);
    }
  }
};

/// AdamW's element update for the fused step (adamw_kernel's arithmetic).
template <class C>
struct adamw_elem {
  float* p;
  float* m;
  float* v;
  C* pc;
  const step_vars* vars;  // graph mode: lr from the device
  float lr, beta1, beta2, eps, weight_decay;
  decay_segments groups{};
  LOCUS_HOST_DEVICE void operator()(index_t i, float gi, const update_scalars& sc) const {
    const float l = vars ? vars->lr : lr;
    float mi = m[i], vi = v[i];
    const float pi = locus::detail::adamw_kernel<C>::update(p[i], gi, mi, vi, l, beta1, beta2, eps,
                                                            groups.at(i, weight_decay), sc.bias1, sc.rsqrt_bias2);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (pc) pc[i] = locus::detail::store<C>(pi);
  }
  void host(index_t n, const float* gs, float inv, bool scaled, float clip, const update_scalars& sc) const {
    groups.each(n, weight_decay, [&](index_t b, index_t count, float wd) {
      locus::detail::adamw_host_n<C>(count, p + b, gs + b, m + b, v + b, pc ? pc + b : nullptr, inv, scaled, clip,
                                     vars ? vars->lr : lr, beta1, beta2, eps, wd, sc.bias1, sc.rsqrt_bias2);
    });
  }
};

/// SGD's element update for the fused step (sgd_kernel's arithmetic).
template <class C>
struct sgd_elem {
  float* p;
  float* buf;
  C* pc;
  const step_vars* vars;
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  decay_segments groups{};
  LOCUS_HOST_DEVICE void operator()(index_t i, float gi, const update_scalars& sc) const {
    const float l = vars ? vars->lr : lr;
    float d = gi + groups.at(i, weight_decay) * p[i];
    if (buf) {
      const float b = sc.first ? d : momentum * buf[i] + (1.0f - dampening) * d;
      buf[i] = b;
      d = nesterov ? d + momentum * b : b;
    }
    const float pi = p[i] - l * d;
    p[i] = pi;
    if (pc) pc[i] = locus::detail::store<C>(pi);
  }
  void host(index_t n, const float* g, float inv, bool scaled, float clip, const update_scalars& sc) const {
    for (index_t i = 0; i < n; ++i) (*this)(i, locus::detail::clamp_abs_if(scaled ? g[i] * inv : g[i], clip), sc);
  }
};

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
  void after_load() {
    params_.sync_compute();
    // the last step's clipping norm belongs to the run before the load (grad_norm())
    locus::detail::zero_bytes<D>(scalars_.data_handle(), scalars_.size_bytes());
  }

  /// Whether this optimizer updates `store` (it was built from it): the trainer refuses
  /// an optimizer bound to another model's parameters.
  template <Device MD, class Policy>
  [[nodiscard]] bool bound_to(const nn::parameter_store<MD, Policy>& store) const noexcept {
    if constexpr (!std::is_same_v<MD, D>) {
      return false;
    } else {
      return static_cast<const void*>(params_.p) == static_cast<const void*>(store.master().data_handle()) &&
             static_cast<const void*>(params_.g) == static_cast<const void*>(store.grad_address()) &&
             params_.n == store.size();
    }
  }
  /// The elements and master weights of the store it was built from (for messages).
  [[nodiscard]] index_t bound_size() const noexcept { return params_.n; }
  [[nodiscard]] const void* bound_data() const noexcept { return params_.p; }
  /// The GPU its state lives on (the one current when it was built); -1 on host devices.
  [[nodiscard]] int device_index() const noexcept { return steps_.device_index(); }

  /// The weight decay of the store's parameter i (its group's, else the weight_decay option).
  [[nodiscard]] double weight_decay_of(std::size_t i) const {
    if (i >= decay_.size())
      throw index_error("locus: the optimizer has " + std::to_string(decay_.size()) + " parameters, not " +
                        std::to_string(i + 1));
    return decay_[i];
  }
  /// The first parameter whose decay differs from what `record` (a weight_decay_record()
  /// of an optimizer over the same store) says, as "name: saved X, now Y"; empty if none.
  [[nodiscard]] std::string weight_decay_difference(const std::string& record) const {
    double saved_default = -1.0;
    std::vector<std::pair<std::string, double>> saved;
    std::size_t at = 0;
    while (at <= record.size()) {
      const std::size_t end = std::min(record.find(';', at), record.size());
      const std::string item = record.substr(at, end - at);
      const std::size_t eq = item.rfind('=');
      if (eq == std::string::npos) return "the record is not a list of name=value";
      char* stop = nullptr;
      const std::string num = item.substr(eq + 1);
      const double v = std::strtod(num.c_str(), &stop);
      if (num.empty() || stop != num.c_str() + num.size()) return "the record has a value that is not a number";
      if (at == 0) saved_default = v;
      else saved.emplace_back(item.substr(0, eq), v);
      at = end + 1;
    }
    for (std::size_t i = 0; i < decay_.size(); ++i) {
      double want = saved_default;
      for (const auto& [n, v] : saved)
        if (n == names_[i]) want = v;
      if (want != decay_[i])
        return "'" + names_[i] + "': saved " + exact_text(want) + ", now " + exact_text(decay_[i]);
    }
    return {};
  }
  /// Each parameter's weight decay as text ("default=value", then ";name=value" for each
  /// parameter whose decay is not the weight_decay option): what checkpoints record.
  [[nodiscard]] std::string weight_decay_record() const {
    std::string out = "default=" + exact_text(o_.weight_decay);
    for (std::size_t i = 0; i < decay_.size(); ++i)
      if (decay_[i] != o_.weight_decay) out += ";" + names_[i] + "=" + exact_text(decay_[i]);
    return out;
  }

 protected:
  template <Device MD, class Policy>
  optimizer_base(nn::parameter_store<MD, Policy>& params, const Options& o, const std::vector<param_group>& groups)
      : params_(bound_parameters<D>::template bind<MD, Policy>(params)),
        o_(o),
        steps_(zeros<std::int64_t, D>(extents<1>{1})),
        scalars_(zeros<std::int32_t, D>(extents<1>{static_cast<index_t>(sizeof(fused_scalars) / 4)})) {
    set_groups(params, groups);
  }

  static std::string exact_text(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
  }

  /// Each parameter's decay from the groups (checked: known names, each in one group at
  /// most, valid decays), and the segments the update kernels read.
  template <Device MD, class Policy>
  void set_groups(const nn::parameter_store<MD, Policy>& store, const std::vector<param_group>& groups) {
    const auto& entries = store.entries();
    std::vector<double> decay(entries.size(), o_.weight_decay);
    std::vector<int> owner(entries.size(), -1);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const double wd = groups[g].weight_decay;
      if (!(wd >= 0.0) || !(wd <= std::numeric_limits<float>::max()))
        throw value_error("locus: parameter group " + std::to_string(g) + " has weight_decay = " + std::to_string(wd) +
                          "; it must be a finite number >= 0");
      for (const auto& name : groups[g].names) {
        const std::size_t i = store.index_of(name);  // an index_error listing the names
        if (owner[i] == static_cast<int>(g))
          throw value_error("locus: parameter '" + name + "' is listed twice in parameter group " +
                            std::to_string(g) + "; name it once");
        if (owner[i] >= 0)
          throw value_error("locus: parameter '" + name + "' is in parameter groups " + std::to_string(owner[i]) +
                            " and " + std::to_string(g) + "; a parameter belongs to one group at most");
        owner[i] = static_cast<int>(g);
        decay[i] = groups[g].weight_decay;
      }
    }
    decay_ = std::move(decay);
    names_.clear();
    for (const auto& e : entries) names_.push_back(e.name);
    std::vector<index_t> begins;
    std::vector<float> wds;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const float wd = static_cast<float>(decay_[i]);
      if (!wds.empty() && wds.back() == wd) continue;  // (the padding after a parameter goes with it)
      begins.push_back(i == 0 ? 0 : entries[i].offset);
      wds.push_back(wd);
    }
    segments_ = {};
    if (wds.empty() || (wds.size() == 1 && wds[0] == static_cast<float>(o_.weight_decay))) {
      host_begin_.clear();
      host_wd_.clear();
      return;
    }
    host_begin_ = std::move(begins);
    host_wd_ = std::move(wds);
    const auto k = static_cast<index_t>(host_wd_.size());
    seg_begin_ = from_host<D>(std::span<const index_t>(host_begin_), extents<1>{k});
    seg_wd_ = from_host<D>(std::span<const float>(host_wd_), extents<1>{k});
    segments_ = decay_segments{seg_begin_.data_handle(), seg_wd_.data_handle(), static_cast<int>(k)};
  }
  /// f(first, count, wd) for each segment of the flat buffer (one call when uniform): the
  /// non-fused steps launch one update per segment.
  template <class F>
  void each_segment(float uniform, F&& f) const {
    decay_segments{host_begin_.data(), host_wd_.data(), static_cast<int>(host_wd_.size())}.each(params_.n, uniform, f);
  }

  fused_scalars* fused() noexcept { return reinterpret_cast<fused_scalars*>(scalars_.data_handle()); }

  /// fused_step's first pass (the check); the caller launches the second.
  template <class A>
  void run_check(const fused_args<A>& a, float beta1, float beta2) {
    if (a.st == nullptr)
      throw error("locus: fused_step needs the grad scaler's state or the trainer's non-finite guard");
    fused_scalars* fs = fused();
    if constexpr (!D::host_accessible) {
      // cuda: the norm's squares by one deterministic reduction before the check pass (the
      // check pass's blocks cannot combine a sum without atomics; the host folds it in)
#if LOCUS_HAS_CUDA && LOCUS_CUDA_COMPILER
      if (a.clip_norm > 0)
        locus::detail::cub_reduce(thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0),
                                                                  square_of_unscaled{params_.g, a.st, a.scaler}),
                                  &fs->grad_sq, params_.n, locus::detail::sum_op{}, 0.0);
#endif
    }
    locus::detail::launch_n_then<D>(params_.n, check_pass<A>{params_.g, a.st, fs, steps_.data_handle(), a, beta1, beta2},
                                    &fs->tickets[0]);
  }
  template <class U, class A>
  void run_update(const U& u, const fused_args<A>& a) {
    fused_scalars* fs = fused();
    locus::detail::launch_n_then<D>(params_.n,
                                    update_pass<U>{u, params_.g, fs, a.st, a.scaler, a.growth, a.backoff, a.interval,
                                                   a.scaler || a.clip_norm > 0, a.clip_value},
                                    &fs->tickets[1]);
  }

 public:
  /// The global L2 norm of the (unscaled) gradients at the last fused step that clipped
  /// (NaN when that step was skipped, 0 before any); reads one float back from D.
  [[nodiscard]] double last_grad_norm() const {
    const auto h = to<cpu>(scalars_);
    fused_scalars f;
    std::memcpy(&f, h.data_handle(), sizeof f);
    return static_cast<double>(f.grad_norm);
  }

 protected:

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
  // parameter groups: each parameter's decay and name, and the kernels' segments (on D
  // for the fused update's lookup, on the host for the non-fused steps' launches)
  std::vector<double> decay_;
  std::vector<std::string> names_;
  tensor<index_t, D, 1> seg_begin_;
  tensor<float, D, 1> seg_wd_;
  decay_segments segments_{};
  std::vector<index_t> host_begin_;  // the same segments on the host
  std::vector<float> host_wd_;
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

  /// groups: parameter groups with their own weight decay (the rest has o.weight_decay).
  template <Device MD, class Policy>
  adamw(nn::parameter_store<MD, Policy>& params, adamw_options o = {}, const std::vector<param_group>& groups = {})
      : base(params, checked(o), groups),
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

  /// The whole step in two launches, with the check, the skip decision and the grad
  /// scaler's update folded in (see the header comment): what train::trainer calls.
  template <class A>
  void fused_step(const detail::fused_args<A>& a) {
    const auto& o = this->o_;
    const auto& pr = this->params_;
    this->run_check(a, static_cast<float>(o.beta1), static_cast<float>(o.beta2));
    detail::with_compute(pr.kind, [&](auto* tag) {
      using C = std::remove_pointer_t<decltype(tag)>;
      this->run_update(detail::adamw_elem<C>{pr.p, m_.data_handle(), v_.data_handle(), static_cast<C*>(pr.pc), a.vars,
                                             static_cast<float>(o.lr), static_cast<float>(o.beta1),
                                             static_cast<float>(o.beta2), static_cast<float>(o.eps),
                                             static_cast<float>(o.weight_decay), this->segments_},
                       a);
    });
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
      C* pc = static_cast<C*>(pr.pc);
      this->each_segment(static_cast<float>(o.weight_decay), [&](index_t b, index_t count, float wd) {
        locus::detail::run_adamw<D>(locus::detail::adamw_kernel<C>{pr.p + b, pr.g + b, m_.data_handle() + b,
                                                                   v_.data_handle() + b, pc ? pc + b : nullptr, sc,
                                                                   static_cast<float>(o.lr), static_cast<float>(o.beta1),
                                                                   static_cast<float>(o.beta2),
                                                                   static_cast<float>(o.eps), wd},
                                    count);
      });
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

  /// groups: parameter groups with their own weight decay (the rest has o.weight_decay).
  template <Device MD, class Policy>
  sgd(nn::parameter_store<MD, Policy>& params, sgd_options o = {}, const std::vector<param_group>& groups = {})
      : base(params, checked(o), groups) {
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
      throw ::locus::value_error("locus: Nesterov momentum needs momentum > 0 and dampening 0");
    if (o.momentum != 0.0) buf_ = zeros<float, D>(extents<1>{this->params_.n});
  }

  /// As adamw::step: without a guard on a model that computes in f16, locus::error.
  void step(locus::detail::step_state* guard = nullptr) { update(this->begin_step(guard, 0.0f, 0.0f)); }
  void step(unscaled_t) { update(this->begin_unscaled(nullptr, 0.0f, 0.0f)); }

  /// As adamw::fused_step.
  template <class A>
  void fused_step(const detail::fused_args<A>& a) {
    const auto& o = this->o_;
    const auto& pr = this->params_;
    this->run_check(a, 0.0f, 0.0f);
    detail::with_compute(pr.kind, [&](auto* tag) {
      using C = std::remove_pointer_t<decltype(tag)>;
      this->run_update(detail::sgd_elem<C>{pr.p, o.momentum != 0.0 ? buf_.data_handle() : nullptr,
                                           static_cast<C*>(pr.pc), a.vars, static_cast<float>(o.lr),
                                           static_cast<float>(o.momentum), static_cast<float>(o.dampening),
                                           static_cast<float>(o.weight_decay), o.nesterov, this->segments_},
                       a);
    });
  }

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
      C* pc = static_cast<C*>(pr.pc);
      float* buf = o.momentum != 0.0 ? buf_.data_handle() : nullptr;
      this->each_segment(static_cast<float>(o.weight_decay), [&](index_t b, index_t count, float wd) {
        locus::detail::launch_n<D>(count, locus::detail::sgd_kernel<C>{
                                              pr.p + b, pr.g + b, buf ? buf + b : nullptr, pc ? pc + b : nullptr, sc,
                                              static_cast<float>(o.lr), static_cast<float>(o.momentum),
                                              static_cast<float>(o.dampening), wd, o.nesterov});
      });
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
  /// value_error for options that make no schedule (called by operator() and by the
  /// trainer when the schedule is set, before any step).
  void check() const {
    if (step_size < 1 || !(gamma > 0.0) || !std::isfinite(gamma))
      throw value_error("locus: step_lr needs step_size >= 1 and a finite gamma > 0, got step_size = " +
                        std::to_string(step_size) + ", gamma = " + std::to_string(gamma));
  }
  double operator()(std::int64_t step, double base) const {
    check();
    return base * std::pow(gamma, static_cast<double>(step / step_size));
  }
};

/// Cosine annealing from base to min_lr over total_steps, then min_lr
/// (torch.optim.lr_scheduler.CosineAnnealingLR with T_max = total_steps).
struct cosine_lr {
  std::int64_t total_steps = 1;
  double min_lr = 0.0;
  void check() const {
    if (total_steps < 1 || !(min_lr >= 0.0) || !std::isfinite(min_lr))
      throw value_error("locus: cosine_lr needs total_steps >= 1 (0 would hold the lr at min_lr from the first "
                        "step: training that changes nothing) and a finite min_lr >= 0, got total_steps = " +
                        std::to_string(total_steps) + ", min_lr = " + std::to_string(min_lr));
  }
  double operator()(std::int64_t step, double base) const {
    check();
    if (step >= total_steps) return min_lr;
    const double t = static_cast<double>(step) / static_cast<double>(total_steps);
    return min_lr + (base - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
};

/// Linear warm-up from base / warmup_steps to base over warmup_steps, then `after`
/// (counted from the end of the warm-up).
template <class After = constant_lr>
struct warmup_lr {
  std::int64_t warmup_steps = 0;
  After after{};
  void check() const {
    if (warmup_steps < 0)
      throw value_error("locus: warmup_lr needs warmup_steps >= 0, got " + std::to_string(warmup_steps));
    if constexpr (requires { after.check(); }) after.check();
  }
  double operator()(std::int64_t step, double base) const {
    check();
    if (step < warmup_steps)
      return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    return after(step - warmup_steps, base);
  }
};

/// One-cycle (torch.optim.lr_scheduler.OneCycleLR with max_lr = the base lr, cosine
/// annealing, two phases): from base / div_factor up to base over the first
/// pct_start * total_steps - 1 steps, then down to base / (div_factor * final_div_factor)
/// at step total_steps - 1; that final lr afterwards.
struct one_cycle_lr {
  std::int64_t total_steps = 1;
  double pct_start = 0.3;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  void check() const {
    if (total_steps < 1 || !(pct_start > 0.0 && pct_start < 1.0) || !(div_factor > 0.0) || !std::isfinite(div_factor) ||
        !(final_div_factor > 0.0) || !std::isfinite(final_div_factor))
      throw value_error("locus: one_cycle_lr needs total_steps >= 1, pct_start in (0, 1) and finite div_factor and "
                        "final_div_factor > 0 (as torch.optim.lr_scheduler.OneCycleLR), got total_steps = " +
                        std::to_string(total_steps) + ", pct_start = " + std::to_string(pct_start) +
                        ", div_factor = " + std::to_string(div_factor) +
                        ", final_div_factor = " + std::to_string(final_div_factor));
  }
  double operator()(std::int64_t step, double base) const {
    check();
    const double initial = base / div_factor, final_lr = initial / final_div_factor;
    const auto anneal = [](double from, double to, double pct) {
      return to + (from - to) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
    };
    if (step >= total_steps - 1) return final_lr;
    const double up_end = pct_start * static_cast<double>(total_steps) - 1.0;
    const double s = static_cast<double>(step);
    if (s <= up_end) return anneal(initial, base, up_end > 0 ? s / up_end : 1.0);
    const double down_end = static_cast<double>(total_steps - 1);
    return anneal(base, final_lr, (s - up_end) / (down_end - up_end));
  }
};

/// Reduce-on-plateau (torch.optim.lr_scheduler.ReduceLROnPlateau, mode "min", relative
/// threshold): call observe(metric) once an epoch with the metric to minimise (a test
/// loss); after more than `patience` epochs without a relative improvement of
/// `threshold`, the lr is multiplied by `factor` (never below min_lr), then `cooldown`
/// epochs pass before counting again. It is stateful: attach it by reference,
/// t.set_schedule(std::ref(plateau)), so the trainer reads the lr it decided. Its state
/// is not in checkpoints.
class reduce_on_plateau {
 public:
  struct options {
    double factor = 0.1;
    int patience = 10;
    double threshold = 1e-4;
    int cooldown = 0;
    double min_lr = 0.0;
  };
  reduce_on_plateau() : reduce_on_plateau(options{}) {}
  explicit reduce_on_plateau(const options& o) : o_(o) {
    if (!(o.factor > 0.0 && o.factor < 1.0))
      throw value_error("locus: reduce_on_plateau factor must be in (0, 1), got " + std::to_string(o.factor));
    if (o.patience < 0 || o.cooldown < 0 || !(o.threshold >= 0.0) || !(o.min_lr >= 0.0))
      throw value_error("locus: reduce_on_plateau needs patience >= 0, cooldown >= 0, threshold >= 0 and min_lr >= 0");
  }
  /// Records one epoch's metric; returns whether the lr was reduced. A NaN metric counts
  /// as no improvement.
  bool observe(double metric) {
    if (metric < best_ * (1.0 - o_.threshold)) {
      best_ = metric;
      bad_ = 0;
    } else {
      ++bad_;
    }
    if (cooling_ > 0) {
      --cooling_;
      bad_ = 0;
    }
    if (bad_ > o_.patience) {
      scale_ *= o_.factor;
      cooling_ = o_.cooldown;
      bad_ = 0;
      return true;
    }
    return false;
  }
  /// The product of the reductions so far.
  [[nodiscard]] double scale() const noexcept { return scale_; }
  double operator()(std::int64_t, double base) const {
    const double lr = base * scale_;
    return lr > o_.min_lr ? lr : o_.min_lr;
  }

 private:
  options o_;
  double best_ = std::numeric_limits<double>::infinity();
  double scale_ = 1.0;
  int bad_ = 0, cooling_ = 0;
};

/// Any schedule, type-erased.
using schedule = std::function<double(std::int64_t step, double base_lr)>;

}  // namespace locus::optim
