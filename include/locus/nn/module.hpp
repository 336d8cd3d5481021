// Models of your own: a module is a struct with named layers (and sub-modules) and a
// forward written in plain C++ over differentiable values (ag::var), branches, loops
// and skip connections included. nn::model<Net> owns the parameters (one
// parameter_store, PyTorch's dotted names), the tape, and what the trainer, optimizers,
// checkpoints and data_parallel need, exactly as nn::sequential provides it.
//
//   template <class D, class P>
//   struct block : locus::nn::module<D, P> {
//     locus::nn::layer<locus::nn::conv2d<D, P>> conv1{this, "conv1", 16, 16, 3, {.padding = 1}};
//     locus::nn::layer<locus::nn::batch_norm2d<D, P>> bn1{this, "bn1", 16};
//     locus::nn::layer<locus::nn::relu<D, P>> relu{this, "relu"};
//     auto forward(const typename block::template var<4>& x) { return relu(bn1(conv1(x)) + x); }
//   };
//   template <class D, class P>
//   struct net : locus::nn::module<D, P> {
//     locus::nn::child<block<D, P>> layer1{this, "layer1"};   // parameters "layer1.conv1.weight", ...
//     ...
//   };
//   locus::nn::model<net<locus::cpu, locus::amp::fp32>> m;    // builds, allocates, initialises
//   locus::train::trainer t(m, opt, locus::nn::cross_entropy{});
//
// How it fits together. nn::model constructs the module tree while a registry is
// current on its thread: each nn::layer member declares its layer's parameters in the
// model's store under the module's prefix and its own name, each nn::child constructs
// its module under a longer prefix. Then the store is allocated and the layers are bound
// and initialised (from seed 0, as PyTorch initialises each layer). A layer called in
// forward is one tape entry with the layer's own fused forward and backward (the same
// kernels nn::sequential runs, the parameter gradients written straight into the store),
// so a module loses no speed to the tape; ag:: operations between layers (+ of a skip
// connection, reshape, arithmetic) are tape entries of their own.
//
// Rules. A layer's parameters live on the module's device: a member layer of another
// device or policy does not compile. A layer object holds the activations its backward
// needs, so one layer is called at most once per forward (a second call is an
// autograd_error: declare a second layer, as PyTorch needs for layers that keep state).
// A module is built only inside an nn::model or as an nn::child (an error naming both).
//
// Length (over 600 lines): nn::model<Net> is one class template: the naming of
// parameters, the tape's reuse between steps, hooks and what the trainer and
// data_parallel call are its members, over one state.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "../ag/ops.hpp"
#include "conv.hpp"
#include "layers.hpp"
#include "parameters.hpp"

namespace locus::nn {

template <Device D, class Policy>
class module;

namespace detail {
/// What the trainer and checkpoints see of one layer of a module (type-erased): hooks,
/// the dropout counter (0 and ignored for other layers), the data-parallel rank stream.
class layer_ref {
 public:
  virtual ~layer_ref() = default;
  [[nodiscard]] virtual bool has_hooks() const = 0;
  [[nodiscard]] virtual std::uint64_t counter() const = 0;
  virtual void set_counter(std::uint64_t c) = 0;
  virtual void set_rank_stream(std::uint64_t r) = 0;
  [[nodiscard]] virtual std::string describe() const = 0;
  [[nodiscard]] virtual index_t parameter_count() const = 0;
  [[nodiscard]] virtual const std::string& name() const = 0;
  /// Activation checkpointing: frees what the layer keeps for backward; saves its dropout
  /// counter and buffers in slot 0 (before a checkpointed forward) or 1 (after it), and
  /// puts a slot back: slot 0 before the recompute (which then draws the same masks and
  /// updates the statistics once), slot 1 when the recompute failed.
  virtual void release_activations() noexcept = 0;
  virtual void checkpoint_save(int slot) = 0;
  virtual void checkpoint_restore(int slot) = 0;
  /// Records that the layer ran in the forward of step `generation` of `tape` (a
  /// checkpointed segment's layers, for the once-per-forward rule).
  virtual void mark_called(const void* tape, std::uint64_t generation) noexcept = 0;
  /// How many tape entries of step `generation` of `tape` write this layer's parameter
  /// gradients (a layer: 0 or 1; an nn::param: one per on()). Data parallel's buckets.
  [[nodiscard]] virtual std::int64_t uses(const void* tape, std::uint64_t generation) const noexcept = 0;

  // Data parallel's buckets: the entry's place in its registry and in the store (its
  // parameters are store entries [first_entry, end_entry)), and the registry's hook that
  // each of its tape entries calls once its backward has written the gradients.
  std::size_t reg_index = 0, first_entry = 0, end_entry = 0;
  const std::function<void(std::size_t)>* grads_done_hook = nullptr;
  void grads_done() const {
    if (grads_done_hook != nullptr && *grads_done_hook) (*grads_done_hook)(reg_index);
  }
};

/// A checkpointed segment while its forward runs: the layers it calls, and the step of
/// the outer tape it belongs to.
struct segment {
  std::vector<layer_ref*> layers;
  const void* outer_tape = nullptr;
  std::uint64_t outer_generation = 0;
};

/// The checkpointed segment whose forward runs now on this thread, if any.
inline segment*& current_segment() noexcept {
  thread_local segment* s = nullptr;
  return s;
}

template <Device D, class Policy>
class registry {
 public:
  using store_type = parameter_store<D, Policy>;
  using M = typename Policy::master;
  using buffer_view = std::variant<tensor_view<M, D, 1>, tensor_view<std::int64_t, D, 0>>;

  struct entry {
    layer_ref* layer;
    std::function<void(store_type&)> bind;
    std::function<void(std::uint64_t)> reset;
    std::function<void(std::vector<std::pair<std::string, buffer_view>>&)> buffers;
  };

  store_type store;
  std::vector<entry> layers;
  std::vector<std::string> names;  // every layer's and child's full name (duplicates refused)
  int tickets = 0;  // modules that may be constructed now: nn::model's root, an nn::child's module
  std::vector<std::pair<std::string, buffer_view>> buffers;
  std::string prefix;  // of the module being constructed
  /// Set by nn::model while output_shape() or layer_shapes() runs the forward: layers with
  /// state across calls (nn::lstm's carried state) leave it alone.
  bool probing = false;
  /// Set by nn::model during a backward whose gradients data parallel reduces in buckets:
  /// called with an entry's index each time one of its tape entries has run backward.
  std::function<void(std::size_t)> grads_done;

  /// Registers l (after it declared its parameters, which began at store entry `first`).
  void add(entry e, std::size_t first) {
    e.layer->reg_index = layers.size();
    e.layer->first_entry = first;
    e.layer->end_entry = store.entries().size();
    e.layer->grads_done_hook = &grads_done;
    layers.push_back(std::move(e));
  }
};

/// A callable of any buffer (to ask whether a layer has for_each_buffer: nvcc refuses a
/// lambda inside a requires-expression).
struct buffer_probe {
  template <class V>
  void operator()(const std::string&, V) const noexcept {}
};

/// Layers whose forward and infer take a fused activation (linear, batch_norm2d: they
/// say so), and those of them that fuse relu only. (Traits, not requires-expressions:
/// nvcc compiles these.)
template <class L, class = void>
struct fuses_activation : std::false_type {};
template <class L>
struct fuses_activation<L, std::void_t<decltype(L::fuses_activation)>> : std::bool_constant<L::fuses_activation> {};
template <class L, class = void>
struct fuses_relu_only : std::false_type {};
template <class L>
struct fuses_relu_only<L, std::void_t<decltype(L::fuses_relu_only)>> : std::bool_constant<L::fuses_relu_only> {};

template <class L>
concept has_buffers = requires(L& l) { l.for_each_buffer(std::string{}, buffer_probe{}); };

template <Device D, class Policy>
registry<D, Policy>*& current_registry() noexcept {
  thread_local registry<D, Policy>* r = nullptr;
  return r;
}

/// A layer's or child's name: non-empty, no leading, trailing or doubled dot, not taken.
template <class Registry>
std::string claim_name(Registry& r, const std::string& prefix, const std::string& name, const char* what) {
  const bool bad = name.empty() || name.front() == '.' || name.back() == '.' || name.find("..") != std::string::npos;
  if (bad)
    throw value_error(std::string("locus: ") + what + " name '" + name + "' in module '" + prefix +
                      "' must be non-empty, without a leading, trailing or doubled '.' (its parameters are named "
                      "'<module>.<name>.weight')");
  std::string full = prefix + name;
  for (const auto& n : r.names)
    if (n == full)
      throw value_error(std::string("locus: ") + what + " '" + full + "' collides with '" + n +
                        "' (two layers or children of one name, or a dotted name that a child's layer spells): "
                        "parameter names would repeat; rename one");
  r.names.push_back(full);
  return full;
}

/// Sets the registry and prefix for the modules constructed in its scope.
template <Device D, class Policy>
class registry_scope {
 public:
  registry_scope(registry<D, Policy>* r, std::string prefix)
      : previous_(current_registry<D, Policy>()), previous_prefix_(r->prefix), previous_tickets_(r->tickets) {
    current_registry<D, Policy>() = r;
    r->prefix = std::move(prefix);
    r->tickets = 1;  // the one module this scope constructs
  }
  registry_scope(const registry_scope&) = delete;
  registry_scope& operator=(const registry_scope&) = delete;
  ~registry_scope() {
    current_registry<D, Policy>()->prefix = previous_prefix_;
    current_registry<D, Policy>()->tickets = previous_tickets_;
    current_registry<D, Policy>() = previous_;
  }

 private:
  registry<D, Policy>* previous_;
  std::string previous_prefix_;
  int previous_tickets_;
};

// Prevents: a layer of another device or policy inside a module (its parameters would
// live elsewhere than the module's).
template <class L, Device D, class Policy>
constexpr bool require_module_layer() {
  if constexpr (!std::is_same_v<typename L::device, D>) {
    static_assert(::locus::detail::always_false<L>,
                  "locus: a module's layer lives on another device than the module (its parameters would live "
                  "apart from the model's store); declare it with the module's device: nn::layer<nn::linear<D, P>>");
    return false;
  } else if constexpr (!std::is_same_v<typename L::policy, Policy>) {
    static_assert(::locus::detail::always_false<L>,
                  "locus: a module's layer has another precision policy than the module (its parameters would "
                  "live apart from the model's store); declare it with the module's policy: "
                  "nn::layer<nn::linear<D, P>>");
    return false;
  } else {
    return true;
  }
}
}  // namespace detail

/// The base of a module: the device, the policy, the value types of its forward, and
/// where its layers register. Construct it only inside nn::model or nn::child.
template <Device D, class Policy>
class module {
 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  /// The differentiable values a forward takes and returns: var<2> [batch, features],
  /// var<4> [batch, channels, height, width].
  template <std::size_t R>
  using var = ag::var<C, D, R>;
  /// Integer ids a forward takes (token ids [batch, time], int64 or int32): what
  /// nn::embedding looks up. A model whose forward takes ids<R> is trained on id batches.
  template <std::size_t R, class I = std::int64_t>
  using ids = ag::ids<C, D, R, I>;

  // (nvcc warns of a line that starts with the word module, C++20's keyword: these
  // declarations begin with another token)
  explicit module() : registry_(detail::current_registry<D, policy>()) {
    if (registry_ == nullptr || registry_->tickets <= 0)
      throw ::locus::error(
          "locus: a module is built by nn::model<Net> (which owns its parameters: locus::nn::model<Net> m;) or as "
          "a member nn::child<Net> of another module, not on its own (a local variable or a plain member would "
          "register layers that do not live as long as the model)");
    --registry_->tickets;
    prefix_ = registry_->prefix;
  }
  explicit module(const module&) = delete;
  auto operator=(const module&) -> module& = delete;

  /// The module's name prefix in the model ("" for the model's root, "layer1." below).
  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  /// The registry its layers declare into (for nn::layer and nn::child).
  [[nodiscard]] detail::registry<D, policy>* registry() const noexcept { return registry_; }

 private:
  detail::registry<D, policy>* registry_;
  std::string prefix_;
};

/// A layer of locus's (linear, conv2d, batch_norm2d, relu, dropout, pooling, flatten,
/// layer_norm, ...) as a member of a module: its parameters are named
/// "<module prefix><name>.weight"; calling it on a value records one tape entry.
template <class L>
class layer final : public detail::layer_ref {
 public:
  using device = typename L::device;
  using policy = typename L::policy;
  using C = typename policy::compute;

  template <class Parent, class... A>
  layer(Parent* parent, std::string name, A&&... args) : l_(std::forward<A>(args)...), name_(std::move(name)) {
    static_assert(detail::require_module_layer<L, typename Parent::device, typename Parent::policy>());
    auto* reg = parent->registry();
    if (detail::current_registry<device, policy>() != reg)
      throw ::locus::error("locus: layer '" + parent->prefix() + name_ +
                           "' was made after its model was built (inside forward?); a layer is a member of its module, "
                           "constructed with it");
    full_name_ = detail::claim_name(*reg, parent->prefix(), name_, "layer");
    const std::size_t first = reg->store.entries().size();
    l_.declare(reg->store, full_name_ + ".");
    typename detail::registry<device, policy>::entry e;
    e.layer = this;
    e.bind = [this](parameter_store<device, policy>& s) { l_.bind(s); };
    e.reset = [this](std::uint64_t seed) { l_.reset_parameters(seed); };
    e.buffers = [this](auto& out) {
      if constexpr (detail::has_buffers<L>) {
        l_.for_each_buffer(full_name_ + ".", [&](const std::string& n, auto v) {
          using V = decltype(v);
          if constexpr (std::is_same_v<V, tensor_view<typename policy::master, device, 1>> ||
                        std::is_same_v<V, tensor_view<std::int64_t, device, 0>>)
            out.emplace_back(n, v);
        });
      } else {
        (void)this;  // (clang's -Wunused-lambda-capture for layers without buffers)
        (void)out;
      }
    };
    reg->add(std::move(e), first);
  }
  layer(const layer&) = delete;
  layer& operator=(const layer&) = delete;

  /// Records the layer's forward on the value's tape (its inference forward when the
  /// tape is not training): one entry whose backward is the layer's own.
  template <class V>
    requires ag::is_var_v<V>
  auto operator()(const V& x) {
    if constexpr (!std::is_same_v<typename V::device, device>) {
      static_assert(::locus::detail::always_false<V>,
                    "locus: a module's layer lives on another device than the module (or than the value it is "
                    "called on); declare it with the module's device: nn::layer<nn::linear<D, P>>");
      return ag::var<typename V::value_type, typename V::device, V::rank>{};  // (no errors after this one)
    } else if constexpr (!std::is_same_v<typename V::value_type, C>) {
      static_assert(::locus::detail::always_false<V>,
                    "locus: a module's layer has another precision policy than the module (its compute dtype "
                    "differs from the value's); declare it with the module's policy: nn::layer<nn::linear<D, P>>");
      return ag::var<typename V::value_type, typename V::device, V::rank>{};
    } else {
      return call(x, ::locus::detail::act_kind::none);
    }
  }

  /// The layer with an activation fused into it, as nn::sequential fuses the activation
  /// after a linear layer: fc(x, ag::fused::relu) is relu(fc(x)) in one entry and one
  /// pass (linear: any ag::fused activation, in the GEMM's epilogue where it can;
  /// batch_norm2d: relu). Saves the activation's value and gradient buffers too.
  template <class V>
    requires ag::is_var_v<V>
  auto operator()(const V& x, ag::fused act) {
    if constexpr (!detail::fuses_activation<L>::value) {
      static_assert(::locus::detail::always_false<V>,
                    "locus: this layer has no fused activation (linear and batch_norm2d have one); apply the "
                    "activation after it: ag::relu(layer(x))");
      return (*this)(x);
    } else {
      const auto kind = ag::detail::kind_of(act);
      if constexpr (detail::fuses_relu_only<L>::value) {
        if (kind != ::locus::detail::act_kind::none && kind != ::locus::detail::act_kind::relu)
          throw value_error("locus: layer '" + full_name_ + "' (" + l_.describe() +
                            ") fuses relu only; apply another activation after it: ag::gelu(layer(x))");
      }
      if constexpr (!std::is_same_v<typename V::device, device> || !std::is_same_v<typename V::value_type, C>)
        return (*this)(x);  // the device and policy rules of the call without activation
      else
        return call(x, kind);
    }
  }

 private:
  template <class V>
  auto call(const V& x, ::locus::detail::act_kind act) {
    auto& t = ag::detail::owner(x, "a module's layer");
    auto* segment = t.training() ? detail::current_segment() : nullptr;
    if ((called_ == t.generation() && called_tape_ == &t) ||
        (segment != nullptr && called_ == segment->outer_generation && called_tape_ == segment->outer_tape))
      throw autograd_error("locus: layer '" + full_name_ +
                           "' was called twice in one forward (a checkpointed call counts): a layer keeps the "
                           "activations its backward needs, so each call needs its own layer (declare another "
                           "nn::layer member, or another nn::child)");
    called_ = t.generation();
    called_tape_ = &t;
    if (segment != nullptr) {
      segment->layers.push_back(this);
      checkpoint_save(0);
    }
    using out_view = decltype(l_.forward(x.value()));
    constexpr std::size_t RO = out_view::rank;
    if (!t.training()) {
      auto y = infer_with(x.value(), act);
      inferred_.template emplace<tensor<C, device, RO>>(std::move(y));
      const auto& held = std::get<tensor<C, device, RO>>(inferred_);
      return t.template alias<RO>(held.view(), false);
    }
    const auto y = forward_with(x.value(), act);
    const bool rg = x.requires_grad() || l_.parameter_count() > 0;
    auto out = t.template alias<RO>(y, rg);
    if (rg) {
      auto& n = t.template record<node<V::rank, RO>>();
      n.self = this;
      n.x = ag::detail::access::id(x);
      n.out = ag::detail::access::id(out);
      n.in_shape = x.shape();
      n.out_shape = y.shape();
    }
    return out;
  }

 public:
  template <class X>
  auto forward_with(const X& x, ::locus::detail::act_kind act) {
    if constexpr (detail::fuses_activation<L>::value) return l_.forward(x, act);
    else return l_.forward(x);  // (act is none: only layers that fuse one get another)
  }
  template <class X>
  auto infer_with(const X& x, ::locus::detail::act_kind act) const {
    if constexpr (detail::fuses_activation<L>::value) return l_.infer(x, act);
    else return l_.infer(x);
  }

 public:
  /// The layer itself (its options, weight(), hooks: add_forward_hook works here).
  [[nodiscard]] L& get() noexcept { return l_; }
  [[nodiscard]] const L& get() const noexcept { return l_; }

  // layer_ref
  [[nodiscard]] bool has_hooks() const override {
    if constexpr (requires(const L& l) { l.has_hooks(); }) return l_.has_hooks();
    else return false;
  }
  [[nodiscard]] std::uint64_t counter() const override {
    if constexpr (requires(const L& l) { l.counter(); }) return l_.counter();
    else return 0;
  }
  void set_counter(std::uint64_t c) override {
    if constexpr (requires(L& l) { l.set_counter(c); }) l_.set_counter(c);
  }
  void set_rank_stream(std::uint64_t r) override {
    if constexpr (requires(L& l) { l.set_rank_stream(r); }) l_.set_rank_stream(r);
  }
  [[nodiscard]] std::string describe() const override { return l_.describe(); }
  [[nodiscard]] index_t parameter_count() const override { return l_.parameter_count(); }
  [[nodiscard]] const std::string& name() const override { return full_name_; }
  void release_activations() noexcept override {
    if constexpr (requires(L& l) { l.release_activations(); }) l_.release_activations();
  }
  void checkpoint_save(int slot) override {
    auto& sv = saved_[slot];
    sv.counter = counter();
    if constexpr (detail::has_buffers<L>) {
      std::size_t m = 0, i = 0;
      l_.for_each_buffer(std::string{}, [&](const std::string&, auto v) {
        if constexpr (std::is_same_v<decltype(v), tensor_view<std::int64_t, device, 0>>) {
          if (sv.counts.size() <= i) sv.counts.emplace_back(v.shape());
          ::locus::copy(v, sv.counts[i++]);
        } else {
          if (sv.values.size() <= m) sv.values.emplace_back(v.shape());
          ::locus::copy(v, sv.values[m++]);
        }
      });
    }
  }
  void checkpoint_restore(int slot) override {
    auto& sv = saved_[slot];
    set_counter(sv.counter);
    if constexpr (detail::has_buffers<L>) {
      std::size_t m = 0, i = 0;
      l_.for_each_buffer(std::string{}, [&](const std::string&, auto v) {
        if constexpr (std::is_same_v<decltype(v), tensor_view<std::int64_t, device, 0>>) ::locus::copy(sv.counts[i++], v);
        else ::locus::copy(sv.values[m++], v);
      });
    }
  }
  void mark_called(const void* tape, std::uint64_t generation) noexcept override {
    called_tape_ = tape;
    called_ = generation;
  }
  [[nodiscard]] std::int64_t uses(const void* tape, std::uint64_t generation) const noexcept override {
    return called_tape_ == tape && called_ == generation && l_.parameter_count() > 0 ? 1 : 0;
  }

 private:
  template <std::size_t RI, std::size_t RO>
  struct node final : ag::node<C, device> {
    layer* self = nullptr;
    std::uint32_t x = 0, out = 0;
    extents<RI> in_shape{};
    extents<RO> out_shape{};
    void backward(ag::tape<C, device>& t) override {
      const auto g = t.template grad_in<RO>(out, out_shape);
      if (g.data_handle() == nullptr) {
        self->grads_done();
        return;
      }
      const bool need = t.wants_grad(x);
      const auto gx = self->l_.backward(g, need);
      self->grads_done();  // its parameters' gradients are written
      if (need) {
        const tensor_view<const C, device, RI> src{::locus::detail::raw_view_key{}, gx.data_handle(), in_shape,
                                                   gx.device_index()};
        // the layer keeps gx until its next backward: x's gradient refers to it, no copy
        // (unless another use of x wrote first: then it is added; a releasing tape, a
        // checkpointed segment's, adopts nothing, and the layer frees its activations now)
        if (!t.grad_adopt(x, src)) {
          auto [dst, fresh] = t.template grad_out<RI>(x, in_shape);
          ag::detail::put(dst, fresh, src);
        }
      }
      if (ag::detail::access::releasing(t)) self->release_activations();
    }
  };

  L l_;
  std::string name_, full_name_;
  std::uint64_t called_ = 0;
  const void* called_tape_ = nullptr;
  std::variant<std::monostate, tensor<C, device, 1>, tensor<C, device, 2>, tensor<C, device, 3>, tensor<C, device, 4>>
      inferred_;
  // activation checkpointing: the counter and buffers before (0) and after (1) the
  // segment's forward
  struct saved_state {
    std::uint64_t counter = 0;
    std::vector<tensor<typename policy::master, device, 1>> values;
    std::vector<tensor<std::int64_t, device, 0>> counts;
  };
  std::array<saved_state, 2> saved_;
};

namespace detail {
/// A checkpointed child's own tape (its forward records there, then everything of it is
/// freed) and the layers its forward called.
template <class T, Device D>
struct checkpoint_state {
  ag::tape<T, D> tape;
  segment seg;
  /// Frees the segment's activations: its layers' and its tape's buffers.
  void release() noexcept {
    for (auto* l : seg.layers) l->release_activations();
    tape.release();
  }
};

/// Makes `s` the segment the layers called in its scope add themselves to.
class segment_scope {
 public:
  explicit segment_scope(segment* s) noexcept : previous_(current_segment()) { current_segment() = s; }
  segment_scope(const segment_scope&) = delete;
  segment_scope& operator=(const segment_scope&) = delete;
  ~segment_scope() { current_segment() = previous_; }

 private:
  segment* previous_;
};

/// Frees a segment's activations when it goes out of scope (an exception included).
template <class T, Device D>
struct release_on_exit {
  checkpoint_state<T, D>& state;
  ~release_on_exit() { state.release(); }
};
}  // namespace detail

/// A module as a member of another: its layers are named "<prefix><name>.<layer>...".
template <class M>
class child {
 public:
  template <class Parent, class... A>
  child(Parent* parent, const std::string& name, A&&... args) {
    static_assert(std::is_same_v<typename M::device, typename Parent::device> &&
                      std::is_same_v<typename M::policy, typename Parent::policy>,
                  "locus: a child module has another device or precision policy than its parent; declare it with "
                  "the parent's: nn::child<block<D, P>>");
    auto* reg = parent->registry();
    if (detail::current_registry<typename M::device, typename M::policy>() != reg)
      throw ::locus::error("locus: child module '" + parent->prefix() + name +
                           "' was made after its model was built; a child is a member of its module, constructed "
                           "with it");
    const std::string full = detail::claim_name(*reg, parent->prefix(), name, "child module");
    name_ = full;
    const detail::registry_scope<typename M::device, typename M::policy> scope(reg, full + ".");
    m_.emplace(std::forward<A>(args)...);
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  M* operator->() noexcept { return &*m_; }
  const M* operator->() const noexcept { return &*m_; }
  M& operator*() noexcept { return *m_; }
  const M& operator*() const noexcept { return *m_; }
  /// Calls the child's forward: layer1(x) for layer1->forward(x).
  template <class... A>
  auto operator()(A&&... args) {
    return m_->forward(std::forward<A>(args)...);
  }

  /// The child's forward with activation checkpointing (nn::checkpoint(child, x)).
  template <class V>
    requires ag::is_var_v<V>
  auto checkpoint(const V& x) {
    using T = typename M::C;
    using Dv = typename M::device;
    using out_var = std::remove_cvref_t<decltype(m_->forward(x))>;
    static_assert(ag::is_var_v<out_var>, "locus: nn::checkpoint needs a child whose forward returns a value");
    auto& t = ag::detail::owner(x, "nn::checkpoint");
    if (!t.training()) return out_var(m_->forward(x));  // inference keeps nothing anyway
    if (detail::current_segment() != nullptr)
      throw autograd_error("locus: nn::checkpoint of '" + name_ +
                           "' inside another checkpointed segment; checkpoint the outer segment or the inner ones, "
                           "not both");
    if (!ckpt_) ckpt_ = std::make_unique<detail::checkpoint_state<T, Dv>>();
    auto& st = *ckpt_;
    if (st.seg.outer_tape == &t && st.seg.outer_generation == t.generation())
      throw autograd_error("locus: child '" + name_ +
                           "' was checkpointed twice in one forward: its recompute keeps one call's state; declare "
                           "another nn::child for a second use");
    st.seg.layers.clear();
    st.seg.outer_tape = &t;
    st.seg.outer_generation = t.generation();
    out_var out;
    {
      const detail::release_on_exit<T, Dv> release{st};
      const detail::segment_scope scope(&st.seg);
      st.tape.reset();
      st.tape.set_training(true);
      const auto ys = m_->forward(st.tape.constant(x.value()));
      if (ys.owner() != &st.tape)
        throw autograd_error("locus: the forward of checkpointed '" + name_ +
                             "' returned a value that is not computed from its input");
      const bool rg = x.requires_grad() || ys.requires_grad();
      out = t.template result<out_var::rank>(ys.shape(), rg);
      ::locus::copy(ys.value(), t.writable(out));
      // the segment's layers count as called in this forward of the outer tape (a plain
      // call of one of them after this is refused), and their state after it is kept
      // for a recompute that fails
      for (auto* l : st.seg.layers) {
        l->mark_called(&t, t.generation());
        l->checkpoint_save(1);
      }
    }
    if (out.requires_grad()) {
      auto& n = t.template record<checkpoint_node<V::rank, out_var::rank>>();
      n.self = this;
      n.x = ag::detail::access::id(x);
      n.x_value = x.value();
      n.out = ag::detail::access::id(out);
      n.out_shape = out.shape();
    }
    return out;
  }

 private:
  template <std::size_t RI, std::size_t RO>
  struct checkpoint_node final : ag::node<typename M::C, typename M::device> {
    child* self = nullptr;
    std::uint32_t x = 0, out = 0;
    tensor_view<const typename M::C, typename M::device, RI> x_value;
    extents<RO> out_shape{};
    void backward(ag::tape<typename M::C, typename M::device>& t) override {
      const auto g = t.template grad_in<RO>(out, out_shape);
      if (g.data_handle() == nullptr) return;
      auto& st = *self->ckpt_;
      const detail::release_on_exit<typename M::C, typename M::device> release{st};
      // the counters and statistics of before the forward: the recompute draws the same
      // dropout masks and leaves the statistics as the forward left them
      for (auto* l : st.seg.layers) l->checkpoint_restore(0);
      try {
        st.tape.reset();
        st.tape.set_training(true);
        const bool need = t.wants_grad(x);
        const auto xs = need ? st.tape.leaf(x_value) : st.tape.constant(x_value);
        const auto ys = self->m_->forward(xs);
        if (need && ag::detail::access::id(ys) == ag::detail::access::id(xs)) {
          // the segment returned its input: its gradient is the output's
          auto [dst, fresh] = t.template grad_out<RI>(x, x_value.shape());
          const tensor_view<const typename M::C, typename M::device, RI> gx{
              ::locus::detail::raw_view_key{}, g.data_handle(), x_value.shape(), g.device_index()};
          ag::detail::put(dst, fresh, gx);
          return;
        }
        // What reached x from the nodes after the segment starts x's gradient inside it,
        // so the sums run in the order of the plain backward (bit for bit).
        const auto prior = t.template grad_in<RI>(x, x_value.shape());
        if (need && prior.data_handle() != nullptr) {
          auto [d, fresh] = st.tape.template grad_out<RI>(ag::detail::access::id(xs), x_value.shape());
          (void)fresh;
          ::locus::copy(prior, d);
        }
        ag::detail::access::set_releasing(st.tape, true);  // each buffer freed once nothing left to run reads it
        st.tape.backward(ys, g);
        if (need) {
          auto [dst, fresh] = t.template grad_out<RI>(x, x_value.shape());
          (void)fresh;
          ::locus::copy(st.tape.grad(xs), dst);  // (the prior contribution is in it)
        }
      } catch (...) {
        for (auto* l : st.seg.layers) l->checkpoint_restore(1);  // as the forward left them
        throw;
      }
    }
  };

  std::optional<M> m_;
  std::string name_;
  std::unique_ptr<detail::checkpoint_state<typename M::C, typename M::device>> ckpt_;
};

/// Activation checkpointing: runs child's forward on x keeping none of its activations
/// (only x, and the output as one value); backward runs the forward again and then its
/// backward. Gradients are bit for bit those of child(x); a dropout inside draws the same
/// mask on the recompute; batch norm's running statistics are updated once. Costs one
/// more forward of the segment in the step. In inference it is child(x).
///   auto forward(const var<4>& x) { return fc(flat(pool(nn::checkpoint(layer2, nn::checkpoint(layer1, x))))); }
template <class M, class V>
  requires ag::is_var_v<V>
auto checkpoint(child<M>& c, const V& x) {
  return c.checkpoint(x);
}
// Prevents: checkpointing a child whose forward takes token ids (a segment is recomputed
// from the value it got; ids are the model's input, with nothing before them to save).
template <class M, class V>
  requires ag::is_ids_v<V>
auto checkpoint(child<M>& c, const V& x) {  // (auto: the body, and its message, comes first)
  static_assert(::locus::detail::always_false<V>,
                "locus: nn::checkpoint recomputes a segment from a value (ag::var), not from token ids; "
                "checkpoint the blocks after the embedding: nn::checkpoint(h0, wte(x))");
  return c(x);  // (the child's own result type: no errors after this one)
}

namespace detail {
template <class Net, std::size_t R>
concept forward_takes = requires(Net& n, const ag::var<typename Net::C, typename Net::device, R>& v) { n.forward(v); };
template <class Net, std::size_t R, class I>
concept forward_takes_ids =
    requires(Net& n, const ag::ids<typename Net::C, typename Net::device, R, I>& v) { n.forward(v); };

/// What a module's forward takes: a value var<R> of the compute dtype, or ids<R, I>
/// (kind 1: int64, kind 2: int32).
struct input_form {
  std::size_t rank = 0;
  int kind = 0;
};
template <class Net>
constexpr input_form module_input() {
  if constexpr (forward_takes<Net, 2>) return {2, 0};
  else if constexpr (forward_takes<Net, 4>) return {4, 0};
  else if constexpr (forward_takes<Net, 3>) return {3, 0};
  else if constexpr (forward_takes<Net, 1>) return {1, 0};
  else if constexpr (forward_takes_ids<Net, 2, std::int64_t>) return {2, 1};
  else if constexpr (forward_takes_ids<Net, 2, std::int32_t>) return {2, 2};
  else if constexpr (forward_takes_ids<Net, 1, std::int64_t>) return {1, 1};
  else if constexpr (forward_takes_ids<Net, 1, std::int32_t>) return {1, 2};
  else {
    static_assert(::locus::detail::always_false<Net>,
                  "locus: nn::model<Net> needs Net::forward(const var<R>& x) (R from 1 to 4) returning a value "
                  "(var<2> for a classifier's logits), or forward(const ids<R>& x) (R 1 or 2) for token ids; "
                  "write auto forward(const typename Net::template var<2>& x) { ... }");
    return {2, 0};
  }
}
template <class Net, int Kind = module_input<Net>().kind>
struct module_input_element {
  using type = typename Net::C;
};
template <class Net>
struct module_input_element<Net, 1> {
  using type = std::int64_t;
};
template <class Net>
struct module_input_element<Net, 2> {
  using type = std::int32_t;
};
/// The argument of a module's forward: the value, or the ids, of its input.
template <class Net, std::size_t R, class X = typename module_input_element<Net>::type>
using module_input_arg = std::conditional_t<std::is_integral_v<X>, ag::ids<typename Net::C, typename Net::device, R, X>,
                                            ag::var<typename Net::C, typename Net::device, R>>;
}  // namespace detail

/// A module and everything it owns: the parameters (one store, PyTorch's dotted names),
/// the layers' buffers, and the tape of its training forward. It is what the trainer,
/// optimizers, checkpoints, nn::save/nn::load and data_parallel take, as nn::sequential.
template <class Net>
class model {
 public:
  using device = typename Net::device;
  using policy = typename Net::policy;
  using C = typename policy::compute;
  using M = typename policy::master;
  using store_type = parameter_store<device, policy>;
  static constexpr std::size_t input_rank = detail::module_input<Net>().rank;
  /// The input's element type: the compute dtype, or int64/int32 for a forward over ids.
  using input_type = typename detail::module_input_element<Net>::type;
  using input_view = tensor_view<const input_type, device, input_rank>;
  using input_arg = detail::module_input_arg<Net, input_rank>;
  using out_var = std::remove_cvref_t<decltype(std::declval<Net&>().forward(std::declval<const input_arg&>()))>;
  static_assert(ag::is_var_v<out_var>, "locus: Net::forward must return a value (an ag::var) of the module's dtype");
  static constexpr std::size_t output_rank = out_var::rank;
  using output_view = tensor_view<const C, device, output_rank>;
  using view = output_view;
  /// A module may hold a dropout layer: the trainer's graph mode refuses modules (a
  /// replay would repeat a captured mask).
  static constexpr bool has_dropout = true;

  /// Builds Net(args...) with its parameters registered, allocates them and initialises
  /// them from seed 0.
  template <class... A>
  explicit model(A&&... args) : reg_(std::make_unique<detail::registry<device, policy>>()) {
    {
      const detail::registry_scope<device, policy> scope(reg_.get(), "");
      net_ = std::make_unique<Net>(std::forward<A>(args)...);
    }
    reg_->store.allocate();
    for (auto& e : reg_->layers) e.bind(reg_->store);
    reset_parameters(0);
    for (auto& e : reg_->layers) e.buffers(reg_->buffers);
  }
  model(model&&) noexcept = default;
  model& operator=(model&&) noexcept = default;
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  /// Re-draws every parameter as PyTorch initialises it (each layer from Philox(seed)),
  /// and resets the buffers.
  void reset_parameters(std::uint64_t seed) {
    seed_ = seed;
    for (auto& e : reg_->layers) e.reset(seed);
    reg_->store.sync_compute();
  }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  /// The module (its layers and children, to read or hook).
  [[nodiscard]] Net& net() noexcept { return *net_; }
  [[nodiscard]] const Net& net() const noexcept { return *net_; }

  store_type& parameters() & noexcept { return reg_->store; }
  const store_type& parameters() const& noexcept { return reg_->store; }
  template <class Model = model>
  const auto& parameters() const&& {
    static_assert(::locus::detail::always_false<Model>, LOCUS_TEMPORARY_MODEL_MESSAGE("parameters()"));
    return reg_->store;
  }

  /// The training forward: records the module's forward on the model's tape (reset
  /// first: the last step's values end here). x must stay alive until backward.
  output_view forward(const input_view& x) {
    tape_->reset();
    tape_->set_training(true);
    out_ = net_->forward(enter(*tape_, x));
    return out_.value();
  }
  /// Backpropagates dL/d(output) through the tape: parameter gradients go to the store
  /// (written where discard_grad left them, added otherwise). The input's gradient is
  /// not computed (an empty view).
  input_view backward(const output_view& gy, bool need_input_grad = false) {
    (void)need_input_grad;
    if (out_.owner() == nullptr)
      throw autograd_error("locus: model backward() before any forward(); run forward(x) first");
    if (!grads_final_) {
      tape_->backward(out_, gy);
      return {};
    }
    // Buckets: every layer's parameters are final once each tape entry of this step that
    // writes them has run backward (an unused one's at once). The store holds them in
    // registration order, so each time the run of final layers at its end grows, the
    // gradients from its first parameter on are final: grads_final_(that offset).
    const auto& layers = reg_->layers;
    pending_.assign(layers.size(), 0);
    for (std::size_t i = 0; i < layers.size(); ++i) pending_[i] = layers[i].layer->uses(tape_.get(), tape_->generation());
    final_from_ = layers.size();
    reported_ = reg_->store.size();
    reg_->grads_done = [this](std::size_t i) {
      if (pending_[i] > 0 && --pending_[i] == 0) report_final();
    };
    try {
      report_final();
      tape_->backward(out_, gy);
    } catch (...) {
      reg_->grads_done = {};
      throw;
    }
    reg_->grads_done = {};
    return {};
  }
  /// During backward, f(offset) whenever the gradients from `offset` to the end of the
  /// flat buffer are final (dist::data_parallel's buckets start there, through the
  /// trainer); as nn::sequential's. An empty function: nothing.
  void set_gradients_final(std::function<void(index_t first_final)> f) { grads_final_ = std::move(f); }
  /// The inference forward: the module's forward with the tape in inference mode (batch
  /// norm's running statistics, no dropout), nothing recorded for backward.
  tensor<C, device, output_rank> infer(const input_view& x) const {
    infer_tape_->reset();
    infer_tape_->set_training(false);
    const auto y = const_cast<Net&>(*net_).forward(enter(*infer_tape_, x));
    tensor<C, device, output_rank> out(y.shape());
    ::locus::copy(y.value(), out);
    return out;
  }

  /// The output's shape for an input of shape `in`: runs the inference forward on zeros
  /// of that shape (a module's shapes come from its forward; pass a batch of 1).
  [[nodiscard]] std::vector<index_t> output_shape(const std::vector<index_t>& in) const {
    const auto x = probe_input(in);
    const probe_scope probing(*reg_);
    const auto y = infer(x);
    const auto s = y.shape();
    return {s.begin(), s.end()};
  }
  /// The shape of every value the inference forward records for an input of shape `in`
  /// (the layers' outputs and the operations' between them, inside checkpointed children
  /// too, the input not included), in forward order: an estimate of the activations a
  /// training batch of that shape keeps (reshapes count though they alias). It runs the
  /// inference forward, so it is not to be called while infer() runs on another thread.
  [[nodiscard]] std::vector<std::vector<index_t>> layer_shapes(const std::vector<index_t>& in) const {
    const auto x = probe_input(in);
    {
      const probe_scope probing(*reg_);
      (void)infer(x);
    }
    std::vector<std::vector<index_t>> out;
    // (a forward over ids records no value for its input: value 0 is the first result)
    const std::size_t first = std::is_integral_v<input_type> ? 0 : 1;
    for (std::size_t i = first; i < infer_tape_->values(); ++i) out.push_back(infer_tape_->value_shape(i));
    return out;
  }

  /// Calls f(index, layer) for every layer (registration order); layer is a
  /// detail::layer_ref: has_hooks(), counter()/set_counter() (dropout), name().
  template <class F>
  void for_each_layer(F&& f) {
    std::size_t i = 0;
    for (auto& e : reg_->layers) f(i++, *e.layer);
  }
  template <class F>
  void for_each_layer(F&& f) const {
    std::size_t i = 0;
    for (const auto& e : reg_->layers) f(i++, std::as_const(*e.layer));
  }
  /// Calls f(name, view) for every buffer (batch norm's running statistics and count),
  /// named as PyTorch names them ("layer1.bn1.running_mean").
  template <class F>
  void for_each_buffer(F&& f) {
    for (auto& b : reg_->buffers) {
      const std::string& name = b.first;
      std::visit([&](auto& view) { f(name, view); }, b.second);
    }
  }
  template <class F>
  void for_each_buffer(F&& f) const {
    for (const auto& b : reg_->buffers) {
      const std::string& name = b.first;
      std::visit([&](const auto& view) { f(name, ::locus::detail::as_view_const(view)); }, b.second);
    }
  }
  /// Every dropout layer draws rank `rank`'s stream (dist::data_parallel).
  void set_dropout_rank(std::uint64_t rank) noexcept {
    for (auto& e : reg_->layers) e.layer->set_rank_stream(rank);
  }

  /// Each layer by its dotted name with its parameter count, then the total.
  [[nodiscard]] std::string summary() const {
    std::string out;
    index_t total = 0;
    for (const auto& e : reg_->layers) {
      out += "  " + e.layer->name() + "  " + e.layer->describe() + "  " + std::to_string(e.layer->parameter_count()) + "\n";
      total += e.layer->parameter_count();
    }
    out += "  total: " + std::to_string(total) + " parameters\n";
    return out;
  }

  /// The tape of the last training forward (operations recorded, values).
  [[nodiscard]] const ag::tape<C, device>& tape() const noexcept { return *tape_; }

 private:
  /// registry::probing for the scope of a shape query (exceptions included).
  struct probe_scope {
    detail::registry<device, policy>& r;
    explicit probe_scope(detail::registry<device, policy>& reg) noexcept : r(reg) { r.probing = true; }
    ~probe_scope() { r.probing = false; }
    probe_scope(const probe_scope&) = delete;
    probe_scope& operator=(const probe_scope&) = delete;
  };
  static input_arg enter(ag::tape<C, device>& t, const input_view& x) {
    if constexpr (std::is_integral_v<input_type>) return t.ids(x);
    else return t.constant(x);
  }
  tensor<input_type, device, input_rank> probe_input(const std::vector<index_t>& in) const {
    if (in.size() != input_rank)
      throw shape_error("locus: the model's forward takes a rank-" + std::to_string(input_rank) +
                        " input, but the shape given has rank " + std::to_string(in.size()));
    extents<input_rank> e{};
    for (std::size_t i = 0; i < input_rank; ++i) {
      if (in[i] < 0) throw shape_error("locus: a negative extent in the shape given to the model");
      e[i] = in[i];
    }
    return zeros<input_type, device>(e);
  }

  std::unique_ptr<detail::registry<device, policy>> reg_;
  std::unique_ptr<Net> net_;
  // (behind pointers: values point at their tape, and the model moves)
  std::unique_ptr<ag::tape<C, device>> tape_ = std::make_unique<ag::tape<C, device>>();
  std::unique_ptr<ag::tape<C, device>> infer_tape_ = std::make_unique<ag::tape<C, device>>();
  out_var out_;
  std::uint64_t seed_ = 0;
  // data parallel's buckets (backward with grads_final_ set)
  std::function<void(index_t)> grads_final_;
  std::vector<std::int64_t> pending_;  // per registry entry: its tape entries still to run backward
  std::size_t final_from_ = 0;         // registry entries [final_from_, end) are final
  index_t reported_ = 0;               // the last offset passed to grads_final_

  void report_final() {
    const auto& layers = reg_->layers;
    while (final_from_ > 0 && pending_[final_from_ - 1] == 0) --final_from_;
    const auto& entries = reg_->store.entries();
    for (std::size_t i = final_from_; i < layers.size(); ++i) {
      const auto* l = layers[i].layer;
      if (l->first_entry == l->end_entry) continue;  // no parameters
      const index_t first = entries[l->first_entry].offset;
      if (first < reported_) {
        reported_ = first;
        grads_final_(first);
      }
      return;
    }
  }
};

}  // namespace locus::nn
