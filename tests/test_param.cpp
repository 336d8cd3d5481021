// Host suite: functional parameters (nn::param, <locus/nn/param.hpp>): a module's own
// weights outside any layer get their gradients in the store, against f64 central
// finite differences of the inference forward (which shares nothing with backward);
// a parameter used twice adds both contributions; names, initialisation, errors;
// training through the trainer under fp32 and bf16_mixed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <locus/nn/param.hpp>
#include <locus/train.hpp>

namespace {

namespace nn = locus::nn;
namespace ag = locus::ag;
using locus::cpu;
using locus::index_t;

/// y = tanh(x w + b) * gain + (x w) * gain: w, b and gain are parameters, gain used twice.
template <class D, class P>
struct own : nn::module<D, P> {
  nn::param<D, P, 2> w{this, "w", {4, 3}, nn::param_init::uniform(-0.5, 0.5)};
  nn::param<D, P, 1> b{this, "b", {3}, nn::param_init::normal(0.0, 0.1)};
  nn::param<D, P, 1> gain{this, "gain", {3}, nn::param_init::ones()};
  auto forward(const typename own::template var<2>& x) {
    const auto z = ag::matmul(x, w.on(x));
    return ag::tanh(z + b.on(x)) * gain.on(x) + z * gain.on(x);
  }
};

template <class D, class P>
struct outer : nn::module<D, P> {
  nn::child<own<D, P>> inner{this, "inner"};
  nn::layer<nn::linear<D, P>> fc{this, "fc", 3, 2};
  auto forward(const typename outer::template var<2>& x) { return fc(inner(x)); }
};

}  // namespace

TEST_CASE("nn::param: gradients of a module's own weights (one used twice) match f64 finite differences") {
  using P = locus::amp::fp64;
  nn::model<outer<cpu, P>> m;
  m.reset_parameters(3);
  const auto& names = m.parameters().entries();
  REQUIRE(names.size() == 5);
  CHECK(names[0].name == "inner.w");
  CHECK(names[1].name == "inner.b");
  CHECK(names[2].name == "inner.gain");
  CHECK(names[3].name == "fc.weight");
  const auto x = locus::randn<double, cpu>({5, 4}, 1);
  const auto gy = locus::randn<double, cpu>({5, 2}, 2);
  m.parameters().zero_grad();
  (void)m.forward(x.view());
  (void)m.backward(gy.view());
  const auto loss = [&] {
    const auto y = m.infer(x.view());
    double s = 0;
    for (index_t i = 0; i < y.numel(); ++i) s += y.data_handle()[i] * gy.data_handle()[i];
    return s;
  };
  auto& st = m.parameters();
  const auto grad = st.grad();
  for (std::size_t p = 0; p < 3; ++p) {
    const auto& e = st.entries()[p];
    for (index_t i = 0; i < e.numel; ++i) {
      double* w = st.master().data_handle() + e.offset + i;
      const double keep = *w, h = 1e-6;
      *w = keep + h;
      const double up = loss();
      *w = keep - h;
      const double down = loss();
      *w = keep;
      const double numeric = (up - down) / (2 * h);
      const double a = grad.data_handle()[e.offset + i];
      INFO(e.name << " element " << i << ": backward " << a << ", finite differences " << numeric);
      CHECK(std::abs(a - numeric) <= 1e-6 * std::max(1.0, std::abs(numeric)));
    }
  }
  // a second backward of a new forward adds (accumulation), a discarded gradient is overwritten
  const double g0 = grad.data_handle()[st.entries()[2].offset];
  (void)m.forward(x.view());
  (void)m.backward(gy.view());
  CHECK(st.grad().data_handle()[st.entries()[2].offset] == doctest::Approx(2 * g0).epsilon(1e-12));
  st.discard_grad();
  (void)m.forward(x.view());
  (void)m.backward(gy.view());
  CHECK(st.grad().data_handle()[st.entries()[2].offset] == doctest::Approx(g0).epsilon(1e-12));
}

TEST_CASE("nn::param: initialisation, names and errors") {
  using P = locus::amp::fp32;
  nn::model<own<cpu, P>> m;
  auto& net = m.net();
  for (index_t i = 0; i < 3; ++i) CHECK(net.gain.master()(i) == 1.0f);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 3; ++j) {
      CHECK(net.w.master()(i, j) >= -0.5f);
      CHECK(net.w.master()(i, j) < 0.5f);
    }
  // the same seed draws the same weights, another seed others
  const float w00 = net.w.master()(0, 0);
  m.reset_parameters(0);
  CHECK(net.w.master()(0, 0) == w00);
  m.reset_parameters(5);
  CHECK(net.w.master()(0, 0) != w00);
  CHECK(m.summary().find("w  param [4, 3]  12") != std::string::npos);
  // a forward in inference records no gradient entry
  const auto x = locus::randn<float, cpu>({2, 4}, 3);
  const auto y = m.infer(x.view());
  CHECK(y.shape() == locus::extents<2>{2, 3});
}

namespace {
template <class D, class P>
struct bad_uniform : nn::module<D, P> {
  nn::param<D, P, 1> p{this, "p", {3}, nn::param_init::uniform(1.0, 1.0)};
  auto forward(const typename bad_uniform::template var<2>& x) { return x * p.on(x); }
};
template <class D, class P>
struct twice : nn::module<D, P> {
  nn::param<D, P, 1> p{this, "p", {3}};
  nn::param<D, P, 1> q{this, "p", {3}};
  auto forward(const typename twice::template var<2>& x) { return x * p.on(x); }
};
template <class D, class P>
struct scale_net : nn::module<D, P> {
  nn::layer<nn::linear<D, P>> fc{this, "fc", 6, 4};
  nn::param<D, P, 1> gain{this, "gain", {4}, nn::param_init::constant(0.5)};
  auto forward(const typename scale_net::template var<2>& x) { return fc(x) * gain.on(x); }
};
}  // namespace

TEST_CASE("nn::param: a bad initialisation or a repeated name is refused, and a module with one trains in fp32 and bf16") {
  using P = locus::amp::fp32;
  using bad_model = nn::model<bad_uniform<cpu, P>>;
  using twice_model = nn::model<twice<cpu, P>>;
  CHECK_THROWS_AS(bad_model{}, locus::value_error);
  CHECK_THROWS_AS(twice_model{}, locus::value_error);
  const auto run = [](auto& m) {
    locus::optim::adamw<cpu> opt(m.parameters(), {.lr = 5e-2});
    locus::train::trainer t(m, opt, nn::cross_entropy{});
    auto x = locus::randn<float, cpu>({16, 6}, 4);
    std::vector<std::int64_t> labels;
    for (index_t i = 0; i < 16; ++i) labels.push_back(i % 4);
    const auto y = locus::from_host<cpu>(labels, {16});
    for (int s = 0; s < 30; ++s) t.step(x, y);
    return m.net().gain.master()(0);
  };
  nn::model<scale_net<cpu, P>> a;
  CHECK(a.net().gain.master()(0) == 0.5f);
  CHECK(run(a) != 0.5f);  // the optimizer moved the parameter
  nn::model<scale_net<cpu, locus::amp::bf16_mixed>> b;
  CHECK(run(b) != 0.5f);
}
