// Functional parameters: a weight of a module's own, outside any locus layer (a
// learned scale, a positional table, an attention's projection written with ag::matmul).
//
//   template <class D, class P>
//   struct scaled : locus::nn::module<D, P> {
//     locus::nn::layer<locus::nn::linear<D, P>> fc{this, "fc", 16, 8};
//     locus::nn::param<D, P, 1> gain{this, "gain", {8}, locus::nn::param_init::ones()};
//     auto forward(const typename scaled::template var<2>& x) { return fc(x) * gain.on(x); }
//   };
//
// The parameter lives in the model's one parameter_store under "<module prefix><name>"
// (so optimizers, clipping, the scaler, checkpoints and nn::save/nn::load see it as any
// layer's weight) and is initialised from Philox(seed) as layers are. p.on(x) is the
// parameter as a value of x's tape: a leaf over the store's compute copy, followed on
// the tape by one entry that moves the gradient that reached the leaf into the store
// (written where discard_grad left it, added otherwise; cast to the master dtype under
// mixed precision). It may be used any number of times in one forward: the
// contributions add. In inference it is a constant. Its device and policy are the
// module's (a compile error otherwise).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../ops/random.hpp"
#include "module.hpp"

namespace locus::nn {

/// How an nn::param is initialised by the model's reset_parameters(seed).
struct param_init {
  enum class kind { zeros, constant, uniform, normal };
  kind how = kind::zeros;
  double a = 0.0, b = 0.0;
  static param_init zeros() noexcept { return {}; }
  static param_init ones() noexcept { return {kind::constant, 1.0, 0.0}; }
  static param_init constant(double v) noexcept { return {kind::constant, v, 0.0}; }
  /// U(lo, hi), as layers draw their weights.
  static param_init uniform(double lo, double hi) noexcept { return {kind::uniform, lo, hi}; }
  /// mean + stddev * N(0, 1) (Box-Muller in f64).
  static param_init normal(double mean, double stddev) noexcept { return {kind::normal, mean, stddev}; }
};

namespace detail {
template <class V, class = void>
struct compute_of {
  using type = void;
};
template <class V>
struct compute_of<V, std::void_t<typename V::compute_type>> {
  using type = typename V::compute_type;
};

/// dst[i] = mean + sd * N(0, 1) from Philox (seed, i, stream).
template <class M>
struct normal_init_kernel {
  M* dst;
  std::uint64_t seed, stream;
  double mean, sd;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const ::locus::detail::philox_out r = ::locus::detail::philox4x32(seed, static_cast<std::uint64_t>(i), stream);
    const double u1 = 1.0 - ::locus::detail::uniform_double(r.v[0], r.v[1]);  // (0, 1]
    const double u2 = ::locus::detail::uniform_double(r.v[2], r.v[3]);
    const double z = ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
    dst[i] = static_cast<M>(::fma(sd, z, mean));
  }
};
}  // namespace detail

/// A parameter of rank R (1 to 4) of a module on device D with policy Policy (see the
/// header).
template <Device D, class Policy, std::size_t R>
class param final : public detail::layer_ref {
  static_assert(R >= 1 && R <= 4, "locus: nn::param has rank 1 to 4");

 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using M = typename policy::master;

  template <class Parent>
  param(Parent* parent, std::string name, const extents<R>& shape, param_init init = param_init::zeros())
      : shape_(shape), init_(init) {
    if constexpr (same_place<Parent>()) declare(parent, name, shape, init);
  }
  param(const param&) = delete;
  param& operator=(const param&) = delete;

 private:
  // Prevents: a parameter on another device or policy than its module (one error line:
  // the declaration below is not instantiated then).
  template <class Parent>
  static constexpr bool same_place() {
    constexpr bool ok = std::is_same_v<typename Parent::device, D> && std::is_same_v<typename Parent::policy, policy>;
    static_assert(ok, "locus: an nn::param lives on another device or precision policy than its module (it would "
                      "live apart from the model's store); declare it with the module's: nn::param<D, P, 1>");
    return ok;
  }
  template <class Parent>
  void declare(Parent* parent, const std::string& name, const extents<R>& shape, param_init init) {
    auto* reg = parent->registry();
    if (detail::current_registry<D, policy>() != reg)
      throw ::locus::error("locus: parameter '" + parent->prefix() + name +
                           "' was made after its model was built (inside forward?); a parameter is a member of its "
                           "module, constructed with it");
    if (init.how == param_init::kind::uniform && !(init.a < init.b))
      throw value_error("locus: nn::param '" + parent->prefix() + name + "' uniform(lo, hi) needs lo < hi");
    if (init.how == param_init::kind::normal && !(init.b >= 0.0))
      throw value_error("locus: nn::param '" + parent->prefix() + name + "' normal(mean, stddev) needs stddev >= 0");
    name_ = detail::claim_name(*reg, parent->prefix(), name, "parameter");
    const std::size_t first = reg->store.entries().size();
    if constexpr (R == 1) index_ = reg->store.add(name_, {shape[0]});
    else if constexpr (R == 2) index_ = reg->store.add(name_, {shape[0], shape[1]});
    else if constexpr (R == 3) index_ = reg->store.add(name_, {shape[0], shape[1], shape[2]});
    else index_ = reg->store.add(name_, {shape[0], shape[1], shape[2], shape[3]});
    typename detail::registry<D, policy>::entry e;
    e.layer = this;
    e.bind = [this](parameter_store<D, policy>& s) { store_ = &s; };
    e.reset = [this](std::uint64_t seed) { reset(seed); };
    e.buffers = [](auto&) {};
    reg->add(std::move(e), first);
  }

 public:

  /// The parameter as a value of x's tape (see the header); x a value or a forward's ids.
  template <class V>
    requires(ag::is_var_v<V> || ag::is_ids_v<V>)
  ag::var<C, D, R> on(const V& x) {
    using VC = std::conditional_t<ag::is_ids_v<V>, typename detail::compute_of<V>::type, typename V::value_type>;
    if constexpr (!std::is_same_v<typename V::device, D> || !std::is_same_v<VC, C>) {
      static_assert(::locus::detail::always_false<V>,
                    "locus: nn::param::on(x) of a value of another device or dtype than the module's");
      return {};
    } else {
      auto& t = ag::detail::owner(x, "nn::param::on");
      const auto w = store_->template compute<R>(index_);
      if (!t.training()) return t.constant(w);
      // counted against the model's step (a checkpointed segment's tape belongs to it)
      const auto* seg = detail::current_segment();
      const void* step_tape = seg != nullptr ? seg->outer_tape : static_cast<const void*>(&t);
      const std::uint64_t step = seg != nullptr ? seg->outer_generation : t.generation();
      if (use_tape_ == step_tape && use_step_ == step) {
        ++uses_;
      } else {
        use_tape_ = step_tape;
        use_step_ = step;
        uses_ = 1;
      }
      auto v = t.leaf(w);
      auto& n = t.template record<sink>();
      n.self = this;
      n.id = ag::detail::access::id(v);
      return v;
    }
  }

  /// Its master weights and gradient (to read, or to set by hand: then call the
  /// store's sync_compute() under a mixed policy).
  [[nodiscard]] tensor_view<M, D, R> master() noexcept { return store_->template master<R>(index_); }
  [[nodiscard]] tensor_view<M, D, R> grad() { return store_->template grad<R>(index_); }
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  [[nodiscard]] const extents<R>& shape() const noexcept { return shape_; }

  // layer_ref: a parameter has no hooks, dropout stream or activations
  [[nodiscard]] bool has_hooks() const override { return false; }
  [[nodiscard]] std::uint64_t counter() const override { return 0; }
  void set_counter(std::uint64_t) override {}
  void set_rank_stream(std::uint64_t) override {}
  [[nodiscard]] std::string describe() const override { return "param " + ::locus::detail::shape_string(shape_); }
  [[nodiscard]] index_t parameter_count() const override { return ::locus::detail::numel_of(shape_); }
  [[nodiscard]] const std::string& name() const override { return name_; }
  void release_activations() noexcept override {}
  void checkpoint_save(int) override {}
  void checkpoint_restore(int) override {}
  void mark_called(const void*, std::uint64_t) noexcept override {}
  [[nodiscard]] std::int64_t uses(const void* tape, std::uint64_t generation) const noexcept override {
    return use_tape_ == tape && use_step_ == generation ? uses_ : 0;
  }

 private:
  /// Moves the gradient that reached the leaf into the store (runs after every
  /// consumer of the leaf: it was recorded before them).
  struct sink final : ag::node<C, D> {
    param* self = nullptr;
    std::uint32_t id = 0;
    void backward(ag::tape<C, D>& t) override {
      const auto g = t.template grad_in<R>(id, self->shape_);
      if (g.data_handle() != nullptr) {
        auto [dst, fresh] = self->store_->template grad_out<R>(self->index_);
        if constexpr (std::is_same_v<C, M>) {
          ag::detail::put(dst, fresh, g);
        } else {
          if (fresh) ::locus::detail::assign_expr(dst, ::locus::cast<M>(g));
          else dst += ::locus::cast<M>(g);
        }
      }
      self->grads_done();
    }
  };

  void reset(std::uint64_t seed) {
    const auto v = store_->master_flat(index_);
    const std::uint64_t stream = index_ + 1;
    switch (init_.how) {
      case param_init::kind::zeros:
      case param_init::kind::constant:
        ::locus::detail::launch_n<D>(v.numel(), ::locus::detail::fill_value<M>{
                                                    v.data_handle(), ::locus::detail::scalar_cast<M>(init_.a)});
        break;
      case param_init::kind::uniform:
        ::locus::detail::launch_n<D>(
            v.numel(), ::locus::detail::uniform_init_kernel<M>{v.data_handle(), seed, stream, init_.a, init_.b});
        break;
      case param_init::kind::normal:
        ::locus::detail::launch_n<D>(
            v.numel(), detail::normal_init_kernel<M>{v.data_handle(), seed, stream, init_.a, init_.b});
        break;
    }
  }

  extents<R> shape_;
  param_init init_;
  std::string name_;
  std::size_t index_ = 0;
  parameter_store<D, policy>* store_ = nullptr;
  // on() calls of the latest training step (data parallel's buckets: layer_ref::uses)
  const void* use_tape_ = nullptr;
  std::uint64_t use_step_ = 0;
  std::int64_t uses_ = 0;
};

}  // namespace locus::nn
