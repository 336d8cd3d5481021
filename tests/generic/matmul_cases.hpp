// Device-generic tests of matmul, transpose and linear (included with
// LOCUS_TEST_DEVICES defined, like tensor_cases.hpp: cpu and pinned in the host suite,
// cuda in the nvcc suite). Inputs are fresh normal random numbers made on the device
// under test; every result is read back with to<cpu>() and compared with a
// double-precision reference computed on the host from the same inputs, with the error
// measured relative to the largest reference value:
//   f32 and f32-accumulated f16/bf16 -> f32: 1e-5; f64: 1e-12; bf16 out: 1e-2; f16 out: 2e-3.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <locus/locus.hpp>

#ifndef LOCUS_TEST_DEVICES
#error "define LOCUS_TEST_DEVICES before including generic/matmul_cases.hpp"
#endif

namespace locus_matmul_test {

using locus::index_t;

/// The elements of a tensor, read back to the host, as doubles (row-major order).
template <class T, class D, std::size_t R>
std::vector<double> doubles(const locus::tensor<T, D, R>& t) {
  const auto h = locus::to<locus::cpu>(t);
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(h.numel()));
  for (const auto& v : h.span()) out.push_back(static_cast<double>(locus::detail::load(v)));
  return out;
}

/// The view `v` of `device_base`, laid over `host_base` (a host copy of device_base):
/// same offset, shape and strides, readable on the host.
template <class T, class D, std::size_t RB, class U, std::size_t R>
locus::tensor_view<const T, locus::cpu, R> mirror(const locus::tensor<T, locus::cpu, RB>& host_base,
                                                   const locus::tensor<T, D, RB>& device_base,
                                                   const locus::tensor_view<U, D, R>& v) {
  const auto offset = v.data_handle() - device_base.data_handle();
  return locus::unsafe_view<locus::cpu>(host_base.data_handle() + offset, v.shape(), v.strides());
}

/// Double-precision reference of a rank-2 or rank-3 product of host views.
template <class T, std::size_t R>
std::vector<double> reference(const locus::tensor_view<const T, locus::cpu, R>& a,
                              const locus::tensor_view<const T, locus::cpu, R>& b) {
  const index_t batch = R == 3 ? a.shape()[0] : 1;
  const index_t m = a.shape()[R - 2], k = a.shape()[R - 1], n = b.shape()[R - 1];
  std::vector<double> out(static_cast<std::size_t>(batch * m * n), 0.0);
  for (index_t bi = 0; bi < batch; ++bi)
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        double s = 0;
        for (index_t p = 0; p < k; ++p) {
          if constexpr (R == 2)
            s += static_cast<double>(locus::detail::load(a(i, p))) *
                 static_cast<double>(locus::detail::load(b(p, j)));
          else
            s += static_cast<double>(locus::detail::load(a(bi, i, p))) *
                 static_cast<double>(locus::detail::load(b(bi, p, j)));
        }
        out[static_cast<std::size_t>((bi * m + i) * n + j)] = s;
      }
  return out;
}

/// max |got - ref| / max |ref| (the scale of the result).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  REQUIRE(got.size() == ref.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  if (std::isnan(worst)) return worst;
  return worst / std::max(scale, 1e-30);
}

inline double apply(locus::activation act, double x) {
  switch (act) {
    case locus::activation::none: return x;
    case locus::activation::relu: return x > 0 ? x : 0;
    case locus::activation::gelu: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case locus::activation::gelu_tanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  return x;
}

inline const char* name_of(locus::activation act) {
  switch (act) {
    case locus::activation::none: return "none";
    case locus::activation::relu: return "relu";
    case locus::activation::gelu: return "gelu";
    case locus::activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}

/// Reference of y = act(x w^T + b) from host copies (b may be empty: no bias).
inline std::vector<double> linear_reference(const std::vector<double>& x, const std::vector<double>& w,
                                            const std::vector<double>& b, index_t n, index_t m,
                                            index_t k, locus::activation act) {
  std::vector<double> y(static_cast<std::size_t>(n * m));
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < m; ++j) {
      double s = b.empty() ? 0.0 : b[static_cast<std::size_t>(j)];
      for (index_t p = 0; p < k; ++p)
        s += x[static_cast<std::size_t>(i * k + p)] * w[static_cast<std::size_t>(j * k + p)];
      y[static_cast<std::size_t>(i * m + j)] = apply(act, s);
    }
  return y;
}

inline bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace locus_matmul_test

TEST_CASE_TEMPLATE("matmul: f32 products match a double reference at several sizes", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {127, 255, 63}, {64, 64, 64}, {200, 33, 129}, {3, 1, 300}};
  std::uint64_t seed = 100;
  for (const auto& s : sizes) {
    CAPTURE(s[0]);
    CAPTURE(s[1]);
    CAPTURE(s[2]);
    auto a = locus::randn<float, D>({s[0], s[2]}, seed++);
    auto b = locus::randn<float, D>({s[2], s[1]}, seed++);
    auto c = locus::matmul(a, b);
    static_assert(std::is_same_v<decltype(c), locus::tensor<float, D, 2>>);
    CHECK(c.shape() == locus::extents<2>{s[0], s[1]});
    const auto ha = locus::to<locus::cpu>(a);
    const auto hb = locus::to<locus::cpu>(b);
    CHECK(rel_error(doubles(c), reference(ha.view(), hb.view())) <= 1e-5);
  }
}

TEST_CASE_TEMPLATE("matmul: f64 products match a double reference", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  auto a = locus::randn<double, D>({45, 70}, 7);
  auto b = locus::randn<double, D>({70, 33}, 8);
  auto c = locus::matmul(a, b);
  const auto ha = locus::to<locus::cpu>(a);
  const auto hb = locus::to<locus::cpu>(b);
  CHECK(rel_error(doubles(c), reference(ha.view(), hb.view())) <= 1e-12);
}

TEST_CASE_TEMPLATE("matmul: transposed and strided operands need no contiguous copy from the caller",
                   D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t m = 37, n = 23, k = 51;
  // Storage for A^T ([k, m]) and B^T ([n, k]): their transposes are the operands.
  auto at = locus::randn<float, D>({k, m}, 31);
  auto bt = locus::randn<float, D>({n, k}, 32);
  auto a = locus::randn<float, D>({m, k}, 33);
  auto b = locus::randn<float, D>({k, n}, 34);
  const auto hat = locus::to<locus::cpu>(at), hbt = locus::to<locus::cpu>(bt);
  const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);

  auto ta = locus::transpose(at);
  auto tb = locus::transpose(bt);
  static_assert(std::is_same_v<decltype(ta), locus::tensor_view<float, D, 2>>);
  CHECK(ta.shape() == locus::extents<2>{m, k});
  CHECK(ta.data_handle() == at.data_handle());

  SUBCASE("A^T B") {
    CHECK(rel_error(doubles(locus::matmul(ta, b)), reference(mirror(hat, at, ta), hb.view())) <= 1e-5);
  }
  SUBCASE("A B^T") {
    CHECK(rel_error(doubles(locus::matmul(a, tb)), reference(ha.view(), mirror(hbt, bt, tb))) <= 1e-5);
  }
  SUBCASE("A^T B^T") {
    CHECK(rel_error(doubles(locus::matmul(ta, tb)), reference(mirror(hat, at, ta), mirror(hbt, bt, tb))) <= 1e-5);
  }
  SUBCASE("row slices and column-strided views") {
    // Rows [5, 5 + 20) of a: a contiguous view with an offset.
    auto rows = a.slice(5, 25);
    CHECK(rel_error(doubles(locus::matmul(rows, b)), reference(mirror(ha, a, rows), hb.view())) <= 1e-5);
    // Every other column of a wider matrix: neither stride is 1, so it is copied first.
    auto wide = locus::randn<float, D>({m, 2 * k}, 35);
    const auto hwide = locus::to<locus::cpu>(wide);
    locus::tensor_view<const float, D, 2> every_other = locus::unsafe_view<D>(wide.data_handle() + 1, {m, k}, {2 * k, 2});
    CHECK(rel_error(doubles(locus::matmul(every_other, b)), reference(mirror(hwide, wide, every_other), hb.view())) <= 1e-5);
    // A column block of a wider matrix: unit column stride, row stride 2k (BLAS lda).
    locus::tensor_view<const float, D, 2> block = locus::unsafe_view<D>(wide.data_handle() + 3, {m, k}, {2 * k, 1});
    CHECK(rel_error(doubles(locus::matmul(block, b)), reference(mirror(hwide, wide, block), hb.view())) <= 1e-5);
  }
}

TEST_CASE_TEMPLATE("matmul: batched rank-3 products and batched transposes", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t batch = 5, m = 17, k = 29, n = 11;
  auto a = locus::randn<float, D>({batch, m, k}, 41);
  auto b = locus::randn<float, D>({batch, k, n}, 42);
  auto c = locus::matmul(a, b);
  static_assert(std::is_same_v<decltype(c), locus::tensor<float, D, 3>>);
  CHECK(c.shape() == locus::extents<3>{batch, m, n});
  const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
  CHECK(rel_error(doubles(c), reference(ha.view(), hb.view())) <= 1e-5);

  // Q K^T as attention computes it: K stored [batch, n, k], transposed per batch.
  auto kk = locus::randn<float, D>({batch, n, k}, 43);
  const auto hk = locus::to<locus::cpu>(kk);
  auto kt = locus::transpose(kk);
  CHECK(kt.shape() == locus::extents<3>{batch, k, n});
  CHECK(rel_error(doubles(locus::matmul(a, kt)), reference(ha.view(), mirror(hk, kk, kt))) <= 1e-5);

  // Batches that are themselves a slice.
  auto part = a.slice(1, 4);
  auto bpart = b.slice(2, 5);
  CHECK(rel_error(doubles(locus::matmul(part, bpart)), reference(mirror(ha, a, part), mirror(hb, b, bpart))) <= 1e-5);
}

TEST_CASE_TEMPLATE("matmul: bf16 and f16 inputs accumulate in f32", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t m = 65, n = 47, k = 130;
  {
    auto a = locus::randn<locus::bf16, D>({m, k}, 51);
    auto b = locus::randn<locus::bf16, D>({k, n}, 52);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    const auto ref = reference(ha.view(), hb.view());
    auto c = locus::matmul(a, b);
    static_assert(std::is_same_v<decltype(c), locus::tensor<locus::bf16, D, 2>>);
    CHECK(rel_error(doubles(c), ref) <= 1e-2);
    auto c32 = locus::matmul<float>(a, b);
    static_assert(std::is_same_v<decltype(c32), locus::tensor<float, D, 2>>);
    CHECK(rel_error(doubles(c32), ref) <= 1e-5);
    // Transposed half operands.
    auto bt = locus::randn<locus::bf16, D>({n, k}, 53);
    const auto hbt = locus::to<locus::cpu>(bt);
    auto tb = locus::transpose(bt);
    CHECK(rel_error(doubles(locus::matmul<float>(a, tb)), reference(ha.view(), mirror(hbt, bt, tb))) <= 1e-5);
  }
  {
    auto a = locus::randn<locus::f16, D>({m, k}, 54);
    auto b = locus::randn<locus::f16, D>({k, n}, 55);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    const auto ref = reference(ha.view(), hb.view());
    CHECK(rel_error(doubles(locus::matmul(a, b)), ref) <= 2e-3);
    CHECK(rel_error(doubles(locus::matmul<float>(a, b)), ref) <= 1e-5);
  }
  {
    auto a = locus::randn<locus::bf16, D>({3, m, k}, 56);
    auto b = locus::randn<locus::bf16, D>({3, k, n}, 57);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    CHECK(rel_error(doubles(locus::matmul<float>(a, b)), reference(ha.view(), hb.view())) <= 1e-5);
  }
}

TEST_CASE_TEMPLATE("matmul_into with locus::accumulate adds the product to the destination", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t m = 33, n = 29, k = 70;
  // f32: c += a b, with b transposed (the weight-gradient layout), twice
  {
    auto a = locus::randn<float, D>({k, m}, 81);
    auto b = locus::randn<float, D>({k, n}, 82);
    auto c = locus::randn<float, D>({m, n}, 83);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    std::vector<double> ref = doubles(c);
    auto ta = locus::transpose(a);
    const auto prod = reference(mirror(ha, a, ta), hb.view());
    for (int rep = 0; rep < 2; ++rep) {
      locus::matmul_into(c, ta, b, locus::accumulate);
      for (std::size_t i = 0; i < ref.size(); ++i) ref[i] += prod[i];
      CHECK(rel_error(doubles(c), ref) <= 1e-5);
    }
  }
  // bf16 operands accumulate into an f32 destination
  {
    auto a = locus::randn<locus::bf16, D>({m, k}, 84);
    auto b = locus::randn<locus::bf16, D>({k, n}, 85);
    auto c = locus::randn<float, D>({m, n}, 86);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    std::vector<double> ref = doubles(c);
    const auto prod = reference(ha.view(), hb.view());
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] += prod[i];
    locus::matmul_into(c, a, b, locus::accumulate);
    CHECK(rel_error(doubles(c), ref) <= 1e-5);
  }
  // a strided destination (the transpose of an [n, m] tensor: column stride m), which
  // goes through a temporary on every device, cuda included
  {
    auto a = locus::randn<float, D>({m, k}, 88);
    auto b = locus::randn<float, D>({k, n}, 89);
    auto ct = locus::randn<float, D>({n, m}, 90);
    const auto ha = locus::to<locus::cpu>(a), hb = locus::to<locus::cpu>(b);
    const auto before = doubles(ct);
    const auto prod = reference(ha.view(), hb.view());
    locus::matmul_into(locus::transpose(ct), a, b, locus::accumulate);
    const auto after = doubles(ct);
    std::vector<double> got, ref;
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) {
        got.push_back(after[static_cast<std::size_t>(j * m + i)]);
        ref.push_back(before[static_cast<std::size_t>(j * m + i)] + prod[static_cast<std::size_t>(i * n + j)]);
      }
    CHECK(rel_error(got, ref) <= 1e-5);
    locus::matmul_into(locus::transpose(ct), a, b);  // and overwriting
    const auto over = doubles(ct);
    got.clear();
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) got.push_back(over[static_cast<std::size_t>(j * m + i)]);
    CHECK(rel_error(got, prod) <= 1e-5);
  }
  // an empty inner dimension adds nothing
  {
    auto a = locus::zeros<float, D>({m, 0});
    auto b = locus::zeros<float, D>({0, n});
    auto c = locus::randn<float, D>({m, n}, 87);
    const auto before = doubles(c);
    locus::matmul_into(c, a, b, locus::accumulate);
    CHECK(doubles(c) == before);
  }
}

TEST_CASE_TEMPLATE("linear: each activation with and without bias matches a double reference", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t n = 37, k = 29, m = 19;
  auto x = locus::randn<float, D>({n, k}, 61);
  auto w = locus::randn<float, D>({m, k}, 62);
  auto b = locus::randn<float, D>({m}, 63);
  const auto X = doubles(x), W = doubles(w), B = doubles(b);
  for (auto act : {locus::activation::none, locus::activation::relu, locus::activation::gelu,
                   locus::activation::gelu_tanh}) {
    CAPTURE(name_of(act));
    auto y = locus::linear(x, w, b, act);
    static_assert(std::is_same_v<decltype(y), locus::tensor<float, D, 2>>);
    CHECK(y.shape() == locus::extents<2>{n, m});
    CHECK(rel_error(doubles(y), linear_reference(X, W, B, n, m, k, act)) <= 1e-5);
    auto y0 = locus::linear(x, w, act);
    CHECK(rel_error(doubles(y0), linear_reference(X, W, {}, n, m, k, act)) <= 1e-5);
  }
  // The default activation is none.
  CHECK(rel_error(doubles(locus::linear(x, w, b)), linear_reference(X, W, B, n, m, k, locus::activation::none)) <= 1e-5);
}

TEST_CASE_TEMPLATE("linear: bf16 layers with bf16 or f32 outputs", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t n = 33, k = 70, m = 24;
  auto x = locus::randn<locus::bf16, D>({n, k}, 71);
  auto w = locus::randn<locus::bf16, D>({m, k}, 72);
  auto b = locus::randn<locus::bf16, D>({m}, 73);
  auto b32 = locus::randn<float, D>({m}, 74);
  const auto X = doubles(x), W = doubles(w), B = doubles(b), B32 = doubles(b32);
  for (auto act : {locus::activation::relu, locus::activation::gelu_tanh, locus::activation::gelu}) {
    CAPTURE(name_of(act));
    auto y = locus::linear(x, w, b, act);
    static_assert(std::is_same_v<decltype(y), locus::tensor<locus::bf16, D, 2>>);
    CHECK(rel_error(doubles(y), linear_reference(X, W, B, n, m, k, act)) <= 1e-2);
    auto y32 = locus::linear<float>(x, w, b32, act);
    static_assert(std::is_same_v<decltype(y32), locus::tensor<float, D, 2>>);
    CHECK(rel_error(doubles(y32), linear_reference(X, W, B32, n, m, k, act)) <= 1e-5);
  }
  auto h = locus::randn<locus::f16, D>({n, k}, 75);
  auto hw = locus::randn<locus::f16, D>({m, k}, 76);
  auto hb = locus::randn<locus::f16, D>({m}, 77);
  CHECK(rel_error(doubles(locus::linear(h, hw, hb, locus::activation::relu)),
                  linear_reference(doubles(h), doubles(hw), doubles(hb), n, m, k, locus::activation::relu)) <= 2e-3);
}

TEST_CASE_TEMPLATE("linear_into and matmul_into write into existing memory", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  const index_t n = 21, k = 40, m = 13;
  auto x = locus::randn<float, D>({n, k}, 81);
  auto w = locus::randn<float, D>({m, k}, 82);
  auto b = locus::randn<float, D>({m}, 83);
  const auto X = doubles(x), W = doubles(w), B = doubles(b);

  auto y = locus::empty<float, D>({n, m});
  const float* before = y.data_handle();
  locus::linear_into(y, x, w, b, locus::activation::relu);
  CHECK(y.data_handle() == before);
  CHECK(rel_error(doubles(y), linear_reference(X, W, B, n, m, k, locus::activation::relu)) <= 1e-5);
  locus::linear_into(y, x, w, locus::activation::gelu_tanh);
  CHECK(rel_error(doubles(y), linear_reference(X, W, {}, n, m, k, locus::activation::gelu_tanh)) <= 1e-5);

  // Into rows [4, 4 + n) of a larger buffer (a view); the rows around it stay as they were.
  auto big = locus::randn<float, D>({n + 8, m}, 84);
  const auto before_big = doubles(big);
  locus::linear_into(big.slice(4, 4 + n), x, w, b);
  const auto after_big = doubles(big);
  const auto ref = linear_reference(X, W, B, n, m, k, locus::activation::none);
  std::vector<double> inside(after_big.begin() + 4 * m, after_big.begin() + (4 + n) * m);
  CHECK(rel_error(inside, ref) <= 1e-5);
  CHECK(std::equal(after_big.begin(), after_big.begin() + 4 * m, before_big.begin()));
  CHECK(std::equal(after_big.begin() + (4 + n) * m, after_big.end(), before_big.begin() + (4 + n) * m));

  // matmul_into, and a destination that is also an operand (computed through a temporary).
  auto sq = locus::randn<float, D>({k, k}, 85);
  auto c = locus::empty<float, D>({n, k});
  locus::matmul_into(c, x, sq);
  const auto hx = locus::to<locus::cpu>(x), hsq = locus::to<locus::cpu>(sq);
  const auto ref_c = reference(hx.view(), hsq.view());
  CHECK(rel_error(doubles(c), ref_c) <= 1e-5);
  auto x2 = x.clone();
  locus::matmul_into(x2, x2, sq);
  CHECK(rel_error(doubles(x2), ref_c) <= 1e-5);
  // bf16 inputs into an f32 destination.
  auto xb = locus::randn<locus::bf16, D>({n, k}, 86);
  auto wb = locus::randn<locus::bf16, D>({m, k}, 87);
  auto y32 = locus::empty<float, D>({n, m});
  locus::linear_into(y32, xb, wb, b, locus::activation::gelu);
  CHECK(rel_error(doubles(y32), linear_reference(doubles(xb), doubles(wb), B, n, m, k, locus::activation::gelu)) <= 1e-5);
}

TEST_CASE_TEMPLATE("matmul: shape errors name both shapes and leave the destination unchanged", D,
                   LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  auto a = locus::randn<float, D>({3, 4}, 91);
  auto b = locus::randn<float, D>({5, 6}, 92);
  try {
    (void)locus::matmul(a, b);
    FAIL("matmul of [3, 4] and [5, 6] did not throw");
  } catch (const locus::shape_error& e) {
    const std::string msg = e.what();
    CHECK(mentions(msg, "[3, 4]"));
    CHECK(mentions(msg, "[5, 6]"));
    CHECK(mentions(msg, "4 vs 5"));
  }
  auto c = locus::randn<float, D>({3, 6}, 93);
  const auto c_before = doubles(c);
  CHECK_THROWS_AS(locus::matmul_into(c, a, b), locus::shape_error);
  CHECK(doubles(c) == c_before);
  // Right operands, wrong destination shape.
  auto b2 = locus::randn<float, D>({4, 5}, 94);
  try {
    locus::matmul_into(c, a, b2);
    FAIL("matmul_into a [3, 6] destination did not throw");
  } catch (const locus::shape_error& e) {
    const std::string msg = e.what();
    CHECK(mentions(msg, "[3, 5]"));
    CHECK(mentions(msg, "[3, 6]"));
    CHECK(mentions(msg, "not changed"));
  }
  CHECK(doubles(c) == c_before);

  // Batched: batch extents and inner extents.
  auto p = locus::randn<float, D>({2, 3, 4}, 95);
  auto q = locus::randn<float, D>({3, 4, 5}, 96);
  auto r = locus::randn<float, D>({2, 5, 5}, 97);
  CHECK_THROWS_WITH_AS((void)locus::matmul(p, q), doctest::Contains("[2, 3, 4]"), locus::shape_error);
  CHECK_THROWS_WITH_AS((void)locus::matmul(p, r), doctest::Contains("[2, 5, 5]"), locus::shape_error);

  // linear: in-features and bias length.
  auto x = locus::randn<float, D>({8, 10}, 98);
  auto w = locus::randn<float, D>({7, 11}, 99);
  auto w_ok = locus::randn<float, D>({7, 10}, 100);
  auto bias = locus::randn<float, D>({6}, 101);
  auto y = locus::randn<float, D>({8, 7}, 102);
  const auto y_before = doubles(y);
  try {
    locus::linear_into(y, x, w, locus::activation::relu);
    FAIL("linear with 10 and 11 in-features did not throw");
  } catch (const locus::shape_error& e) {
    const std::string msg = e.what();
    CHECK(mentions(msg, "[8, 10]"));
    CHECK(mentions(msg, "[7, 11]"));
  }
  CHECK_THROWS_WITH_AS(locus::linear_into(y, x, w_ok, bias), doctest::Contains("[6]"), locus::shape_error);
  auto y_bad = locus::randn<float, D>({8, 6}, 103);
  CHECK_THROWS_WITH_AS(locus::linear_into(y_bad, x, w_ok), doctest::Contains("[8, 6]"), locus::shape_error);
  CHECK(doubles(y) == y_before);
}

TEST_CASE_TEMPLATE("matmul: empty extents give empty or bias-only results", D, LOCUS_TEST_DEVICES) {
  using namespace locus_matmul_test;
  auto a0 = locus::randn<float, D>({0, 5}, 111);
  auto b = locus::randn<float, D>({5, 4}, 112);
  CHECK(locus::matmul(a0, b).shape() == locus::extents<2>{0, 4});
  // An empty inner extent: the product is all zeros; linear adds the bias.
  auto x = locus::randn<float, D>({3, 0}, 113);
  auto w = locus::randn<float, D>({4, 0}, 114);
  auto bias = locus::randn<float, D>({4}, 115);
  for (double v : doubles(locus::matmul(x, locus::transpose(w)))) CHECK(v == 0.0);
  const auto B = doubles(bias);
  const auto y = doubles(locus::linear(x, w, bias, locus::activation::relu));
  for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(std::max(0.0, B[i % 4])));
}
