// copy() whose source and destination share memory (cpu and pinned): the result is
// always that of a copy from a separate source. Each expected value comes from a clone
// of the input taken before the copy, indexed by hand; nothing is compared with
// another call of copy(). Run under ASan/UBSan: a memcpy of overlapping ranges or a
// read of an already-overwritten element shows up there or in the values.
#include <doctest/doctest.h>

#include "host_devices.hpp"

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include <locus/locus.hpp>

namespace {

/// A tensor whose element k (row-major) is k + 1 (every element distinct).
template <class T, class D, std::size_t R>
locus::tensor<T, D, R> numbered(const locus::extents<R>& shape) {
  locus::tensor<T, D, R> t(shape);
  auto s = t.span();
  for (std::size_t k = 0; k < s.size(); ++k) s[k] = static_cast<T>(k + 1);
  return t;
}

template <class T, class D, std::size_t R>
bool equal_bytes(const locus::tensor<T, D, R>& a, const locus::tensor<T, D, R>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data_handle(), b.data_handle(), a.size_bytes()) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("copy of a tensor onto its own memory, same layout, changes nothing", D, LOCUS_TEST_DEVICES) {
  auto t = numbered<float, D, 2>({3, 4});
  const auto ref = t.clone();
  locus::copy(t, t);
  CHECK(equal_bytes(t, ref));
  locus::copy(t.view(), t);
  locus::copy(std::as_const(t).view(), t.view());  // a const view source, an rvalue view destination
  locus::copy(t.slice(1, 3), t.slice(1, 3));
  locus::copy(locus::transpose(locus::transpose(t)), t);  // strides swapped twice: the same mapping
  CHECK(equal_bytes(t, ref));

  auto r0 = locus::full<std::int64_t, D>(locus::extents<0>{}, std::numeric_limits<std::int64_t>::min());
  locus::copy(r0, r0);
  CHECK(r0.item() == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE_TEMPLATE("copy(transpose(t), t) gives the transpose of the input", D, LOCUS_TEST_DEVICES) {
  auto t = numbered<double, D, 2>({5, 5});
  const auto ref = t.clone();
  locus::copy(locus::transpose(t), t);
  for (locus::index_t i = 0; i < 5; ++i)
    for (locus::index_t j = 0; j < 5; ++j) CHECK(t(i, j) == ref(j, i));

  // Rank 3: each of the two [4, 4] matrices transposed in place.
  auto b = numbered<std::int32_t, D, 3>({2, 4, 4});
  const auto bref = b.clone();
  locus::copy(locus::transpose(b), b);
  for (locus::index_t k = 0; k < 2; ++k)
    for (locus::index_t i = 0; i < 4; ++i)
      for (locus::index_t j = 0; j < 4; ++j) CHECK(b(k, i, j) == bref(k, j, i));

  // And back again: the original.
  locus::copy(locus::transpose(b), b);
  CHECK(equal_bytes(b, bref));
}

TEST_CASE_TEMPLATE("copy between overlapping shifted slices is a memmove", D, LOCUS_TEST_DEVICES) {
  SUBCASE("forward: copy(t.slice(0, 6), t.slice(2, 8))") {
    auto t = numbered<float, D, 1>({8});
    const auto ref = t.clone();
    locus::copy(t.slice(0, 6), t.slice(2, 8));
    CHECK(t(0) == ref(0));
    CHECK(t(1) == ref(1));
    for (locus::index_t k = 0; k < 6; ++k) CHECK(t(k + 2) == ref(k));
  }
  SUBCASE("backward: copy(t.slice(2, 8), t.slice(0, 6))") {
    auto t = numbered<float, D, 1>({8});
    const auto ref = t.clone();
    locus::copy(t.slice(2, 8), t.slice(0, 6));
    for (locus::index_t k = 0; k < 6; ++k) CHECK(t(k) == ref(k + 2));
    CHECK(t(6) == ref(6));
    CHECK(t(7) == ref(7));
  }
  SUBCASE("rows of a matrix shifted down by one") {
    auto m = numbered<std::int64_t, D, 2>({5, 3});
    const auto ref = m.clone();
    locus::copy(std::as_const(m).slice(0, 4), m.slice(1, 5));
    for (locus::index_t j = 0; j < 3; ++j) CHECK(m(0, j) == ref(0, j));
    for (locus::index_t i = 1; i < 5; ++i)
      for (locus::index_t j = 0; j < 3; ++j) CHECK(m(i, j) == ref(i - 1, j));
  }
  SUBCASE("a large buffer shifted by one element") {
    const locus::index_t n = 1 << 16;
    auto t = numbered<std::int32_t, D, 1>({n});
    locus::copy(t.slice(0, n - 1), t.slice(1, n));
    bool ok = t(0) == 1;
    for (locus::index_t k = 1; k < n; ++k) ok = ok && t(k) == static_cast<std::int32_t>(k);
    CHECK(ok);
  }
}

TEST_CASE_TEMPLATE("an overlapping copy keeps every bit: integer extremes, NaN, inf, -0", D, LOCUS_TEST_DEVICES) {
  auto i = locus::empty<std::int64_t, D>({6});
  const std::int64_t iv[] = {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                             -1, 0, 1, std::numeric_limits<std::int64_t>::min() + 1};
  std::memcpy(i.data_handle(), iv, sizeof iv);
  locus::copy(i.slice(0, 5), i.slice(1, 6));
  CHECK(i(0) == iv[0]);
  for (locus::index_t k = 0; k < 5; ++k) CHECK(i(k + 1) == iv[k]);

  auto f = locus::empty<float, D>({3, 3});
  const float nan_payload = [] {
    const std::uint32_t bits = 0x7fc12345u;  // a quiet NaN with a payload
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }();
  const float fv[] = {nan_payload, std::numeric_limits<float>::infinity(), -0.0f,
                      -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                      std::numeric_limits<float>::max(), 1.0f, -1.0f, std::numeric_limits<float>::lowest()};
  std::memcpy(f.data_handle(), fv, sizeof fv);
  const auto fref = f.clone();
  locus::copy(locus::transpose(f), f);  // through a temporary
  for (locus::index_t r = 0; r < 3; ++r)
    for (locus::index_t c = 0; c < 3; ++c) CHECK(std::memcmp(&f(r, c), &fref(c, r), sizeof(float)) == 0);
}

TEST_CASE_TEMPLATE("strided overlapping copies go through a temporary", D, LOCUS_TEST_DEVICES) {
  SUBCASE("columns into rows: copy(transpose(m).slice(0, 2), m.slice(1, 3))") {
    auto m = numbered<float, D, 2>({4, 4});
    const auto ref = m.clone();
    locus::copy(locus::transpose(m).slice(0, 2), m.slice(1, 3));
    for (locus::index_t i = 0; i < 4; ++i)
      for (locus::index_t j = 0; j < 4; ++j) {
        const float expected = (i == 1 || i == 2) ? ref(j, i - 1) : ref(i, j);
        CHECK(m(i, j) == expected);
      }
  }
  SUBCASE("rows into columns: copy(m.slice(1, 3), transpose(m).slice(0, 2))") {
    auto m = numbered<float, D, 2>({4, 4});
    const auto ref = m.clone();
    locus::copy(m.slice(1, 3), locus::transpose(m).slice(0, 2));  // writes m(j, r) for r < 2
    for (locus::index_t i = 0; i < 4; ++i)
      for (locus::index_t j = 0; j < 4; ++j) {
        const float expected = j < 2 ? ref(1 + j, i) : ref(i, j);
        CHECK(m(i, j) == expected);
      }
  }
  SUBCASE("a transposed view of one tensor into a reshaped view of its own memory") {
    auto t = numbered<std::int32_t, D, 2>({2, 3});
    const auto ref = t.clone();
    locus::copy(locus::transpose(t), t.reshape({3, 2}));  // [3, 2] from [2, 3]^T
    const auto flat = t.reshape({6});
    for (locus::index_t r = 0; r < 3; ++r)
      for (locus::index_t c = 0; c < 2; ++c) CHECK(flat(r * 2 + c) == ref(c, r));
  }
}

TEST_CASE_TEMPLATE("empty and zero-size copies, overlapping or not, are no-ops", D, LOCUS_TEST_DEVICES) {
  auto t = numbered<float, D, 1>({6});
  const auto ref = t.clone();
  locus::copy(t.slice(3, 3), t.slice(4, 4));
  locus::copy(t.slice(0, 0), t.slice(0, 0));
  locus::tensor<float, D, 2> e0, e1;  // default: no memory
  locus::copy(e0, e1);
  locus::copy(e0, e0);
  auto z = locus::empty<float, D>({0, 5});
  locus::copy(z, z);
  CHECK(equal_bytes(t, ref));
  CHECK(e1.numel() == 0);
}

TEST_CASE_TEMPLATE("an overlapping copy of the wrong shape throws and changes nothing", D, LOCUS_TEST_DEVICES) {
  auto t = numbered<float, D, 1>({8});
  const auto ref = t.clone();
  CHECK_THROWS_AS(locus::copy(t.slice(0, 5), t.slice(2, 8)), locus::shape_error);
  CHECK_THROWS_AS(locus::copy(t.reshape({2, 4}), locus::transpose(t.reshape({2, 4}))), locus::shape_error);
  CHECK(equal_bytes(t, ref));
}
