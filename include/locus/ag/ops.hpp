// The differentiable operations over ag::var values (see ag/tape.hpp): element-wise
// arithmetic with bias broadcasting, scalar arithmetic, activations, exp and log,
// matmul, linear (fused with its activation: one tape entry, one GEMM epilogue),
// sum and mean, log_softmax, cross_entropy (log-softmax fused with the loss, as
// nn::cross_entropy), reshape and flatten; transpose, slice, concat, softmax and
// gather_rows are in ag/shapes.hpp, scaled_dot_product_attention in ag/attention.hpp,
// rms_norm and layer_norm in ag/norm.hpp and rope in ag/rope.hpp, all included at the end.
//
// Rules. Two values of different devices or dtypes in one operation are compile errors
// (the same `locus:` rules as tensors'); shapes that do not match are a shape_error
// naming both, before anything is recorded. Broadcasting: the second operand of +, -, *
// may have fewer axes than the first when its shape equals the first's trailing axes
// (a bias [F] over activations [N, F]); its gradient is the sum over the broadcast axes.
//
// Length: every operation here is a forward and a node with its backward side by side,
// sharing the detail helpers at the top (owner checks, put, scratch buffers); the seam
// for a split is per family (element-wise, GEMMs, reductions and losses, shapes,
// operations of your own), the layout family already in ag/shapes.hpp.
//
// Length (over 600 lines): the differentiable element-wise, matmul, reduction and loss
// operations share one pattern (record an entry, its backward as a lambda over saved
// views); the shape operations are already ag/shapes.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../amp/policy.hpp"
#include "../nn/kernels.hpp"
#include "../nn/loss.hpp"
#include "../ops/expr.hpp"
#include "../ops/matmul.hpp"
#include "../ops/reduce.hpp"
#include "tape.hpp"

namespace locus::ag {

namespace detail {
using ::locus::detail::act_kind;
using ::locus::detail::assign_expr;

template <class A, class B>
constexpr bool check_pair() {
  if constexpr (!::locus::detail::require_same_operand_device<typename A::device, typename B::device>()) return false;
  else return ::locus::detail::require_same_operand_dtype<typename A::value_type, typename B::value_type>();
}

template <class T, class D>
tape<T, D>& tape_of(const var<T, D, 0>&) = delete;

/// The tape both values belong to (each checked: same tape, this step).
template <class V>
auto& owner(const V& v, const char* what) {
  auto* t = access::tape_of(const_cast<V&>(v));
  if (t == nullptr)
    throw autograd_error(std::string("locus: ") + what + " got an empty value (default-constructed); make values "
                         "with a tape: tape.constant(x), tape.leaf(x), or an operation");
  if (!access::tape_current(v))  // checked before *t is touched: the tape may be gone
    throw autograd_error(std::string("locus: ") + what + " got a value of an earlier step: its tape was reset "
                         "(its memory is reused) or destroyed since; compute it again in this step's forward");
  t->check_owned(v, what);
  return *t;
}
template <class A, class B>
auto& owner(const A& a, const B& b, const char* what) {
  auto& t = owner(a, what);
  t.check_owned(b, what);
  return t;
}

/// A column sum over rows: dst[j] (= or +=) sum_i src[i * cols + j] (the bias gradient's
/// kernel: exact order, the same bits every run).
template <class D, class T>
void column_sum(const T* src, T* dst, index_t rows, index_t cols, bool overwrite) {
  ::locus::detail::bias_act_grad_kernel<T, T> k{src, nullptr, nullptr, nullptr, dst, rows, cols, act_kind::none};
  k.overwrite = overwrite;
  ::locus::detail::run_bias_act_grad<D>(k);
}

template <class T, class D, std::size_t R>
tensor_view<const T, D, R> with_shape(const T* p, const extents<R>& s, int gpu) noexcept {
  return {::locus::detail::raw_view_key{}, p, s, gpu};
}
template <class T, class D, std::size_t R>
tensor_view<T, D, R> with_shape_mut(T* p, const extents<R>& s, int gpu) noexcept {
  return {::locus::detail::raw_view_key{}, p, s, gpu};
}

/// dst = src (fresh) or dst += src.
template <class T, class D, std::size_t R, class E>
void put(const tensor_view<T, D, R>& dst, bool fresh, const E& src) {
  if (fresh) assign_expr(dst, ::locus::detail::to_expr(src));
  else dst += src;
}

template <class T, class D>
void ensure_flat(tensor<T, D, 1>& t, index_t n) {
  if (t.numel() < n || t.data_handle() == nullptr) {
    t = tensor<T, D, 1>();
    t = tensor<T, D, 1>(extents<1>{n > 0 ? n : 1});
  }
}

enum class binary_kind { add, sub, mul };

template <class T, class D, std::size_t RA, std::size_t RB>
struct binary_node final : node<T, D> {
  binary_kind kind{};
  std::uint32_t a = 0, b = 0, out = 0;
  tensor_view<const T, D, RA> av;
  tensor_view<const T, D, RB> bv;
  tensor<T, D, 1> scratch;  // a broadcast b's product term before its column sum

  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<RA>(out, av.shape());
    if (g.data_handle() == nullptr) return;
    if (t.wants_grad(a)) {
      auto [ga, fresh] = t.template grad_out<RA>(a, av.shape());
      if (kind == binary_kind::mul) put(ga, fresh, g * bv);
      else put(ga, fresh, g);
    }
    if (!t.wants_grad(b)) return;
    if constexpr (RA == RB) {
      auto [gb, fresh] = t.template grad_out<RB>(b, bv.shape());
      if (kind == binary_kind::mul) put(gb, fresh, g * av);
      else if (kind == binary_kind::sub) put(gb, fresh, -g);
      else put(gb, fresh, g);
    } else {
      const index_t cols = bv.numel();
      const index_t rows = cols == 0 ? 0 : av.numel() / cols;
      auto [gb, fresh] = t.template grad_out<RB>(b, bv.shape());
      const T* src = g.data_handle();
      if (kind != binary_kind::add) {
        ensure_flat(scratch, av.numel());
        const auto s = with_shape_mut<T, D, RA>(scratch.data_handle(), av.shape(), scratch.device_index());
        if (kind == binary_kind::mul) assign_expr(s, g * av);
        else assign_expr(s, -g);
        src = scratch.data_handle();
      }
      if (rows == 0 && fresh)
        ::locus::detail::launch_n<D>(gb.numel(),
                                     ::locus::detail::fill_value<T>{gb.data_handle(), ::locus::detail::scalar_cast<T>(0.0)});
      else column_sum<D>(src, gb.data_handle(), rows, cols, fresh);
    }
  }
};

template <binary_kind K, class T, class D, std::size_t RA, std::size_t RB>
var<T, D, RA> binary(const var<T, D, RA>& a, const var<T, D, RB>& b, const char* what) {
  auto& t = owner(a, b, what);
  const auto as = a.shape();
  const auto bs = b.shape();
  bool ok = true;
  for (std::size_t i = 0; i < RB; ++i) ok = ok && bs[i] == as[RA - RB + i];
  if (!ok)
    throw shape_error(std::string("locus: ") + what + " of values of shapes " + shape_text(as) + " and " +
                      shape_text(bs) + (RA == RB ? ": the shapes must be equal"
                                                 : ": the second must equal the first's trailing axes (a bias "
                                                   "[F] over [N, F])") +
                      "; nothing was recorded");
  const bool rg = a.requires_grad() || b.requires_grad();
  auto out = t.template result<RA>(as, rg);
  const auto o = t.writable(out);
  if constexpr (K == binary_kind::add) assign_expr(o, a.value() + b.value());
  else if constexpr (K == binary_kind::sub) assign_expr(o, a.value() - b.value());
  else assign_expr(o, a.value() * b.value());
  if (rg) {
    auto& n = t.template record<binary_node<T, D, RA, RB>>();
    n.kind = K;
    n.a = access::id(a);
    n.b = access::id(b);
    n.out = access::id(out);
    n.av = a.value();
    n.bv = b.value();
  }
  return out;
}

// Prevents: a + b where b has more axes than a (only the second operand broadcasts).
template <std::size_t RA, std::size_t RB>
constexpr bool require_broadcast_ranks() {
  static_assert(RB <= RA, "locus: the second operand of an ag:: operation has more axes than the first; only the "
                          "second broadcasts (a bias [F] over [N, F]): write x + b, not b + x, for sub: -(b - x)");
  return RB <= RA;
}

/// out = alpha * x + beta (scalar arithmetic).
template <class T, class D, std::size_t R>
struct affine_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  extents<R> shape{};
  double alpha = 1.0;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, shape);
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, shape);
    if (alpha == 1.0) put(gx, fresh, g);
    else put(gx, fresh, g * ::locus::detail::scalar_operand<T>(alpha));
  }
};

template <class T, class D, std::size_t R>
var<T, D, R> affine(const var<T, D, R>& x, double alpha, double beta, const char* what) {
  auto& t = owner(x, what);
  auto out = t.template result<R>(x.shape(), x.requires_grad());
  const auto o = t.writable(out);
  const auto sa = ::locus::detail::scalar_operand<T>(alpha);
  const auto sb = ::locus::detail::scalar_operand<T>(beta);
  if (beta == 0.0) assign_expr(o, x.value() * sa);
  else assign_expr(o, x.value() * sa + sb);
  if (x.requires_grad()) {
    auto& n = t.template record<affine_node<T, D, R>>();
    n.x = access::id(x);
    n.out = access::id(out);
    n.shape = x.shape();
    n.alpha = alpha;
  }
  return out;
}

/// y = act(x) with locus's activation kernels (relu, gelu, gelu_tanh, tanh, sigmoid).
template <class T, class D, std::size_t R>
struct activation_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  act_kind kind{};
  tensor_view<const T, D, R> xv, yv;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, yv.shape());
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, yv.shape());
    const bool uses_z = kind == act_kind::gelu || kind == act_kind::gelu_tanh;
    if (fresh) {
      ::locus::detail::launch_n<D>(yv.numel(), ::locus::detail::act_backward_kernel<T>{
                                                   g.data_handle(), uses_z ? xv.data_handle() : nullptr,
                                                   uses_z ? nullptr : yv.data_handle(), gx.data_handle(), kind});
    } else {
      ensure_flat(scratch, yv.numel());
      ::locus::detail::launch_n<D>(yv.numel(), ::locus::detail::act_backward_kernel<T>{
                                                   g.data_handle(), uses_z ? xv.data_handle() : nullptr,
                                                   uses_z ? nullptr : yv.data_handle(), scratch.data_handle(), kind});
      gx += with_shape<T, D, R>(scratch.data_handle(), yv.shape(), scratch.device_index());
    }
  }
  tensor<T, D, 1> scratch;
};

template <class T, class D, std::size_t R>
void check_contiguous_value(const var<T, D, R>& x, const char* what) {
  if (!x.value().is_contiguous())
    throw shape_error(std::string("locus: ") + what + " needs a contiguous value; give the tape a contiguous tensor "
                      "(x.clone())");
}

template <class T, class D, std::size_t R>
var<T, D, R> apply_activation(const var<T, D, R>& x, act_kind kind, const char* what) {
  auto& t = owner(x, what);
  check_contiguous_value(x, what);
  auto out = t.template result<R>(x.shape(), x.requires_grad());
  ::locus::detail::launch_n<D>(x.numel(), ::locus::detail::act_forward_kernel<T>{x.value().data_handle(),
                                                                                  t.writable(out).data_handle(), kind});
  if (x.requires_grad()) {
    auto& n = t.template record<activation_node<T, D, R>>();
    n.x = access::id(x);
    n.out = access::id(out);
    n.kind = kind;
    n.xv = x.value();
    n.yv = out.value();
  }
  return out;
}

enum class unary_kind { exp, log };

template <class T, class D, std::size_t R>
struct unary_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  unary_kind kind{};
  tensor_view<const T, D, R> xv, yv;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<R>(out, yv.shape());
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, yv.shape());
    if (kind == unary_kind::exp) put(gx, fresh, g * yv);
    else put(gx, fresh, g / xv);
  }
};

template <class T, class D, std::size_t R>
var<T, D, R> unary(const var<T, D, R>& x, unary_kind kind, const char* what) {
  auto& t = owner(x, what);
  auto out = t.template result<R>(x.shape(), x.requires_grad());
  if (kind == unary_kind::exp) assign_expr(t.writable(out), ::locus::exp(x.value()));
  else assign_expr(t.writable(out), ::locus::log(x.value()));
  if (x.requires_grad()) {
    auto& n = t.template record<unary_node<T, D, R>>();
    n.x = access::id(x);
    n.out = access::id(out);
    n.kind = kind;
    n.xv = x.value();
    n.yv = out.value();
  }
  return out;
}
}  // namespace detail

// ---- element-wise arithmetic -----------------------------------------------------------

template <class A, class B>
  requires(is_var_v<A> && is_var_v<B>)
auto operator+(const A& a, const B& b) {
  if constexpr (detail::check_pair<A, B>() && detail::require_broadcast_ranks<A::rank, B::rank>())
    return detail::binary<detail::binary_kind::add>(a, b, "ag: a + b");
}
template <class A, class B>
  requires(is_var_v<A> && is_var_v<B>)
auto operator-(const A& a, const B& b) {
  if constexpr (detail::check_pair<A, B>() && detail::require_broadcast_ranks<A::rank, B::rank>())
    return detail::binary<detail::binary_kind::sub>(a, b, "ag: a - b");
}
template <class A, class B>
  requires(is_var_v<A> && is_var_v<B>)
auto operator*(const A& a, const B& b) {
  if constexpr (detail::check_pair<A, B>() && detail::require_broadcast_ranks<A::rank, B::rank>())
    return detail::binary<detail::binary_kind::mul>(a, b, "ag: a * b");
}

/// Scalar arithmetic: x * s, s * x, x + s, s + x, x - s, s - x, -x, x / s.
template <class T, class D, std::size_t R>
var<T, D, R> operator*(const var<T, D, R>& x, double s) {
  return detail::affine(x, s, 0.0, "ag: x * s");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator*(double s, const var<T, D, R>& x) {
  return detail::affine(x, s, 0.0, "ag: s * x");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator/(const var<T, D, R>& x, double s) {
  return detail::affine(x, 1.0 / s, 0.0, "ag: x / s");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator+(const var<T, D, R>& x, double s) {
  return detail::affine(x, 1.0, s, "ag: x + s");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator+(double s, const var<T, D, R>& x) {
  return detail::affine(x, 1.0, s, "ag: s + x");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator-(const var<T, D, R>& x, double s) {
  return detail::affine(x, 1.0, -s, "ag: x - s");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator-(double s, const var<T, D, R>& x) {
  return detail::affine(x, -1.0, s, "ag: s - x");
}
template <class T, class D, std::size_t R>
var<T, D, R> operator-(const var<T, D, R>& x) {
  return detail::affine(x, -1.0, 0.0, "ag: -x");
}

// ---- activations and functions ------------------------------------------------------------
template <class T, class D, std::size_t R>
var<T, D, R> relu(const var<T, D, R>& x) {
  return detail::apply_activation(x, detail::act_kind::relu, "ag::relu");
}
/// GELU, exact (erf), as PyTorch's default.
template <class T, class D, std::size_t R>
var<T, D, R> gelu(const var<T, D, R>& x) {
  return detail::apply_activation(x, detail::act_kind::gelu, "ag::gelu");
}
/// GELU's tanh approximation (PyTorch's approximate="tanh").
template <class T, class D, std::size_t R>
var<T, D, R> gelu_tanh(const var<T, D, R>& x) {
  return detail::apply_activation(x, detail::act_kind::gelu_tanh, "ag::gelu_tanh");
}
template <class T, class D, std::size_t R>
var<T, D, R> tanh(const var<T, D, R>& x) {
  return detail::apply_activation(x, detail::act_kind::tanh, "ag::tanh");
}
template <class T, class D, std::size_t R>
var<T, D, R> sigmoid(const var<T, D, R>& x) {
  return detail::apply_activation(x, detail::act_kind::sigmoid, "ag::sigmoid");
}
template <class T, class D, std::size_t R>
var<T, D, R> exp(const var<T, D, R>& x) {
  return detail::unary(x, detail::unary_kind::exp, "ag::exp");
}
template <class T, class D, std::size_t R>
var<T, D, R> log(const var<T, D, R>& x) {
  return detail::unary(x, detail::unary_kind::log, "ag::log");
}

// ---- matmul and linear --------------------------------------------------------------------
namespace detail {
/// dst = a b (fresh) or dst += a b: an accumulating GEMM for f32/f64; f16/bf16 through
/// a scratch product and an addition (a GEMM does not accumulate into 16 bits).
template <class T, class D, class A, class B>
void gemm_put(const tensor_view<T, D, 2>& dst, bool fresh, const A& a, const B& b, tensor<T, D, 1>& scratch) {
  if (fresh) {
    matmul_into(dst, a, b);
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    matmul_into(dst, a, b, ::locus::accumulate);
  } else {
    ensure_flat(scratch, dst.numel());
    const auto s = with_shape_mut<T, D, 2>(scratch.data_handle(), dst.shape(), scratch.device_index());
    matmul_into(s, a, b);
    dst += std::as_const(s);
  }
}

template <class T, class D>
struct matmul_node final : node<T, D> {
  tensor<T, D, 1> scratch;
  std::uint32_t a = 0, b = 0, out = 0;
  tensor_view<const T, D, 2> av, bv;
  void backward(tape<T, D>& t) override {
    const extents<2> os{av.shape()[0], bv.shape()[1]};
    const auto g = t.template grad_in<2>(out, os);
    if (g.data_handle() == nullptr) return;
    if (t.wants_grad(a)) {  // dA = G B^T
      auto [ga, fresh] = t.template grad_out<2>(a, av.shape());
      gemm_put(ga, fresh, g, transpose(bv), scratch);
    }
    if (t.wants_grad(b)) {  // dB = A^T G
      auto [gb, fresh] = t.template grad_out<2>(b, bv.shape());
      gemm_put(gb, fresh, transpose(av), g, scratch);
    }
  }
};

/// y = act(x w^T + b): one GEMM with the bias and relu in its epilogue (other
/// activations: z kept, act applied after), and in backward the activation's
/// derivative and the bias gradient in one pass (as nn::linear).
template <class T, class D>
struct linear_node final : node<T, D> {
  std::uint32_t x = 0, w = 0, b = 0, out = 0;
  bool has_bias = false;
  act_kind act = act_kind::none;
  tensor_view<const T, D, 2> xv, wv, yv;
  tensor<T, D, 1> z, dz, scratch;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<2>(out, yv.shape());
    if (g.data_handle() == nullptr) return;
    const index_t n = yv.shape()[0], o = yv.shape()[1];
    tensor_view<const T, D, 2> d = g;
    const bool need_dz = act != act_kind::none;
    const bool bias_grad = has_bias && t.wants_grad(b);
    if (need_dz || bias_grad) {
      T* db = nullptr;
      bool overwrite = false;
      if (bias_grad) {
        auto [gb, fresh] = t.template grad_out<1>(b, extents<1>{o});
        db = gb.data_handle();
        overwrite = fresh;
      }
      if (need_dz) ensure_flat(dz, yv.numel());
      const bool uses_z = act == act_kind::gelu || act == act_kind::gelu_tanh;
      ::locus::detail::bias_act_grad_kernel<T, T> k{g.data_handle(), uses_z ? z.data_handle() : nullptr,
                                                    uses_z ? nullptr : yv.data_handle(),
                                                    need_dz ? dz.data_handle() : nullptr, db, n, o, act};
      k.overwrite = overwrite;
      ::locus::detail::run_bias_act_grad<D>(k);
      if (need_dz) d = with_shape<T, D, 2>(dz.data_handle(), yv.shape(), dz.device_index());
    }
    if (t.wants_grad(w)) {  // dW = dZ^T X
      auto [gw, fresh] = t.template grad_out<2>(w, wv.shape());
      gemm_put(gw, fresh, transpose(d), xv, scratch);
    }
    if (t.wants_grad(x)) {  // dX = dZ W
      auto [gx, fresh] = t.template grad_out<2>(x, xv.shape());
      gemm_put(gx, fresh, d, wv, scratch);
    }
  }
};

template <class T, class D>
var<T, D, 2> linear_impl(const var<T, D, 2>& x, const var<T, D, 2>& w, const var<T, D, 1>* b, act_kind act) {
  auto& t = owner(x, w, "ag::linear");
  if (b) t.check_owned(*b, "ag::linear");
  const index_t in = w.shape()[1], o = w.shape()[0];
  if (x.shape()[1] != in)
    throw shape_error("locus: ag::linear of an input " + shape_text(x.shape()) + " and a weight " +
                      shape_text(w.shape()) + ": the input's features (" + std::to_string(x.shape()[1]) +
                      ") must equal the weight's second extent (" + std::to_string(in) + ")");
  if (b && b->shape()[0] != o)
    throw shape_error("locus: ag::linear with a weight " + shape_text(w.shape()) + " and a bias " +
                      shape_text(b->shape()) + ": the bias needs " + std::to_string(o) + " elements");
  const bool rg = x.requires_grad() || w.requires_grad() || (b && b->requires_grad());
  auto out = t.template result<2>(extents<2>{x.shape()[0], o}, rg);
  const auto y = t.writable(out);
  linear_node<T, D>* n = rg ? &t.template record<linear_node<T, D>>() : nullptr;
  if (act == act_kind::none || act == act_kind::relu) {
    const ::locus::activation a = act == act_kind::relu ? ::locus::activation::relu : ::locus::activation::none;
    if (b) linear_into(y, x.value(), w.value(), b->value(), a);
    else linear_into(y, x.value(), w.value(), a);
  } else {  // the derivative needs z
    tensor<T, D, 1> local;
    tensor<T, D, 1>& zb = n ? n->z : local;
    ensure_flat(zb, y.numel());
    const auto zv = with_shape_mut<T, D, 2>(zb.data_handle(), y.shape(), zb.device_index());
    if (b) linear_into(zv, x.value(), w.value(), b->value());
    else linear_into(zv, x.value(), w.value());
    ::locus::detail::launch_n<D>(y.numel(), ::locus::detail::act_forward_kernel<T>{zb.data_handle(), y.data_handle(), act});
  }
  if (n) {
    n->x = access::id(x);
    n->w = access::id(w);
    n->has_bias = b != nullptr;
    n->b = b ? access::id(*b) : 0;
    n->out = access::id(out);
    n->act = act;
    n->xv = x.value();
    n->wv = w.value();
    n->yv = out.value();
  }
  return out;
}
}  // namespace detail

/// a [M, K] times b [K, N].
template <class A, class B>
  requires(is_var_v<A> && is_var_v<B>)
auto matmul(const A& a, const B& b) {
  if constexpr (detail::check_pair<A, B>()) {
    static_assert(A::rank == 2 && B::rank == 2, "locus: ag::matmul takes two rank-2 values ([M, K] and [K, N])");
    auto& t = detail::owner(a, b, "ag::matmul");
    if (a.shape()[1] != b.shape()[0])
      throw shape_error("locus: ag::matmul of " + detail::shape_text(a.shape()) + " and " +
                        detail::shape_text(b.shape()) + ": the inner extents differ");
    using T = typename A::value_type;
    using D = typename A::device;
    const bool rg = a.requires_grad() || b.requires_grad();
    auto out = t.template result<2>(extents<2>{a.shape()[0], b.shape()[1]}, rg);
    matmul_into(t.writable(out), a.value(), b.value());
    if (rg) {
      auto& n = t.template record<detail::matmul_node<T, D>>();
      n.a = detail::access::id(a);
      n.b = detail::access::id(b);
      n.out = detail::access::id(out);
      n.av = a.value();
      n.bv = b.value();
    }
    return out;
  }
}

/// The activation fused into ag::linear (relu in the GEMM's epilogue).
enum class fused { none, relu, gelu, gelu_tanh, tanh, sigmoid };

namespace detail {
constexpr act_kind kind_of(fused f) noexcept {
  switch (f) {
    case fused::relu: return act_kind::relu;
    case fused::gelu: return act_kind::gelu;
    case fused::gelu_tanh: return act_kind::gelu_tanh;
    case fused::tanh: return act_kind::tanh;
    case fused::sigmoid: return act_kind::sigmoid;
    case fused::none: break;
  }
  return act_kind::none;
}
}  // namespace detail

// Prevents: a linear over values of two devices or dtypes ("no matching function").
template <class X, class W, class B>
  requires(is_var_v<X> && is_var_v<W> && is_var_v<B> &&
           !(std::is_same_v<typename X::value_type, typename W::value_type> &&
             std::is_same_v<typename X::value_type, typename B::value_type> &&
             std::is_same_v<typename X::device, typename W::device> &&
             std::is_same_v<typename X::device, typename B::device>))
int linear(const X&, const W&, const B&, fused = fused::none) {
  if constexpr (detail::check_pair<X, W>()) (void)detail::check_pair<X, B>();
  return 0;
}

/// act(x w^T + b): x [N, in], w [out, in] (PyTorch's layout), b [out]; one tape entry.
template <class T, class D>
var<T, D, 2> linear(const var<T, D, 2>& x, const var<T, D, 2>& w, const var<T, D, 1>& b, fused act = fused::none) {
  return detail::linear_impl(x, w, &b, detail::kind_of(act));
}
template <class T, class D>
var<T, D, 2> linear(const var<T, D, 2>& x, const var<T, D, 2>& w, fused act = fused::none) {
  return detail::linear_impl<T, D>(x, w, nullptr, detail::kind_of(act));
}

// ---- reductions ---------------------------------------------------------------------------
namespace detail {
template <class T, class D, std::size_t R>
struct reduce_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  extents<R> shape{};
  double scale = 1.0;  // 1 for sum, 1/n for mean
  tensor<T, D, 0> acc;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<0>(out, extents<0>{});
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<R>(x, shape);
    if (scale == 1.0) put(gx, fresh, g * ::locus::detail::scalar_operand<T>(1.0));
    else put(gx, fresh, g * ::locus::detail::scalar_operand<T>(scale));
  }
};

template <::locus::detail::reduce_kind K, class T, class D, std::size_t R>
var<T, D, 0> reduce(const var<T, D, R>& x, const char* what) {
  auto& t = owner(x, what);
  auto& n = t.template record<reduce_node<T, D, R>>();
  try {
    if (n.acc.data_handle() == nullptr) n.acc = tensor<T, D, 0>(extents<0>{});
    ::locus::detail::reduce_all_into<K>(::locus::detail::to_expr(x.value()), n.acc, 0.0);
  } catch (...) {
    t.unrecord();
    throw;
  }
  // the node owns the result's memory (stable until the node is reused next step)
  auto out = t.template alias<0>(std::as_const(n.acc).view(), x.requires_grad());
  n.x = access::id(x);
  n.out = access::id(out);
  n.shape = x.shape();
  n.scale = K == ::locus::detail::reduce_kind::mean ? (x.numel() > 0 ? 1.0 / static_cast<double>(x.numel()) : 0.0)
                                                      : 1.0;
  return out;
}
}  // namespace detail

/// The sum of every element (rank 0).
template <class T, class D, std::size_t R>
var<T, D, 0> sum(const var<T, D, R>& x) {
  return detail::reduce<::locus::detail::reduce_kind::sum>(x, "ag::sum");
}
/// The mean of every element (rank 0); of no elements: NaN, as PyTorch.
template <class T, class D, std::size_t R>
var<T, D, 0> mean(const var<T, D, R>& x) {
  return detail::reduce<::locus::detail::reduce_kind::mean>(x, "ag::mean");
}

// ---- log_softmax and cross_entropy ------------------------------------------------------
namespace detail {
/// Row r of y = log_softmax(x) over `cols` columns (max-shifted, in compute_t<T>).
/// A row's maximum m and sum of exp(x - m) (compute_t<T>): softmax's and log_softmax's
/// first two passes.
template <class T>
LOCUS_HOST_DEVICE inline void row_max_sum(const T* xr, index_t cols, ::locus::detail::compute_t<T>& m,
                                          ::locus::detail::compute_t<T>& s) {
  using C = ::locus::detail::compute_t<T>;
  m = ::locus::detail::load(xr[0]);
  for (index_t j = 1; j < cols; ++j) {
    const C v = ::locus::detail::load(xr[j]);
    m = v > m ? v : m;
  }
  s = C(0);
  for (index_t j = 0; j < cols; ++j) s += ::locus::detail::m_exp(::locus::detail::load(xr[j]) - m);
}

template <class T>
struct log_softmax_rows {
  const T* x;
  T* y;
  index_t cols;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    using C = ::locus::detail::compute_t<T>;
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    C m, s;
    row_max_sum(xr, cols, m, s);
    const C lse = m + ::locus::detail::m_log(s);
    for (index_t j = 0; j < cols; ++j) yr[j] = ::locus::detail::store<T>(::locus::detail::load(xr[j]) - lse);
  }
};
/// Row r of gx (= or +=) g - exp(y) * sum(g) (log_softmax's backward).
template <class T>
struct log_softmax_back_rows {
  const T* g;
  const T* y;
  T* gx;
  index_t cols;
  bool overwrite;
  LOCUS_HOST_DEVICE void operator()(index_t r) const {
    using C = ::locus::detail::compute_t<T>;
    const T* gr = g + r * cols;
    const T* yr = y + r * cols;
    T* out = gx + r * cols;
    C s(0);
    for (index_t j = 0; j < cols; ++j) s += ::locus::detail::load(gr[j]);
    for (index_t j = 0; j < cols; ++j) {
      const C v = ::locus::detail::load(gr[j]) - ::locus::detail::m_exp(::locus::detail::load(yr[j])) * s;
      out[j] = ::locus::detail::store<T>(overwrite ? v : ::locus::detail::load(out[j]) + v);
    }
  }
};

template <class T, class D>
struct log_softmax_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  tensor_view<const T, D, 2> yv;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<2>(out, yv.shape());
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<2>(x, yv.shape());
    ::locus::detail::launch_n<D>(yv.shape()[0], log_softmax_back_rows<T>{g.data_handle(), yv.data_handle(),
                                                                          gx.data_handle(), yv.shape()[1], fresh},
                                 yv.shape()[1]);
  }
};

template <class T>
struct policy_of {
  using type = amp::fp32;
};
template <>
struct policy_of<double> {
  using type = amp::fp64;
};
template <>
struct policy_of<::locus::bf16> {
  using type = amp::bf16_mixed;
};
template <>
struct policy_of<::locus::f16> {
  using type = amp::fp16_mixed;
};

template <class T, class D>
struct cross_entropy_node final : node<T, D> {
  using state_t = ::locus::nn::cross_entropy_state<D, typename policy_of<T>::type>;
  using A = typename state_t::A;
  std::uint32_t x = 0, out = 0;
  extents<2> shape{};
  std::unique_ptr<state_t> state;
  float smoothing = -1.0f;
  tensor<A, D, 0> loss;
  tensor<T, D, 0> value;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<0>(out, extents<0>{});
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<2>(x, shape);
    put(gx, fresh, state->grad() * g);
  }
};
}  // namespace detail

/// log(softmax(x)) along the last axis of [N, K] values (max-shifted: stable).
template <class T, class D>
var<T, D, 2> log_softmax(const var<T, D, 2>& x) {
  auto& t = detail::owner(x, "ag::log_softmax");
  detail::check_contiguous_value(x, "ag::log_softmax");
  auto out = t.template result<2>(x.shape(), x.requires_grad());
  if (x.shape()[1] > 0)
    ::locus::detail::launch_n<D>(x.shape()[0], detail::log_softmax_rows<T>{x.value().data_handle(),
                                                                           t.writable(out).data_handle(), x.shape()[1]},
                                 x.shape()[1]);
  if (x.requires_grad()) {
    auto& n = t.template record<detail::log_softmax_node<T, D>>();
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.yv = out.value();
  }
  return out;
}

/// The mean cross-entropy of logits [N, K] against i64 labels [N] on the same device,
/// with optional label smoothing: nn::cross_entropy's fused kernel, one tape entry. A
/// label outside [0, K) is an index_error (at once on host devices; on cuda at the next
/// check, as nn::cross_entropy).
template <class T, class D>
var<T, D, 0> cross_entropy(const var<T, D, 2>& logits, const tensor_view<const std::int64_t, D, 1>& labels,
                           float label_smoothing = 0.0f) {
  auto& t = detail::owner(logits, "ag::cross_entropy");
  if (labels.shape()[0] != logits.shape()[0])
    throw shape_error("locus: ag::cross_entropy of logits " + detail::shape_text(logits.shape()) + " and labels " +
                      detail::shape_text(labels.shape()) + ": one label per row");
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    throw value_error("locus: ag::cross_entropy label_smoothing must be in [0, 1], got " +
                      std::to_string(label_smoothing));
  detail::check_contiguous_value(logits, "ag::cross_entropy");
  if (!labels.is_contiguous())
    throw shape_error("locus: ag::cross_entropy needs contiguous labels; pass a tensor or a contiguous view");
  auto& n = t.template record<detail::cross_entropy_node<T, D>>();
  struct undo {  // a failure below (a label out of range) takes the entry back
    tape<T, D>& t;
    bool armed = true;
    ~undo() {
      if (armed) t.unrecord();
    }
  } guard{t};
  if (!n.state || n.smoothing != label_smoothing) {
    n.state = std::make_unique<typename detail::cross_entropy_node<T, D>::state_t>(
        ::locus::nn::cross_entropy{.label_smoothing = label_smoothing});
    n.smoothing = label_smoothing;
  }
  if (n.loss.data_handle() == nullptr) {
    n.loss = tensor<typename detail::cross_entropy_node<T, D>::A, D, 0>(extents<0>{});
    n.value = tensor<T, D, 0>(extents<0>{});
  }
  n.state->forward_into(n.loss, logits.value(), labels);
  ::locus::detail::assign_expr(n.value.view(), ::locus::cast<T>(std::as_const(n.loss).view()));
  auto out = t.template alias<0>(std::as_const(n.value).view(), logits.requires_grad());
  guard.armed = false;
  n.x = detail::access::id(logits);
  n.out = detail::access::id(out);
  n.shape = logits.shape();
  return out;
}
template <class T, class D>
var<T, D, 0> cross_entropy(const var<T, D, 2>& logits, const tensor<std::int64_t, D, 1>& labels,
                           float label_smoothing = 0.0f) {
  return cross_entropy(logits, labels.view(), label_smoothing);
}

// ---- shapes -------------------------------------------------------------------------------
namespace detail {
template <class T, class D, std::size_t RI, std::size_t RO>
struct reshape_node final : node<T, D> {
  std::uint32_t x = 0, out = 0;
  extents<RI> in{};
  extents<RO> os{};
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<RO>(out, os);
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<RI>(x, in);
    put(gx, fresh, with_shape<T, D, RI>(g.data_handle(), in, g.device_index()));
  }
};
}  // namespace detail

/// The same elements in another shape of the same element count (a view: no copy; the
/// value must be contiguous).
template <class T, class D, std::size_t R, std::size_t R2>
var<T, D, R2> reshape(const var<T, D, R>& x, const extents<R2>& shape) {
  auto& t = detail::owner(x, "ag::reshape");
  detail::check_contiguous_value(x, "ag::reshape");
  const auto v = x.value().reshape(shape);  // shape_error naming both when the counts differ
  auto out = t.template alias<R2>(v, x.requires_grad());
  if (x.requires_grad()) {
    auto& n = t.template record<detail::reshape_node<T, D, R, R2>>();
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.in = x.shape();
    n.os = shape;
  }
  return out;
}
template <class T, class D, std::size_t R, std::size_t R2>
var<T, D, R2> reshape(const var<T, D, R>& x, const index_t (&shape)[R2]) {
  extents<R2> s{};
  for (std::size_t i = 0; i < R2; ++i) s[i] = shape[i];
  return reshape(x, s);
}
/// [N, ...] as [N, the other extents multiplied] (PyTorch's flatten(1)).
template <class T, class D, std::size_t R>
var<T, D, 2> flatten(const var<T, D, R>& x) {
  static_assert(R >= 1, "locus: ag::flatten needs a value with a batch axis (rank 1 or more)");
  index_t rest = 1;  // the other extents multiplied (an empty batch keeps them: [0, 3, 4] -> [0, 12])
  for (std::size_t i = 1; i < R; ++i) rest *= x.shape()[i];
  return reshape(x, extents<2>{x.shape()[0], rest});
}

}  // namespace locus::ag

// ---- operations of your own ---------------------------------------------------------------
namespace locus::ag {
namespace detail {
template <class F, class T, class D, std::size_t RI, std::size_t RO>
struct custom_unary_node final : node<T, D> {
  std::optional<F> fn;
  std::uint32_t x = 0, out = 0;
  tensor_view<const T, D, RI> xv;
  tensor_view<const T, D, RO> yv;
  tensor<T, D, 1> scratch;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<RO>(out, yv.shape());
    if (g.data_handle() == nullptr || !t.wants_grad(x)) return;
    auto [gx, fresh] = t.template grad_out<RI>(x, xv.shape());
    if (fresh) {
      fn->backward(g, xv, yv, gx);
    } else {
      ensure_flat(scratch, xv.numel());
      const auto s = with_shape_mut<T, D, RI>(scratch.data_handle(), xv.shape(), scratch.device_index());
      fn->backward(g, xv, yv, s);
      gx += std::as_const(s);
    }
  }
};

template <class F, class T, class D, std::size_t RA, std::size_t RB, std::size_t RO>
struct custom_binary_node final : node<T, D> {
  std::optional<F> fn;
  std::uint32_t a = 0, b = 0, out = 0;
  tensor_view<const T, D, RA> av;
  tensor_view<const T, D, RB> bv;
  tensor_view<const T, D, RO> yv;
  tensor<T, D, 1> sa, sb;
  void backward(tape<T, D>& t) override {
    const auto g = t.template grad_in<RO>(out, yv.shape());
    if (g.data_handle() == nullptr) return;
    const bool wa = t.wants_grad(a), wb = t.wants_grad(b);
    if (!wa && !wb) return;
    // the function writes both gradients into scratch; they are then stored or added
    ensure_flat(sa, av.numel());
    ensure_flat(sb, bv.numel());
    const auto ga = with_shape_mut<T, D, RA>(sa.data_handle(), av.shape(), sa.device_index());
    const auto gb = with_shape_mut<T, D, RB>(sb.data_handle(), bv.shape(), sb.device_index());
    fn->backward(g, av, bv, yv, ga, gb);
    if (wa) {
      auto [dst, fresh] = t.template grad_out<RA>(a, av.shape());
      put(dst, fresh, std::as_const(ga));
    }
    if (wb) {
      auto [dst, fresh] = t.template grad_out<RB>(b, bv.shape());
      put(dst, fresh, std::as_const(gb));
    }
  }
};
}  // namespace detail

/// A differentiable operation of your own on one value: `fn` (copied into the tape
/// entry) has
///   extents<RO> shape(const extents<RI>& in) const;      the output's shape
///   void forward(out, x);                                out: tensor_view<T, D, RO>
///   void backward(grad_out, x, out, grad_x);             grad_x: written (not added)
/// with x, out and grad_out views of const T. Its forward and backward may use any
/// locus operation on those views (expressions, matmul_into, reductions). Check it
/// against finite differences, as tests/test_autograd.cpp does.
template <class F, class T, class D, std::size_t RI>
auto apply(const F& fn, const var<T, D, RI>& x) {
  auto& t = detail::owner(x, "ag::apply");
  using shape_t = decltype(fn.shape(x.shape()));
  constexpr std::size_t RO = std::tuple_size_v<shape_t>;
  const extents<RO> os = fn.shape(x.shape());
  auto out = t.template result<RO>(os, x.requires_grad());
  if (x.requires_grad()) {
    auto& n = t.template record<detail::custom_unary_node<F, T, D, RI, RO>>();
    n.fn.emplace(fn);
    n.x = detail::access::id(x);
    n.out = detail::access::id(out);
    n.xv = x.value();
    n.yv = out.value();
    n.fn->forward(t.writable(out), x.value());
  } else {
    F copy = fn;
    copy.forward(t.writable(out), x.value());
  }
  return out;
}

// Prevents: ag::apply over values of two devices or dtypes ("no matching function").
template <class F, class A, class B>
  requires(is_var_v<A> && is_var_v<B> &&
           !(std::is_same_v<typename A::value_type, typename B::value_type> &&
             std::is_same_v<typename A::device, typename B::device>))
int apply(const F&, const A&, const B&) {
  (void)detail::check_pair<A, B>();
  return 0;
}

/// The same for two values: shape(a, b), forward(out, a, b),
/// backward(grad_out, a, b, out, grad_a, grad_b) (both gradients written).
template <class F, class T, class D, std::size_t RA, std::size_t RB>
auto apply(const F& fn, const var<T, D, RA>& a, const var<T, D, RB>& b) {
  auto& t = detail::owner(a, b, "ag::apply");
  using shape_t = decltype(fn.shape(a.shape(), b.shape()));
  constexpr std::size_t RO = std::tuple_size_v<shape_t>;
  const extents<RO> os = fn.shape(a.shape(), b.shape());
  const bool rg = a.requires_grad() || b.requires_grad();
  auto out = t.template result<RO>(os, rg);
  if (rg) {
    auto& n = t.template record<detail::custom_binary_node<F, T, D, RA, RB, RO>>();
    n.fn.emplace(fn);
    n.a = detail::access::id(a);
    n.b = detail::access::id(b);
    n.out = detail::access::id(out);
    n.av = a.value();
    n.bv = b.value();
    n.yv = out.value();
    n.fn->forward(t.writable(out), a.value(), b.value());
  } else {
    F copy = fn;
    copy.forward(t.writable(out), a.value(), b.value());
  }
  return out;
}
}  // namespace locus::ag

// The layout operations and softmax (transpose, slice, concat, softmax, gather_rows), and
// fused scaled dot-product attention, RMS normalisation.
#include "shapes.hpp"
#include "attention.hpp"
#include "norm.hpp"
#include "rope.hpp"
