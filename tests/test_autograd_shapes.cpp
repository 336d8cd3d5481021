// Host suite: the layout operations and softmax of ag/shapes.hpp (transpose, slice,
// concat, softmax, gather_rows), each gradient against central finite differences in
// f64 of the forward alone; forwards against values computed here by index loops; the
// run-time rules (axes outside the rank, slices outside the extent, concat shapes that
// differ, ids outside the table), each leaving the tape as it was; accumulation when a
// value feeds several of these operations; bf16 against f32.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <locus/ag/ops.hpp>
#include <locus/locus.hpp>

namespace {

namespace ag = locus::ag;
using locus::extents;
using locus::index_t;
using T = double;
using D = locus::cpu;
using tape_t = ag::tape<T, D>;
using inputs = std::vector<locus::tensor<T, D, 2>*>;

/// f(tape, leaves) -> rank-0 value; dL/d(input) from backward against central
/// differences of the forward.
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

locus::tensor<T, D, 2> random(index_t r, index_t c, std::uint64_t seed) { return locus::rand<T, D>({r, c}, seed, -1.0, 1.0); }

/// A fixed, non-uniform weighting so every output element matters differently.
template <std::size_t R>
ag::var<T, D, 0> weigh(tape_t& t, const ag::var<T, D, R>& v, locus::tensor<T, D, R>& w) {
  return ag::sum(v * t.constant(w));
}

}  // namespace

TEST_CASE("autograd shapes: transpose of the last two and of any two axes against loops and finite differences") {
  auto a = random(6, 4, 1);
  {  // forward against index loops: rank 3 [2, 3, 4] with axes 0 and 2 exchanged
    tape_t t;
    const auto x = ag::reshape(t.constant(a), extents<3>{2, 3, 4});
    const auto y = ag::transpose(x, 0, 2);
    REQUIRE(y.shape() == extents<3>{4, 3, 2});
    for (index_t i = 0; i < 2; ++i)
      for (index_t j = 0; j < 3; ++j)
        for (index_t k = 0; k < 4; ++k) CHECK(y.value()(k, j, i) == a.data_handle()[(i * 3 + j) * 4 + k]);
  }
  auto w2 = random(4, 6, 2);
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::transpose(v[0]), w2); }, {&a});
  auto w3 = locus::rand<T, D>({4, 3, 2}, 3, -1.0, 1.0);
  check_gradients(
      [&](tape_t& t, auto& v) { return weigh<3>(t, ag::transpose(ag::reshape(v[0], extents<3>{2, 3, 4}), 0, 2), w3); },
      {&a});
  // a value used plainly and transposed: both contributions add (a x^T x-like product)
  auto sq = random(4, 4, 4);
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::matmul(v[0], ag::transpose(v[0])) * v[0]); }, {&sq});
  // a transposed matmul operand that feeds a tanh
  auto b = random(6, 5, 5);
  check_gradients([](tape_t&, auto& v) { return ag::sum(ag::tanh(ag::matmul(ag::transpose(v[0]), v[1]))); },
                  {&a, &b});
}

TEST_CASE("autograd shapes: slice along each axis, the rest of the input getting no gradient") {
  auto a = random(5, 6, 6);
  {
    tape_t t;
    const auto x = t.constant(a);
    const auto y = ag::slice(x, 1, 2, 5);
    REQUIRE(y.shape() == extents<2>{5, 3});
    for (index_t i = 0; i < 5; ++i)
      for (index_t j = 0; j < 3; ++j) CHECK(y.value()(i, j) == a(i, j + 2));
  }
  auto w0 = random(2, 6, 7), w1 = random(5, 3, 8);
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::slice(v[0], 0, 1, 3), w0); }, {&a});
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::slice(v[0], 1, 2, 5), w1); }, {&a});
  // two overlapping slices of one value and the value itself: contributions add
  check_gradients(
      [&](tape_t& t, auto& v) {
        const auto s1 = ag::slice(v[0], 1, 0, 3), s2 = ag::slice(v[0], 1, 2, 5);
        return ag::sum(ag::exp(s1 * s2)) + weigh<2>(t, ag::slice(v[0], 1, 2, 5), w1) + ag::mean(v[0]);
      },
      {&a});
  // an empty slice has no elements and gives no gradient
  tape_t t;
  const auto x = t.leaf(a);
  const auto e = ag::slice(x, 0, 3, 3);
  CHECK(e.numel() == 0);
  const auto loss = ag::sum(e) + ag::sum(ag::slice(x, 0, 0, 1));
  t.backward(loss);
  const auto g = t.grad(x);
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 6; ++j) CHECK(g(i, j) == (i == 0 ? 1.0 : 0.0));
}

TEST_CASE("autograd shapes: concat along either axis, of two and three values and of a run-time list") {
  auto a = random(3, 4, 9), b = random(3, 2, 10), c = random(2, 4, 11);
  {
    tape_t t;
    const auto x = t.constant(a), y = t.constant(b);
    const auto z = ag::concat(1, x, y);
    REQUIRE(z.shape() == extents<2>{3, 6});
    for (index_t i = 0; i < 3; ++i)
      for (index_t j = 0; j < 6; ++j) CHECK(z.value()(i, j) == (j < 4 ? a(i, j) : b(i, j - 4)));
  }
  auto w1 = random(3, 6, 12), w0 = random(8, 4, 13);
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::concat(1, v[0], v[1]), w1); }, {&a, &b});
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::concat(0, v[0], v[1], v[0]), w0); }, {&a, &c});
  check_gradients(
      [&](tape_t& t, auto& v) {
        const std::vector<ag::var<T, D, 2>> parts{v[1], ag::tanh(v[0]), v[0]};
        return weigh<2>(t, ag::concat(0, parts), w0);
      },
      {&a, &c});
}

TEST_CASE("autograd shapes: softmax along the last axis against a loop in f64 and finite differences") {
  auto a = random(4, 5, 14);
  a(0, 0) = 700.0;  // exp would overflow without the shift
  {
    tape_t t;
    const auto y = ag::softmax(t.constant(a));
    for (index_t i = 0; i < 4; ++i) {
      double m = -std::numeric_limits<double>::infinity(), s = 0;
      for (index_t j = 0; j < 5; ++j) m = std::max(m, a(i, j));
      for (index_t j = 0; j < 5; ++j) s += std::exp(a(i, j) - m);
      for (index_t j = 0; j < 5; ++j) CHECK(y.value()(i, j) == doctest::Approx(std::exp(a(i, j) - m) / s).epsilon(1e-14));
    }
  }
  a(0, 0) = 0.3;
  auto w = random(4, 5, 15);
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::softmax(v[0]), w); }, {&a});
  auto w3 = locus::rand<T, D>({2, 2, 5}, 16, -1.0, 1.0);
  check_gradients(
      [&](tape_t& t, auto& v) { return weigh<3>(t, ag::softmax(ag::reshape(v[0], extents<3>{2, 2, 5})), w3); }, {&a});
  // attention-like: softmax(q k^T) v, every input a leaf
  auto q = random(3, 4, 17), k = random(5, 4, 18), vv = random(5, 2, 19);
  check_gradients(
      [](tape_t&, auto& v) {
        const auto p = ag::softmax(ag::matmul(v[0], ag::transpose(v[1])) * 0.5);
        return ag::sum(ag::tanh(ag::matmul(p, v[2])));
      },
      {&q, &k, &vv});
}

TEST_CASE("autograd shapes: gather_rows picks rows by int64 and int32 ids of rank 1 and 2, and adds repeated rows") {
  auto table = random(6, 3, 20);
  locus::tensor<std::int64_t, D, 2> ids({2, 3});
  const std::int64_t idv[] = {4, 0, 4, 5, 4, 1};
  for (index_t i = 0; i < 6; ++i) ids.data_handle()[i] = idv[i];
  {
    tape_t t;
    const auto y = ag::gather_rows(t.constant(table), ids);
    REQUIRE(y.shape() == extents<3>{2, 3, 3});
    for (index_t i = 0; i < 2; ++i)
      for (index_t j = 0; j < 3; ++j)
        for (index_t e = 0; e < 3; ++e) CHECK(y.value()(i, j, e) == table(idv[i * 3 + j], e));
  }
  auto w = locus::rand<T, D>({2, 3, 3}, 21, -1.0, 1.0);
  check_gradients([&](tape_t& t, auto& v) { return weigh<3>(t, ag::gather_rows(v[0], ids), w); }, {&table});
  locus::tensor<std::int32_t, D, 1> ids32({4});
  const std::int32_t iv[] = {2, 2, 0, 5};
  for (index_t i = 0; i < 4; ++i) ids32.data_handle()[i] = iv[i];
  auto w2 = random(4, 3, 22);
  check_gradients([&](tape_t& t, auto& v) { return weigh<2>(t, ag::tanh(ag::gather_rows(v[0], ids32)), w2); },
                  {&table});
  // rows never picked get a zero gradient
  tape_t t;
  const auto tv = t.leaf(table);
  t.backward(ag::sum(ag::gather_rows(tv, ids32)));
  const auto g = t.grad(tv);
  for (index_t e = 0; e < 3; ++e) {
    CHECK(g(1, e) == 0.0);
    CHECK(g(2, e) == 2.0);
    CHECK(g(3, e) == 0.0);
  }
}

TEST_CASE("autograd shapes: bad axes, slices, concat shapes and ids are errors naming what was given, nothing recorded") {
  auto a = random(3, 4, 23), b = random(2, 5, 24);
  tape_t t;
  const auto x = t.leaf(a), y = t.leaf(b);
  const auto before = t.operations();
  const auto values = t.values();
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const locus::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([&] { (void)ag::transpose(x, 0, 2); }).find("axis 2 of a rank-2 value") != std::string::npos);
  CHECK(message([&] { (void)ag::slice(x, 1, 3, 5); }).find("[3, 5) of axis 1 of a value of shape [3, 4]") !=
        std::string::npos);
  CHECK(message([&] { (void)ag::slice(x, 0, 2, 1); }).find("[2, 1)") != std::string::npos);
  CHECK(message([&] { (void)ag::slice(x, 0, -1, 1); }).find("[-1, 1)") != std::string::npos);
  CHECK(message([&] { (void)ag::slice(x, 2, 0, 1); }).find("axis 2 of a rank-2 value") != std::string::npos);
  const auto m = message([&] { (void)ag::concat(0, x, y); });
  CHECK(m.find("shapes [3, 4] and [2, 5]") != std::string::npos);
  CHECK(message([&] { (void)ag::concat(0, std::vector<ag::var<T, D, 2>>{}); }).find("of no values") !=
        std::string::npos);
  locus::tensor<std::int64_t, D, 1> bad({3});
  bad.data_handle()[0] = 0;
  bad.data_handle()[1] = 3;
  bad.data_handle()[2] = 1;
  const auto g = message([&] { (void)ag::gather_rows(x, bad); });
  CHECK(g.find("id 3 at position 1 is outside the table's 3 rows") != std::string::npos);
  bad.data_handle()[1] = std::numeric_limits<std::int64_t>::min();
  CHECK(message([&] { (void)ag::gather_rows(x, bad); }).find("id -9223372036854775808") != std::string::npos);
  CHECK(t.operations() == before);
  CHECK(t.values() == values);
  // the tape still works: a backward after the refused calls is right
  t.backward(ag::sum(ag::slice(x, 1, 0, 2)) + ag::sum(y));
  CHECK(t.grad(x)(2, 1) == 1.0);
  CHECK(t.grad(x)(2, 2) == 0.0);
  CHECK(t.grad(y)(1, 4) == 1.0);
}

TEST_CASE("autograd shapes: a step at unchanged shapes reuses every buffer, and bf16 follows f32") {
  auto a = locus::rand<float, D>({4, 6}, 25, -1.0, 1.0);
  locus::tensor<std::int64_t, D, 1> ids({5});
  for (index_t i = 0; i < 5; ++i) ids.data_handle()[i] = (i * 3) % 4;
  ag::tape<float, D> t;
  std::vector<float> first;
  for (int step = 0; step < 3; ++step) {
    t.reset();
    const auto x = t.leaf(a);
    const auto y = ag::concat(1, ag::softmax(ag::slice(x, 1, 0, 3)), ag::transpose(ag::slice(ag::transpose(x), 0, 3, 6)));
    const auto loss = ag::sum(ag::gather_rows(y, ids) * ag::gather_rows(y, ids));
    t.backward(loss);
    const auto g = t.grad(x);
    std::vector<float> now(g.data_handle(), g.data_handle() + g.numel());
    if (step == 0) first = now;
    else CHECK(now == first);
    const auto* p = t.grad(x).data_handle();
    if (step == 2) CHECK(p == t.grad(x).data_handle());
  }
  // bf16: the same operations on rounded inputs stay within bf16's precision of f32
  const auto ab = locus::eval(locus::cast<locus::bf16>(a.view()));
  const auto af = locus::eval(locus::cast<float>(ab.view()));
  ag::tape<locus::bf16, D> tb;
  ag::tape<float, D> tf;
  const auto xb = tb.leaf(ab);
  const auto xf = tf.leaf(af);
  tb.backward(ag::sum(ag::softmax(ag::transpose(xb)) * ag::transpose(xb)));
  tf.backward(ag::sum(ag::softmax(ag::transpose(xf)) * ag::transpose(xf)));
  const auto gb = tb.grad(xb);
  const auto gf = tf.grad(xf);
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 6; ++j)
      CHECK(static_cast<float>(gb(i, j)) == doctest::Approx(gf(i, j)).epsilon(0.02).scale(1.0));
}
