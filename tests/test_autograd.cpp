// Host suite: reverse-mode autograd (ag::tape, ag::var, ag/ops.hpp). Every
// differentiable operation's gradient against central finite differences in f64 (the
// reference is the forward alone, evaluated at perturbed inputs, so it shares nothing
// with the backward code), whole graphs with branches and a skip connection, gradient
// accumulation when one value feeds several operations, and the run-time rules: backward
// twice, a value of an earlier step or of another tape, shapes that do not match,
// nothing changed by a refused call. The steady state reuses every buffer and node.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <locus/ag/ops.hpp>
#include <locus/locus.hpp>

namespace {

namespace ag = locus::ag;
using locus::index_t;
using T = double;
using D = locus::cpu;
using tape_t = ag::tape<T, D>;

/// Inputs of a check: tensors whose gradient is taken.
using inputs = std::vector<locus::tensor<T, D, 2>*>;

/// f(tape, leaves) -> a rank-0 value. Checks dL/d(input) from backward against central
/// differences of the forward (f64, step h, relative-or-absolute tolerance tol).
void check_gradients(const std::function<ag::var<T, D, 0>(tape_t&, std::vector<ag::var<T, D, 2>>&)>& f, inputs in,
                     double h = 1e-6, double tol = 1e-6) {
  tape_t t;
  std::vector<ag::var<T, D, 2>> leaves;
  for (auto* x : in) leaves.push_back(t.leaf(*x));
  const auto loss = f(t, leaves);
  t.backward(loss);
  std::vector<std::vector<double>> analytic;
  for (auto& l : leaves) {
    const auto g = t.grad(l);
    analytic.emplace_back(g.data_handle(), g.data_handle() + g.numel());
  }
  const auto value_at = [&]() {
    tape_t u;
    std::vector<ag::var<T, D, 2>> ls;
    for (auto* x : in) ls.push_back(u.constant(*x));
    return f(u, ls).value().data_handle()[0];
  };
  for (std::size_t k = 0; k < in.size(); ++k) {
    T* p = in[k]->data_handle();
    for (index_t i = 0; i < in[k]->numel(); ++i) {
      const T keep = p[i];
      p[i] = keep + h;
      const double up = value_at();
      p[i] = keep - h;
      const double down = value_at();
      p[i] = keep;
      const double numeric = (up - down) / (2 * h);
      const double a = analytic[k][static_cast<std::size_t>(i)];
      INFO("input " << k << " element " << i << ": backward " << a << ", finite differences " << numeric);
      CHECK(std::abs(a - numeric) <= tol * std::max(1.0, std::abs(numeric)));
    }
  }
}

locus::tensor<T, D, 2> random(index_t r, index_t c, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return locus::rand<T, D>({r, c}, seed, lo, hi);
}

}  // namespace

TEST_CASE("autograd: element-wise +, -, * and scalar arithmetic against finite differences") {
  auto a = random(3, 4, 1), b = random(3, 4, 2);
  check_gradients([](tape_t&, auto& v) { return ag::sum(v[0] * v[1] + v[0] - v[1]); }, {&a, &b});
  check_gradients([](tape_t&, auto& v) { return ag::mean((2.5 * v[0] - 1.0) * (v[1] / 4.0 + 3.0)); }, {&a, &b});
  check_gradients([](tape_t&, auto& v) { return ag::sum(-v[0] * (1.0 - v[1])); }, {&a, &b});
  // one value used twice: contributions add
  check_gradients([](tape_t&, auto& v) { return ag::sum(v[0] * v[0] * v[0]); }, {&a});
}

TEST_CASE("autograd: a bias broadcast over rows gets the sum of its rows' gradients") {
  auto x = random(5, 3, 3);
  auto b = random(1, 3, 4);
  check_gradients(
      [](tape_t&, auto& v) {
        const auto bias = ag::reshape(v[1], locus::extents<1>{3});
        return ag::sum(ag::tanh(v[0] + bias) * (v[0] * bias) - (v[0] - bias));
      },
      {&x, &b});
}

TEST_CASE("autograd: activations, exp and log against finite differences") {
  // away from relu's kink at 0
  auto x = random(4, 5, 5, 0.1, 1.5);
  auto s = random(4, 5, 6);
  for (index_t i = 0; i < 10; ++i) x.data_handle()[i] = -x.data_handle()[i];
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::relu(v[0]) * v[1]); }, {&x, &s});
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::gelu(v[0]) * v[1]); }, {&x, &s});
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::gelu_tanh(v[0]) * v[1]); }, {&x, &s});
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::tanh(v[0]) * v[1]); }, {&x, &s});
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::sigmoid(v[0]) * v[1]); }, {&x, &s});
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::exp(v[0]) * v[1]); }, {&x, &s});
  auto pos = random(4, 5, 7, 0.5, 2.0);
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::log(v[0]) * v[1]); }, {&pos, &s});
}

TEST_CASE("autograd: matmul and linear (with each fused activation) against finite differences") {
  auto a = random(4, 3, 8), b = random(3, 5, 9), s = random(4, 5, 10);
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::matmul(v[0], v[1]) * v[2]); }, {&a, &b, &s});
  auto x = random(6, 4, 11), w = random(3, 4, 12), bias = random(1, 3, 13), g = random(6, 3, 14);
  for (const auto act : {ag::fused::none, ag::fused::relu, ag::fused::gelu, ag::fused::gelu_tanh, ag::fused::tanh,
                         ag::fused::sigmoid}) {
    CAPTURE(static_cast<int>(act));
    check_gradients(
        [act](tape_t&, auto& v) {
          return ag::sum(ag::linear(v[0], v[1], ag::reshape(v[2], locus::extents<1>{3}), act) * v[3]);
        },
        {&x, &w, &bias, &g});
    check_gradients([act](tape_t&, auto& v) { return ag::sum(ag::linear(v[0], v[1], act) * v[2]); }, {&x, &w, &g});
  }
}

TEST_CASE("autograd: log_softmax and cross_entropy (with label smoothing) against finite differences") {
  auto x = random(5, 4, 15, -3.0, 3.0), s = random(5, 4, 16);
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::log_softmax(v[0]) * v[1]); }, {&x, &s});
  const auto labels = locus::from_host<D>(std::vector<std::int64_t>{0, 3, 1, 1, 2}, {5});
  check_gradients([&](tape_t&, auto& v) { return ag::cross_entropy(v[0], labels); }, {&x});
  check_gradients([&](tape_t&, auto& v) { return ag::cross_entropy(v[0], labels, 0.1f) * 3.0; }, {&x});
  // the loss equals nn::cross_entropy's
  tape_t t;
  const auto l = ag::cross_entropy(t.constant(x), labels);
  double ref = 0;
  for (index_t i = 0; i < 5; ++i) {
    double m = -1e300, z = 0;
    for (index_t j = 0; j < 4; ++j) m = std::max(m, x(i, j));
    for (index_t j = 0; j < 4; ++j) z += std::exp(x(i, j) - m);
    ref += -(x(i, labels(i)) - m - std::log(z));
  }
  CHECK(l.value().data_handle()[0] == doctest::Approx(ref / 5).epsilon(1e-12));
}

TEST_CASE("autograd: a network with two branches, a skip connection and a reused weight") {
  auto x = random(4, 6, 17), w1 = random(5, 6, 18), w2 = random(6, 5, 19), b1 = random(1, 5, 20);
  auto head = random(3, 6, 21);
  const auto labels = locus::from_host<D>(std::vector<std::int64_t>{2, 0, 1, 2}, {4});
  check_gradients(
      [&](tape_t&, auto& v) {
        const auto h = ag::linear(v[0], v[1], ag::reshape(v[3], locus::extents<1>{5}), ag::fused::relu);
        const auto branch = ag::linear(h, v[2]);                // [4, 6]
        const auto other = ag::sigmoid(ag::linear(v[0], v[1]));  // w1 used a second time
        const auto y = ag::relu(branch + v[0]) + ag::linear(other, v[2]) * 0.5;  // skip connection
        return ag::cross_entropy(ag::linear(y, v[4]), labels) + ag::mean(ag::tanh(y)) * 0.1;
      },
      {&x, &w1, &w2, &b1, &head}, 1e-6, 2e-6);
}

TEST_CASE("autograd: flatten and reshape pass gradients through, rank 4 to rank 2") {
  auto x = random(2, 12, 22), s = random(2, 12, 23);
  check_gradients(
      [](tape_t&, auto& v) {
        const auto img = ag::reshape(v[0], locus::extents<4>{2, 3, 2, 2});
        return ag::sum(ag::flatten(ag::relu(img) + img) * v[1]);
      },
      {&x, &s});
}

TEST_CASE("autograd: values that need no gradient get none, and constants cost no backward entry") {
  auto x = random(3, 3, 24), w = random(3, 3, 25);
  tape_t t;
  const auto c = t.constant(x);
  const auto l = t.leaf(w);
  const auto y = ag::relu(ag::matmul(c, c));  // constants only: nothing recorded for backward
  CHECK_FALSE(y.requires_grad());
  CHECK(t.operations() == 0);
  const auto loss = ag::sum(ag::matmul(y, l));
  CHECK(loss.requires_grad());
  t.backward(loss);
  CHECK_THROWS_WITH_AS((void)t.grad(c), doctest::Contains("requires no gradient"), locus::autograd_error);
  const auto g = t.grad(l);
  // d sum(Y W) / dW = Y^T 1
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 3; ++j) {
      double ref = 0;
      for (index_t r = 0; r < 3; ++r) ref += y.value()(r, i);
      CHECK(g(i, j) == doctest::Approx(ref).epsilon(1e-14));
    }
}

TEST_CASE("autograd: backward twice, values of an earlier step or another tape, and empty values are autograd_errors") {
  auto x = random(2, 2, 26);
  tape_t t;
  const auto a = t.leaf(x);
  const auto loss = ag::sum(a * a);
  t.backward(loss);
  const auto g0 = std::vector<double>(t.grad(a).data_handle(), t.grad(a).data_handle() + 4);
  CHECK_THROWS_WITH_AS(t.backward(loss), doctest::Contains("already run for this step"), locus::autograd_error);
  CHECK(std::vector<double>(t.grad(a).data_handle(), t.grad(a).data_handle() + 4) == g0);  // unchanged
  CHECK_THROWS_WITH_AS((void)ag::relu(a), doctest::Contains("after backward"), locus::autograd_error);
  t.reset();
  CHECK_THROWS_WITH_AS((void)ag::relu(a), doctest::Contains("earlier step"), locus::autograd_error);
  CHECK_THROWS_WITH_AS(t.backward(loss), doctest::Contains("earlier step"), locus::autograd_error);
  tape_t other;
  const auto b = other.leaf(x);
  const auto a2 = t.leaf(x);
  CHECK_THROWS_WITH_AS((void)(a2 + b), doctest::Contains("another tape"), locus::autograd_error);
  CHECK_THROWS_WITH_AS(t.backward(ag::sum(b)), doctest::Contains("another tape"), locus::autograd_error);
  ag::var<T, D, 2> empty;
  CHECK_THROWS_WITH_AS((void)ag::relu(empty), doctest::Contains("empty value"), locus::autograd_error);
  CHECK_THROWS_WITH_AS((void)t.grad(a2), doctest::Contains("before backward"), locus::autograd_error);
}

TEST_CASE("autograd: shapes that do not match are shape_errors naming both, with nothing recorded") {
  auto x = random(3, 4, 27), y = random(4, 3, 28), b = random(1, 5, 29);
  tape_t t;
  const auto a = t.leaf(x);
  const auto c = t.leaf(y);
  const auto bias = ag::reshape(t.leaf(b), locus::extents<1>{5});
  const auto before = t.operations();
  const auto values = t.values();
  CHECK_THROWS_WITH_AS((void)(a + c), doctest::Contains("[3, 4] and [4, 3]"), locus::shape_error);
  CHECK_THROWS_WITH_AS((void)(a * bias), doctest::Contains("trailing axes"), locus::shape_error);
  CHECK_THROWS_WITH_AS((void)ag::matmul(a, a), doctest::Contains("inner extents"), locus::shape_error);
  CHECK_THROWS_AS((void)ag::reshape(a, locus::extents<2>{5, 2}), locus::shape_error);
  const auto labels = locus::from_host<D>(std::vector<std::int64_t>{0, 1}, {2});
  CHECK_THROWS_WITH_AS((void)ag::cross_entropy(a, labels), doctest::Contains("one label per row"), locus::shape_error);
  CHECK(t.operations() == before);
  CHECK(t.values() == values);
}

TEST_CASE("autograd: a step at unchanged shapes reuses the tape's buffers and nodes") {
  auto x = random(8, 6, 30), w = random(4, 6, 31);
  const auto labels = locus::from_host<D>(std::vector<std::int64_t>{0, 1, 2, 3, 0, 1, 2, 3}, {8});
  tape_t t;
  std::vector<const void*> first;
  for (int step = 0; step < 3; ++step) {
    t.reset();
    const auto h = ag::linear(t.constant(x), t.leaf(w), ag::fused::relu);
    const auto loss = ag::cross_entropy(h, labels) + ag::mean(h * h) * 0.01;
    t.backward(loss);
    std::vector<const void*> now{h.value().data_handle(), loss.value().data_handle()};
    if (step == 0) first = now;
    else CHECK(now == first);  // the same buffers
  }
  CHECK(t.operations() == 6);
}

namespace {
/// y = x^3 with its own backward (3 x^2 g): a user's operation.
struct cube {
  locus::extents<2> shape(const locus::extents<2>& in) const { return in; }
  void forward(const locus::tensor_view<T, D, 2>& out, const locus::tensor_view<const T, D, 2>& x) const {
    out = x * x * x;
  }
  void backward(const locus::tensor_view<const T, D, 2>& g, const locus::tensor_view<const T, D, 2>& x,
                const locus::tensor_view<const T, D, 2>&, const locus::tensor_view<T, D, 2>& gx) const {
    gx = g * x * x * 3.0;
  }
};
/// out[i] = sum_j a[i, j] * b[j] (a matrix-vector product), both gradients by hand.
struct matvec {
  locus::extents<1> shape(const locus::extents<2>& a, const locus::extents<1>&) const { return {a[0]}; }
  void forward(const locus::tensor_view<T, D, 1>& out, const locus::tensor_view<const T, D, 2>& a,
               const locus::tensor_view<const T, D, 1>& b) const {
    for (index_t i = 0; i < a.shape()[0]; ++i) {
      double s = 0;
      for (index_t j = 0; j < a.shape()[1]; ++j) s += a(i, j) * b(j);
      out(i) = s;
    }
  }
  void backward(const locus::tensor_view<const T, D, 1>& g, const locus::tensor_view<const T, D, 2>& a,
                const locus::tensor_view<const T, D, 1>& b, const locus::tensor_view<const T, D, 1>&,
                const locus::tensor_view<T, D, 2>& ga, const locus::tensor_view<T, D, 1>& gb) const {
    for (index_t j = 0; j < a.shape()[1]; ++j) gb(j) = 0;
    for (index_t i = 0; i < a.shape()[0]; ++i)
      for (index_t j = 0; j < a.shape()[1]; ++j) {
        ga(i, j) = g(i) * b(j);
        gb(j) += g(i) * a(i, j);
      }
  }
};
}  // namespace

TEST_CASE("autograd: operations of your own (ag::apply) with their backward, used twice, against finite differences") {
  auto x = random(3, 4, 40), v = random(1, 4, 41);
  check_gradients([](tape_t&, auto& in) { return ag::sum(ag::apply(cube{}, in[0]) + ag::apply(cube{}, in[0])); },
                  {&x});
  check_gradients(
      [](tape_t&, auto& in) {
        const auto y = ag::apply(matvec{}, ag::tanh(in[0]), ag::reshape(in[1], locus::extents<1>{4}));
        return ag::sum(y * y);
      },
      {&x, &v});
}

// ---- the cases of the hostile review of autograd (kept as tests) ------------------------

TEST_CASE("autograd review: a cross_entropy that throws leaves nothing on the tape, and the next backward is right") {
  auto x = random(4, 3, 50), w = random(3, 3, 51);
  const auto bad = locus::from_host<D>(std::vector<std::int64_t>{0, 7, 1, 2}, {4});
  const auto good = locus::from_host<D>(std::vector<std::int64_t>{0, 2, 1, 2}, {4});
  tape_t t;
  const auto wv = t.leaf(w);
  const auto logits = ag::matmul(t.constant(x), wv);
  const auto ops = t.operations();
  CHECK_THROWS_AS((void)ag::cross_entropy(logits, bad), locus::index_error);
  CHECK_THROWS_AS((void)ag::cross_entropy(logits, good, -0.5f), locus::value_error);
  CHECK_THROWS_AS((void)ag::cross_entropy(logits, good, std::nanf("")), locus::value_error);
  CHECK(t.operations() == ops);
  t.backward(ag::cross_entropy(logits, good));
  const auto g = t.grad(wv);
  // the same loss on a fresh tape, without the failed calls
  tape_t u;
  const auto w2 = u.leaf(w);
  u.backward(ag::cross_entropy(ag::matmul(u.constant(x), w2), good));
  const auto g2 = u.grad(w2);
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 3; ++j) CHECK(g(i, j) == g2(i, j));
}

TEST_CASE("autograd review: a value of a destroyed tape is refused by a new tape at the same address") {
  auto x = random(2, 2, 52);
  // (a unique_ptr: g++ -O3 sees std::optional's emplace as reading an uninitialised tape)
  auto t = std::make_unique<tape_t>();
  const auto old = t->leaf(x);
  t.reset();
  t = std::make_unique<tape_t>();  // very likely the same address
  CHECK_THROWS_AS((void)ag::relu(old), locus::autograd_error);
  CHECK_THROWS_AS(t->backward(ag::sum(old)), locus::autograd_error);
}

TEST_CASE("autograd review: views of mutable elements enter the tape, and flatten keeps an empty batch's features") {
  auto x = random(6, 4, 53);
  tape_t t;
  const auto part = t.constant(x.slice(0, 4));  // a view of a named tensor: nothing dangles
  CHECK(part.shape() == locus::extents<2>{4, 4});
  const auto l = t.leaf(x.slice(2, 6));
  CHECK(l.requires_grad());
  auto e = locus::zeros<T, D>({0, 3, 4});
  const auto f = ag::flatten(t.constant(e));
  CHECK(f.shape() == locus::extents<2>{0, 12});
}

TEST_CASE("autograd review: matmul and linear on bf16 tapes, against the f32 gradients") {
  auto xf = locus::rand<float, D>({5, 4}, 60, -1.0, 1.0), wf = locus::rand<float, D>({3, 4}, 61, -1.0, 1.0);
  auto xb = locus::eval(locus::cast<locus::bf16>(xf));
  auto wb = locus::eval(locus::cast<locus::bf16>(wf));
  ag::tape<float, D> tf;
  const auto wvf = tf.leaf(wf);
  const auto hf = ag::linear(tf.constant(xf), wvf, ag::fused::tanh);
  tf.backward(ag::sum(ag::matmul(hf, wvf) + ag::matmul(hf, wvf)));  // wf used three times: accumulation
  ag::tape<locus::bf16, D> tb;
  const auto wvb = tb.leaf(wb);
  const auto hb = ag::linear(tb.constant(xb), wvb, ag::fused::tanh);
  tb.backward(ag::sum(ag::matmul(hb, wvb) + ag::matmul(hb, wvb)));
  const auto gf = tf.grad(wvf);
  const auto gb = tb.grad(wvb);
  for (index_t i = 0; i < 3; ++i)
    for (index_t j = 0; j < 4; ++j)
      CHECK(static_cast<float>(gb(i, j)) == doctest::Approx(gf(i, j)).epsilon(0.05).scale(1.0));
}
