// CUDA suite: the tape's layout operations (ag/shapes.hpp), attention and rms_norm
// (ag/attention.hpp, ag/norm.hpp) and nn::param on cuda give the gradients the host tape
// gives for the same inputs (the host ones are checked against f64 finite differences in
// tests/test_autograd_shapes.cpp, test_attention.cpp and test_param.cpp); a model over
// token ids (nn::embedding, learned positions, a tied projection) trained by the trainer
// with AdamW's parameter groups on cuda ends where the same run on the host ends.
// Skipped, and reported so, without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <locus/ag/ops.hpp>
#include <locus/locus.hpp>
#include <locus/nn/embedding.hpp>
#include <locus/nn/param.hpp>
#include <locus/nn/recurrent.hpp>
#include <locus/train.hpp>

namespace {
namespace ag = locus::ag;
using locus::index_t;

template <class D>
std::vector<float> layout_grad(const locus::tensor<float, locus::cpu, 2>& a_host,
                               const locus::tensor<std::int64_t, locus::cpu, 1>& ids_host) {
  const auto a = locus::to<D>(a_host);
  const auto ids = locus::to<D>(ids_host);
  ag::tape<float, D> t;
  const auto x = t.leaf(a);
  const auto y = ag::concat(1, ag::softmax(ag::slice(x, 1, 0, 3)), ag::transpose(ag::slice(ag::transpose(x), 0, 3, 6)));
  t.backward(ag::sum(ag::gather_rows(y, ids) * ag::gather_rows(y, ids)));
  const auto g = locus::to<locus::cpu>(t.grad(x));
  return {g.data_handle(), g.data_handle() + g.numel()};
}

template <class D, class P>
struct gained : locus::nn::module<D, P> {
  locus::nn::param<D, P, 2> w{this, "w", {6, 4}, locus::nn::param_init::uniform(-0.5, 0.5)};
  locus::nn::param<D, P, 1> gain{this, "gain", {4}, locus::nn::param_init::ones()};
  auto forward(const typename gained::template var<2>& x) {
    return ag::tanh(ag::matmul(x, w.on(x))) * gain.on(x) + gain.on(x);
  }
};

template <class D>
std::vector<float> param_grad(const locus::tensor<float, locus::cpu, 2>& x_host,
                              const locus::tensor<float, locus::cpu, 2>& gy_host) {
  locus::nn::model<gained<D, locus::amp::fp32>> m;
  const auto x = locus::to<D>(x_host);
  const auto gy = locus::to<D>(gy_host);
  m.parameters().zero_grad();
  (void)m.forward(x.view());
  (void)m.backward(gy.view());
  const auto g = locus::to<locus::cpu>(m.parameters().grad());
  return {g.data_handle(), g.data_handle() + g.numel()};
}
}  // namespace

TEST_CASE("ag layout operations and nn::param on cuda give the gradients of the host tape") {
  const auto a = locus::rand<float, locus::cpu>({4, 6}, 25, -1.0, 1.0);
  locus::tensor<std::int64_t, locus::cpu, 1> ids({5});
  for (index_t i = 0; i < 5; ++i) ids.data_handle()[i] = (i * 3) % 4;
  const auto h = layout_grad<locus::cpu>(a, ids);
  const auto c = layout_grad<locus::cuda>(a, ids);
  REQUIRE(h.size() == c.size());
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(c[i] == doctest::Approx(h[i]).epsilon(1e-5).scale(1.0));
  // an id outside the table is refused on cuda too (the ids are checked on the host)
  ids.data_handle()[2] = 9;
  CHECK_THROWS_AS(layout_grad<locus::cuda>(a, ids), locus::value_error);

  const auto x = locus::randn<float, locus::cpu>({3, 6}, 1);
  const auto gy = locus::randn<float, locus::cpu>({3, 4}, 2);
  const auto hp = param_grad<locus::cpu>(x, gy);
  const auto cp = param_grad<locus::cuda>(x, gy);
  REQUIRE(hp.size() == cp.size());
  for (std::size_t i = 0; i < hp.size(); ++i) CHECK(cp[i] == doctest::Approx(hp[i]).epsilon(1e-5).scale(1.0));
}

namespace {
/// Output and the three gradients of causal attention (q and k turned by rope) followed by
/// rms_norm, on D.
template <class D>
std::vector<float> attention_grads(const locus::tensor<float, locus::cpu, 4>& q_host,
                                   const locus::tensor<float, locus::cpu, 4>& k_host,
                                   const locus::tensor<float, locus::cpu, 4>& v_host) {
  const auto q = locus::to<D>(q_host), k = locus::to<D>(k_host), v = locus::to<D>(v_host);
  ag::tape<float, D> t;
  const auto lq = t.leaf(q), lk = t.leaf(k), lv = t.leaf(v);
  const auto o = ag::rms_norm(
      ag::scaled_dot_product_attention(ag::rope(lq, {.offset = 20}), ag::rope(lk), lv, {.causal = true}), 1e-5);
  t.backward(ag::sum(o * o * o));
  std::vector<float> out;
  for (const auto* x : {&lq, &lk, &lv}) {
    const auto g = locus::to<locus::cpu>(t.grad(*x));
    out.insert(out.end(), g.data_handle(), g.data_handle() + g.numel());
  }
  const auto y = locus::to<locus::cpu>(o.value());
  out.insert(out.end(), y.data_handle(), y.data_handle() + y.numel());
  return out;
}
}  // namespace

TEST_CASE("attention, rope and rms_norm on cuda give what the host tape gives") {
  // 70 keys: past the kernel's block of 32; 2 x 3 heads.
  const auto q = locus::randn<float, locus::cpu>({2, 3, 50, 16}, 3);
  const auto k = locus::randn<float, locus::cpu>({2, 3, 70, 16}, 4);
  const auto v = locus::randn<float, locus::cpu>({2, 3, 70, 8}, 5);
  const auto h = attention_grads<locus::cpu>(q, k, v);
  const auto c = attention_grads<locus::cuda>(q, k, v);
  REQUIRE(h.size() == c.size());
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(c[i] == doctest::Approx(h[i]).epsilon(1e-4).scale(1.0));
}

namespace {
template <class D, class P>
struct tiny_lm : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 7, 6};
  locus::nn::positional_embedding<D, P> wpe{this, "wpe", 5, 6};
  locus::nn::layer<locus::nn::linear<D, P>> fc{this, "fc", 6, 6};
  auto forward(const typename tiny_lm::template ids<2>& x) {
    const auto s = x.shape();
    const auto h = ag::reshape(wpe(wte(x)), locus::extents<2>{s[0] * s[1], 6});
    return ag::linear(ag::tanh(fc(h)), wte.weight().on(x));
  }
};

template <class D>
std::vector<float> trained_lm(const locus::tensor<std::int64_t, locus::cpu, 2>& ids_host,
                              const locus::tensor<std::int64_t, locus::cpu, 1>& next_host) {
  locus::nn::model<tiny_lm<D, locus::amp::fp32>> m;
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2, .weight_decay = 0.1},
                             {locus::optim::no_decay_group(m.parameters())});
  locus::train::trainer t(m, opt, locus::nn::cross_entropy{});
  const auto ids = locus::to<D>(ids_host);
  const auto next = locus::to<D>(next_host);
  for (int s = 0; s < 5; ++s) t.step(ids, next);
  const auto w = locus::to<locus::cpu>(std::as_const(m.parameters()).master());
  return {w.data_handle(), w.data_handle() + w.numel()};
}
}  // namespace

TEST_CASE("a model over token ids with AdamW's parameter groups trains on cuda as on the host") {
  locus::tensor<std::int64_t, locus::cpu, 2> ids({2, 4});
  locus::tensor<std::int64_t, locus::cpu, 1> next({8});
  for (index_t i = 0; i < 8; ++i) {
    ids.data_handle()[i] = (i * 5) % 7;
    next.data_handle()[i] = (i * 5 + 1) % 7;
  }
  const auto h = trained_lm<locus::cpu>(ids, next);
  const auto c = trained_lm<locus::cuda>(ids, next);
  REQUIRE(h.size() == c.size());
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(c[i] == doctest::Approx(h[i]).epsilon(1e-4).scale(1.0));
  // an id outside the vocabulary is refused on cuda too, before the step
  ids.data_handle()[3] = 7;
  CHECK_THROWS_AS(trained_lm<locus::cuda>(ids, next), locus::value_error);
}

namespace {
/// A model of a stacked LSTM (batch first, carried state) then a GRU and a linear head,
/// trained five steps by the trainer on D: the master weights after.
template <class D, class P>
struct seq_lm : locus::nn::module<D, P> {
  locus::nn::lstm<D, P> lstm{this, "lstm", 3, 8, {.layers = 2, .batch_first = true, .carry_state = true}};
  locus::nn::gru<D, P> gru{this, "gru", 8, 6, {.batch_first = true}};
  locus::nn::layer<locus::nn::linear<D, P>> head{this, "head", 6, 1};
  auto forward(const typename seq_lm::template var<3>& x) {
    const auto y = gru(lstm(x));
    return head(ag::reshape(y, locus::extents<2>{x.shape()[0] * x.shape()[1], 6}));
  }
};

template <class D>
std::vector<float> trained_rnn(const locus::tensor<float, locus::cpu, 3>& x_host,
                               const locus::tensor<float, locus::cpu, 2>& y_host) {
  locus::nn::model<seq_lm<D, locus::amp::fp32>> m;
  locus::optim::adamw<D> opt(m.parameters(), {.lr = 1e-2});
  locus::train::trainer t(m, opt, locus::nn::mse{});
  const auto x = locus::to<D>(x_host);
  const auto y = locus::to<D>(y_host);
  for (int s = 0; s < 5; ++s) t.step(x, y);
  const auto w = locus::to<locus::cpu>(std::as_const(m.parameters()).master());
  return {w.data_handle(), w.data_handle() + w.numel()};
}
}  // namespace

TEST_CASE("nn::lstm and nn::gru (stacked, carried state) train on cuda as on the host") {
  const auto x = locus::randn<float, locus::cpu>({4, 9, 3}, 7);
  const auto y = locus::randn<float, locus::cpu>({36, 1}, 8);
  const auto h = trained_rnn<locus::cpu>(x, y);
  const auto c = trained_rnn<locus::cuda>(x, y);
  REQUIRE(h.size() == c.size());
  for (std::size_t i = 0; i < h.size(); ++i) CHECK(c[i] == doctest::Approx(h[i]).epsilon(1e-4).scale(1.0));
}
