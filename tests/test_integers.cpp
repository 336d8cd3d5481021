// Host suite: integer semantics (issue 12, items 6 and 11). Wrapping, saturating casts and
// integer powers in constant evaluation (where any undefined behaviour is a compile
// error, so these static_asserts also prove the operations are defined), and the integer
// factories: arange with a fractional step and full with a value the dtype cannot hold
// are value_errors. References: two's complement by hand through the unsigned type, and
// PyTorch's documented results.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include <locus/locus.hpp>

#include "host_devices.hpp"

namespace {
using i32l = std::numeric_limits<std::int32_t>;
using i64l = std::numeric_limits<std::int64_t>;
namespace d = locus::detail;

// Constant evaluation rejects signed overflow, a division trap and an out-of-range
// float-to-int conversion: each line would fail to compile if the operation were UB.
static_assert(d::wrap_add(i32l::max(), 1) == i32l::min());
static_assert(d::wrap_sub(i32l::min(), 1) == i32l::max());
static_assert(d::wrap_mul(i32l::max(), 2) == -2);
static_assert(d::wrap_neg(i32l::min()) == i32l::min());
static_assert(d::wrap_neg(i64l::min()) == i64l::min());
static_assert(d::wrap_mul(i64l::max(), i64l::max()) == 1);
static_assert(d::int_div(i32l::min(), -1) == i32l::min());
static_assert(d::int_div(i64l::min(), std::int64_t(-1)) == i64l::min());
static_assert(d::int_div(-7, 2) == -3 && d::int_div(7, -2) == -3);
static_assert(d::int_pow(2, 31) == i32l::min() && d::int_pow(2, 32) == 0 && d::int_pow(0, 0) == 1);
static_assert(d::int_pow(-1, -3) == -1 && d::int_pow(-1, -4) == 1 && d::int_pow(1, -9) == 1 && d::int_pow(2, -1) == 0);
static_assert(d::int_pow(std::uint8_t(3), std::uint8_t(6)) == std::uint8_t(729 % 256));
static_assert(d::int_pow(std::int64_t(3), std::int64_t(40)) == -6289078614652622815LL);  // 3^40 - 2^64
static_assert(d::saturate_cast<std::int32_t>(3e9f) == i32l::max());
static_assert(d::saturate_cast<std::int32_t>(-3e9f) == i32l::min());
static_assert(d::saturate_cast<std::int32_t>(2147483520.0f) == 2147483520);  // the largest f32 below 2^31
static_assert(d::saturate_cast<std::int32_t>(-2147483648.0f) == i32l::min());
static_assert(d::saturate_cast<std::int32_t>(-2.9) == -2 && d::saturate_cast<std::int32_t>(2.9) == 2);
static_assert(d::saturate_cast<std::uint8_t>(300.7f) == 255 && d::saturate_cast<std::uint8_t>(-0.9f) == 0);
static_assert(d::saturate_cast<std::uint8_t>(-1.0f) == 0 && d::saturate_cast<std::uint8_t>(255.99f) == 255);
static_assert(d::saturate_cast<std::int64_t>(1e19) == i64l::max() && d::saturate_cast<std::int64_t>(-1e19) == i64l::min());
static_assert(d::saturate_cast<std::int64_t>(9223372036854774784.0) == 9223372036854774784LL);
static_assert(d::saturate_cast<std::int32_t>(std::numeric_limits<float>::infinity()) == i32l::max());
static_assert(d::saturate_cast<std::int32_t>(std::numeric_limits<double>::quiet_NaN()) == 0);
static_assert(d::saturate_cast<bool>(0.5f) && !d::saturate_cast<bool>(-0.0f));
static_assert(d::integer_fits<std::uint8_t>(255) && !d::integer_fits<std::uint8_t>(256) && !d::integer_fits<std::uint8_t>(-1));
static_assert(d::integer_fits<std::int64_t>(9223372036854775807ULL) && !d::integer_fits<std::int64_t>(9223372036854775808ULL));
static_assert(d::integer_fits<bool>(1) && !d::integer_fits<bool>(2) && d::integer_fits<bool>(true));
static_assert(!d::integer_fits<std::int32_t>(std::int64_t(1) << 31) && d::integer_fits<std::int32_t>(-(std::int64_t(1) << 31)));

template <class T, class D, std::size_t R>
std::vector<T> values(const locus::tensor<T, D, R>& t) {
  auto h = locus::to<locus::cpu>(t);
  return std::vector<T>(h.span().begin(), h.span().end());
}
}  // namespace

TEST_CASE_TEMPLATE("arange of an integer dtype needs a whole-number start and step and is exact", D, LOCUS_TEST_DEVICES) {
  // torch.arange(0, 2.5, 0.5, dtype=int) truncates each element to 0, 0, 1, 1, 2 (locus
  // gave five zeros); locus refuses it and names the explicit spelling.
  CHECK_THROWS_WITH_AS((locus::arange<std::int32_t, D>(0, 2.5, 0.5)),
                       doctest::Contains("arange<i32>(0, 2.5, 0.5) needs a whole-number start and step"),
                       locus::value_error);
  CHECK_THROWS_AS((locus::arange<std::int64_t, D>(0.5, 3)), locus::value_error);
  CHECK_THROWS_AS((locus::arange<std::uint8_t, D>(0, 10, 1.5)), locus::value_error);
  // The spelling the message names: a floating arange, truncated explicitly.
  auto t = locus::eval(locus::cast<std::int32_t>(locus::arange<double, D>(0, 2.5, 0.5)));
  CHECK(values(t) == std::vector<std::int32_t>{0, 0, 1, 1, 2});
  // A fractional stop is fine: the elements are still whole numbers.
  CHECK(values(locus::arange<std::int32_t, D>(0, 2.5)) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(values(locus::arange<std::int32_t, D>(5, -1, -2)) == std::vector<std::int32_t>{5, 3, 1});
  CHECK(values(locus::arange<std::int32_t, D>(3)) == std::vector<std::int32_t>{0, 1, 2});
  CHECK(locus::arange<std::int32_t, D>(3, 3).numel() == 0);
  // Range: u8 holds 0..255; bool 0 and 1.
  CHECK(values(locus::arange<std::uint8_t, D>(250, 256)) == std::vector<std::uint8_t>{250, 251, 252, 253, 254, 255});
  CHECK_THROWS_AS((locus::arange<std::uint8_t, D>(250, 257)), locus::value_error);
  CHECK_THROWS_AS((locus::arange<std::uint8_t, D>(-1, 3)), locus::value_error);
  CHECK(values(locus::arange<bool, D>(2)) == std::vector<bool>{false, true});
  CHECK_THROWS_AS((locus::arange<bool, D>(3)), locus::value_error);
  // Out of range is refused before anything is allocated (3e9 i32 elements: 12 GB).
  const auto before = locus::memory_stats<D>().allocations;
  CHECK_THROWS_AS((locus::arange<std::int32_t, D>(0, 3e9)), locus::value_error);
  CHECK(locus::memory_stats<D>().allocations == before);
  // i64 near its ends is exact (computed in i64, not through double).
  CHECK(values(locus::arange<std::int64_t, D>(-9.0e18, 9.0e18, 3.0e18)) ==
        std::vector<std::int64_t>{-9000000000000000000LL, -6000000000000000000LL, -3000000000000000000LL, 0,
                                  3000000000000000000LL, 6000000000000000000LL});
  // 2^53 - 1 + 2 = 2^53 + 1 has no double: the elements are still exact.
  CHECK(values(locus::arange<std::int64_t, D>(9007199254740991.0, 9007199254740996.0, 2)) ==
        std::vector<std::int64_t>{9007199254740991LL, 9007199254740993LL, 9007199254740995LL});
  // Floating aranges are unchanged: computed in double, rounded once.
  CHECK(values(locus::arange<float, D>(0, 2.5, 0.5)) == std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f});
}

TEST_CASE_TEMPLATE("full of an integer dtype needs a value the dtype holds exactly", D, LOCUS_TEST_DEVICES) {
  CHECK_THROWS_WITH_AS((locus::full<std::uint8_t, D>({2}, 300)), doctest::Contains("cannot hold the value 300"),
                       locus::value_error);
  CHECK_THROWS_AS((locus::full<std::uint8_t, D>({2}, -1)), locus::value_error);
  CHECK_THROWS_AS((locus::full<std::int32_t, D>({2}, 2.5)), locus::value_error);
  CHECK_THROWS_AS((locus::full<std::int32_t, D>({2}, std::numeric_limits<double>::quiet_NaN())), locus::value_error);
  CHECK_THROWS_AS((locus::full<std::int32_t, D>({2}, std::numeric_limits<float>::infinity())), locus::value_error);
  CHECK_THROWS_AS((locus::full<std::int64_t, D>({2}, 9.3e18)), locus::value_error);
  CHECK_THROWS_AS((locus::full<bool, D>({2}, 2)), locus::value_error);
  CHECK_THROWS_AS((locus::full<std::int32_t, D>({2}, std::int64_t(1) << 31)), locus::value_error);
  CHECK(values(locus::full<std::uint8_t, D>({2}, 255)) == std::vector<std::uint8_t>{255, 255});
  CHECK(values(locus::full<std::int32_t, D>({2}, 2.0)) == std::vector<std::int32_t>{2, 2});
  CHECK(values(locus::full<std::int64_t, D>({1}, -9223372036854775808.0)) == std::vector<std::int64_t>{i64l::min()});
  CHECK(values(locus::full<std::int64_t, D>({1}, i64l::max())) == std::vector<std::int64_t>{i64l::max()});
  CHECK(values(locus::full<bool, D>({1}, true)) == std::vector<bool>{true});
  CHECK(values(locus::ones<bool, D>({1})) == std::vector<bool>{true});
  // Floating dtypes round as before (f16 of 1e5 is inf, not an error).
  CHECK(std::isinf(static_cast<float>(locus::full<locus::f16, locus::cpu>({1}, 1e5f)(0))));
}
