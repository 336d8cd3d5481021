// Device-generic test bodies (the Kokkos "category file" pattern): a translation unit
// defines LOCUS_TEST_DEVICES (cpu and pinned in the host suite, cuda in the nvcc
// suite) and includes this file, so every device runs the same checks. Results are
// always read back through an explicit to<cpu>(), which also tests the transfers.
#pragma once

#include <algorithm>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include <locus/locus.hpp>

#ifndef LOCUS_TEST_DEVICES
#error "define LOCUS_TEST_DEVICES before including generic/tensor_cases.hpp"
#endif

namespace locus_test {

template <class T, std::size_t R>
std::vector<T> host_values(const locus::tensor<T, locus::cpu, R>& t) {
  auto s = t.span();
  return {s.begin(), s.end()};
}

template <class T, class D, std::size_t R>
std::vector<T> values_of(const locus::tensor<T, D, R>& t) {
  return host_values(locus::to<locus::cpu>(t));
}

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace locus_test

TEST_CASE_TEMPLATE("factories: zeros ones full and empty have the requested shape and values",
                   D, LOCUS_TEST_DEVICES) {
  auto z = locus::zeros<float, D>({3, 5});
  static_assert(std::is_same_v<decltype(z), locus::tensor<float, D, 2>>);
  CHECK(z.shape() == locus::extents<2>{3, 5});
  CHECK(z.numel() == 15);
  CHECK(z.size_bytes() == 15 * sizeof(float));
  for (float v : locus_test::values_of(z)) CHECK(v == 0.0f);

  auto o = locus::ones<double, D>({2, 3, 4});
  for (double v : locus_test::values_of(o)) CHECK(v == 1.0);

  auto f = locus::full<std::int32_t, D>({7}, -3);
  for (auto v : locus_test::values_of(f)) CHECK(v == -3);

  auto b = locus::full<locus::bf16, D>({4}, 1.5);
  for (auto v : locus_test::values_of(b)) CHECK(static_cast<float>(v) == 1.5f);

  auto big = locus::full<float, D>({1 << 17}, 2.5f);  // above the parallel threshold
  auto bv = locus_test::values_of(big);
  CHECK(std::all_of(bv.begin(), bv.end(), [](float v) { return v == 2.5f; }));

  auto e = locus::empty<std::uint8_t, D>({0, 4});
  CHECK(e.numel() == 0);
  CHECK(e.empty());
  CHECK(locus_test::values_of(e).empty());
}

TEST_CASE_TEMPLATE("factories: arange counts like std::iota", D, LOCUS_TEST_DEVICES) {
  auto a = locus::arange<std::int64_t, D>(100000);
  std::vector<std::int64_t> ref(100000);
  std::iota(ref.begin(), ref.end(), 0);
  CHECK(locus_test::values_of(a) == ref);

  auto f = locus::arange<double, D>(1.0, 2.0, 0.25);
  CHECK(locus_test::values_of(f) == std::vector<double>{1.0, 1.25, 1.5, 1.75});
  CHECK(locus::arange<float, D>(5.0, 1.0).numel() == 0);
  CHECK_THROWS_AS((locus::arange<float, D>(0.0, 1.0, 0.0)), locus::shape_error);
  // Counts that are not finite or do not fit index_t, and a negative n: shape_error,
  // not a cast whose result the language leaves undefined.
  CHECK_THROWS_AS((locus::arange<float, D>(0.0, 1e300, 1e-300)), locus::shape_error);
  CHECK_THROWS_AS((locus::arange<float, D>(0.0, std::numeric_limits<double>::infinity())), locus::shape_error);
  CHECK_THROWS_AS((locus::arange<float, D>(std::numeric_limits<double>::quiet_NaN(), 1.0)), locus::shape_error);
  CHECK_THROWS_AS((locus::arange<float, D>(0.0, 1.0, std::numeric_limits<double>::infinity())), locus::shape_error);
  CHECK_THROWS_AS((locus::arange<float, D>(-3)), locus::shape_error);
}

TEST_CASE_TEMPLATE("random: the same seed gives the same numbers with plausible statistics", D, LOCUS_TEST_DEVICES) {
  const auto a = locus_test::values_of(locus::rand<float, D>({1000, 100}, 1234));
  const auto b = locus_test::values_of(locus::rand<float, D>({1000, 100}, 1234));
  const auto c = locus_test::values_of(locus::rand<float, D>({1000, 100}, 1235));
  CHECK(a == b);
  CHECK(a != c);
  // Bit for bit what the cpu device produces (the same functor runs everywhere).
  CHECK(a == locus_test::host_values(locus::rand<float, locus::cpu>({1000, 100}, 1234)));
  double mean = 0, var = 0;
  for (float v : a) {
    CHECK(v >= 0.0f);
    CHECK(v < 1.0f);
    mean += v;
  }
  mean /= static_cast<double>(a.size());
  for (float v : a) var += (v - mean) * (v - mean);
  var /= static_cast<double>(a.size());
  CHECK(mean == doctest::Approx(0.5).epsilon(0.01));
  CHECK(var == doctest::Approx(1.0 / 12.0).epsilon(0.02));

  const auto n = locus_test::values_of(locus::randn<double, D>({200000}, 7, 2.0, 3.0));
  double m = 0, s2 = 0;
  for (double v : n) m += v;
  m /= static_cast<double>(n.size());
  for (double v : n) s2 += (v - m) * (v - m);
  s2 /= static_cast<double>(n.size());
  CHECK(m == doctest::Approx(2.0).epsilon(0.01));
  CHECK(std::sqrt(s2) == doctest::Approx(3.0).epsilon(0.01));

  // randn on another device agrees with the cpu to the last bit of libm's log/cos.
  const auto nf = locus_test::values_of(locus::randn<float, D>({4096}, 99));
  const auto nc = locus_test::host_values(locus::randn<float, locus::cpu>({4096}, 99));
  for (std::size_t i = 0; i < nf.size(); ++i)
    CHECK(std::abs(static_cast<std::int64_t>(locus_test::float_bits(nf[i])) -
                   static_cast<std::int64_t>(locus_test::float_bits(nc[i]))) <= 1);
}

TEST_CASE_TEMPLATE("from_host and to<cpu> round-trip exactly and a size mismatch throws", D,
                   LOCUS_TEST_DEVICES) {
  std::vector<float> src(6 * 7);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = 0.1f * static_cast<float>(i) - 1.7f;
  auto t = locus::from_host<D>(src, {6, 7});
  static_assert(std::is_same_v<decltype(t), locus::tensor<float, D, 2>>);
  CHECK(locus_test::values_of(t) == src);
  CHECK_THROWS_AS((locus::from_host<D>(src, {6, 6})), locus::shape_error);
  try {
    (void)locus::from_host<D>(src, {5, 9});
    FAIL("no exception");
  } catch (const locus::shape_error& e) {
    const std::string m = e.what();
    CHECK(m.find("42") != std::string::npos);
    CHECK(m.find("[5, 9]") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE("bad shapes: negative or overflowing extents throw shape_error", D,
                   LOCUS_TEST_DEVICES) {
  CHECK_THROWS_AS((locus::zeros<float, D>({-1, 3})), locus::shape_error);
  CHECK_THROWS_AS((locus::empty<float, D>({std::int64_t{1} << 40, std::int64_t{1} << 40})),
                  locus::shape_error);
  try {
    (void)locus::empty<float, D>({2, -5});
    FAIL("no exception");
  } catch (const locus::shape_error& e) {
    CHECK(std::string(e.what()).find("[2, -5]") != std::string::npos);
  }
}

TEST_CASE_TEMPLATE("copy and to between every pair of devices", D, LOCUS_TEST_DEVICES) {
  auto src = locus::rand<float, locus::cpu>({33, 17}, 5);
  const auto ref = locus_test::host_values(src);
  auto on_d = locus::to<D>(src);
#if LOCUS_HAS_CUDA
  auto on_pinned = locus::to<locus::pinned>(on_d);
#else
  auto on_pinned = locus::to<locus::cpu>(on_d);  // no pinned device without CUDA
#endif
  auto back_d = locus::to<D>(on_pinned);
  auto again = locus::to<D>(back_d);  // same device: a deep copy
  CHECK(locus_test::values_of(again) == ref);
  auto c = again.clone();
  CHECK(c.data_handle() != again.data_handle());
  CHECK(locus_test::values_of(c) == ref);

  auto dst = locus::zeros<float, D>({33, 17});
  locus::copy(src, dst);
  CHECK(locus_test::values_of(dst) == ref);
  auto host = locus::zeros<float, locus::cpu>({33, 17});
  locus::copy(dst.view(), host);
  CHECK(locus_test::host_values(host) == ref);
}

TEST_CASE_TEMPLATE("copy with mismatched shapes throws and leaves the destination unchanged", D,
                   LOCUS_TEST_DEVICES) {
  auto src = locus::ones<float, D>({4, 5});
  auto dst = locus::full<float, D>({5, 4}, 7.0f);
  CHECK_THROWS_AS((locus::copy(src, dst)), locus::shape_error);
  for (float v : locus_test::values_of(dst)) CHECK(v == 7.0f);
}

TEST_CASE_TEMPLATE("views: reshape and slice along the first axis and strided copies", D,
                   LOCUS_TEST_DEVICES) {
  auto t = locus::arange<float, D>(24);
  auto m = t.reshape({4, 6});
  static_assert(std::is_same_v<decltype(m), locus::tensor_view<float, D, 2>>);
  CHECK(m.shape() == locus::extents<2>{4, 6});
  CHECK(m.strides() == locus::extents<2>{6, 1});
  CHECK_THROWS_AS(((void)t.reshape({5, 5})), locus::shape_error);

  auto rows = m.slice(1, 3);  // rows 1 and 2: elements 6..17
  CHECK(rows.shape() == locus::extents<2>{2, 6});
  auto host = locus::to<locus::cpu>(rows);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 6; ++j) CHECK(host(i, j) == static_cast<float>(6 * (i + 1) + j));
  CHECK_THROWS_AS(((void)m.slice(3, 5)), locus::shape_error);
  CHECK_THROWS_AS(((void)m.slice(2, 1)), locus::shape_error);
  CHECK(m.slice(4, 4).numel() == 0);

  // Writing through a slice changes the owner.
  auto patch = locus::full<float, D>({1, 6}, -1.0f);
  locus::copy(patch, m.slice(0, 1));
  auto all = locus_test::values_of(t);
  for (int j = 0; j < 6; ++j) CHECK(all[static_cast<std::size_t>(j)] == -1.0f);
  CHECK(all[6] == 6.0f);

  // A strided host view (every other column) copied onto D and back.
  auto h = locus::arange<float, locus::cpu>(12);
  locus::tensor_view<const float, locus::cpu, 2> cols = locus::unsafe_view<locus::cpu>(h.data_handle(), {3, 2}, {4, 2});
  CHECK_FALSE(cols.is_contiguous());
  auto on_d = locus::to<D>(cols);
  CHECK(locus_test::values_of(on_d) == std::vector<float>{0, 2, 4, 6, 8, 10});
  auto back = locus::zeros<float, locus::cpu>({3, 4});
  locus::tensor_view<float, locus::cpu, 2> into = locus::unsafe_view<locus::cpu>(back.data_handle(), {3, 2}, {4, 2});
  locus::copy(on_d, into);
  CHECK(back(2, 2) == 10.0f);
  CHECK(back(2, 1) == 0.0f);

  // clone() of a view (the fix that building a tensor from a view names): a new,
  // contiguous tensor of the same device; a const view gives a mutable tensor.
  auto rows_copy = std::as_const(m).slice(1, 3).clone();
  static_assert(std::is_same_v<decltype(rows_copy), locus::tensor<float, D, 2>>);
  CHECK(rows_copy.data_handle() != m.data_handle() + 6);
  CHECK(locus_test::values_of(rows_copy) == std::vector<float>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17});
  auto strided_copy = cols.clone();  // every other column of a host tensor
  static_assert(std::is_same_v<decltype(strided_copy), locus::tensor<float, locus::cpu, 2>>);
  CHECK(strided_copy.view().is_contiguous());
  CHECK(locus_test::host_values(strided_copy) == std::vector<float>{0, 2, 4, 6, 8, 10});
}

TEST_CASE_TEMPLATE("moved-from tensors are empty and safe to destroy", D, LOCUS_TEST_DEVICES) {
  const auto before = locus::memory_stats<D>().allocated_bytes;
  {
    auto a = locus::ones<float, D>({64, 64});
    auto b = std::move(a);
    CHECK(a.numel() == 0);         // NOLINT(bugprone-use-after-move)
    CHECK(a.data_handle() == nullptr);
    CHECK(b.numel() == 64 * 64);
    locus::tensor<float, D, 2> c;
    c = std::move(b);
    CHECK(b.empty());
    CHECK(c.numel() == 64 * 64);
    c = locus::tensor<float, D, 2>{};
    CHECK(c.empty());
  }
  CHECK(locus::memory_stats<D>().allocated_bytes == before);
}

TEST_CASE_TEMPLATE("memory statistics count allocations and the caching allocator reuses blocks", D,
                   LOCUS_TEST_DEVICES) {
  locus::empty_cache<D>();
  const auto s0 = locus::memory_stats<D>();
  {
    auto a = locus::empty<float, D>({1000});
    const auto s1 = locus::memory_stats<D>();
    CHECK(s1.allocated_bytes >= s0.allocated_bytes + 4000);
    CHECK(s1.allocations == s0.allocations + 1);
    CHECK(s1.peak_allocated_bytes >= s1.allocated_bytes);
    CHECK(s1.reserved_bytes >= s1.allocated_bytes);
  }
  const auto s2 = locus::memory_stats<D>();
  CHECK(s2.allocated_bytes == s0.allocated_bytes);
  {
    auto b = locus::empty<float, D>({1000});
    const auto s3 = locus::memory_stats<D>();
    if constexpr (std::is_same_v<D, locus::cpu>) {
      CHECK(s3.cache_hits == s0.cache_hits);
    } else {
      CHECK(s3.cache_hits == s0.cache_hits + 1);  // the freed block came back
      CHECK(s3.reserved_bytes == s2.reserved_bytes);
    }
  }
  locus::empty_cache<D>();
  CHECK(locus::memory_stats<D>().reserved_bytes == locus::memory_stats<D>().allocated_bytes);
}

TEST_CASE_TEMPLATE("allocation above the memory limit throws out_of_memory and leaks nothing", D,
                   LOCUS_TEST_DEVICES) {
  struct limit_guard {
    ~limit_guard() { locus::set_memory_limit<D>(std::numeric_limits<std::size_t>::max()); }
  } guard;
  locus::empty_cache<D>();
  auto keep = locus::empty<float, D>({256});
  { auto cached = locus::empty<float, D>({1 << 17}); }  // 512 KiB, freed: cached (pinned, cuda)
  const auto before = locus::memory_stats<D>();
  locus::set_memory_limit<D>(before.reserved_bytes + (1u << 20));
  try {
    auto too_big = locus::empty<float, D>({1 << 20});  // 4 MiB
    FAIL("no exception");
  } catch (const locus::out_of_memory& e) {
    CHECK(e.device() == std::string(D::name));
    CHECK(e.requested_bytes() >= (4u << 20));
    CHECK(e.allocated_bytes() == before.allocated_bytes);
    CHECK(e.reserved_bytes() == before.reserved_bytes);  // no use emptying the cache: it could never fit
    const std::string m = e.what();
    CHECK(m.find("batch") != std::string::npos);
    CHECK(m.find("gradient accumulation") != std::string::npos);
  }
  const auto after = locus::memory_stats<D>();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.reserved_bytes == before.reserved_bytes);
  CHECK(after.allocations == before.allocations);
  CHECK(after.peak_allocated_bytes == before.peak_allocated_bytes);
  // Below the limit still works.
  auto fits = locus::empty<float, D>({1024});
  CHECK(fits.numel() == 1024);
}

TEST_CASE_TEMPLATE("with the cache full a failing allocation empties it and retries", D,
                   LOCUS_TEST_DEVICES) {
  struct limit_guard {
    ~limit_guard() { locus::set_memory_limit<D>(std::numeric_limits<std::size_t>::max()); }
  } guard;
  locus::empty_cache<D>();
  const auto base = locus::memory_stats<D>();
  { auto a = locus::empty<std::uint8_t, D>({3 << 20}); }  // freed: cached (pinned, cuda)
  locus::set_memory_limit<D>(base.reserved_bytes + (4u << 20));
  auto b = locus::empty<std::uint8_t, D>({3 << 19});  // a different size class: needs the room
  CHECK(b.numel() == (3 << 19));
  CHECK(locus::memory_stats<D>().reserved_bytes <= base.reserved_bytes + (4u << 20));
}
