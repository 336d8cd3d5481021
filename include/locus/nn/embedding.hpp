// Embeddings for sequence models: token ids to vectors, and learned positions.
//
//   template <class D, class P>
//   struct lm : locus::nn::module<D, P> {
//     locus::nn::embedding<D, P> wte{this, "wte", 96, 64};            // "wte.weight" [96, 64]
//     locus::nn::positional_embedding<D, P> wpe{this, "wpe", 128, 64}; // "wpe.weight" [128, 64]
//     auto forward(const typename lm::template ids<2>& x) {            // [batch, time] int64
//       const auto h = wpe(wte(x));                                    // [batch, time, 64]
//       return ag::linear(ag::reshape(h, {...}), wte.weight().on(x));  // tied output projection
//     }
//   };
//
// nn::embedding<D, P> is PyTorch's nn.Embedding: a table [vocabulary, dim] named
// "<name>.weight", drawn from N(0, 1) unless another nn::param_init is given; called on
// ids of rank R (int64 or int32, tape.ids(x) or what nn::model passes) it gives the rows
// they pick, a value of rank R + 1. An id outside [0, vocabulary) is a value_error naming
// the id, its position and the vocabulary size, raised before anything is recorded (no
// parameter use, no tape entry). weight() is the table as an nn::param: weight().on(x)
// in the same forward ties an output projection to it (the gradients of both uses add).
//
// nn::positional_embedding<D, P> is GPT's learned position table wpe [context, dim]:
// called on a value [batch, time, dim] it adds rows 0 .. time-1 (one slice of the table,
// broadcast over the batch). A sequence longer than the context, or of another width, is
// a shape_error naming both, before anything is recorded. (RoPE, which has no
// parameters, is ag::rope.)
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "../ag/shapes.hpp"
#include "param.hpp"

namespace locus::nn {

namespace detail {
template <class X, class = void>
struct device_of {
  using type = void;
};
template <class X>
struct device_of<X, std::void_t<typename X::device>> {
  using type = typename X::device;
};

inline index_t positive_extent(index_t n, const std::string& what, const char* which) {
  if (n <= 0)
    throw value_error("locus: " + what + " needs a positive " + which + ", got " + std::to_string(n));
  return n;
}
}  // namespace detail

/// A token embedding (PyTorch's nn.Embedding; see the header).
template <Device D, class Policy>
class embedding {
 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;

  template <class Parent>
  embedding(Parent* parent, std::string name, index_t vocabulary, index_t dim,
            param_init init = param_init::normal(0.0, 1.0))
      : vocabulary_(detail::positive_extent(vocabulary, "nn::embedding '" + parent->prefix() + name + "'",
                                            "vocabulary size")),
        dim_(detail::positive_extent(dim, "nn::embedding '" + parent->prefix() + name + "'", "dimension")),
        name_(parent->prefix() + name),
        weight_(parent, name + ".weight", extents<2>{vocabulary, dim}, init) {
    parent->registry()->store.mark_embedding(weight_.index());
  }
  embedding(const embedding&) = delete;
  embedding& operator=(const embedding&) = delete;

  /// The rows the ids pick: [ids' shape..., dim].
  template <std::size_t R, class I>
  ag::var<C, D, R + 1> operator()(const ag::ids<C, D, R, I>& x) {
    (void)ag::detail::owner(x, "nn::embedding");
    const auto v = x.value();
    if (!v.is_contiguous())
      throw shape_error("locus: nn::embedding '" + name_ + "' needs contiguous ids; pass a tensor or a contiguous view");
    if (const auto bad = ag::detail::find_bad_id(v, vocabulary_))
      throw value_error("locus: nn::embedding '" + name_ + "': token id " + std::to_string(bad->id) +
                        " at position " + std::to_string(bad->position) + " is outside its vocabulary of " +
                        std::to_string(vocabulary_) + " ids [0, " + std::to_string(vocabulary_) +
                        "); nothing was recorded");
    return ag::detail::gather_checked_rows(weight_.on(x), v);  // (checked above: not twice)
  }
  // Prevents: looking up a value of floating-point features, or ids of another device or
  // precision policy than the embedding's.
  template <class X>
    requires(!ag::is_ids_v<X> || !std::is_same_v<typename detail::device_of<X>::type, D> ||
             !std::is_same_v<typename nn::detail::compute_of<X>::type, C>)
  ag::var<C, D, 2> operator()(const X&) {
    if constexpr (!ag::is_var_v<X> && !ag::is_ids_v<X>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::embedding takes a forward's ids (ag::ids: tape.ids(x), or the argument of "
                    "forward(const ids<2>& x)), not a tensor; a tensor enters a forward through its tape");
    else if constexpr (ag::is_var_v<X>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::embedding looks up integer token ids, but got a value of floating-point features; "
                    "write the forward over ids: auto forward(const typename Net::template ids<2>& x), or make "
                    "them with tape.ids(x)");
    else if constexpr (!std::is_same_v<typename detail::device_of<X>::type, D>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::embedding got ids of another device than its table; declare the embedding with "
                    "its module's device (nn::embedding<D, P>), or move the ids: locus::to<D>(ids)");
    else
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::embedding got ids of a tape of another compute dtype than its table's precision "
                    "policy; declare the embedding with its module's policy: nn::embedding<D, P>");
    return {};
  }

  /// The table as a parameter: weight().on(x) is it as a value (weight tying).
  [[nodiscard]] param<D, Policy, 2>& weight() noexcept { return weight_; }
  [[nodiscard]] const param<D, Policy, 2>& weight() const noexcept { return weight_; }
  [[nodiscard]] index_t vocabulary() const noexcept { return vocabulary_; }
  [[nodiscard]] index_t dim() const noexcept { return dim_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  index_t vocabulary_, dim_;
  std::string name_;
  param<D, Policy, 2> weight_;
};

/// Learned positions (GPT's wpe; see the header).
template <Device D, class Policy>
class positional_embedding {
 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;

  template <class Parent>
  positional_embedding(Parent* parent, std::string name, index_t context, index_t dim,
                       param_init init = param_init::normal(0.0, 1.0))
      : context_(detail::positive_extent(context, "nn::positional_embedding '" + parent->prefix() + name + "'",
                                         "context length")),
        dim_(detail::positive_extent(dim, "nn::positional_embedding '" + parent->prefix() + name + "'",
                                     "dimension")),
        name_(parent->prefix() + name),
        weight_(parent, name + ".weight", extents<2>{context, dim}, init) {
    parent->registry()->store.mark_embedding(weight_.index());
  }
  positional_embedding(const positional_embedding&) = delete;
  positional_embedding& operator=(const positional_embedding&) = delete;

  /// x [batch, time, dim] plus the positions 0 .. time-1.
  ag::var<C, D, 3> operator()(const ag::var<C, D, 3>& x) {
    (void)ag::detail::owner(x, "nn::positional_embedding");
    const auto s = x.shape();
    if (s[1] > context_)
      throw shape_error("locus: nn::positional_embedding '" + name_ + "': a sequence of " + std::to_string(s[1]) +
                        " positions is longer than its context of " + std::to_string(context_) +
                        " (input shape " + ::locus::detail::shape_string(s) +
                        "); crop the sequence or build the model with a longer context");
    if (s[2] != dim_)
      throw shape_error("locus: nn::positional_embedding '" + name_ + "' adds vectors of " + std::to_string(dim_) +
                        " to an input of shape " + ::locus::detail::shape_string(s) + " (last axis " +
                        std::to_string(s[2]) + ")");
    if (s[1] == 0)
      throw shape_error("locus: nn::positional_embedding '" + name_ + "' got an empty sequence (input shape " +
                        ::locus::detail::shape_string(s) + "); a sequence needs at least one position");
    return x + ag::slice(weight_.on(x), 0, 0, s[1]);
  }
  // Prevents: positions added to a value of another rank, device or policy.
  template <class X>
    requires(!std::is_same_v<X, ag::var<C, D, 3>>)
  ag::var<C, D, 3> operator()(const X&) {
    if constexpr (!ag::is_var_v<X>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::positional_embedding adds positions to a forward's value [batch, time, dim] (an "
                    "ag::var), not a tensor; a tensor enters a forward through its tape");
    else if constexpr (std::is_same_v<typename detail::device_of<X>::type, D> &&
                       std::is_same_v<typename X::value_type, C>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::positional_embedding adds positions to a value [batch, time, dim] of rank 3; "
                    "reshape it first: ag::reshape(x, {batch, time, dim})");
    else
      static_assert(::locus::detail::always_false<X>,
                    "locus: nn::positional_embedding adds positions to a value [batch, time, dim] of its module's "
                    "device and compute dtype (embed the ids first: wpe(wte(x)))");
    return {};
  }

  [[nodiscard]] param<D, Policy, 2>& weight() noexcept { return weight_; }
  [[nodiscard]] const param<D, Policy, 2>& weight() const noexcept { return weight_; }
  [[nodiscard]] index_t context() const noexcept { return context_; }
  [[nodiscard]] index_t dim() const noexcept { return dim_; }

 private:
  index_t context_, dim_;
  std::string name_;
  param<D, Policy, 2> weight_;
};

}  // namespace locus::nn
