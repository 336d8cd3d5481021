// Device-generic tests of the lazy elementwise expressions (included with
// LOCUS_TEST_DEVICES defined, like tensor_cases.hpp). Every result is compared with a
// double-precision reference computed on the host from the same inputs.
#pragma once

#include <algorithm>
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <functional>
#include <vector>

#include <locus/locus.hpp>

namespace locus_expr_test {

template <class T, class D, std::size_t R>
std::vector<double> as_double(const locus::tensor<T, D, R>& t) {
  auto h = locus::to<locus::cpu>(t);
  std::vector<double> out;
  for (const auto& v : h.span()) out.push_back(static_cast<double>(locus::detail::load(v)));
  return out;
}

/// max |got - ref| / |ref| over elements: the true relative error (a zero reference
/// demands an exact zero).
inline double max_true_rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref[i]);
    if (ref[i] == 0) {
      if (err != 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, err / std::abs(ref[i]));
  }
  return worst;
}

/// max |got - ref| / max(1, |ref|): relative for results of magnitude above 1, absolute
/// below (for compositions whose f32 steps may cancel near zero).
inline double max_rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(1.0, std::abs(ref[i]));
    worst = std::max(worst, std::abs(got[i] - ref[i]) / scale);
  }
  return worst;
}

}  // namespace locus_expr_test

TEST_CASE_TEMPLATE("expressions: fused arithmetic with scalars matches a double reference", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::as_double;
  auto a = locus::randn<float, D>({300, 257}, 11);
  auto x = locus::randn<float, D>({300, 257}, 12);
  auto b = locus::rand<float, D>({300, 257}, 13, 0.5, 2.0);
  locus::tensor<float, D, 2> y = locus::relu(a * x + b) / b - 0.25f;
  const auto A = as_double(a), X = as_double(x), B = as_double(b), Y = as_double(y);
  std::vector<double> ref(A.size());
  for (std::size_t i = 0; i < A.size(); ++i)
    ref[i] = std::max(0.0, double(float(A[i] * X[i]) + float(B[i]))) / B[i] - 0.25;
  CHECK(locus_expr_test::max_rel_error(Y, ref) <= 1e-6);

  // 2 - a, -a, a * 3 written the other way round
  auto z = locus::eval(2.0f - a + (-a) * 3);
  const auto Z = as_double(z);
  for (std::size_t i = 0; i < A.size(); i += 97) CHECK(Z[i] == doctest::Approx(2 - 4 * A[i]).epsilon(1e-6));
}

TEST_CASE_TEMPLATE("expressions: unary math functions match a double reference", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::as_double;
  auto p = locus::rand<float, D>({4096}, 21, 0.01, 4.0);
  auto s = locus::randn<float, D>({4096}, 22);
  const auto P = as_double(p), S = as_double(s);
  struct fn_case {
    const char* name;
    std::vector<double> got;
    std::function<double(double, double)> ref;
  };
  std::vector<fn_case> cases;
  cases.push_back({"exp", as_double(locus::eval(locus::exp(s))), [](double, double x) { return std::exp(x); }});
  cases.push_back({"log", as_double(locus::eval(locus::log(p))), [](double q, double) { return std::log(q); }});
  cases.push_back({"sqrt", as_double(locus::eval(locus::sqrt(p))), [](double q, double) { return std::sqrt(q); }});
  cases.push_back({"rsqrt", as_double(locus::eval(locus::rsqrt(p))), [](double q, double) { return 1 / std::sqrt(q); }});
  cases.push_back({"tanh", as_double(locus::eval(locus::tanh(s))), [](double, double x) { return std::tanh(x); }});
  cases.push_back({"sigmoid", as_double(locus::eval(locus::sigmoid(s))), [](double, double x) { return 1 / (1 + std::exp(-x)); }});
  cases.push_back({"relu", as_double(locus::eval(locus::relu(s))), [](double, double x) { return x > 0 ? x : 0; }});
  cases.push_back({"abs", as_double(locus::eval(locus::abs(s))), [](double, double x) { return std::abs(x); }});
  cases.push_back({"neg", as_double(locus::eval(locus::neg(s))), [](double, double x) { return -x; }});
  cases.push_back({"gelu", as_double(locus::eval(locus::gelu(s))),
                   [](double, double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }});
  cases.push_back({"gelu_tanh", as_double(locus::eval(locus::gelu_tanh(s))), [](double, double x) {
                     return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
                   }});
  cases.push_back({"pow", as_double(locus::eval(locus::pow(p, 1.5f))), [](double q, double) { return std::pow(q, 1.5); }});
  cases.push_back({"maximum", as_double(locus::eval(locus::maximum(s, p))), [](double q, double x) { return std::max(q, x); }});
  cases.push_back({"minimum", as_double(locus::eval(locus::minimum(s, p))), [](double q, double x) { return std::min(q, x); }});
  cases.push_back({"clamp", as_double(locus::eval(locus::clamp(s, -0.5f, 0.75f))),
                   [](double, double x) { return std::min(std::max(x, -0.5), 0.75); }});
  for (auto& c : cases) {
    std::vector<double> ref(P.size());
    for (std::size_t i = 0; i < P.size(); ++i) ref[i] = c.ref(P[i], S[i]);
    INFO(c.name);
    // One function of an f32 input: its true relative error, at most 1e-6 (about 8
    // ulp; libm's float functions carry a few). GELU for negative inputs is where
    // 1 + erf / 1 + tanh formulations lose digits.
    CHECK(locus_expr_test::max_true_rel_error(c.got, ref) <= 1e-6);
  }
}

TEST_CASE_TEMPLATE("expressions: bf16 and f16 compute in f32 within their tolerances", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::as_double;
  auto a32 = locus::randn<float, D>({1000}, 31);
  auto b32 = locus::randn<float, D>({1000}, 32);
  locus::tensor<locus::bf16, D, 1> a = locus::cast<locus::bf16>(a32);
  locus::tensor<locus::bf16, D, 1> b = locus::cast<locus::bf16>(b32);
  locus::tensor<locus::bf16, D, 1> y = locus::tanh(a * b + 1.0f);
  const auto A = as_double(a), B = as_double(b), Y = as_double(y);
  std::vector<double> ref(A.size());
  for (std::size_t i = 0; i < A.size(); ++i) ref[i] = std::tanh(A[i] * B[i] + 1.0);
  CHECK(locus_expr_test::max_rel_error(Y, ref) <= 1e-2);

  locus::tensor<locus::f16, D, 1> ah = locus::cast<locus::f16>(a32);
  locus::tensor<locus::f16, D, 1> yh = locus::sigmoid(ah) * 2.0f;
  const auto AH = as_double(ah), YH = as_double(yh);
  for (std::size_t i = 0; i < AH.size(); ++i) ref[i] = 2 / (1 + std::exp(-AH[i]));
  CHECK(locus_expr_test::max_rel_error(YH, ref) <= 2e-3);

  // cast back to f32 is exact
  locus::tensor<float, D, 1> back = locus::cast<float>(a);
  CHECK(as_double(back) == A);
}

TEST_CASE_TEMPLATE("expressions: NumPy broadcasting and its errors", D, LOCUS_TEST_DEVICES) {
  auto m_owner = locus::arange<float, D>(12);
  auto col_owner = locus::arange<float, D>(3);
  auto m = m_owner.reshape({3, 4});
  auto row = locus::arange<float, D>(4);     // shape [4]
  auto col = col_owner.reshape({3, 1});      // shape [3, 1]
  auto s = locus::eval(m + row * 10.0f + col * 100.0f);
  static_assert(decltype(s)::rank == 2);
  auto h = locus::to<locus::cpu>(s);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(h(i, j) == float(4 * i + j + 10 * j + 100 * i));

  auto bad = locus::arange<float, D>(5);
  CHECK_THROWS_AS((void)(m + bad), locus::shape_error);
  try {
    (void)(m + bad);
    FAIL("no exception");
  } catch (const locus::shape_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("[3, 4]") != std::string::npos);
    CHECK(msg.find("[5]") != std::string::npos);
  }
  // Assigning into a destination of another shape throws and leaves it unchanged.
  auto dst = locus::full<float, D>({2, 4}, 9.0f);
  CHECK_THROWS_AS(dst.view() = m + 1.0f, locus::shape_error);
  auto dh = locus::to<locus::cpu>(dst);
  for (float v : dh.span()) CHECK(v == 9.0f);
}

TEST_CASE_TEMPLATE("expressions: comparisons where and in-place operators", D, LOCUS_TEST_DEVICES) {
  auto a = locus::randn<float, D>({64, 33}, 41);
  auto mask = locus::eval(a > 0.0f);
  static_assert(std::is_same_v<decltype(mask), locus::tensor<bool, D, 2>>);
  auto w = locus::eval(locus::where(a >= 0.0f, a, 0.0f) - locus::relu(a));
  for (double v : locus_expr_test::as_double(w)) CHECK(v == 0.0);
  auto mh = locus::to<locus::cpu>(mask);
  auto ah = locus::to<locus::cpu>(a);
  for (locus::index_t i = 0; i < 64; ++i) CHECK(mh(i, 5) == (ah(i, 5) > 0.0f));

  auto t = a.clone();
  t += a;           // 2a
  t *= 3.0f;        // 6a
  t -= a;           // 5a
  t.view() /= 5.0f; // a
  auto th = locus::to<locus::cpu>(t);
  for (locus::index_t i = 0; i < 64; ++i)
    for (locus::index_t j = 0; j < 33; ++j) CHECK(th(i, j) == doctest::Approx(ah(i, j)).epsilon(1e-6));
  // In-place on a slice changes only the slice.
  t.slice(0, 1) += 100.0f;
  th = locus::to<locus::cpu>(t);
  CHECK(th(0, 0) == doctest::Approx(ah(0, 0) + 100.0f));
  CHECK(th(1, 0) == doctest::Approx(ah(1, 0)));
}

TEST_CASE_TEMPLATE("expressions: strided views as operands and destinations", D, LOCUS_TEST_DEVICES) {
  auto base = locus::arange<float, locus::cpu>(24);
  auto on_d = locus::to<D>(base);
  // every other element of each row of a [4, 6] matrix: shape [4, 3], strides [6, 2]
  locus::tensor_view<const float, D, 2> odd(on_d.data_handle() + 1, {4, 3}, {6, 2});
  auto r = locus::eval(odd * 2.0f);
  auto h = locus::to<locus::cpu>(r);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(h(i, j) == 2.0f * float(6 * i + 2 * j + 1));
  locus::tensor_view<float, D, 2> even(on_d.data_handle(), {4, 3}, {6, 2});
  even = odd + 0.5f;  // writes the even columns
  auto back = locus::to<locus::cpu>(on_d);
  CHECK(back(0) == 1.5f);
  CHECK(back(1) == 1.0f);
  CHECK(back(6) == 7.5f);
}

TEST_CASE_TEMPLATE("expressions: NaN propagates through maximum and minimum", D, LOCUS_TEST_DEVICES) {
  std::vector<float> v{1.0f, std::nanf(""), -2.0f};
  auto t = locus::from_host<D>(v, {3});
  auto mx = locus::to<locus::cpu>(locus::eval(locus::maximum(t, 0.0f)));
  auto mn = locus::to<locus::cpu>(locus::eval(locus::minimum(0.0f, t)));
  CHECK(mx(0) == 1.0f);
  CHECK(std::isnan(mx(1)));
  CHECK(mx(2) == 0.0f);
  CHECK(std::isnan(mn(1)));
  CHECK(mn(2) == -2.0f);
}

TEST_CASE_TEMPLATE("expressions: an operand that aliases the destination through another mapping is read before it is written",
                   D, LOCUS_TEST_DEVICES) {
  using locus_expr_test::as_double;
  const int n = 67;  // odd, so that no row lines up with a block of threads
  auto t = locus::randn<float, D>({n, n}, 41);
  const auto T0 = as_double(t);
  // t += transpose(t): element (i, j) reads (j, i), which another element writes.
  t += locus::transpose(t);
  auto T1 = as_double(t);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const std::size_t a = std::size_t(i * n + j), b = std::size_t(j * n + i);
      CHECK(T1[a] == double(float(T0[a]) + float(T0[b])));
    }
  // t = transpose(t) * 2 (same shape: evaluated in place, so through a temporary).
  t = locus::transpose(t) * 2.0f;
  const auto T2 = as_double(t);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) CHECK(T2[std::size_t(i * n + j)] == 2 * T1[std::size_t(j * n + i)]);
  // Subtracting row 0 from every row: row 0 becomes 0 before other rows read it.
  t -= t.slice(0, 1);
  const auto T3 = as_double(t);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      CHECK(T3[std::size_t(i * n + j)] == double(float(T2[std::size_t(i * n + j)]) - float(T2[std::size_t(j)])));
  // Overlapping shifted views of one buffer: v[1:] = v[:-1] + 1 reads the old values.
  auto v = locus::arange<float, D>(100);
  auto head = v.slice(0, 99), tail = v.slice(1, 100);
  tail = head + 1.0f;
  const auto V = as_double(v);
  for (int i = 0; i < 100; ++i) CHECK(V[std::size_t(i)] == (i == 0 ? 0.0 : double(i)));
}

TEST_CASE_TEMPLATE("expressions: one pass and one allocation at most", D, LOCUS_TEST_DEVICES) {
  auto a = locus::randn<float, D>({1000}, 51);
  auto x = locus::randn<float, D>({1000}, 52);
  auto b = locus::randn<float, D>({1000}, 53);
  const auto before = locus::memory_stats<D>().allocations;
  locus::tensor<float, D, 1> y = locus::relu(a * x + b);  // the result, nothing in between
  CHECK(locus::memory_stats<D>().allocations == before + 1);
  y = locus::relu(a * x + b) * y + y;  // same shape, y read only at its own positions: in place
  CHECK(locus::memory_stats<D>().allocations == before + 1);
  y += a * x;
  CHECK(locus::memory_stats<D>().allocations == before + 1);
}
