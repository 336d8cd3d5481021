// Multi-head attention as a module member: PyTorch's nn.MultiheadAttention (without
// dropout, extra key/value biases or other key/value widths), over the fused
// ag::scaled_dot_product_attention.
//
//   template <class D, class P>
//   struct block : locus::nn::module<D, P> {
//     locus::nn::multi_head_attention<D, P> attn{this, "attn", 96, 4, {.causal = true, .batch_first = true}};
//     auto forward(const typename block::template var<3>& x) { return attn(x); }  // [B, T, 96]
//   };
//   // the sizes as template arguments: heads that do not divide the width do not compile
//   locus::nn::multi_head_attention<D, P, 96, 4> attn{this, "attn", {.causal = true}};
//
// Parameters under PyTorch's names and layout: "<name>.in_proj_weight" [3E, E] (the
// query, key and value projections stacked, in that order), "<name>.in_proj_bias" [3E],
// "<name>.out_proj.weight" [E, E] and "<name>.out_proj.bias" [E]; initialised as
// PyTorch's: in_proj_weight Xavier-uniform, U(-sqrt(6 / 4E), sqrt(6 / 4E)), out_proj's
// weight U(-1/sqrt(E), 1/sqrt(E)), both biases zero. So nn.MultiheadAttention's
// state_dict loads by name (nn::load) and a locus checkpoint loads into it. With
// {.bias = false} neither bias exists (PyTorch's bias=False).
//
// attn(x) is self-attention over x [T, B, E] ([B, T, E] with batch_first, as PyTorch's);
// attn(query, key, value) attends query [Tq, B, E] over key and value [Tk, B, E], with
// causal the lower-triangular mask from the top left (PyTorch's is_causal). Each gives
// the output of the query's layout (PyTorch's attn_output; its attention weights, which
// the fused kernel never forms, are not returned). Every head's T x T scores stay inside
// the fused kernel (see ag/attention.hpp): the extra memory is linear in T.
//
// Rules: the width E and the heads positive, the heads dividing E, and at most 256
// features per head (the fused kernel's limit): a value_error naming both when the layer
// is built, or, with the sizes as template arguments, a compile error; an input whose last extent is not E, or a key and value of other
// batches or lengths, is a shape_error naming the shapes before anything is recorded.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "../ag/attention.hpp"
#include "../ag/shapes.hpp"
#include "param.hpp"

namespace locus::nn {

/// Options of nn::multi_head_attention.
struct attention_layer_options {
  /// Query i attends keys 0..i only (a decoder's mask; PyTorch's is_causal).
  bool causal = false;
  /// Inputs and output [B, T, E] instead of [T, B, E] (PyTorch's batch_first).
  bool batch_first = false;
  /// in_proj_bias and out_proj.bias (PyTorch's bias).
  bool bias = true;
};

namespace detail {
/// The width after the checks of a multi_head_attention built with run-time sizes.
inline index_t checked_attention_width(const std::string& what, index_t width, index_t heads) {
  if (width <= 0 || heads <= 0)
    throw value_error("locus: " + what + " needs a positive width and head count, got width " + std::to_string(width) +
                      " and " + std::to_string(heads) + " heads");
  if (width % heads != 0)
    throw value_error("locus: " + what + ": " + std::to_string(heads) + " heads do not divide the width " +
                      std::to_string(width) + " (each head takes width / heads features); pick a divisor of " +
                      std::to_string(width));
  if (width / heads > ag::max_attention_head_dim)
    throw value_error("locus: " + what + ": width " + std::to_string(width) + " over " + std::to_string(heads) +
                      " heads gives heads of " + std::to_string(width / heads) + " features; the fused attention "
                      "takes at most " + std::to_string(ag::max_attention_head_dim) + " per head: use more heads");
  if (width > std::numeric_limits<index_t>::max() / 3)
    throw value_error("locus: " + what + ": width " + std::to_string(width) + " is too large (3 x width overflows)");
  return width;
}
}  // namespace detail

/// Multi-head attention (PyTorch's nn.MultiheadAttention; see the header). Width and
/// Heads given as template arguments (both or neither) are checked when it compiles.
template <Device D, class Policy, index_t Width = 0, index_t Heads = 0>
class multi_head_attention {
  static_assert((Width == 0) == (Heads == 0),
                "locus: nn::multi_head_attention<D, P, Width, Heads>: give both sizes as template arguments, or "
                "neither (then the constructor takes them)");
  static_assert(Width >= 0 && Heads >= 0,
                "locus: nn::multi_head_attention<D, P, Width, Heads>: the width and the head count must be positive");
  static_assert(Heads == 0 || Width % Heads == 0,
                "locus: nn::multi_head_attention<D, P, Width, Heads>: Heads does not divide Width (each head takes "
                "Width / Heads features); pick Heads among Width's divisors");
  static_assert(Heads == 0 || Width / Heads <= ag::max_attention_head_dim,
                "locus: nn::multi_head_attention<D, P, Width, Heads>: Width / Heads is over 256 features per head, "
                "more than the fused attention takes; use more heads");

 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  using value = ag::var<C, D, 3>;

  /// Sizes at run time: a value_error when heads do not divide the width.
  template <class Parent>
    requires(Width == 0)
  multi_head_attention(Parent* parent, const std::string& name, index_t width, index_t heads,
                       attention_layer_options o = {})
      : multi_head_attention(parent, name, width, heads, o, 0) {}
  /// Sizes as template arguments (checked when this compiles).
  template <class Parent>
    requires(Width > 0)
  multi_head_attention(Parent* parent, const std::string& name, attention_layer_options o = {})
      : multi_head_attention(parent, name, Width, Heads, o, 0) {}
  multi_head_attention(const multi_head_attention&) = delete;
  multi_head_attention& operator=(const multi_head_attention&) = delete;

  /// Self-attention over x [T, B, E] ([B, T, E] with batch_first): the output, x's layout.
  value operator()(const value& x) {
    check_input(x, "its input");
    const auto s = x.shape();
    const index_t rows = s[0] * s[1];
    const auto qkv = project(ag::reshape(x, extents<2>{rows, e_}), 0, 3 * e_);  // [rows, 3E]
    const auto part = [&](index_t p) { return heads_of(ag::slice(qkv, 1, p * e_, (p + 1) * e_), s); };
    return attend(part(0), part(1), part(2), s);
  }
  /// query [Tq, B, E] over key and value [Tk, B, E] (batch first: [B, T, E]): query's layout.
  value operator()(const value& query, const value& key, const value& val) {
    check_input(query, "its query");
    check_input(key, "its key");
    check_input(val, "its value");
    const auto qs = query.shape(), ks = key.shape(), vs = val.shape();
    const index_t bq = batch(qs), bk = batch(ks);
    if (bq != bk || ks != vs)
      throw shape_error("locus: " + what() + ": query " + ::locus::detail::shape_string(qs) + ", key " +
                        ::locus::detail::shape_string(ks) + " and value " + ::locus::detail::shape_string(vs) +
                        ": the key and the value must have one shape, and the batch of the query");
    const auto one = [&](const value& x, index_t p) {
      const auto xs = x.shape();
      return heads_of(project(ag::reshape(x, extents<2>{xs[0] * xs[1], e_}), p * e_, (p + 1) * e_), xs);
    };
    return attend(one(query, 0), one(key, 1), one(val, 2), qs);
  }
  // Prevents: a tensor, or a value of another rank, device or policy.
  template <class... X>
    requires((sizeof...(X) == 1 || sizeof...(X) == 3) && !(std::is_same_v<X, value> && ...))
  value operator()(const X&...) {
    constexpr bool vars = (ag::is_var_v<X> && ...);
    if constexpr (!vars)
      static_assert(::locus::detail::always_false<X...>,
                    "locus: nn::multi_head_attention runs over a forward's values (ag::var), not tensors; a tensor "
                    "enters a forward through its tape");
    else if constexpr (((std::is_same_v<typename X::device, D> && std::is_same_v<typename X::value_type, C>) && ...))
      static_assert(::locus::detail::always_false<X...>,
                    "locus: nn::multi_head_attention takes sequences of rank 3, [T, B, E] (or [B, T, E] with "
                    "batch_first); reshape them first: ag::reshape(x, {T, B, E})");
    else
      static_assert(::locus::detail::always_false<X...>,
                    "locus: nn::multi_head_attention takes values of its module's device and compute dtype; declare "
                    "it with its module's: nn::multi_head_attention<D, P>");
    return {};
  }

  [[nodiscard]] index_t width() const noexcept { return e_; }
  [[nodiscard]] index_t heads() const noexcept { return h_; }
  [[nodiscard]] const attention_layer_options& options() const noexcept { return o_; }
  [[nodiscard]] param<D, Policy, 2>& in_proj_weight() noexcept { return in_w_; }
  [[nodiscard]] param<D, Policy, 2>& out_proj_weight() noexcept { return out_w_; }
  /// The biases (a value_error with {.bias = false}).
  [[nodiscard]] param<D, Policy, 1>& in_proj_bias() { return bias_of(in_b_); }
  [[nodiscard]] param<D, Policy, 1>& out_proj_bias() { return bias_of(out_b_); }

 private:
  template <class Parent>
  multi_head_attention(Parent* parent, const std::string& name, index_t width, index_t heads,
                       attention_layer_options o, int)
      : name_(parent->prefix() + name),
        e_(detail::checked_attention_width("nn::multi_head_attention '" + name_ + "'", width, heads)),
        h_(heads),
        o_(o),
        in_w_(parent, name + ".in_proj_weight", extents<2>{3 * e_, e_},
              param_init::uniform(-std::sqrt(6.0 / (4.0 * static_cast<double>(e_))),
                                  std::sqrt(6.0 / (4.0 * static_cast<double>(e_))))),
        out_w_(parent, name + ".out_proj.weight", extents<2>{e_, e_},
               param_init::uniform(-1.0 / std::sqrt(static_cast<double>(e_)), 1.0 / std::sqrt(static_cast<double>(e_)))) {
    if (o.bias) {
      in_b_.emplace(parent, name + ".in_proj_bias", extents<1>{3 * e_}, param_init::zeros());
      out_b_.emplace(parent, name + ".out_proj.bias", extents<1>{e_}, param_init::zeros());
    }
  }

  [[nodiscard]] std::string what() const { return "nn::multi_head_attention '" + name_ + "'"; }
  [[nodiscard]] index_t batch(const extents<3>& s) const noexcept { return o_.batch_first ? s[0] : s[1]; }
  param<D, Policy, 1>& bias_of(std::optional<param<D, Policy, 1>>& b) {
    if (!b) throw value_error("locus: " + what() + " has no biases (built with {.bias = false})");
    return *b;
  }
  void check_input(const value& x, const char* which) const {
    const auto s = x.shape();
    if (s[2] != e_ || s[0] == 0 || s[1] == 0)
      throw shape_error("locus: " + what() + " of width " + std::to_string(e_) + ": " + which + " " +
                        ::locus::detail::shape_string(s) + " is not " + (o_.batch_first ? "[B, T, " : "[T, B, ") +
                        std::to_string(e_) + "] with B and T positive");
  }
  // x2 [rows, E] times rows [lo, hi) of in_proj (and its bias): [rows, hi - lo]
  ag::var<C, D, 2> project(const ag::var<C, D, 2>& x2, index_t lo, index_t hi) {
    auto w = in_w_.on(x2);
    if (lo != 0 || hi != 3 * e_) w = ag::slice(w, 0, lo, hi);
    if (!in_b_) return ag::linear(x2, w);
    auto b = in_b_->on(x2);
    if (lo != 0 || hi != 3 * e_) b = ag::slice(b, 0, lo, hi);
    return ag::linear(x2, w, b);
  }
  // [rows, E] of a sequence of shape s to [B, H, T, E / H]
  ag::var<C, D, 4> heads_of(const ag::var<C, D, 2>& p, const extents<3>& s) const {
    const auto r = ag::reshape(p, extents<4>{s[0], s[1], h_, e_ / h_});  // [B, T, H, d] or [T, B, H, d]
    return ag::transpose(o_.batch_first ? r : ag::transpose(r, 0, 1), 1, 2);
  }
  value attend(const ag::var<C, D, 4>& q, const ag::var<C, D, 4>& k, const ag::var<C, D, 4>& v, const extents<3>& qs) {
    const auto a = ag::transpose(ag::scaled_dot_product_attention(q, k, v, {.causal = o_.causal}), 1, 2);  // [B, T, H, d]
    const auto merged = ag::reshape(o_.batch_first ? a : ag::transpose(a, 0, 1), extents<2>{qs[0] * qs[1], e_});
    const auto y = out_b_ ? ag::linear(merged, out_w_.on(merged), out_b_->on(merged)) : ag::linear(merged, out_w_.on(merged));
    return ag::reshape(y, qs);
  }

  std::string name_;
  index_t e_, h_;
  attention_layer_options o_;
  param<D, Policy, 2> in_w_, out_w_;
  std::optional<param<D, Policy, 1>> in_b_, out_b_;
};

}  // namespace locus::nn
