// Recurrent layers as module members: PyTorch's nn.LSTM and nn.GRU (one direction, any
// number of stacked layers), over ag::lstm / ag::gru (one fused tape entry per layer).
//
//   template <class D, class P>
//   struct char_rnn : locus::nn::module<D, P> {
//     locus::nn::embedding<D, P> emb{this, "emb", 96, 32};
//     locus::nn::lstm<D, P> rnn{this, "rnn", 32, 128, {.layers = 2, .batch_first = true}};
//     locus::nn::layer<locus::nn::linear<D, P>> head{this, "head", 128, 96};
//     auto forward(const typename char_rnn::template ids<2>& x) {       // [batch, time]
//       const auto y = rnn(emb(x));                                    // [batch, time, 128]
//       return head(ag::reshape(y, {x.shape()[0] * x.shape()[1], 128}));
//     }
//   };
//
// Parameters under PyTorch's names and layout, per layer k: "<name>.weight_ih_l<k>"
// [G*H, in], "weight_hh_l<k>" [G*H, H], "bias_ih_l<k>" and "bias_hh_l<k>" [G*H], gates
// (i, f, g, o) for the LSTM (G = 4) and (r, z, n) for the GRU (G = 3), each drawn from
// U(-1/sqrt(H), 1/sqrt(H)) as PyTorch's: nn.LSTM's state_dict loads by name (nn::load)
// and a locus checkpoint loads into nn.LSTM.
//
// rnn(x) takes x [T, B, I] ([B, T, I] with batch_first) and gives every step's output
// of the last layer, of the same layout. The initial state is zeros, unless
// carry_state: then each call starts from the state the last call ended with (values
// only: no gradient flows back into an earlier batch, truncated backpropagation through
// time) until reset_state(); a batch of another size than the carried state is a
// shape_error. rnn.run(x, h0, c0) gives {y, h, c} with the states [layers, B, H] as
// PyTorch's (h_n, c_n). Options: layers (>= 1), batch_first, carry_state (PyTorch's
// dropout between layers and bidirectional layers are not built).
#pragma once

#include <cmath>
#include <deque>
#include <string>
#include <type_traits>

#include "../ag/recurrent.hpp"
#include "../ag/shapes.hpp"
#include "../transfer/copy.hpp"
#include "param.hpp"

namespace locus::nn {

/// Options of nn::lstm and nn::gru.
struct rnn_options {
  /// Stacked layers (PyTorch's num_layers).
  index_t layers = 1;
  /// x and y [B, T, features] instead of [T, B, features].
  bool batch_first = false;
  /// Start each call from the state the last one ended with (see the header).
  bool carry_state = false;
};

/// The states a recurrent module's run() gives: y of x's layout, h (and c for the LSTM)
/// [layers, B, H].
template <class C, class D>
struct rnn_run {
  ag::var<C, D, 3> y, h, c;
};

namespace detail {

/// What nn::lstm (G = 4) and nn::gru (G = 3) share.
template <Device D, class Policy, int G>
class recurrent {
 public:
  using device = D;
  using policy = ::locus::detail::checked_policy_t<Policy>;
  using C = typename policy::compute;
  static constexpr int gates = G;

  template <class Parent>
  recurrent(Parent* parent, const std::string& name, index_t input_size, index_t hidden_size, rnn_options o,
            const char* kind)
      : kind_(kind),
        name_(parent->prefix() + name),
        in_(input_size),
        hidden_(hidden_size),
        o_(o),
        probing_(&parent->registry()->probing) {
    const std::string what = std::string("nn::") + kind_ + " '" + name_ + "'";
    if (input_size <= 0 || hidden_size <= 0)
      throw value_error("locus: " + what + " needs a positive input size and hidden size, got " +
                        std::to_string(input_size) + " and " + std::to_string(hidden_size));
    if (o.layers <= 0) throw value_error("locus: " + what + " needs at least one layer, got " + std::to_string(o.layers));
    const double k = 1.0 / std::sqrt(static_cast<double>(hidden_size));
    const auto init = param_init::uniform(-k, k);
    for (index_t l = 0; l < o.layers; ++l) {
      const std::string s = "_l" + std::to_string(l);
      const index_t in = l == 0 ? input_size : hidden_size;
      w_ih_.emplace_back(parent, name + ".weight_ih" + s, extents<2>{G * hidden_size, in}, init);
      w_hh_.emplace_back(parent, name + ".weight_hh" + s, extents<2>{G * hidden_size, hidden_size}, init);
      b_ih_.emplace_back(parent, name + ".bias_ih" + s, extents<1>{G * hidden_size}, init);
      b_hh_.emplace_back(parent, name + ".bias_hh" + s, extents<1>{G * hidden_size}, init);
    }
  }
  recurrent(const recurrent&) = delete;
  recurrent& operator=(const recurrent&) = delete;

  /// Every step's output of the last layer, x's layout (see the header).
  ag::var<C, D, 3> operator()(const ag::var<C, D, 3>& x) {
    auto& t = ag::detail::owner(x, what().c_str());
    const auto s = x.shape();
    const index_t batch = o_.batch_first ? s[0] : s[1];
    // a shape query (nn::model::output_shape, layer_shapes) neither reads nor advances it
    if (*probing_) return forward(x, nullptr, nullptr, false).y;
    if (o_.carry_state && detail::current_segment() != nullptr)
      throw autograd_error("locus: " + what() + " carries its state (carry_state) inside nn::checkpoint: the "
                           "recompute in backward would start from the state this forward advanced; leave the layer "
                           "out of the checkpointed child, or carry no state");
    if (!o_.carry_state || !carried_) return forward(x, nullptr, nullptr, true).y;
    if (state_h_.shape()[1] != batch)
      throw shape_error("locus: " + what() + " carries a state of batch " + std::to_string(state_h_.shape()[1]) +
                        " from its last call, but got an input of shape " + ::locus::detail::shape_string(s) +
                        " (batch " + std::to_string(batch) + "); call reset_state() where the sequences change");
    const auto h0 = t.constant(state_h_);
    if constexpr (G == 4) {
      const auto c0 = t.constant(state_c_);
      return forward(x, &h0, &c0, true).y;
    } else {
      return forward(x, &h0, nullptr, true).y;
    }
  }
  // Prevents: a tensor, or a value of another rank, device or policy.
  template <class X>
    requires(!std::is_same_v<X, ag::var<C, D, 3>>)
  ag::var<C, D, 3> operator()(const X&) {
    if constexpr (!ag::is_var_v<X>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: a recurrent layer (nn::lstm, nn::gru) runs over a forward's value (an ag::var), not a "
                    "tensor; a tensor enters a forward through its tape");
    else if constexpr (std::is_same_v<typename X::device, D> && std::is_same_v<typename X::value_type, C>)
      static_assert(::locus::detail::always_false<X>,
                    "locus: a recurrent layer (nn::lstm, nn::gru) takes a sequence of rank 3, [T, B, features] (or "
                    "[B, T, features] with batch_first); reshape it first: ag::reshape(x, {T, B, features})");
    else
      static_assert(::locus::detail::always_false<X>,
                    "locus: a recurrent layer (nn::lstm, nn::gru) takes a value of its module's device and compute "
                    "dtype; declare it with its module's: nn::lstm<D, P>");
    return {};
  }

  /// Forgets the carried state: the next call starts from zeros.
  void reset_state() noexcept { carried_ = false; }
  /// Whether a carried state is held (carry_state, after a call).
  [[nodiscard]] bool has_state() const noexcept { return carried_; }
  /// The carried hidden state [layers, B, H] (valid while has_state()).
  [[nodiscard]] tensor_view<const C, D, 3> state_h() const noexcept { return state_h_; }

  [[nodiscard]] param<D, Policy, 2>& weight_ih(index_t l) { return w_ih_.at(static_cast<std::size_t>(l)); }
  [[nodiscard]] param<D, Policy, 2>& weight_hh(index_t l) { return w_hh_.at(static_cast<std::size_t>(l)); }
  [[nodiscard]] param<D, Policy, 1>& bias_ih(index_t l) { return b_ih_.at(static_cast<std::size_t>(l)); }
  [[nodiscard]] param<D, Policy, 1>& bias_hh(index_t l) { return b_hh_.at(static_cast<std::size_t>(l)); }
  [[nodiscard]] index_t input_size() const noexcept { return in_; }
  [[nodiscard]] index_t hidden_size() const noexcept { return hidden_; }
  [[nodiscard]] index_t layers() const noexcept { return o_.layers; }
  [[nodiscard]] const rnn_options& options() const noexcept { return o_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 protected:
  [[nodiscard]] std::string what() const { return std::string("nn::") + kind_ + " '" + name_ + "'"; }

  /// Every layer in turn; h0 (and c0) [layers, B, H] or null (zeros). `carry`: keep the
  /// last states when carry_state.
  rnn_run<C, D> forward(const ag::var<C, D, 3>& x, const ag::var<C, D, 3>* h0, const ag::var<C, D, 3>* c0,
                        bool carry) {
    const auto s = x.shape();
    if (s[2] != in_)
      throw shape_error("locus: " + what() + " takes " + std::to_string(in_) + " input features, but got an input of "
                        "shape " + ::locus::detail::shape_string(s) + (o_.batch_first ? " ([B, T, features])" : " ([T, B, features])"));
    const index_t batch = o_.batch_first ? s[0] : s[1];
    const auto check_state = [&](const ag::var<C, D, 3>* st, const char* which) {
      if (st && (st->shape()[0] != o_.layers || st->shape()[1] != batch || st->shape()[2] != hidden_))
        throw shape_error("locus: " + what() + ": " + which + " of shape " + ::locus::detail::shape_string(st->shape()) +
                          " should be [layers, B, H] = [" + std::to_string(o_.layers) + ", " + std::to_string(batch) +
                          ", " + std::to_string(hidden_) + "] for an input of shape " + ::locus::detail::shape_string(s));
    };
    check_state(h0, "h0");
    check_state(c0, "c0");
    ag::var<C, D, 3> seq = o_.batch_first ? ag::transpose(x, 0, 1) : x;
    std::vector<ag::var<C, D, 3>> hs, cs;
    for (index_t l = 0; l < o_.layers; ++l) {
      const std::size_t k = static_cast<std::size_t>(l);
      const auto wih = w_ih_[k].on(x), whh = w_hh_[k].on(x);
      const auto bih = b_ih_[k].on(x), bhh = b_hh_[k].on(x);
      const auto layer_state = [&](const ag::var<C, D, 3>* st) {
        return ag::reshape(ag::slice(*st, 0, l, l + 1), extents<2>{batch, hidden_});
      };
      if constexpr (G == 4) {
        // h0 and c0 come together (run(x, h0, c0), or the carried state) or not at all
        const auto r = h0 ? ag::lstm(seq, layer_state(h0), layer_state(c0), wih, whh, bih, bhh)
                          : ag::lstm(seq, wih, whh, bih, bhh);
        seq = r.y;
        hs.push_back(ag::reshape(r.h, extents<3>{1, batch, hidden_}));
        cs.push_back(ag::reshape(r.c, extents<3>{1, batch, hidden_}));
      } else {
        const auto r = h0 ? ag::gru(seq, layer_state(h0), wih, whh, bih, bhh) : ag::gru(seq, wih, whh, bih, bhh);
        seq = r.y;
        hs.push_back(ag::reshape(r.h, extents<3>{1, batch, hidden_}));
      }
    }
    rnn_run<C, D> out;
    out.y = o_.batch_first ? ag::transpose(seq, 0, 1) : seq;
    out.h = hs.size() == 1 ? hs[0] : ag::concat(0, hs);
    if constexpr (G == 4) out.c = cs.size() == 1 ? cs[0] : ag::concat(0, cs);
    if (carry && o_.carry_state) {  // the values only (detached): the next call's constants
      keep(state_h_, out.h.value());
      if constexpr (G == 4) keep(state_c_, out.c.value());
      carried_ = true;
    }
    return out;
  }

 private:
  static void keep(tensor<C, D, 3>& dst, const tensor_view<const C, D, 3>& v) {
    if (dst.shape() != v.shape()) dst = tensor<C, D, 3>(v.shape());
    ::locus::copy(v, dst);
  }

  const char* kind_;
  std::string name_;
  index_t in_, hidden_;
  rnn_options o_;
  std::deque<param<D, Policy, 2>> w_ih_, w_hh_;
  std::deque<param<D, Policy, 1>> b_ih_, b_hh_;
  tensor<C, D, 3> state_h_, state_c_;
  bool carried_ = false;
  const bool* probing_;  // the model's registry's: set during a shape query
};

}  // namespace detail

/// PyTorch's nn.LSTM as a module member (see the header).
template <Device D, class Policy>
class lstm : public detail::recurrent<D, Policy, 4> {
  using base = detail::recurrent<D, Policy, 4>;

 public:
  using C = typename base::C;
  template <class Parent>
  lstm(Parent* parent, std::string name, index_t input_size, index_t hidden_size, rnn_options o = {})
      : base(parent, name, input_size, hidden_size, o, "lstm") {}
  using base::operator();
  /// {y, h_n, c_n} from h0 and c0 [layers, B, H] (PyTorch's lstm(x, (h0, c0))); the
  /// carried state is neither read nor written.
  rnn_run<C, D> run(const ag::var<C, D, 3>& x, const ag::var<C, D, 3>& h0, const ag::var<C, D, 3>& c0) {
    return this->forward(x, &h0, &c0, false);
  }
  /// {y, h_n, c_n} from a zero state.
  rnn_run<C, D> run(const ag::var<C, D, 3>& x) { return this->forward(x, nullptr, nullptr, false); }
};

/// PyTorch's nn.GRU as a module member (see the header).
template <Device D, class Policy>
class gru : public detail::recurrent<D, Policy, 3> {
  using base = detail::recurrent<D, Policy, 3>;

 public:
  using C = typename base::C;
  template <class Parent>
  gru(Parent* parent, std::string name, index_t input_size, index_t hidden_size, rnn_options o = {})
      : base(parent, name, input_size, hidden_size, o, "gru") {}
  using base::operator();
  /// {y, h_n} from h0 [layers, B, H] (PyTorch's gru(x, h0)); run(x): from zeros.
  rnn_run<C, D> run(const ag::var<C, D, 3>& x, const ag::var<C, D, 3>& h0) { return this->forward(x, &h0, nullptr, false); }
  rnn_run<C, D> run(const ag::var<C, D, 3>& x) { return this->forward(x, nullptr, nullptr, false); }
};

}  // namespace locus::nn
