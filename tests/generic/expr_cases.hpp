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
  locus::tensor_view<const float, D, 2> odd = locus::unsafe_view<D>(on_d.data_handle() + 1, {4, 3}, {6, 2});
  auto r = locus::eval(odd * 2.0f);
  auto h = locus::to<locus::cpu>(r);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(h(i, j) == 2.0f * float(6 * i + 2 * j + 1));
  locus::tensor_view<float, D, 2> even = locus::unsafe_view<D>(on_d.data_handle(), {4, 3}, {6, 2});
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

// ---- integers and scalars (issue 12, items 5 and 6): PyTorch is the reference ---------------
namespace locus_expr_test {
template <class T, class D, std::size_t R>
std::vector<T> values(const locus::tensor<T, D, R>& t) {
  auto h = locus::to<locus::cpu>(t);
  return std::vector<T>(h.span().begin(), h.span().end());
}
// Two's complement by hand, through the unsigned type: the independent reference.
inline std::int32_t w32(std::uint32_t u) { return static_cast<std::int32_t>(u); }
inline std::int64_t w64(std::uint64_t u) { return static_cast<std::int64_t>(u); }
}  // namespace locus_expr_test

TEST_CASE_TEMPLATE("integers: add, sub, mul, neg and abs wrap in two's complement as PyTorch's do", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  using locus_expr_test::w32;
  using locus_expr_test::w64;
  const std::int32_t mx = std::numeric_limits<std::int32_t>::max(), mn = std::numeric_limits<std::int32_t>::min();
  const std::vector<std::int32_t> v{mx, mn, -1, 0, 1, 46341, -7, 123456789};
  auto a = locus::from_host<D>(v, {8});
  const auto plus = values(locus::eval(a + 1)), minus = values(locus::eval(a - 1)), times = values(locus::eval(a * 3));
  const auto sq = values(locus::eval(a * a)), neg = values(locus::eval(-a)), ab = values(locus::eval(locus::abs(a)));
  const auto rev = values(locus::eval(1 - a));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(v[i]);
    CHECK(plus[i] == w32(u + 1u));
    CHECK(minus[i] == w32(u - 1u));
    CHECK(times[i] == w32(u * 3u));
    CHECK(sq[i] == w32(u * u));
    CHECK(neg[i] == w32(0u - u));
    CHECK(rev[i] == w32(1u - u));
    CHECK(ab[i] == (v[i] < 0 ? w32(0u - u) : v[i]));
  }
  CHECK(plus[0] == mn);  // INT_MAX + 1
  CHECK(neg[1] == mn);   // -INT_MIN
  CHECK(ab[1] == mn);    // abs(INT_MIN), as torch.abs gives

  const std::int64_t mx64 = std::numeric_limits<std::int64_t>::max(), mn64 = std::numeric_limits<std::int64_t>::min();
  const std::vector<std::int64_t> l{mx64, mn64, -1, 3037000500LL};
  auto b = locus::from_host<D>(l, {4});
  const auto lp = values(locus::eval(b + b)), lm = values(locus::eval(b * b)), ln = values(locus::eval(-b));
  for (std::size_t i = 0; i < l.size(); ++i) {
    const std::uint64_t u = static_cast<std::uint64_t>(l[i]);
    CHECK(lp[i] == w64(u + u));
    CHECK(lm[i] == w64(u * u));
    CHECK(ln[i] == w64(0u - u));
  }

  // u8 wraps modulo 256 (torch.uint8 does)
  const std::vector<std::uint8_t> c{0, 1, 200, 255};
  auto u8 = locus::from_host<D>(c, {4});
  const auto cp = values(locus::eval(u8 + 100)), cm = values(locus::eval(u8 - 1)), ct = values(locus::eval(u8 * u8));
  const auto cn = values(locus::eval(-u8));
  for (std::size_t i = 0; i < c.size(); ++i) {
    CHECK(cp[i] == static_cast<std::uint8_t>((c[i] + 100u) % 256u));
    CHECK(cm[i] == static_cast<std::uint8_t>((c[i] + 255u) % 256u));
    CHECK(ct[i] == static_cast<std::uint8_t>((unsigned(c[i]) * c[i]) % 256u));
    CHECK(cn[i] == static_cast<std::uint8_t>((256u - c[i]) % 256u));
  }
  // In place too.
  a += mx;
  const auto ai = values(a);
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(ai[i] == w32(static_cast<std::uint32_t>(v[i]) + static_cast<std::uint32_t>(mx)));
}

TEST_CASE_TEMPLATE("integers: division truncates toward zero and MIN / -1 wraps to MIN", D, LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  const std::int32_t mn = std::numeric_limits<std::int32_t>::min();
  auto a = locus::from_host<D>(std::vector<std::int32_t>{7, -7, 7, -7, mn, mn, 0, 5}, {8});
  auto b = locus::from_host<D>(std::vector<std::int32_t>{2, 2, -2, -2, -1, 1, -3, 5}, {8});
  CHECK(values(locus::eval(a / b)) == std::vector<std::int32_t>{3, -3, -3, 3, mn, mn, 0, 1});
  CHECK(values(locus::eval(a / -1)) == std::vector<std::int32_t>{-7, 7, -7, 7, mn, mn, 0, -5});
  CHECK(values(locus::eval(100 / b)) == std::vector<std::int32_t>{50, 50, -50, -50, -100, 100, -33, 20});
  const std::int64_t mn64 = std::numeric_limits<std::int64_t>::min();
  auto l = locus::from_host<D>(std::vector<std::int64_t>{mn64, -9}, {2});
  CHECK(values(locus::eval(l / -1)) == std::vector<std::int64_t>{mn64, 9});
  auto u = locus::from_host<D>(std::vector<std::uint8_t>{255, 7}, {2});
  CHECK(values(locus::eval(u / 2)) == std::vector<std::uint8_t>{127, 3});
}

TEST_CASE_TEMPLATE("integers: division by zero is a value_error on every path, before anything is written", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  // A scalar zero: refused when the expression is built.
  auto a = locus::full<std::int32_t, D>({4}, 9);
  CHECK_THROWS_AS((void)(a / 0), locus::value_error);
  CHECK_THROWS_WITH_AS((void)(a / 0), doctest::Contains("integer division by zero"), locus::value_error);
  CHECK_THROWS_AS(a /= 0, locus::value_error);
  CHECK(values(a) == std::vector<std::int32_t>(4, 9));
  // A tensor divisor with one zero at the end of a long tensor (the parallel host path).
  const locus::index_t n = (1 << 16) + 3;
  auto big = locus::full<std::int32_t, D>({n}, 6);
  std::vector<std::int32_t> dv(static_cast<std::size_t>(n), 3);
  dv.back() = 0;
  auto div = locus::from_host<D>(dv, {n});
  locus::tensor<std::int32_t, D, 1> out = big / 3;
  CHECK_THROWS_AS(out = big / div, locus::value_error);
  CHECK(values(out) == std::vector<std::int32_t>(static_cast<std::size_t>(n), 2));  // unchanged
  CHECK_THROWS_AS(big /= div, locus::value_error);
  CHECK(values(big) == std::vector<std::int32_t>(static_cast<std::size_t>(n), 6));
  CHECK_THROWS_AS((void)locus::eval(7 / div), locus::value_error);
  // A broadcast divisor, an expression as divisor, a strided view, a reduction of a division.
  auto m = locus::full<std::int64_t, D>({3, 5}, 10);
  auto row = locus::from_host<D>(std::vector<std::int64_t>{1, 2, 0, 4, 5}, {1, 5});
  CHECK_THROWS_AS((void)locus::eval(m / row), locus::value_error);
  CHECK_THROWS_AS((void)locus::eval(m / (m - 10)), locus::value_error);
  auto z = locus::zeros<std::int64_t, D>({5, 3});
  CHECK_THROWS_AS((void)locus::eval(m / locus::transpose(z)), locus::value_error);
  CHECK_THROWS_AS((void)locus::sum(m / row), locus::value_error);
  CHECK_THROWS_AS((void)locus::sum(m / row, 1), locus::value_error);
  // where() selects afterwards, as torch.where does: the division is still by zero.
  CHECK_THROWS_AS((void)locus::eval(locus::where(row != 0, m / row, 0)), locus::value_error);
  // The fix the message names works.
  CHECK(values(locus::eval(m / locus::where(row == 0, 1, row))) ==
        std::vector<std::int64_t>{10, 5, 10, 2, 2, 10, 5, 10, 2, 2, 10, 5, 10, 2, 2});
  auto u = locus::full<std::uint8_t, D>({2}, 200);
  CHECK_THROWS_AS((void)locus::eval(u / (u - u)), locus::value_error);
  // No element divides: nothing to refuse.
  auto e = locus::empty<std::int32_t, D>({0});
  CHECK(locus::eval(e / e).numel() == 0);
  // Floating division by zero stays IEEE (inf, NaN).
  auto f = locus::to<locus::cpu>(locus::eval(locus::full<float, D>({1}, 1.0f) / 0.0f));
  CHECK(std::isinf(f(0)));
}

TEST_CASE_TEMPLATE("integers: pow with an integer exponent is exact, wraps and refuses a negative scalar exponent",
                   D, LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  using locus_expr_test::w32;
  const std::vector<std::int32_t> v{3, -3, 46341, 0, 1, -1, 65536};
  auto a = locus::from_host<D>(v, {7});
  const auto sq = values(locus::eval(locus::pow(a, 2)));
  const auto cube = values(locus::eval(locus::pow(a, 3)));
  const auto zero = values(locus::eval(locus::pow(a, 0)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(v[i]);
    CHECK(sq[i] == w32(u * u));
    CHECK(cube[i] == w32(u * u * u));
    CHECK(zero[i] == 1);  // 0^0 == 1, as torch.pow gives
  }
  CHECK_THROWS_AS((void)locus::pow(a, -1), locus::value_error);
  // Scalar base, tensor exponent: 2^31 wraps to INT_MIN, 2^32 to 0.
  auto e = locus::from_host<D>(std::vector<std::int32_t>{0, 1, 10, 30, 31, 32}, {6});
  CHECK(values(locus::eval(locus::pow(2, e))) ==
        std::vector<std::int32_t>{1, 2, 1024, 1 << 30, std::numeric_limits<std::int32_t>::min(), 0});
  // Negative tensor exponents: PyTorch's integer pow gives 1 for 1, +-1 for -1, 0 otherwise.
  auto base = locus::from_host<D>(std::vector<std::int32_t>{1, -1, -1, 2, -5, 0}, {6});
  auto ex = locus::from_host<D>(std::vector<std::int32_t>{-4, -3, -2, -1, -1, -1}, {6});
  CHECK(values(locus::eval(locus::pow(base, ex))) == std::vector<std::int32_t>{1, -1, 1, 0, 0, 0});
  // i64 and u8
  auto l = locus::full<std::int64_t, D>({1}, 3);
  std::uint64_t p = 1;
  for (int i = 0; i < 45; ++i) p *= 3u;
  CHECK(values(locus::eval(locus::pow(l, 45)))[0] == static_cast<std::int64_t>(p));
  auto u = locus::from_host<D>(std::vector<std::uint8_t>{3, 2}, {2});
  CHECK(values(locus::eval(locus::pow(u, 6))) == std::vector<std::uint8_t>{static_cast<std::uint8_t>(729 % 256), 64});
  // Floating pow is unchanged.
  CHECK(locus::to<locus::cpu>(locus::eval(locus::pow(locus::full<float, D>({1}, 2.0f), 0.5f)))(0) ==
        doctest::Approx(std::sqrt(2.0)).epsilon(1e-7));
}

TEST_CASE_TEMPLATE("integers: float to integer casts saturate, truncate toward zero and send NaN to 0", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f{nan, inf, -inf, 300.7f, -300.7f, 2.9f, -2.9f, 2147483648.0f, -2147483904.0f, 1e10f,
                             -0.5f, 255.9f, 256.0f};
  auto t = locus::from_host<D>(f, {13});
  const std::int32_t mx = std::numeric_limits<std::int32_t>::max(), mn = std::numeric_limits<std::int32_t>::min();
  CHECK(values(locus::eval(locus::cast<std::uint8_t>(t))) ==
        std::vector<std::uint8_t>{0, 255, 0, 255, 0, 2, 0, 255, 0, 255, 0, 255, 255});
  CHECK(values(locus::eval(locus::cast<std::int32_t>(t))) ==
        std::vector<std::int32_t>{0, mx, mn, 300, -300, 2, -2, mx, mn, mx, 0, 255, 256});
  const std::int64_t mx64 = std::numeric_limits<std::int64_t>::max(), mn64 = std::numeric_limits<std::int64_t>::min();
  CHECK(values(locus::eval(locus::cast<std::int64_t>(t))) ==
        std::vector<std::int64_t>{0, mx64, mn64, 300, -300, 2, -2, 2147483648LL, -2147483904LL, 10000000000LL, 0, 255, 256});
  const auto b = values(locus::eval(locus::cast<bool>(t)));
  CHECK(b == std::vector<bool>{true, true, true, true, true, true, true, true, true, true, true, true, true});
  auto d = locus::from_host<D>(std::vector<double>{9.3e18, -9.3e18, 9223372036854774784.0, -9223372036854775808.0}, {4});
  CHECK(values(locus::eval(locus::cast<std::int64_t>(d))) ==
        std::vector<std::int64_t>{mx64, mn64, 9223372036854774784LL, mn64});
  auto h = locus::from_host<D>(std::vector<locus::f16>{locus::f16(60000.0f), locus::f16(-inf), locus::f16(nan)}, {3});
  CHECK(values(locus::eval(locus::cast<std::uint8_t>(h))) == std::vector<std::uint8_t>{255, 0, 0});
  auto bf = locus::from_host<D>(std::vector<locus::bf16>{locus::bf16(1e20f), locus::bf16(-1e20f)}, {2});
  CHECK(values(locus::eval(locus::cast<std::int32_t>(bf))) == std::vector<std::int32_t>{mx, mn});
}

TEST_CASE_TEMPLATE("scalars: an integer scalar outside the tensor's dtype is a value_error, not a wrap", D,
                   LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  auto u = locus::full<std::uint8_t, D>({3}, 10);
  CHECK_THROWS_WITH_AS((void)(u + 300), doctest::Contains("outside the range of u8 (0 to 255)"), locus::value_error);
  CHECK_THROWS_AS((void)(300 + u), locus::value_error);
  CHECK_THROWS_AS((void)(u > -1), locus::value_error);
  CHECK_THROWS_AS((void)(u == 256), locus::value_error);
  CHECK_THROWS_AS(u += 300, locus::value_error);
  CHECK(values(u) == std::vector<std::uint8_t>(3, 10));
  CHECK_THROWS_AS((void)locus::where(u > 5, u, 256), locus::value_error);
  CHECK_THROWS_AS((void)locus::clamp(u, 0, 300), locus::value_error);
  CHECK_THROWS_AS((void)locus::maximum(u, -1), locus::value_error);
  CHECK(values(locus::eval(u + 245)) == std::vector<std::uint8_t>(3, 255));  // in range: fine
  CHECK(values(locus::eval(locus::clamp(u, 0, 255))) == std::vector<std::uint8_t>(3, 10));
  auto i = locus::full<std::int32_t, D>({2}, 1);
  CHECK_THROWS_AS((void)(i + (std::int64_t(1) << 31)), locus::value_error);
  CHECK_THROWS_AS((void)(i * 4294967295u), locus::value_error);
  CHECK(values(locus::eval(i + std::numeric_limits<std::int32_t>::max())) ==
        std::vector<std::int32_t>(2, std::numeric_limits<std::int32_t>::min()));  // in range; the sum wraps
  CHECK(values(locus::eval(i * 2147483647)) == std::vector<std::int32_t>(2, 2147483647));
  auto l = locus::full<std::int64_t, D>({2}, 2);
  CHECK_THROWS_AS((void)(l + std::numeric_limits<std::uint64_t>::max()), locus::value_error);
  CHECK(values(locus::eval(l * (std::int64_t(1) << 40))) == std::vector<std::int64_t>(2, std::int64_t(1) << 41));
  // bool tensors hold 0 and 1.
  auto mask = locus::eval(locus::full<float, D>({2}, 1.0f) > 0.0f);
  CHECK_THROWS_AS((void)(mask == 2), locus::value_error);
  CHECK(values(locus::eval(mask == 1)) == std::vector<bool>{true, true});
  CHECK(values(locus::eval(mask == false)) == std::vector<bool>{false, false});
  // The integer compares exactly (i32 > 10 and not some rounding of it).
  auto r = locus::from_host<D>(std::vector<std::int32_t>{10, 11, 16777217}, {3});
  CHECK(values(locus::eval(r > 10)) == std::vector<bool>{false, true, true});
  CHECK(values(locus::eval(r == 16777217)) == std::vector<bool>{false, false, true});
}

TEST_CASE_TEMPLATE("scalars: f16 and bf16 expressions keep the scalar in f32", D, LOCUS_TEST_DEVICES) {
  using locus_expr_test::as_double;
  auto h = locus::ones<locus::f16, D>({4});
  // 1e5 overflows f16 (max 65504): rounded first it was inf, and inf / inf NaN.
  locus::tensor<locus::f16, D, 1> y = (h * 1e5f) / 1e5f;
  for (double v : as_double(y)) CHECK(v == 1.0);
  auto b = locus::ones<locus::bf16, D>({4});
  // 1.001f in bf16 is 1.0 (8 bits of precision): rounded first, the difference was 0.
  locus::tensor<locus::bf16, D, 1> z = (b * 1.001f - b) * 1000.0f;
  for (double v : as_double(z)) CHECK(v == double(locus::bf16((1.001f - 1.0f) * 1000.0f)));
  // where() and scalars in f16 too.
  locus::tensor<locus::f16, D, 1> w = locus::where(h > 0.0f, h * 70000.0f, 0.0f) / 70000.0f;
  for (double v : as_double(w)) CHECK(v == 1.0);
  // An f16 scalar meets an f32 tensor exactly; a double scalar meets an f64 tensor exactly.
  auto f = locus::full<float, D>({1}, 3.0f);
  CHECK(locus::to<locus::cpu>(locus::eval(f * locus::f16(0.5f)))(0) == 1.5f);
  auto d = locus::full<double, D>({1}, 3.0);
  CHECK(locus::to<locus::cpu>(locus::eval(d * 0.1))(0) == 3.0 * 0.1);
  CHECK(locus::to<locus::cpu>(locus::eval(d * 0.1f))(0) == 3.0 * double(0.1f));
  CHECK(locus::to<locus::cpu>(locus::eval(f * 0.1))(0) == 3.0f * 0.1f);
}

TEST_CASE_TEMPLATE("scalars: bool tensors: + is or, * is and, maximum and minimum too", D, LOCUS_TEST_DEVICES) {
  using locus_expr_test::values;
  auto x = locus::from_host<D>(std::vector<float>{-1, -1, 1, 1}, {4});
  auto y = locus::from_host<D>(std::vector<float>{-1, 1, -1, 1}, {4});
  auto p = locus::eval(x > 0.0f), q = locus::eval(y > 0.0f);
  CHECK(values(locus::eval(p + q)) == std::vector<bool>{false, true, true, true});
  CHECK(values(locus::eval(p * q)) == std::vector<bool>{false, false, false, true});
  CHECK(values(locus::eval(locus::maximum(p, q))) == std::vector<bool>{false, true, true, true});
  CHECK(values(locus::eval(locus::minimum(p, q))) == std::vector<bool>{false, false, false, true});
  CHECK(values(locus::eval(p != q)) == std::vector<bool>{false, true, true, false});
  CHECK(values(locus::eval(locus::cast<std::int32_t>(p) - 1)) == std::vector<std::int32_t>{-1, -1, 0, 0});
}
