// Device-generic tests of training (included with LOCUS_TEST_DEVICES defined): gradients
// of every layer and loss against central finite differences in f64, gradient
// accumulation against one large batch, the grad scaler's skip / back-off / growth, the
// optimizers against double-precision references of their formulas, and initialisation.
#pragma once

#include <algorithm>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <locus/train.hpp>

namespace locus_train_test {

using locus::index_t;
namespace nn = locus::nn;

template <class T, class D, std::size_t R>
std::vector<double> host_values(const locus::tensor_view<T, D, R>& v) {
  auto h = locus::to<locus::cpu>(v);
  std::vector<double> out;
  for (const auto& x : h.span()) out.push_back(static_cast<double>(locus::detail::load(x)));
  return out;
}

/// Overwrites element i of a device buffer of doubles (through the host).
template <class D>
void set_element(double* device_ptr, index_t n, index_t i, double value) {
  locus::tensor_view<double, D, 1> v = locus::unsafe_view<D>(device_ptr, locus::extents<1>{n});
  auto h = locus::to<locus::cpu>(v);
  h(i) = value;
  locus::copy(h, v);
}
template <class D>
double get_element(const double* device_ptr, index_t n, index_t i) {
  locus::tensor_view<const double, D, 1> v = locus::unsafe_view<D>(device_ptr, locus::extents<1>{n});
  return locus::to<locus::cpu>(v)(i);
}

/// Indices spread over [0, n): at most k of them.
inline std::vector<index_t> sample_indices(index_t n, index_t k) {
  std::vector<index_t> out;
  if (n <= k) {
    for (index_t i = 0; i < n; ++i) out.push_back(i);
  } else {
    for (index_t j = 0; j < k; ++j) out.push_back((j * 7919 + 13) % n);
  }
  return out;
}

/// Checks d(sum(model(x) * r))/d(parameters and inputs) against central differences in
/// f64. The loss is recomputed with the training forward (dropout's counter reset, so
/// the mask is the same).
template <class D, class Model>
void check_model_gradients(Model& model, index_t batch, index_t features, index_t outputs) {
  auto x = locus::randn<double, D>({batch, features}, 101);
  auto r = locus::randn<double, D>({batch, outputs}, 202);
  auto reset_rng = [&] {
    model.for_each_layer([](std::size_t, auto& l) {
      if constexpr (requires { l.set_counter(std::uint64_t{}); }) l.set_counter(0);
    });
  };
  const std::vector<double> rh = host_values(std::as_const(r).view());
  auto loss = [&]() {
    reset_rng();
    const auto y = host_values(model.forward(std::as_const(x).view()));
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * rh[i];
    return s;
  };

  auto& store = model.parameters();
  store.zero_grad();
  reset_rng();
  model.forward(std::as_const(x).view());
  const auto gx = host_values(model.backward(std::as_const(r).view(), true));
  const auto gp = host_values(std::as_const(store).grad());

  const double h = 1e-6;
  const auto check = [&](double analytic, double plus, double minus, const std::string& what) {
    const double numeric = (plus - minus) / (2 * h);
    INFO(what << ": analytic " << analytic << ", finite difference " << numeric);
    CHECK(std::abs(analytic - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)));
  };
  // parameters
  double* p = store.master().data_handle();
  for (const auto& e : store.entries()) {
    for (index_t j : sample_indices(e.numel, 6)) {
      const index_t i = e.offset + j;
      const double v0 = get_element<D>(p, store.size(), i);
      set_element<D>(p, store.size(), i, v0 + h);
      const double lp = loss();
      set_element<D>(p, store.size(), i, v0 - h);
      const double lm = loss();
      set_element<D>(p, store.size(), i, v0);
      check(gp[static_cast<std::size_t>(i)], lp, lm, e.name + "[" + std::to_string(j) + "]");
    }
  }
  // inputs
  for (index_t i : sample_indices(batch * features, 10)) {
    const double v0 = get_element<D>(x.data_handle(), x.numel(), i);
    set_element<D>(x.data_handle(), x.numel(), i, v0 + h);
    const double lp = loss();
    set_element<D>(x.data_handle(), x.numel(), i, v0 - h);
    const double lm = loss();
    set_element<D>(x.data_handle(), x.numel(), i, v0);
    check(gx[static_cast<std::size_t>(i)], lp, lm, "input[" + std::to_string(i) + "]");
  }
}

/// d(loss)/d(out) of a loss state against central differences in f64.
template <class D, class State, class Target>
void check_loss_gradient(State& st, locus::tensor<double, D, 2>& out, const Target& target) {
  const auto ov = std::as_const(out).view();
  st.forward(ov, target);
  const auto g = host_values(st.grad());
  const double h = 1e-6;
  for (index_t i : sample_indices(out.numel(), 16)) {
    const double v0 = get_element<D>(out.data_handle(), out.numel(), i);
    set_element<D>(out.data_handle(), out.numel(), i, v0 + h);
    const double lp = locus::to<locus::cpu>(st.forward(ov, target)).item();
    set_element<D>(out.data_handle(), out.numel(), i, v0 - h);
    const double lm = locus::to<locus::cpu>(st.forward(ov, target)).item();
    set_element<D>(out.data_handle(), out.numel(), i, v0);
    const double numeric = (lp - lm) / (2 * h);
    INFO("element " << i << ": analytic " << g[static_cast<std::size_t>(i)] << ", finite difference " << numeric);
    CHECK(std::abs(g[static_cast<std::size_t>(i)] - numeric) <= 1e-7 * std::max(1.0, std::abs(numeric)));
  }
}

}  // namespace locus_train_test

using locus::index_t;

TEST_CASE_TEMPLATE("training: every layer's gradients match finite differences in f64", D, LOCUS_TEST_DEVICES) {
  using locus_train_test::check_model_gradients;
  using P = locus::amp::fp64;
  namespace nn = locus::nn;
  SUBCASE("linear with bias") {
    nn::sequential m(nn::linear<D, P>(7, 4));
    check_model_gradients<D>(m, 5, 7, 4);
  }
  SUBCASE("linear without bias") {
    nn::sequential m(nn::linear<D, P>(7, 4, nn::bias::without));
    check_model_gradients<D>(m, 5, 7, 4);
  }
  SUBCASE("linear + relu (fused) + linear") {
    nn::sequential m(nn::linear<D, P>(7, 6), nn::relu<D, P>(), nn::linear<D, P>(6, 3));
    check_model_gradients<D>(m, 5, 7, 3);
  }
  SUBCASE("linear + gelu (fused) + linear") {
    nn::sequential m(nn::linear<D, P>(7, 6), nn::gelu<D, P>(), nn::linear<D, P>(6, 3));
    check_model_gradients<D>(m, 5, 7, 3);
  }
  SUBCASE("linear + gelu_tanh, tanh and sigmoid (fused)") {
    nn::sequential m(nn::linear<D, P>(7, 6), nn::gelu_tanh<D, P>(), nn::linear<D, P>(6, 5), nn::tanh<D, P>(),
                     nn::linear<D, P>(5, 4), nn::sigmoid<D, P>());
    check_model_gradients<D>(m, 5, 7, 4);
  }
  SUBCASE("stand-alone activations and dropout") {
    nn::sequential m(nn::relu<D, P>(), nn::gelu<D, P>(), nn::gelu_tanh<D, P>(), nn::tanh<D, P>(),
                     nn::sigmoid<D, P>(), nn::dropout<D, P>(0.3f, 9));
    check_model_gradients<D>(m, 4, 6, 6);
  }
  SUBCASE("linear + relu with a hook (not fused) matches the fused path") {
    nn::sequential fused(nn::linear<D, P>(7, 6), nn::relu<D, P>(), nn::linear<D, P>(6, 3));
    nn::sequential hooked(nn::linear<D, P>(7, 6), nn::relu<D, P>(), nn::linear<D, P>(6, 3));
    int pre = 0, post = 0;
    hooked.template get<1>().add_forward_pre_hook([&](const auto& x) {
      ++pre;
      CHECK(x.shape()[1] == 6);
    });
    hooked.template get<0>().add_forward_hook([&](const auto& x, const auto& y) {
      ++post;
      CHECK(x.shape()[1] == 7);
      CHECK(y.shape()[1] == 6);
    });
    check_model_gradients<D>(hooked, 5, 7, 3);
    CHECK(pre > 0);
    CHECK(post == pre);
    auto x = locus::randn<double, D>({5, 7}, 3);
    const auto a = locus_train_test::host_values(fused.forward(std::as_const(x).view()));
    const auto b = locus_train_test::host_values(hooked.forward(std::as_const(x).view()));
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
  }
}

TEST_CASE_TEMPLATE("training: losses' gradients match finite differences in f64", D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp64;
  namespace nn = locus::nn;
  SUBCASE("cross_entropy, plain and with label smoothing") {
    for (float eps : {0.0f, 0.1f}) {
      CAPTURE(eps);
      auto logits = locus::randn<double, D>({6, 5}, 31);
      auto labels_h = locus::zeros<std::int64_t, locus::cpu>({6});
      for (index_t i = 0; i < 6; ++i) labels_h(i) = (i * 3) % 5;
      auto labels = locus::to<D>(labels_h);
      nn::cross_entropy::state<D, P> st(nn::cross_entropy{eps});
      locus_train_test::check_loss_gradient<D>(st, logits, std::as_const(labels).view());

      // and the loss itself against a double reference
      const auto z = locus_train_test::host_values(std::as_const(logits).view());
      double ref = 0;
      for (index_t i = 0; i < 6; ++i) {
        double mx = -1e300, se = 0, sum_logp = 0;
        for (index_t j = 0; j < 5; ++j) mx = std::max(mx, z[static_cast<std::size_t>(i * 5 + j)]);
        for (index_t j = 0; j < 5; ++j) se += std::exp(z[static_cast<std::size_t>(i * 5 + j)] - mx);
        const double lse = mx + std::log(se);
        for (index_t j = 0; j < 5; ++j) sum_logp += z[static_cast<std::size_t>(i * 5 + j)] - lse;
        const double e = eps;
        ref += -(1 - e) * (z[static_cast<std::size_t>(i * 5 + labels_h(i))] - lse) - e / 5.0 * sum_logp;
      }
      ref /= 6;
      const double got = locus::to<locus::cpu>(st.forward(std::as_const(logits).view(), std::as_const(labels).view())).item();
      CHECK(got == doctest::Approx(ref).epsilon(1e-12));
    }
  }
  SUBCASE("mse") {
    auto out = locus::randn<double, D>({4, 3}, 41);
    auto target = locus::randn<double, D>({4, 3}, 42);
    nn::mse::state<D, P> st(nn::mse{});
    locus_train_test::check_loss_gradient<D>(st, out, std::as_const(target).view());
  }
}

TEST_CASE_TEMPLATE("training: N micro-batches of B accumulate to the update of one batch of N*B", D,
                   LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  auto make = [] {
    nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::linear<D, P>(16, 4));
    m.reset_parameters(5);
    return m;
  };
  auto x = locus::randn<float, D>({32, 12}, 7);
  auto yh = locus::zeros<std::int64_t, locus::cpu>({32});
  for (index_t i = 0; i < 32; ++i) yh(i) = (i * 7) % 4;
  auto y = locus::to<D>(yh);

  auto big = make();
  locus::optim::sgd<D> opt_big(big.parameters(), {.lr = 0.1, .momentum = 0.9});
  locus::train::trainer t_big(big, opt_big, nn::cross_entropy{});
  auto small = make();
  locus::optim::sgd<D> opt_small(small.parameters(), {.lr = 0.1, .momentum = 0.9});
  locus::train::trainer t_small(small, opt_small, nn::cross_entropy{}, {.accumulate = 4});

  for (int step = 0; step < 2; ++step) {
    t_big.step(x, y);
    for (index_t k = 0; k < 4; ++k) t_small.step(x.slice(8 * k, 8 * k + 8), y.slice(8 * k, 8 * k + 8));
  }
  CHECK(t_big.optimizer_steps() == 2);
  CHECK(t_small.optimizer_steps() == 2);
  const auto a = locus_train_test::host_values(std::as_const(big.parameters()).master());
  const auto b = locus_train_test::host_values(std::as_const(small.parameters()).master());
  auto init = make();
  const auto a0 = locus_train_test::host_values(std::as_const(init.parameters()).master());
  double worst = 0, moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    moved = std::max(moved, std::abs(a[i] - a0[i]));
  }
  CHECK(moved > 1e-3);  // the steps did change the weights
  CHECK(worst <= 2e-6);
}

TEST_CASE_TEMPLATE("parameters: discard_grad defers the zeros: a backward stores (not adds) its gradient, a second adds, "
                   "and a read zeroes what no backward wrote",
                   D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  auto make = [] {
    nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::linear<D, P>(16, 4));
    m.reset_parameters(3);
    return m;
  };
  const auto x = locus::randn<float, D>({8, 12}, 11);
  const auto x2 = locus::randn<float, D>({8, 12}, 21);
  const auto gy = locus::randn<float, D>({8, 4}, 12);
  const auto gy2 = locus::randn<float, D>({8, 4}, 22);
  auto a = make();
  auto b = make();
  // b's gradient bytes are NaN before the discard: a backward that added to them, or a
  // check that read them, would show it.
  const index_t n = b.parameters().size();
  {
    auto h = locus::zeros<float, locus::cpu>({n});
    for (index_t i = 0; i < n; ++i) h(i) = std::numeric_limits<float>::quiet_NaN();
    locus::copy(h, b.parameters().grad());
  }
  a.parameters().zero_grad();
  b.parameters().discard_grad();
  for (auto* m : {&a, &b}) {
    m->forward(x.view());
    m->backward(gy.view());
  }
  const auto ga = locus_train_test::host_values(std::as_const(a.parameters()).grad());
  const auto gb = locus_train_test::host_values(std::as_const(b.parameters()).grad());
  REQUIRE(ga.size() == gb.size());
  // the parameters' elements (the alignment padding between them is no gradient: b's
  // holds the NaN this test wrote there, which no backward touches)
  std::vector<std::size_t> elems;
  for (const auto& e : a.parameters().entries())
    for (index_t i = e.offset; i < e.offset + e.numel; ++i) elems.push_back(static_cast<std::size_t>(i));
  bool same = true, nonzero = false;
  for (const std::size_t i : elems) {
    same = same && ga[i] == gb[i];  // NaN != NaN: a leftover byte fails here
    nonzero = nonzero || ga[i] != 0.0;
  }
  CHECK(same);
  CHECK(nonzero);
  // a second backward accumulates on both (gradient accumulation over micro-batches)
  for (auto* m : {&a, &b}) {
    m->forward(x2.view());
    m->backward(gy2.view());
  }
  const auto ga2 = locus_train_test::host_values(std::as_const(a.parameters()).grad());
  const auto gb2 = locus_train_test::host_values(std::as_const(b.parameters()).grad());
  bool same2 = true, moved = false;
  for (const std::size_t i : elems) {
    same2 = same2 && ga2[i] == gb2[i];
    moved = moved || ga2[i] != ga[i];
  }
  CHECK(same2);
  CHECK(moved);

  // No backward after the discard: every read path sees zeros, the const one included.
  auto& s = b.parameters();
  s.discard_grad();
  const auto g_const = locus_train_test::host_values(std::as_const(s).grad());
  CHECK(std::all_of(g_const.begin(), g_const.end(), [](double v) { return v == 0.0; }));
  // One parameter's view zeroes that parameter alone; the rest stays deferred and
  // settle_grad() then writes it (the other bytes were NaN again meanwhile).
  {
    auto h = locus::zeros<float, locus::cpu>({n});
    for (index_t i = 0; i < n; ++i) h(i) = std::numeric_limits<float>::quiet_NaN();
    locus::copy(h, s.grad());
  }
  const float* base = s.grad().data_handle();  // taken before the discard, as an optimizer does
  s.discard_grad();
  const auto g0 = locus_train_test::host_values(s.template grad<2>(0));
  CHECK(std::all_of(g0.begin(), g0.end(), [](double v) { return v == 0.0; }));
  s.settle_grad();
  // read through the pointer taken before (no accessor that would settle on its own)
  const auto raw = locus_train_test::host_values(locus::unsafe_view<D>(base, locus::extents<1>{n}));
  std::size_t bad = 0;
  for (const auto& e : s.entries())
    for (index_t i = e.offset; i < e.offset + e.numel; ++i) bad += raw[static_cast<std::size_t>(i)] != 0.0;
  CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("training: on host devices the trainer discards gradients between steps and the next backward "
                   "overwrites them (no memset)",
                   D, LOCUS_TEST_DEVICES) {
  if constexpr (D::host_accessible) {
    using P = locus::amp::fp32;
    namespace nn = locus::nn;
    auto make = [] {
      nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::linear<D, P>(16, 4));
      m.reset_parameters(8);
      return m;
    };
    auto a = make(), b = make();
    locus::optim::adamw<D> oa(a.parameters(), {.lr = 1e-2}), ob(b.parameters(), {.lr = 1e-2});
    locus::train::trainer ta(a, oa, nn::cross_entropy{}), tb(b, ob, nn::cross_entropy{});
    const auto x = locus::randn<float, D>({16, 12}, 3);
    auto yh = locus::zeros<std::int64_t, locus::cpu>({16});
    for (index_t i = 0; i < 16; ++i) yh(i) = i % 4;
    const auto y = locus::to<D>(yh);
    for (int s = 0; s < 3; ++s) {
      ta.step(x, y);
      tb.step(x, y);
      auto& st = b.parameters();
      for (std::size_t i = 0; i < st.count(); ++i) CHECK(st.grad_discarded(i));  // no memset happened
      // b's stale gradient bytes become NaN: the next step must overwrite, not add or read
      // them (the parameters' elements: the alignment padding between them stays zero)
      auto g = st.grad_unsettled();
      for (const auto& e : st.entries())
        for (index_t i = e.offset; i < e.offset + e.numel; ++i)
          g.data_handle()[i] = std::numeric_limits<float>::quiet_NaN();
    }
    ta.step(x, y);
    tb.step(x, y);
    ta.flush();
    tb.flush();
    const auto wa = locus_train_test::host_values(std::as_const(a.parameters()).master());
    const auto wb = locus_train_test::host_values(std::as_const(b.parameters()).master());
    bool same = wa.size() == wb.size();
    for (std::size_t i = 0; same && i < wa.size(); ++i) same = wa[i] == wb[i];
    CHECK(same);
  }
}

TEST_CASE_TEMPLATE("training: clip_grad_norm scales the step by min(1, max / (norm + 1e-6)) as PyTorch does, "
                   "reports the norm, and with a scaler clips the unscaled gradient",
                   D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  auto make = [] {
    nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::linear<D, P>(16, 4));
    m.reset_parameters(21);
    return m;
  };
  const auto x = locus::randn<float, D>({32, 12}, 5);
  auto yh = locus::zeros<std::int64_t, locus::cpu>({32});
  for (index_t i = 0; i < 32; ++i) yh(i) = (i * 3) % 4;
  const auto y = locus::to<D>(yh);
  // SGD with lr 1 and nothing else: the step is the (clipped) gradient itself
  auto a = make(), b = make(), big = make();
  locus::optim::sgd<D> oa(a.parameters(), {.lr = 1.0}), ob(b.parameters(), {.lr = 1.0}),
      og(big.parameters(), {.lr = 1.0});
  locus::train::trainer ta(a, oa, nn::cross_entropy{});
  locus::train::trainer tb(b, ob, nn::cross_entropy{}, {.clip_grad_norm = 0.05});
  locus::train::trainer tg(big, og, nn::cross_entropy{}, {.clip_grad_norm = 1e6});
  const auto p0 = locus_train_test::host_values(std::as_const(a.parameters()).master());
  ta.step(x, y);
  tb.step(x, y);
  tg.step(x, y);
  const auto pa = locus_train_test::host_values(std::as_const(a.parameters()).master());
  const auto pb = locus_train_test::host_values(std::as_const(b.parameters()).master());
  const auto pg = locus_train_test::host_values(std::as_const(big.parameters()).master());
  double sq = 0;
  std::vector<double> g(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i) {
    g[i] = p0[i] - pa[i];
    sq += g[i] * g[i];
  }
  const double norm = std::sqrt(sq);
  REQUIRE(norm > 0.1);  // so 0.05 clips
  CHECK(tb.grad_norm() == doctest::Approx(norm).epsilon(1e-5));
  CHECK(tg.grad_norm() == doctest::Approx(norm).epsilon(1e-5));
  const double coef = 0.05 / (norm + 1e-6);
  double worst = 0, step_sq = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    worst = std::max(worst, std::abs(pb[i] - (p0[i] - g[i] * coef)));
    step_sq += (p0[i] - pb[i]) * (p0[i] - pb[i]);
  }
  CHECK(worst < 1e-6);
  CHECK(std::sqrt(step_sq) == doctest::Approx(0.05).epsilon(1e-3));  // the clipped step's norm
  CHECK(pg == pa);  // a bound above the norm changes nothing, bit for bit

  // With a grad scaler: the unscaled gradient's norm, whatever the scale.
  {
    using PF = locus::amp::fp16_mixed;
    auto mk = [] {
      nn::sequential m(nn::linear<D, PF>(12, 16), nn::relu<D, PF>(), nn::linear<D, PF>(16, 4));
      m.reset_parameters(21);
      return m;
    };
    auto m1 = mk(), m2 = mk();
    locus::optim::sgd<D> o1(m1.parameters(), {.lr = 1.0}), o2(m2.parameters(), {.lr = 1.0});
    locus::amp::grad_scaler<D> s1({.init_scale = 1024}), s2({.init_scale = 65536});
    locus::train::trainer t1(m1, o1, nn::cross_entropy{}, s1, {.clip_grad_norm = 0.05});
    locus::train::trainer t2(m2, o2, nn::cross_entropy{}, s2, {.clip_grad_norm = 0.05});
    t1.step(x, y);
    t2.step(x, y);
    CHECK(t1.grad_norm() == doctest::Approx(norm).epsilon(2e-2));  // f16 compute: a close norm
    CHECK(t1.grad_norm() == doctest::Approx(t2.grad_norm()).epsilon(1e-3));
    auto init = mk();
    const auto q0 = locus_train_test::host_values(std::as_const(init.parameters()).master());
    const auto q1 = locus_train_test::host_values(std::as_const(m1.parameters()).master());
    double step1 = 0;
    for (std::size_t i = 0; i < q0.size(); ++i) step1 += (q0[i] - q1[i]) * (q0[i] - q1[i]);
    CHECK(std::sqrt(step1) == doctest::Approx(0.05).epsilon(2e-3));
  }

  // Gradients whose squares overflow f32 (elements near 1e21) but whose norm does not:
  // still clipped to the bound, the norm reported finite.
  {
    nn::sequential h(nn::linear<D, P>(16, 4));
    h.reset_parameters(2);
    locus::optim::sgd<D> oh(h.parameters(), {.lr = 1.0});
    locus::train::trainer th(h, oh, nn::cross_entropy{}, {.clip_grad_norm = 1.0});
    const auto q0 = locus_train_test::host_values(std::as_const(h.parameters()).master());
    const auto xh = locus::to<D>(locus::full<float, locus::cpu>({4, 16}, 1e21f));
    th.step(xh, y.slice(0, 4));
    const auto q1 = locus_train_test::host_values(std::as_const(h.parameters()).master());
    double moved = 0;
    for (std::size_t i = 0; i < q0.size(); ++i) moved += (q0[i] - q1[i]) * (q0[i] - q1[i]);
    CHECK(std::isfinite(th.grad_norm()));
    CHECK(th.grad_norm() > 1e20);
    CHECK(std::sqrt(moved) == doctest::Approx(1.0).epsilon(1e-3));
  }

  // Bad bounds, and a step that would not be fused, are refused at construction.
  auto c = make();
  locus::optim::sgd<D> oc(c.parameters(), {.lr = 1.0});
  CHECK_THROWS_AS(locus::train::trainer(c, oc, nn::cross_entropy{}, {.clip_grad_norm = -1.0}), locus::value_error);
  CHECK_THROWS_AS(locus::train::trainer(c, oc, nn::cross_entropy{}, {.clip_grad_norm = 1e-50}),
                  locus::value_error);  // rounds to 0 (off) in f32
  CHECK_THROWS_AS(
      locus::train::trainer(c, oc, nn::cross_entropy{}, {.clip_grad_norm = std::numeric_limits<double>::quiet_NaN()}),
      locus::value_error);
  CHECK_THROWS_AS(locus::train::trainer(c, oc, nn::cross_entropy{}, {.check_finite = false, .clip_grad_norm = 1.0}),
                  locus::value_error);
}

TEST_CASE_TEMPLATE("training: clip_grad_value limits every gradient to [-c, c] as PyTorch's clip_grad_value_ does, "
                   "after the grad scaler's unscale, for sgd and adamw",
                   D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  auto make = [] {
    nn::sequential m(nn::linear<D, P>(12, 16), nn::relu<D, P>(), nn::linear<D, P>(16, 4));
    m.reset_parameters(21);
    return m;
  };
  const auto x = locus::randn<float, D>({32, 12}, 5);
  auto yh = locus::zeros<std::int64_t, locus::cpu>({32});
  for (index_t i = 0; i < 32; ++i) yh(i) = (i * 3) % 4;
  const auto y = locus::to<D>(yh);
  // SGD with lr 1: the step is the (clipped) gradient itself
  auto a = make(), b = make(), big = make();
  locus::optim::sgd<D> oa(a.parameters(), {.lr = 1.0}), ob(b.parameters(), {.lr = 1.0}),
      og(big.parameters(), {.lr = 1.0});
  locus::train::trainer ta(a, oa, nn::cross_entropy{});
  const auto p0 = locus_train_test::host_values(std::as_const(a.parameters()).master());
  ta.step(x, y);
  const auto pa = locus_train_test::host_values(std::as_const(a.parameters()).master());
  std::vector<double> g(p0.size()), mag;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    g[i] = p0[i] - pa[i];
    mag.push_back(std::abs(g[i]));
  }
  std::sort(mag.begin(), mag.end());
  const double c = mag[mag.size() * 3 / 4];  // a quarter of the gradients are clipped
  REQUIRE(c > 0);
  locus::train::trainer tb(b, ob, nn::cross_entropy{}, {.clip_grad_value = c});
  locus::train::trainer tg(big, og, nn::cross_entropy{}, {.clip_grad_value = 1e6});
  tb.step(x, y);
  tg.step(x, y);
  const auto pb = locus_train_test::host_values(std::as_const(b.parameters()).master());
  const auto pg = locus_train_test::host_values(std::as_const(big.parameters()).master());
  double worst = 0;
  int clipped = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const double gc = std::clamp(g[i], -c, c);
    if (gc != g[i]) ++clipped;
    worst = std::max(worst, std::abs(pb[i] - (p0[i] - gc)));
    CHECK(std::abs(p0[i] - pb[i]) <= c * (1 + 1e-6) + 1e-7);  // no step beyond the bound
  }
  CHECK(clipped > 0);
  CHECK(worst < 1e-6);
  CHECK(pg == pa);  // a bound above every gradient changes nothing, bit for bit

  // AdamW: the clipped gradients go into the moments. Reference: a hand-written loop
  // that clamps the gradient buffer itself, then takes the ordinary (unfused) AdamW
  // step; two steps, so the moments carry the clipping forward. Bit for bit.
  {
    auto m1 = make(), m2 = make();
    locus::optim::adamw<D> o1(m1.parameters(), {.lr = 1e-2}), o2(m2.parameters(), {.lr = 1e-2});
    locus::train::trainer t1(m1, o1, nn::cross_entropy{}, {.clip_grad_value = c});
    nn::cross_entropy::state<D, P> loss(nn::cross_entropy{});
    for (int s = 0; s < 2; ++s) {
      t1.step(x, y);
      auto out = m2.forward(x.view());
      (void)loss.forward(out, y.view());
      m2.backward(loss.grad());
      auto gh = locus::to<locus::cpu>(std::as_const(m2.parameters()).grad());
      int clipped_here = 0;
      for (auto& g : gh.span()) {
        const float k = std::clamp(g, -static_cast<float>(c), static_cast<float>(c));
        clipped_here += k != g;
        g = k;
      }
      CHECK(clipped_here > 0);
      locus::copy(gh, m2.parameters().grad());
      o2.step();
      m2.parameters().zero_grad();
    }
    const auto q1 = locus_train_test::host_values(std::as_const(m1.parameters()).master());
    const auto q2 = locus_train_test::host_values(std::as_const(m2.parameters()).master());
    CHECK(q1 == q2);
    // and not what an unclipped run gives
    auto m3 = make();
    locus::optim::adamw<D> o3(m3.parameters(), {.lr = 1e-2});
    locus::train::trainer t3(m3, o3, nn::cross_entropy{});
    t3.step(x, y);
    t3.step(x, y);
    CHECK(locus_train_test::host_values(std::as_const(m3.parameters()).master()) != q1);
  }

  // With a grad scaler: the bound applies to the unscaled gradient, whatever the scale.
  {
    using PF = locus::amp::fp16_mixed;
    auto mk = [] {
      nn::sequential m(nn::linear<D, PF>(12, 16), nn::relu<D, PF>(), nn::linear<D, PF>(16, 4));
      m.reset_parameters(21);
      return m;
    };
    auto m1 = mk(), m2 = mk();
    locus::optim::sgd<D> o1(m1.parameters(), {.lr = 1.0}), o2(m2.parameters(), {.lr = 1.0});
    locus::amp::grad_scaler<D> s1({.init_scale = 1024}), s2({.init_scale = 65536});
    locus::train::trainer t1(m1, o1, nn::cross_entropy{}, s1, {.clip_grad_value = c});
    locus::train::trainer t2(m2, o2, nn::cross_entropy{}, s2, {.clip_grad_value = c});
    t1.step(x, y);
    t2.step(x, y);
    auto init = mk();
    const auto q0 = locus_train_test::host_values(std::as_const(init.parameters()).master());
    const auto q1 = locus_train_test::host_values(std::as_const(m1.parameters()).master());
    const auto q2 = locus_train_test::host_values(std::as_const(m2.parameters()).master());
    double worst1 = 0, worst12 = 0;
    for (std::size_t i = 0; i < q0.size(); ++i) {
      CHECK(std::abs(q0[i] - q1[i]) <= c * (1 + 1e-6) + 1e-7);
      worst1 = std::max(worst1, std::abs((q0[i] - q1[i]) - std::clamp(g[i], -c, c)));
      worst12 = std::max(worst12, std::abs(q1[i] - q2[i]));
    }
    CHECK(worst1 < 2e-2 * c);   // f16 compute: close to the f32 run's clipped step
    CHECK(worst12 < 1e-3 * c);  // and the same at either scale
  }

  // Bad bounds, both clippings at once, and a step that would not be fused: refused.
  auto e = make();
  locus::optim::sgd<D> oe(e.parameters(), {.lr = 1.0});
  CHECK_THROWS_AS(locus::train::trainer(e, oe, nn::cross_entropy{}, {.clip_grad_value = -1.0}), locus::value_error);
  CHECK_THROWS_WITH_AS(locus::train::trainer(e, oe, nn::cross_entropy{}, {.clip_grad_value = 1e-50}),
                       doctest::Contains("clip_grad_value must be 0 (no clipping) or a finite number from 1.2e-38 to "
                                         "3.4e38 (the f32 range the step computes in), got 1e-50"),
                       locus::value_error);
  CHECK_THROWS_AS(locus::train::trainer(e, oe, nn::cross_entropy{},
                                        {.clip_grad_value = std::numeric_limits<double>::infinity()}),
                  locus::value_error);
  CHECK_THROWS_WITH_AS(locus::train::trainer(e, oe, nn::cross_entropy{}, {.clip_grad_norm = 1.0, .clip_grad_value = 1.0}),
                       doctest::Contains("choose one"), locus::value_error);
  CHECK_THROWS_AS(locus::train::trainer(e, oe, nn::cross_entropy{}, {.check_finite = false, .clip_grad_value = 1.0}),
                  locus::value_error);
}

TEST_CASE_TEMPLATE("training: the grad scaler skips an overflowing step then backs off and grows", D,
                   LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp16_mixed;
  namespace nn = locus::nn;
  nn::sequential m(nn::linear<D, P>(4, 3));
  auto& store = m.parameters();
  locus::optim::adamw<D> opt(store, {.lr = 0.01});
  locus::amp::grad_scaler<D> scaler({.init_scale = 1024.0f, .growth_interval = 3});
  CHECK(scaler.scale() == 1024.0f);

  const auto before = locus_train_test::host_values(std::as_const(store).master());
  auto set_grads = [&](float value, bool inject_inf) {
    auto g = locus::full<float, locus::cpu>({store.size()}, value);
    if (inject_inf) g(index_t{2}) = std::numeric_limits<float>::infinity();
    locus::copy(g, store.grad());
  };

  // an injected inf: the step is skipped and the scale halves
  set_grads(1024.0f * 0.5f, true);
  scaler.unscale(store);
  opt.step(scaler.state());
  scaler.update();
  CHECK(scaler.scale() == 512.0f);
  CHECK(scaler.skipped_steps() == 1);
  CHECK(opt.steps() == 0);
  CHECK(locus_train_test::host_values(std::as_const(store).master()) == before);

  // clean steps: unscale divides by the scale exactly; after 3 of them the scale doubles
  for (int k = 0; k < 3; ++k) {
    set_grads(512.0f * 0.25f, false);
    scaler.unscale(store);
    const auto g = locus_train_test::host_values(std::as_const(store).grad());
    CHECK(g[0] == 0.25);
    opt.step(scaler.state());
    scaler.update();
    CHECK(scaler.scale() == (k < 2 ? 512.0f : 1024.0f));
  }
  CHECK(opt.steps() == 3);
  CHECK(scaler.skipped_steps() == 1);
  const auto after = locus_train_test::host_values(std::as_const(store).master());
  CHECK(after != before);
  // the f16 compute copy follows the master weights
  const auto wc = locus_train_test::host_values(m.template get<0>().weight());
  for (std::size_t i = 0; i < wc.size(); ++i)
    CHECK(wc[i] == static_cast<double>(static_cast<float>(locus::f16(static_cast<float>(after[i])))));
}

TEST_CASE_TEMPLATE("training: AdamW and SGD updates equal double-precision references", D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  SUBCASE("adamw") {
    nn::sequential m(nn::linear<D, P>(5, 3));
    auto& store = m.parameters();
    const locus::optim::adamw_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
    locus::optim::adamw<D> opt(store, o);
    std::vector<double> p = locus_train_test::host_values(std::as_const(store).master());
    std::vector<double> mm(p.size(), 0.0), vv(p.size(), 0.0);
    for (int t = 1; t <= 4; ++t) {
      auto g = locus::randn<float, locus::cpu>({store.size()}, 60 + static_cast<std::uint64_t>(t));
      locus::copy(g, store.grad());
      opt.step();
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double gi = g(static_cast<index_t>(i));
        p[i] -= o.lr * o.weight_decay * p[i];
        mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * gi;
        vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * gi * gi;
        const double mh = mm[i] / (1 - std::pow(o.beta1, t)), vh = vv[i] / (1 - std::pow(o.beta2, t));
        p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
      }
    }
    const auto got = locus_train_test::host_values(std::as_const(store).master());
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(got[i] == doctest::Approx(p[i]).epsilon(1e-5));
    CHECK(opt.steps() == 4);
  }
  SUBCASE("sgd with Nesterov momentum and weight decay") {
    nn::sequential m(nn::linear<D, P>(5, 3));
    auto& store = m.parameters();
    const locus::optim::sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
    locus::optim::sgd<D> opt(store, o);
    std::vector<double> p = locus_train_test::host_values(std::as_const(store).master());
    std::vector<double> buf(p.size(), 0.0);
    for (int t = 1; t <= 4; ++t) {
      auto g = locus::randn<float, locus::cpu>({store.size()}, 70 + static_cast<std::uint64_t>(t));
      locus::copy(g, store.grad());
      opt.step();
      for (std::size_t i = 0; i < p.size(); ++i) {
        const double d = g(static_cast<index_t>(i)) + o.weight_decay * p[i];
        buf[i] = t == 1 ? d : o.momentum * buf[i] + d;
        p[i] -= o.lr * (d + o.momentum * buf[i]);
      }
    }
    const auto got = locus_train_test::host_values(std::as_const(store).master());
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(got[i] == doctest::Approx(p[i]).epsilon(1e-5));
  }
}

TEST_CASE_TEMPLATE("training: linear layers initialise as PyTorch does (uniform within 1/sqrt(in)) and the same on every device",
                   D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  nn::sequential m(nn::linear<D, P>(400, 300));
  m.reset_parameters(17);
  nn::sequential ref(nn::linear<locus::cpu, P>(400, 300));
  ref.reset_parameters(17);
  const auto w = locus_train_test::host_values(m.parameters().template master<2>(0));
  const auto wr = locus_train_test::host_values(ref.parameters().template master<2>(0));
  CHECK(w == wr);
  const double bound = 1.0 / std::sqrt(400.0);
  double mean = 0, var = 0, lo = 1, hi = -1;
  for (double v : w) {
    mean += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  mean /= static_cast<double>(w.size());
  for (double v : w) var += (v - mean) * (v - mean);
  var /= static_cast<double>(w.size());
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(std::abs(mean) < 0.01 * bound);                                      // 120,000 samples
  CHECK(var == doctest::Approx(bound * bound / 3.0).epsilon(0.02));          // U(-b, b)
  nn::sequential other(nn::linear<locus::cpu, P>(400, 300));
  other.reset_parameters(18);
  CHECK(locus_train_test::host_values(other.parameters().template master<2>(0)) != wr);
}

TEST_CASE_TEMPLATE("training: dropout drops about p of the elements and scales the kept by 1/(1-p) and backward reuses the forward's mask",
                   D, LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  using locus_train_test::host_values;
  const float p = 0.3f;
  const float keep_scale = 1.0f / (1.0f - p);  // what the kernel multiplies by, in f32
  const index_t rows = 200, cols = 500;        // 100,000 elements
  const auto x = locus::rand<float, D>({rows, cols}, 11, 0.5, 1.5);  // no zeros: a zero output means dropped
  const auto xv = std::as_const(x).view();
  const auto xh = host_values(xv);
  for (double v : xh) REQUIRE(v != 0.0);

  nn::sequential m(nn::dropout<D, P>(p, 7));
  auto& layer = m.template get<0>();
  auto forward = [&](auto& model) { return host_values(model.forward(xv)); };
  auto mask_of = [](const std::vector<double>& y) {
    std::vector<bool> keep(y.size());
    for (std::size_t i = 0; i < y.size(); ++i) keep[i] = y[i] != 0.0;
    return keep;
  };
  auto fraction_differing = [](const std::vector<bool>& a, const std::vector<bool>& b) {
    std::size_t d = 0;
    for (std::size_t i = 0; i < a.size(); ++i) d += a[i] != b[i] ? 1 : 0;
    return static_cast<double>(d) / static_cast<double>(a.size());
  };
  const double n = static_cast<double>(xh.size());
  const double tolerance = 5.0 * std::sqrt(static_cast<double>(p) * (1.0 - p) / n);  // five standard deviations

  CHECK(layer.counter() == 0);
  const auto y1 = forward(m);
  CHECK(layer.counter() == 1);
  REQUIRE(y1.size() == xh.size());
  std::size_t dropped = 0, wrong_scale = 0;
  for (std::size_t i = 0; i < y1.size(); ++i) {
    if (y1[i] == 0.0) ++dropped;
    else if (y1[i] != static_cast<double>(static_cast<float>(xh[i]) * keep_scale)) ++wrong_scale;
  }
  const double rate = static_cast<double>(dropped) / n;
  INFO("dropped " << dropped << " of " << n << " (rate " << rate << ", p " << p << ", tolerance " << tolerance << ")");
  CHECK(std::abs(rate - p) <= tolerance);
  CHECK(wrong_scale == 0);  // every kept value is x * (1 / (1 - p)), exactly
  const auto mask1 = mask_of(y1);
  {  // the mask is not one row repeated
    const std::vector<bool> row0(mask1.begin(), mask1.begin() + cols), row1(mask1.begin() + cols, mask1.begin() + 2 * cols);
    CHECK(row0 != row1);
  }

  // the same seed gives the same mask; another seed another one
  nn::sequential same(nn::dropout<D, P>(p, 7));
  CHECK(forward(same) == y1);
  nn::sequential other(nn::dropout<D, P>(p, 8));
  CHECK(fraction_differing(mask_of(forward(other)), mask1) > 0.3);  // independent masks: 2p(1-p) = 0.42

  // the next training forward draws a new mask
  const auto y2 = forward(m);
  CHECK(layer.counter() == 2);
  const auto mask2 = mask_of(y2);
  CHECK(fraction_differing(mask1, mask2) > 0.3);
  CHECK(std::abs(1.0 - static_cast<double>(std::count(mask2.begin(), mask2.end(), true)) / n - p) <= tolerance);

  // inference is the identity, draws nothing and saves nothing
  const auto yi = m.infer(xv);
  CHECK(host_values(std::as_const(yi).view()) == xh);
  CHECK(layer.counter() == 2);

  // backward applies the last training forward's mask (and scale) to the gradient
  const auto gy = locus::randn<float, D>({rows, cols}, 12);
  const auto gyh = host_values(std::as_const(gy).view());
  const auto gx = host_values(m.backward(std::as_const(gy).view(), true));
  REQUIRE(gx.size() == gyh.size());
  std::size_t wrong_grad = 0;
  for (std::size_t i = 0; i < gx.size(); ++i) {
    const double expect = mask2[i] ? static_cast<double>(static_cast<float>(gyh[i]) * keep_scale) : 0.0;
    if (gx[i] != expect) ++wrong_grad;
  }
  CHECK(wrong_grad == 0);

  // the mask is a function of (seed, counter): rewinding the counter repeats it
  layer.set_counter(0);
  CHECK(forward(m) == y1);
}

TEST_CASE_TEMPLATE("training: infer equals the training forward and saves nothing that backward uses", D,
                   LOCUS_TEST_DEVICES) {
  using P = locus::amp::fp64;
  namespace nn = locus::nn;
  using locus_train_test::host_values;
  const auto x1 = locus::randn<double, D>({6, 7}, 301);
  const auto x2 = locus::randn<double, D>({6, 7}, 302);
  const auto x1v = std::as_const(x1).view();
  const auto x2v = std::as_const(x2).view();
  auto check_close = [](const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
    }
  };

  SUBCASE("every layer kind fused and not gives the training forward's output") {
    auto make = [] {
      nn::sequential m(nn::linear<D, P>(7, 6), nn::relu<D, P>(), nn::linear<D, P>(6, 5), nn::gelu<D, P>(),
                       nn::linear<D, P>(5, 5, nn::bias::without), nn::gelu_tanh<D, P>(), nn::linear<D, P>(5, 4),
                       nn::tanh<D, P>(), nn::sigmoid<D, P>(), nn::relu<D, P>(), nn::linear<D, P>(4, 3));
      m.reset_parameters(23);
      return m;
    };
    auto fused = make();
    const auto out = fused.infer(x1v);
    const auto inferred = host_values(std::as_const(out).view());
    check_close(inferred, host_values(fused.forward(x1v)));
    const auto out2 = fused.infer(x2v);
    CHECK(inferred != host_values(std::as_const(out2).view()));  // it does depend on x

    // with hooks nothing is fused; the hooks run in both forwards
    auto hooked = make();
    int pre = 0, post = 0;
    hooked.template get<1>().add_forward_pre_hook([&](const auto&) { ++pre; });
    hooked.template get<4>().add_forward_hook([&](const auto&, const auto&) { ++post; });
    const auto hout = hooked.infer(x1v);
    CHECK(pre == 1);
    CHECK(post == 1);
    check_close(host_values(std::as_const(hout).view()), inferred);
    check_close(host_values(hooked.forward(x1v)), inferred);
    CHECK(pre == 2);
    CHECK(post == 2);
  }

  SUBCASE("an infer between forward and backward changes no gradient") {
    auto m = [] {
      nn::sequential s(nn::linear<D, P>(7, 6), nn::relu<D, P>(), nn::dropout<D, P>(0.4f, 5), nn::linear<D, P>(6, 5),
                       nn::tanh<D, P>(), nn::sigmoid<D, P>(), nn::linear<D, P>(5, 3));
      s.reset_parameters(29);
      return s;
    }();
    auto& drop = m.template get<2>();
    const auto gy = locus::randn<double, D>({6, 3}, 303);
    const auto gyv = std::as_const(gy).view();
    auto& store = m.parameters();

    store.zero_grad();
    drop.set_counter(0);
    m.forward(x1v);
    const auto gx_ref = host_values(m.backward(gyv, true));
    const auto gp_ref = host_values(std::as_const(store).grad());

    store.zero_grad();
    drop.set_counter(0);
    m.forward(x1v);
    const auto other = m.infer(x2v);  // another input of the same shape
    CHECK(drop.counter() == 1);       // no mask drawn
    const auto gx = host_values(m.backward(gyv, true));
    const auto gp = host_values(std::as_const(store).grad());
    check_close(gx, gx_ref);
    check_close(gp, gp_ref);

    // and the gradients at x2 are different ones: had infer saved x2's state, the
    // checks above would see it
    store.zero_grad();
    drop.set_counter(0);
    m.forward(x2v);
    CHECK(host_values(m.backward(gyv, true)) != gx_ref);
    (void)other;
  }
}

namespace locus_train_test {
/// A fresh step_state buffer on D (scale `scale`), as the trainer's guard holds it.
template <class D>
locus::tensor<std::int64_t, D, 1> make_guard(float scale) {
  const auto words = static_cast<index_t>((sizeof(locus::detail::step_state) + 7) / 8);
  locus::detail::step_state s{};
  s.scale = scale;
  auto h = locus::zeros<std::int64_t, locus::cpu>({words});
  std::memcpy(h.data_handle(), &s, sizeof s);
  auto t = locus::zeros<std::int64_t, D>({words});
  locus::copy(h, t);
  return t;
}
template <class D>
locus::detail::step_state read_guard(const locus::tensor<std::int64_t, D, 1>& t) {
  const auto h = locus::to<locus::cpu>(t);
  locus::detail::step_state s;
  std::memcpy(&s, h.data_handle(), sizeof s);
  return s;
}
template <class Opt>
std::vector<std::vector<double>> opt_state(Opt& o) {
  std::vector<std::vector<double>> out;
  o.for_each_state([&](const char*, auto v) { out.push_back(host_values(std::as_const(v))); });
  return out;
}
}  // namespace locus_train_test

// The trainer's fused optimizer step (check pass, then update with the unscale folded
// in) against the classic kernels (scaler.unscale, opt.step, scaler.update; or the fp32
// guard's check_begin / check_grads / guard_end): equal bit for bit over clean steps,
// an inf, a NaN, and a gradient whose unscaled value overflows; a skipped step changes
// no weight, no compute copy, no optimizer state and no step count.
TEST_CASE_TEMPLATE("training: the fused optimizer step equals the classic kernels bit for bit and skips exactly", D,
                   LOCUS_TEST_DEVICES) {
  using locus_train_test::host_values;
  namespace nn = locus::nn;
  using P = locus::amp::fp16_mixed;
  const float inf = std::numeric_limits<float>::infinity();
  // value of every gradient, and one injected element (index 2) per step
  struct plan {
    float g;
    float injected;
  };
  const std::vector<plan> steps{{0.5f, 0.5f},      {0.25f, inf},         {0.125f, 0.125f}, {2.0f, std::nanf("")},
                                {1.0f, 1.0f},      {0.75f, -inf},        {0.5f, 0.5f},     {0.3f, 3.0e38f},
                                {0.1f, 0.1f}};
  auto run = [&](auto make_opt, bool with_scaler) {
    nn::sequential a(nn::linear<D, P>(5, 3), nn::relu<D, P>(), nn::linear<D, P>(3, 2));
    nn::sequential b(nn::linear<D, P>(5, 3), nn::relu<D, P>(), nn::linear<D, P>(3, 2));
    a.reset_parameters(7);
    b.reset_parameters(7);
    auto& sa = a.parameters();
    auto& sb = b.parameters();
    REQUIRE(host_values(std::as_const(sa).master()) == host_values(std::as_const(sb).master()));
    auto oa = make_opt(sa);
    auto ob = make_opt(sb);
    // scale 0.5 after the first backoffs: 3e38 / scale overflows while 3e38 is finite
    locus::amp::grad_scaler<D> ca({.init_scale = 2.0f, .growth_interval = 2});
    locus::amp::grad_scaler<D> cb({.init_scale = 2.0f, .growth_interval = 2});
    auto ga = locus_train_test::make_guard<D>(1.0f);
    auto gb = locus_train_test::make_guard<D>(1.0f);
    auto flags_a = locus::zeros<int, D>({static_cast<index_t>(sa.count() + 1)});
    auto flags_b = locus::zeros<int, D>({static_cast<index_t>(sb.count() + 1)});
    auto* gsa = reinterpret_cast<locus::detail::step_state*>(ga.data_handle());
    auto* gsb = reinterpret_cast<locus::detail::step_state*>(gb.data_handle());
    for (std::size_t t = 0; t < steps.size(); ++t) {
      CAPTURE(t);
      auto g = locus::full<float, locus::cpu>({sa.size()}, steps[t].g);
      g(index_t{2}) = steps[t].injected;
      locus::copy(g, sa.grad());
      locus::copy(g, sb.grad());
      const auto before = host_values(std::as_const(sb).master());
      const auto before_state = locus_train_test::opt_state(ob);
      const auto before_steps = ob.steps();
      if (with_scaler) {
        ca.unscale(sa);
        oa.step(ca.state());
        ca.update();
        locus::optim::detail::fused_args<float> f;
        f.st = cb.state();
        f.scaler = true;
        f.growth = cb.options().growth_factor;
        f.backoff = cb.options().backoff_factor;
        f.interval = static_cast<float>(cb.options().growth_interval);
        ob.fused_step(f);
        CHECK(ca.scale() == cb.scale());
        CHECK(ca.skipped_steps() == cb.skipped_steps());
        CHECK(ca.growth_tracker() == cb.growth_tracker());
      } else {
        locus::detail::launch_n<D>(1, locus::detail::check_begin_kernel{gsa});
        locus::detail::run_check_grads<D>(
            locus::detail::check_grads_kernel<float>{sa.grad().data_handle(), gsa, sa.offsets_data(),
                                                     flags_a.data_handle(), static_cast<int>(sa.count()), false},
            sa.size());
        locus::detail::launch_n<D>(1, locus::detail::guard_end_kernel{gsa, static_cast<std::int64_t>(t)});
        oa.step(gsa);
        locus::optim::detail::fused_args<float> f;
        f.st = gsb;
        f.offsets = sb.offsets_data();
        f.param_bad = flags_b.data_handle();
        f.count = static_cast<int>(sb.count());
        f.micro_step = static_cast<std::int64_t>(t);
        ob.fused_step(f);
        const auto sta = locus_train_test::read_guard(ga), stb = locus_train_test::read_guard(gb);
        CHECK(sta.sticky == stb.sticky);
        CHECK(sta.bad_step == stb.bad_step);
        CHECK(sta.skipped == stb.skipped);
        CHECK(host_values(std::as_const(flags_a).view()) == host_values(std::as_const(flags_b).view()));
      }
      const bool bad = !std::isfinite(steps[t].injected) ||
                       (with_scaler && !std::isfinite(steps[t].injected / 0.5f) && t >= 7) || (!with_scaler && t >= 1);
      CHECK(host_values(std::as_const(sa).master()) == host_values(std::as_const(sb).master()));
      CHECK(host_values(a.template get<0>().weight()) == host_values(b.template get<0>().weight()));
      CHECK(locus_train_test::opt_state(oa) == locus_train_test::opt_state(ob));
      CHECK(oa.steps() == ob.steps());
      if (bad) {  // exact skip
        CHECK(host_values(std::as_const(sb).master()) == before);
        CHECK(locus_train_test::opt_state(ob) == before_state);
        CHECK(ob.steps() == before_steps);
      } else {
        CHECK(host_values(std::as_const(sb).master()) != before);
        CHECK(ob.steps() == before_steps + 1);
      }
    }
  };
  SUBCASE("adamw, grad scaler") {
    run([](auto& s) { return locus::optim::adamw<D>(s, {.lr = 0.01, .weight_decay = 0.1}); }, true);
  }
  SUBCASE("sgd with momentum, grad scaler") {
    run([](auto& s) { return locus::optim::sgd<D>(s, {.lr = 0.05, .momentum = 0.9}); }, true);
  }
  SUBCASE("adamw, fp32 guard (sticky after the first bad step)") {
    run([](auto& s) { return locus::optim::adamw<D>(s, {.lr = 0.01}); }, false);
  }
}

// The fused AdamW step with the unscale folded in against double precision.
TEST_CASE_TEMPLATE("training: the fused AdamW step with a grad scaler equals a double-precision reference", D,
                   LOCUS_TEST_DEVICES) {
  using locus_train_test::host_values;
  namespace nn = locus::nn;
  nn::sequential m(nn::linear<D, locus::amp::fp32>(4, 3));
  auto& store = m.parameters();
  const locus::optim::adamw_options o{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05};
  locus::optim::adamw<D> opt(store, o);
  locus::amp::grad_scaler<D> scaler({.init_scale = 8.0f, .growth_interval = 100});
  std::vector<double> p = host_values(std::as_const(store).master());
  std::vector<double> mm(p.size(), 0.0), vv(p.size(), 0.0);
  for (int t = 1; t <= 3; ++t) {
    auto g = locus::randn<float, locus::cpu>({store.size()}, 90 + static_cast<std::uint64_t>(t));
    for (index_t i = 0; i < g.numel(); ++i) g(i) *= 8.0f;  // scaled gradients
    locus::copy(g, store.grad());
    locus::optim::detail::fused_args<float> f;
    f.st = scaler.state();
    f.scaler = true;
    f.interval = 100.0f;
    opt.fused_step(f);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double gi = static_cast<double>(g(static_cast<index_t>(i))) / 8.0;
      p[i] -= o.lr * o.weight_decay * p[i];
      mm[i] = o.beta1 * mm[i] + (1 - o.beta1) * gi;
      vv[i] = o.beta2 * vv[i] + (1 - o.beta2) * gi * gi;
      const double mh = mm[i] / (1 - std::pow(o.beta1, t)), vh = vv[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * mh / (std::sqrt(vh) + o.eps);
    }
    const auto got = host_values(std::as_const(store).master());
    for (std::size_t i = 0; i < p.size(); ++i) CHECK(got[i] == doctest::Approx(p[i]).epsilon(2e-5));
  }
  CHECK(opt.steps() == 3);
  CHECK(scaler.skipped_steps() == 0);
  CHECK(scaler.scale() == 8.0f);
}
