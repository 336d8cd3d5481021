// Device-generic tests of reductions along every path: infinities, arg ties and NaN,
// exact i64 sums, blocked long axes, every op along every axis of random tensors
// (included with LOCUS_TEST_DEVICES defined; a file of its own so that nvcc builds the
// CUDA suite's reductions as two translation units). References are in double.
#pragma once

#include "reduce_common.hpp"

namespace locus_reduce_test {
/// The library's argmax/argmin of a row: the first extreme wins; NaN counts as extreme
/// (the first NaN wins).
inline double ref_arg(const std::vector<double>& row, bool max) {
  std::size_t best = 0;
  for (std::size_t j = 0; j < row.size(); ++j) {
    if (std::isnan(row[j])) return double(j);
    if (max ? row[j] > row[best] : row[j] < row[best]) best = j;
  }
  return double(best);
}

/// The rows of a rank-3 row-major array along `axis`, in the order of the reduced output.
inline std::vector<std::vector<double>> rows_along(const std::vector<double>& X,
                                                   const std::array<locus::index_t, 3>& n,
                                                   std::size_t axis) {
  const std::size_t a0 = axis == 0 ? 1 : 0, a1 = axis == 2 ? 1 : 2;
  std::vector<std::vector<double>> rows;
  locus::index_t idx[3];
  for (idx[a0] = 0; idx[a0] < n[a0]; ++idx[a0])
    for (idx[a1] = 0; idx[a1] < n[a1]; ++idx[a1]) {
      std::vector<double> row;
      for (idx[axis] = 0; idx[axis] < n[axis]; ++idx[axis])
        row.push_back(X[static_cast<std::size_t>((idx[0] * n[1] + idx[1]) * n[2] + idx[2])]);
      rows.push_back(std::move(row));
    }
  return rows;
}

/// The worst rel() of a reduction of a rank-3 tensor along `axis` (NaN if any is NaN),
/// after checking its shape (rank 2, or rank 3 with extent 1 at `axis` for keepdim).
template <class Got>
double worst_rel(const Got& got, const std::vector<double>& ref, std::size_t axis,
                 const std::array<locus::index_t, 3>& n) {
  const auto sh = got.shape();
  if constexpr (Got::rank == 3) {
    for (std::size_t k = 0; k < 3; ++k) CHECK(sh[k] == (k == axis ? 1 : n[k]));
  } else {
    static_assert(Got::rank == 2);
    for (std::size_t k = 0; k < 2; ++k) CHECK(sh[k] == n[k < axis ? k : k + 1]);
  }
  const auto G = doubles(got);
  REQUIRE(G.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < G.size(); ++i) {
    const double r = rel(G[i], ref[i]);
    if (!(r <= worst)) worst = r;
  }
  return worst;
}

/// sum, mean, max, min, argmax, argmin and var along each axis of x, with and without
/// keepdim, against a double reference from the same (rounded) inputs: within tol for
/// sum, mean and var; exact for the others.
template <class T, class D>
void check_axis_reductions(const locus::tensor<T, D, 3>& x, double tol) {
  const auto X = doubles(x);
  const std::array<locus::index_t, 3> n{x.shape()[0], x.shape()[1], x.shape()[2]};
  for (std::size_t axis = 0; axis < 3; ++axis) {
    INFO("axis " << axis);
    std::vector<double> S, M, MX, MN, AX, AN, V;
    for (const auto& row : rows_along(X, n, axis)) {
      double s = 0, mx = row[0], mn = row[0];
      for (double v : row) s += v, mx = std::max(mx, v), mn = std::min(mn, v);
      const double mean = s / double(row.size());
      double ss = 0;
      for (double v : row) ss += (v - mean) * (v - mean);
      S.push_back(s), M.push_back(mean), MX.push_back(mx), MN.push_back(mn);
      AX.push_back(ref_arg(row, true)), AN.push_back(ref_arg(row, false));
      V.push_back(ss / double(row.size() - 1));
    }
    CHECK(worst_rel(locus::sum(x, axis), S, axis, n) <= tol);
    CHECK(worst_rel(locus::sum(x, axis, locus::keepdim), S, axis, n) <= tol);
    CHECK(worst_rel(locus::mean(x, axis), M, axis, n) <= tol);
    CHECK(worst_rel(locus::mean(x, axis, locus::keepdim), M, axis, n) <= tol);
    CHECK(worst_rel(locus::var(x, axis), V, axis, n) <= tol);
    CHECK(worst_rel(locus::var(x, axis, locus::keepdim), V, axis, n) <= tol);
    CHECK(worst_rel(locus::max(x, axis), MX, axis, n) == 0.0);
    CHECK(worst_rel(locus::max(x, axis, locus::keepdim), MX, axis, n) == 0.0);
    CHECK(worst_rel(locus::min(x, axis), MN, axis, n) == 0.0);
    CHECK(worst_rel(locus::min(x, axis, locus::keepdim), MN, axis, n) == 0.0);
    CHECK(worst_rel(locus::argmax(x, axis), AX, axis, n) == 0.0);
    CHECK(worst_rel(locus::argmax(x, axis, locus::keepdim), AX, axis, n) == 0.0);
    CHECK(worst_rel(locus::argmin(x, axis), AN, axis, n) == 0.0);
    CHECK(worst_rel(locus::argmin(x, axis, locus::keepdim), AN, axis, n) == 0.0);
  }
}

/// max of all -inf is -inf and min of all +inf is +inf, whole and along each axis.
template <class T, class D>
void check_infinite_extremes() {
  const double inf = std::numeric_limits<double>::infinity();
  for (const double sign : {-1.0, 1.0}) {
    INFO((sign < 0 ? "max of all -inf" : "min of all +inf"));
    std::vector<T> v(3 * 3000, static_cast<T>(sign * inf));
    auto t = locus::from_host<D>(v, {3, 3000});
    auto ext = [&](const auto&... a) { return sign < 0 ? locus::max(t, a...) : locus::min(t, a...); };
    CHECK(scalar(ext()) == sign * inf);
    for (const std::size_t axis : {std::size_t(0), std::size_t(1)}) {
      INFO("axis " << axis);
      for (double r : doubles(ext(axis))) CHECK(r == sign * inf);
      const auto k = ext(axis, locus::keepdim);
      CHECK(k.shape()[axis] == 1);
      for (double r : doubles(k)) CHECK(r == sign * inf);
    }
    const auto arg = sign < 0 ? locus::argmax(t) : locus::argmin(t);
    CHECK(locus::to<locus::cpu>(arg).item() == 0);
  }
}

/// argmax/argmin of v (5000 elements) whole, and along both axes of v as [5, 1000],
/// against ref_arg; whole-tensor answers also against the expected indices.
template <class T, class D>
void check_args(const std::vector<T>& v, std::int64_t want_max, std::int64_t want_min) {
  std::vector<double> X;
  for (const T& e : v) X.push_back(static_cast<double>(e));
  REQUIRE(ref_arg(X, true) == double(want_max));
  REQUIRE(ref_arg(X, false) == double(want_min));
  auto t = locus::from_host<D>(v, {5000});
  CHECK(locus::to<locus::cpu>(locus::argmax(t)).item() == want_max);
  CHECK(locus::to<locus::cpu>(locus::argmin(t)).item() == want_min);
  auto m = locus::from_host<D>(v, {5, 1000});
  for (std::size_t axis = 0; axis < 2; ++axis) {
    INFO("axis " << axis);
    std::vector<double> AX, AN;
    const std::size_t outer = axis == 0 ? 1000 : 5, len = axis == 0 ? 5 : 1000;
    for (std::size_t o = 0; o < outer; ++o) {
      std::vector<double> row;
      for (std::size_t j = 0; j < len; ++j) row.push_back(X[axis == 0 ? j * 1000 + o : o * 1000 + j]);
      AX.push_back(ref_arg(row, true)), AN.push_back(ref_arg(row, false));
    }
    CHECK(doubles(locus::argmax(m, axis)) == AX);
    CHECK(doubles(locus::argmin(m, axis)) == AN);
  }
}

template <class T, class D>
void check_arg_cases() {
  const int n = 5000;
  std::vector<T> neg(n), pos(n), ties(n);
  for (int i = 0; i < n; ++i) {
    neg[std::size_t(i)] = static_cast<T>(-10 - i % 97);
    pos[std::size_t(i)] = static_cast<T>(10 + i % 89);
    ties[std::size_t(i)] = static_cast<T>((i + 5) % 13 - 6);
  }
  neg[3210] = static_cast<T>(-2);
  pos[4321] = static_cast<T>(3);
  {
    INFO("all negative");
    check_args<T, D>(neg, 3210, 96);
  }
  {
    INFO("all positive");
    check_args<T, D>(pos, 88, 4321);
  }
  {
    INFO("ties: the first index wins");
    check_args<T, D>(ties, 7, 8);
  }
  if constexpr (std::is_floating_point_v<T>) {
    INFO("NaN: the first NaN wins for both");
    auto nan = pos;
    nan[4444] = nan[2222] = std::numeric_limits<T>::quiet_NaN();
    check_args<T, D>(nan, 2222, 2222);
  }
}
}  // namespace locus_reduce_test

TEST_CASE_TEMPLATE("max of all -inf and min of all +inf are infinite along every path", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  check_infinite_extremes<float, D>();
  check_infinite_extremes<double, D>();
}

TEST_CASE_TEMPLATE("argmax and argmin return the first extreme of negative and positive and tied and NaN "
                   "data",
                   D, LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  check_arg_cases<float, D>();
  check_arg_cases<double, D>();
  check_arg_cases<std::int64_t, D>();
}

TEST_CASE_TEMPLATE("i64 sum and max and min are exact near 2^60", D, LOCUS_TEST_DEVICES) {
  // Odd offsets on +-2^60: not representable in double (spacing 256 there), so any pass
  // through double changes the answer.
  const std::int64_t big = std::int64_t(1) << 60, n = 6000;
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = (i % 2 ? big : -big) + (2 * i + 1);
  auto t = locus::from_host<D>(v, {n});
  auto item = [](const auto& s) { return locus::to<locus::cpu>(s).item(); };
  CHECK(item(locus::sum(t)) == n * n);  // the +-2^60 cancel in pairs; the odd parts sum to n^2
  CHECK(item(locus::max(t)) == big + 2 * (n - 1) + 1);
  CHECK(item(locus::min(t)) == -big + 1);
  // Along both axes of [2, n/2] (rows: the innermost axis; columns: the other path).
  auto m = locus::from_host<D>(v, {2, n / 2});
  for (std::size_t axis = 0; axis < 2; ++axis) {
    INFO("axis " << axis);
    const std::int64_t outer = axis == 0 ? n / 2 : 2, len = axis == 0 ? 2 : n / 2;
    std::vector<std::int64_t> S, MX, MN;
    for (std::int64_t o = 0; o < outer; ++o) {
      std::int64_t s = 0, mx = std::numeric_limits<std::int64_t>::lowest();
      std::int64_t mn = std::numeric_limits<std::int64_t>::max();
      for (std::int64_t j = 0; j < len; ++j) {
        const std::int64_t e = v[std::size_t(axis == 0 ? j * (n / 2) + o : o * (n / 2) + j)];
        s += e, mx = std::max(mx, e), mn = std::min(mn, e);
      }
      S.push_back(s), MX.push_back(mx), MN.push_back(mn);
    }
    auto vec = [](const auto& r) {
      auto h = locus::to<locus::cpu>(r);
      return std::vector<std::int64_t>(h.span().begin(), h.span().end());
    };
    CHECK(vec(locus::sum(m, axis)) == S);
    CHECK(vec(locus::max(m, axis)) == MX);
    CHECK(vec(locus::min(m, axis)) == MN);
  }
}

TEST_CASE_TEMPLATE("sums and means along a long axis are blocked like whole-tensor sums", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  // 2^24 values of 1 + 2^-10 per row. Partial sums below 2^13 hold them exactly, so a
  // blocked sum (blocks of 2048 in f32, combined in f64) is exact; f32 partial sums over
  // the whole row grow to ~2^21, where f32's spacing (1/4) drops the 2^-10 parts.
  constexpr locus::index_t n = locus::index_t(1) << 24;
  constexpr float x = 1.0f + 1.0f / 1024.0f;
  auto t = locus::full<float, D>({2, n}, x);
  const double ref = double(n) * double(x);  // 2^24 + 2^14: exact in f32
  auto tt = locus::transpose(t);            // [n, 2], strided: along axis 0 reads columns
  for (double s : doubles(locus::sum(t, 1))) CHECK(s == ref);
  for (double s : doubles(locus::sum(tt, 0))) CHECK(s == ref);
  for (double m : doubles(locus::mean(t, 1))) CHECK(m == double(x));
  for (double m : doubles(locus::mean(tt, 0))) CHECK(m == double(x));
  for (double v : doubles(locus::var(t, 1))) CHECK(v == 0.0);
}

TEST_CASE_TEMPLATE("every reduction along every axis of random f32 and bf16 and f16 tensors matches a double "
                   "reference",
                   D, LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  // f32 within 1e-5 relative, with axes up to 2048 long. On cuda the innermost axis takes
  // cub::DeviceSegmentedReduce (sum, mean, max, min), the others one thread per output.
  check_axis_reductions(locus::randn<float, D>({3, 129, 2048}, 81, 0.5, 2.0), 1e-5);
  check_axis_reductions(locus::randn<float, D>({2048, 5, 24}, 82, 0.5, 2.0), 1e-5);
  // bf16 and f16 (accumulated in f32, the result rounded to the dtype once) against a
  // reference from the same rounded inputs.
  check_axis_reductions(locus::randn<locus::bf16, D>({5, 67, 300}, 83, 0.5, 2.0), 1e-2);
  check_axis_reductions(locus::randn<locus::f16, D>({5, 67, 300}, 84, 0.5, 2.0), 2e-3);
}

namespace locus_reduce_test {
/// Softmax rows of [rows, n] with specials: row 0 random, row 1 with -inf entries (their
/// probability 0), row 2 (when rows > 2) holding a NaN, row 3 every value -inf, row 4 a
/// +inf, row 5 one huge logit (3e38) and one -3e38.
inline std::vector<float> special_rows(locus::index_t rows, locus::index_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(rows * n));
  std::uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) * 0x1p-53 * 16.0 - 8.0);
  }
  const float inf = std::numeric_limits<float>::infinity();
  auto at = [&](locus::index_t r, locus::index_t j) -> float& { return v[static_cast<std::size_t>(r * n + j)]; };
  if (rows > 1 && n > 1) at(1, 0) = at(1, n - 1) = -inf;
  if (rows > 2) at(2, n / 2) = std::numeric_limits<float>::quiet_NaN();
  if (rows > 3)
    for (locus::index_t j = 0; j < n; ++j) at(3, j) = -inf;
  if (rows > 4) at(4, n - 1) = inf;
  if (rows > 5 && n > 2) at(5, 1) = 3e38f, at(5, 2) = -3e38f;
  return v;
}

/// softmax / log_softmax of one row against double; NaN rows all NaN.
inline void check_softmax_row(const std::vector<float>& row, const double* sm, const double* ls, locus::index_t stride) {
  double m = -INFINITY;
  bool nan = false;
  for (float x : row) nan |= std::isnan(x), m = std::max(m, double(x));
  const bool nan_row = nan || !std::isfinite(m);
  double s = 0;
  if (!nan_row)
    for (float x : row) s += std::exp(double(x) - m);
  for (std::size_t j = 0; j < row.size(); ++j) {
    const double got_s = sm[j * std::size_t(stride)], got_l = ls[j * std::size_t(stride)];
    if (nan_row) {
      if (!std::isnan(got_s) || !std::isnan(got_l)) {
        FAIL_CHECK("element " << j << " of a NaN row: " << got_s << ", " << got_l);
        return;
      }
      continue;
    }
    const double lp = (double(row[j]) - m) - std::log(s);
    const bool ok_s = lp == -INFINITY ? got_s == 0.0
                                      : std::abs(got_s - std::exp(lp)) <= (4e-7 * std::max(1.0, -lp) + 1e-5) * std::exp(lp) + 1e-37;
    const bool ok_l = lp < -3.4028234663852886e38 ? got_l == -INFINITY : std::abs(got_l - lp) <= 1e-5 * std::max(1.0, -lp);
    if (!ok_s || !ok_l) {
      FAIL_CHECK("element " << j << " of " << row.size() << ": softmax " << got_s << " want " << std::exp(lp)
                            << ", log_softmax " << got_l << " want " << lp);
      return;
    }
  }
}
}  // namespace locus_reduce_test

TEST_CASE_TEMPLATE("softmax of special rows matches a double reference in every row mode (warp, block, column)", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  // widths: 1, the main job's 10, not a multiple of 32, the warp/block boundary, a vocabulary
  for (locus::index_t n : {locus::index_t(1), locus::index_t(10), locus::index_t(33), locus::index_t(1024),
                           locus::index_t(1025), locus::index_t(50257)}) {
    INFO("width " << n);
    const locus::index_t rows = 6;
    const auto v = special_rows(rows, n, std::uint64_t(n));
    auto x = locus::from_host<D>(v, {rows, n});
    auto xt = locus::eval(locus::transpose(x) * 1.0f);  // [n, rows]: softmax along axis 0 (columns)
    const auto S = doubles(locus::softmax(x, 1)), L = doubles(locus::log_softmax(x, 1));
    const auto ST = doubles(locus::softmax(xt, 0)), LT = doubles(locus::log_softmax(xt, 0));
    // the strided view along its innermost axis reads through the same kernel: same bits
    const auto SV = doubles(locus::softmax(locus::transpose(xt), 1));
    for (locus::index_t r = 0; r < rows; ++r) {
      INFO("row " << r);
      const std::vector<float> row(v.begin() + r * n, v.begin() + (r + 1) * n);
      check_softmax_row(row, S.data() + r * n, L.data() + r * n, 1);
      check_softmax_row(row, ST.data() + r, LT.data() + r, rows);
    }
    for (std::size_t k = 0; k < S.size(); ++k)
      if (!(S[k] == SV[k] || (std::isnan(S[k]) && std::isnan(SV[k])))) {
        FAIL_CHECK("strided and contiguous softmax differ at " << k);
        break;
      }
  }
}

TEST_CASE_TEMPLATE("reductions along a leading axis of adversarial shapes match a double reference", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_reduce_test;
  // [100000, 3] along axis 0: three columns, the axis split over many blocks on cuda
  const auto v = special_rows(100000, 3, 5);
  std::vector<float> clean(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) clean[i] = std::abs(v[i]) < 1e30f ? v[i] : 0.5f;  // finite, no overflow
  clean[3 * 777 + 1] = std::numeric_limits<float>::quiet_NaN();  // column 1 only
  auto x = locus::from_host<D>(clean, {100000, 3});
  const auto S = doubles(locus::sum(x, 0)), MX = doubles(locus::max(x, 0)), AM = doubles(locus::argmax(x, 0));
  const auto V = doubles(locus::var(x, 0));
  for (int c = 0; c < 3; ++c) {
    double s = 0, mx = -INFINITY, ss = 0, mag = 0;
    std::size_t am = 0;
    for (std::size_t r = 0; r < 100000; ++r) {
      const double e = clean[r * 3 + std::size_t(c)];
      s += e;
      mag += std::abs(e);
      if (e > mx) mx = e, am = r;
    }
    for (std::size_t r = 0; r < 100000; ++r) ss += (clean[r * 3 + std::size_t(c)] - s / 1e5) * (clean[r * 3 + std::size_t(c)] - s / 1e5);
    if (c == 1) {
      CHECK(std::isnan(S[1]));
      CHECK(std::isnan(MX[1]));
      CHECK(AM[1] == 777.0);  // the first NaN
      CHECK(std::isnan(V[1]));
      continue;
    }
    // f32 partial sums (host blocks) or f64 (cuda threads): within 2e-6 of the magnitude
    CHECK(std::abs(S[std::size_t(c)] - s) <= 2e-6 * mag);
    CHECK(MX[std::size_t(c)] == mx);
    CHECK(AM[std::size_t(c)] == double(am));
    CHECK(rel(V[std::size_t(c)], ss / (1e5 - 1)) <= 1e-5);
  }
  // 1 x 1, a zero-length axis (sum 0, mean NaN), widths around the tile
  auto one = locus::full<float, D>({1, 1}, 2.5f);
  CHECK(doubles(locus::sum(one, 0))[0] == 2.5);
  CHECK(doubles(locus::argmin(one, 0))[0] == 0.0);
  auto e = locus::zeros<float, D>({0, 5});
  for (double s : doubles(locus::sum(e, 0))) CHECK(s == 0.0);
  for (double m : doubles(locus::mean(e, 0))) CHECK(std::isnan(m));
  for (locus::index_t w : {locus::index_t(31), locus::index_t(32), locus::index_t(33), locus::index_t(65)}) {
    auto t = locus::randn<double, D>({17, w}, std::uint64_t(w));
    const auto T = doubles(t), ST = doubles(locus::sum(t, 0)), MN = doubles(locus::min(t, 0));
    for (locus::index_t c = 0; c < w; ++c) {
      double s = 0, mn = INFINITY;
      for (locus::index_t r = 0; r < 17; ++r) s += T[std::size_t(r * w + c)], mn = std::min(mn, T[std::size_t(r * w + c)]);
      CHECK(rel(ST[std::size_t(c)], s) <= 1e-12);
      CHECK(MN[std::size_t(c)] == mn);
    }
  }
}
