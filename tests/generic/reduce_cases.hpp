// Device-generic tests of reductions, softmax and one_hot (included with
// LOCUS_TEST_DEVICES defined). References are computed in double on the host.
#pragma once

#include "reduce_common.hpp"

TEST_CASE_TEMPLATE("reductions over the whole tensor match a double reference", D, LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  auto x = locus::randn<float, D>({513, 1021}, 71, 0.5, 2.0);
  const auto X = doubles(x);
  double s = 0, mx = -1e300, mn = 1e300;
  std::size_t amx = 0, amn = 0;
  for (std::size_t i = 0; i < X.size(); ++i) {
    s += X[i];
    if (X[i] > mx) mx = X[i], amx = i;
    if (X[i] < mn) mn = X[i], amn = i;
  }
  const double mean = s / double(X.size());
  double ss = 0;
  for (double v : X) ss += (v - mean) * (v - mean);
  auto sum = locus::sum(x);
  static_assert(std::is_same_v<decltype(sum), locus::tensor<float, D, 0>>);
  CHECK(rel(scalar(sum), s) <= 1e-5);
  CHECK(rel(scalar(locus::mean(x)), mean) <= 1e-5);
  CHECK(scalar(locus::max(x)) == mx);
  CHECK(scalar(locus::min(x)) == mn);
  CHECK(locus::to<locus::cpu>(locus::argmax(x)).item() == static_cast<std::int64_t>(amx));
  CHECK(locus::to<locus::cpu>(locus::argmin(x)).item() == static_cast<std::int64_t>(amn));
  CHECK(rel(scalar(locus::var(x)), ss / double(X.size() - 1)) <= 1e-5);
  CHECK(rel(scalar(locus::var(x, locus::correction(0))), ss / double(X.size())) <= 1e-5);
  // An expression is reduced without a temporary: sum(x * x)
  double sq = 0;
  for (double v : X) sq += double(float(v * v));
  CHECK(rel(scalar(locus::sum(x * x)), sq) <= 1e-5);
}

TEST_CASE_TEMPLATE("reductions along an axis match a double reference with and without keepdim", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  auto x = locus::randn<double, D>({7, 33, 5}, 72);
  const auto X = doubles(x);
  auto at = [&](int i, int j, int k) { return X[static_cast<std::size_t>((i * 33 + j) * 5 + k)]; };
  for (std::size_t axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    auto s = locus::sum(x, axis);
    static_assert(decltype(s)::rank == 2);
    auto sk = locus::sum(x, axis, locus::keepdim);
    static_assert(decltype(sk)::rank == 3);
    CHECK(sk.shape()[axis] == 1);
    auto mx = locus::max(x, axis);
    auto am = locus::argmax(x, axis);
    static_assert(std::is_same_v<typename decltype(am)::value_type, std::int64_t>);
    auto vr = locus::var(x, axis);
    const auto S = doubles(s), SK = doubles(sk), MX = doubles(mx), AM = doubles(am), VR = doubles(vr);
    CHECK(S == SK);
    const int n0 = axis == 0 ? 33 : 7, n1 = axis == 2 ? 33 : 5, len = axis == 0 ? 7 : axis == 1 ? 33 : 5;
    for (int a = 0; a < n0; ++a)
      for (int b = 0; b < n1; ++b) {
        double ref = 0, best = -1e300, m2 = 0;
        int arg = 0;
        std::vector<double> row;
        for (int j = 0; j < len; ++j) {
          const double v = axis == 0 ? at(j, a, b) : axis == 1 ? at(a, j, b) : at(a, b, j);
          row.push_back(v);
          ref += v;
          if (v > best) best = v, arg = j;
        }
        const double mean = ref / len;
        for (double v : row) m2 += (v - mean) * (v - mean);
        const std::size_t o = static_cast<std::size_t>(a * n1 + b);
        CHECK(rel(S[o], ref) <= 1e-12);
        CHECK(MX[o] == best);
        CHECK(AM[o] == arg);
        CHECK(rel(VR[o], m2 / (len - 1)) <= 1e-12);
      }
  }
  CHECK_THROWS_AS((void)locus::sum(x, 3), locus::shape_error);
}

TEST_CASE_TEMPLATE("sums are accurate where naive float summation is not", D, LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  // 2^24 values of 3.0f: a naive float loop drifts by a fifth (its increment of 3 is
  // rounded to the spacing of the running total); the blocked sum is exact.
  auto t = locus::full<float, D>({1 << 24}, 3.0f);
  CHECK(scalar(locus::sum(t)) == 3.0 * double(1 << 24));
  float naive = 0;
  for (int i = 0; i < (1 << 24); ++i) naive += 3.0f;
  CHECK(std::abs(double(naive) - 3.0 * double(1 << 24)) > 0.1 * 3.0 * double(1 << 24));
  // bf16 and f16 accumulate in f32: 4096 ones is exact (a bf16 accumulator stops at 256).
  auto b = locus::full<locus::bf16, D>({4096}, 1.0f);
  CHECK(scalar(locus::sum(b)) == 4096.0);
  auto h = locus::full<locus::f16, D>({64, 64}, 0.5f);
  CHECK(scalar(locus::mean(h)) == 0.5);
  CHECK(doubles(locus::sum(h, 1))[3] == 32.0);
}

TEST_CASE_TEMPLATE("reductions propagate NaN and handle empty tensors", D, LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  std::vector<float> v(5000, 1.0f);
  v[4321] = std::numeric_limits<float>::quiet_NaN();
  auto t = locus::from_host<D>(v, {5000});
  CHECK(std::isnan(scalar(locus::sum(t))));
  CHECK(std::isnan(scalar(locus::max(t))));
  CHECK(std::isnan(scalar(locus::min(t))));
  CHECK(locus::to<locus::cpu>(locus::argmax(t)).item() == 4321);
  auto m = locus::from_host<D>(v, {50, 100});
  const auto rows = doubles(locus::max(m, 1));
  CHECK(std::isnan(rows[43]));
  CHECK(rows[42] == 1.0);

  auto e = locus::empty<float, D>({0, 3});
  CHECK(scalar(locus::sum(e)) == 0.0);
  CHECK_THROWS_AS((void)locus::max(e), locus::shape_error);
  CHECK_THROWS_AS((void)locus::argmin(e), locus::shape_error);
  CHECK(doubles(locus::sum(e, 0)) == std::vector<double>{0.0, 0.0, 0.0});
  CHECK_THROWS_AS((void)locus::max(e, 0), locus::shape_error);
  CHECK(locus::max(e, 1).numel() == 0);  // no rows: nothing to reduce, no error
}

TEST_CASE_TEMPLATE("softmax and log_softmax are stable and match a double reference", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  auto x = locus::randn<float, D>({256, 1024}, 73, 0.0, 4.0);
  auto big = locus::eval(x + 1000.0f);  // exp would overflow without the max shift
  auto sm = locus::softmax(big, 1);
  auto ls = locus::log_softmax(big, 1);
  // The reference is computed from the actual input: big, i.e. x + 1000 rounded to f32.
  const auto X = doubles(big), SM = doubles(sm), LS = doubles(ls);
  double worst_sm = 0, worst_ls = 0;
  for (int r = 0; r < 256; r += 17) {
    double m = -1e300, s = 0;
    for (int j = 0; j < 1024; ++j) m = std::max(m, X[std::size_t(r * 1024 + j)]);
    for (int j = 0; j < 1024; ++j) s += std::exp(X[std::size_t(r * 1024 + j)] - m);
    for (int j = 0; j < 1024; ++j) {
      const std::size_t i = std::size_t(r * 1024 + j);
      const double ref_ls = X[i] - m - std::log(s);
      worst_ls = std::max(worst_ls, rel(LS[i], ref_ls));
      worst_sm = std::max(worst_sm, std::abs(SM[i] - std::exp(ref_ls)));
    }
  }
  // Probabilities absolutely, log-probabilities relatively (rel: at least absolutely).
  CHECK(worst_sm <= 1e-5);
  CHECK(worst_ls <= 1e-5);
  auto col = locus::softmax(x, 0);
  const auto C = doubles(locus::sum(col, 0));
  for (double c : C) CHECK(c == doctest::Approx(1.0).epsilon(1e-5));
  CHECK_THROWS_AS((void)locus::softmax(x, 2), locus::shape_error);
  // The innermost-axis form (linear reads) and the general form (strided reads of a
  // transposed view) must agree to the bit: same sums in the same order.
  auto xt = locus::transpose(x);                    // [1024, 256], strided
  auto xtc = locus::eval(xt * 1.0f);                // the same values, contiguous
  for (bool lg : {false, true}) {
    auto general = lg ? locus::log_softmax(xt, 1) : locus::softmax(xt, 1);
    auto fast = lg ? locus::log_softmax(xtc, 1) : locus::softmax(xtc, 1);
    CHECK(doubles(general) == doubles(fast));
  }
}

TEST_CASE_TEMPLATE("one_hot puts a single one at each label", D, LOCUS_TEST_DEVICES) {
  std::vector<std::int64_t> labels{3, 0, 9, 9, 1};
  auto y = locus::from_host<D>(labels, {5});
  auto oh = locus::one_hot<float>(y, 10);
  static_assert(std::is_same_v<decltype(oh), locus::tensor<float, D, 2>>);
  auto h = locus::to<locus::cpu>(oh);
  for (int i = 0; i < 5; ++i)
    for (int c = 0; c < 10; ++c) CHECK(h(i, c) == (labels[std::size_t(i)] == c ? 1.0f : 0.0f));
  if constexpr (D::host_accessible) {
    std::vector<std::int64_t> bad{1, 10};
    auto yb = locus::from_host<D>(bad, {2});
    CHECK_THROWS_AS((void)locus::one_hot<float>(yb, 10), locus::index_error);
  }
}

TEST_CASE_TEMPLATE("sums of bool, u8, i32 and i64 accumulate in i64 and return i64, as PyTorch's do", D,
                   LOCUS_TEST_DEVICES) {
  auto item = [](const auto& s) { return locus::to<locus::cpu>(s).item(); };
  auto vec = [](const auto& r) {
    auto h = locus::to<locus::cpu>(r);
    return std::vector<std::int64_t>(h.span().begin(), h.span().end());
  };
  // 300 u8 ones: 300 (a u8 result was 44).
  auto u = locus::ones<std::uint8_t, D>({300});
  auto su = locus::sum(u);
  static_assert(std::is_same_v<decltype(su), locus::tensor<std::int64_t, D, 0>>);
  CHECK(item(su) == 300);
  // Three 2^30: 3 * 2^30 (an i32 result was negative).
  auto i = locus::full<std::int32_t, D>({3}, 1 << 30);
  static_assert(std::is_same_v<decltype(locus::sum(i)), locus::tensor<std::int64_t, D, 0>>);
  CHECK(item(locus::sum(i)) == 3LL << 30);
  // A bool mask counts (an expression, reduced without a temporary).
  auto x = locus::arange<float, D>(-50, 250);
  auto count = locus::sum(x >= 0.0f);
  static_assert(std::is_same_v<decltype(count), locus::tensor<std::int64_t, D, 0>>);
  CHECK(item(count) == 250);
  // Long tensors (the parallel host path, several blocks): 100000 * 255 and 100000 * INT_MAX.
  const locus::index_t n = 100000;
  CHECK(item(locus::sum(locus::full<std::uint8_t, D>({n}, 255))) == n * 255);
  CHECK(item(locus::sum(locus::full<std::int32_t, D>({n}, std::numeric_limits<std::int32_t>::max()))) ==
        n * std::int64_t(std::numeric_limits<std::int32_t>::max()));
  CHECK(item(locus::sum(locus::full<std::int32_t, D>({n}, std::numeric_limits<std::int32_t>::min()))) ==
        n * std::int64_t(std::numeric_limits<std::int32_t>::min()));
  // i64 sums beyond i64 wrap (two's complement, as torch.sum does), with no UB.
  auto l = locus::from_host<D>(std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(), 1}, {2});
  CHECK(item(locus::sum(l)) == std::numeric_limits<std::int64_t>::min());
  // Empty: 0.
  CHECK(item(locus::sum(locus::empty<std::uint8_t, D>({0}))) == 0);
  // Along both axes (innermost: cuda's segmented path; the other: one thread per output), with keepdim.
  std::vector<std::uint8_t> v(3 * 400);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<std::uint8_t>(200 + k % 56);
  auto m = locus::from_host<D>(v, {3, 400});
  std::vector<std::int64_t> rows(3, 0), cols(400, 0);
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 400; ++c) rows[r] += v[r * 400 + c], cols[c] += v[r * 400 + c];
  auto s1 = locus::sum(m, 1);
  static_assert(std::is_same_v<decltype(s1), locus::tensor<std::int64_t, D, 1>>);
  CHECK(vec(s1) == rows);
  CHECK(vec(locus::sum(m, 0)) == cols);
  static_assert(std::is_same_v<decltype(locus::sum(m, 1, locus::keepdim)), locus::tensor<std::int64_t, D, 2>>);
  CHECK(vec(locus::sum(m, 1, locus::keepdim)) == rows);
  auto mask = locus::eval(locus::cast<float>(m) > 227.5f);
  std::vector<std::int64_t> mrows(3, 0);
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 400; ++c) mrows[r] += v[r * 400 + c] > 227 ? 1 : 0;
  CHECK(vec(locus::sum(mask, 1)) == mrows);
  auto big = locus::full<std::int32_t, D>({2, 3000}, 1 << 30);
  CHECK(vec(locus::sum(big, 1)) == std::vector<std::int64_t>(2, 3000LL << 30));
  CHECK(vec(locus::sum(big, 0)) == std::vector<std::int64_t>(3000, 2LL << 30));
  // max, min, argmax of integers keep their dtype.
  static_assert(std::is_same_v<decltype(locus::max(u)), locus::tensor<std::uint8_t, D, 0>>);
  CHECK(item(locus::max(m)) == 255);
}
