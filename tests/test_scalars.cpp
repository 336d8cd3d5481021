// Host suite: the types scalars give (issue 12, item 5). A scalar joins its tensor's
// compute type (f32 for f16 and bf16) and never changes the result's dtype; a floating
// scalar with an integer or bool tensor is a compile error (tests/compile_fail/scalar_*.cpp)
// and an integer scalar out of range a value_error (generic/expr_cases.hpp, every device).
#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>

#include <locus/locus.hpp>

namespace {
using locus::cpu;
template <class T, std::size_t R = 1>
using t_ = locus::tensor<T, cpu, R>;
template <class E>
using vt = typename std::remove_cvref_t<E>::value_type;

// Scalars keep the tensor's dtype.
static_assert(std::is_same_v<vt<decltype(std::declval<const t_<locus::f16>&>() * 1e5f)>, locus::f16>);
static_assert(std::is_same_v<vt<decltype(std::declval<const t_<std::int32_t>&>() * 2)>, std::int32_t>);
static_assert(std::is_same_v<vt<decltype(std::declval<const t_<std::uint8_t>&>() + 300)>, std::uint8_t>);
static_assert(std::is_same_v<vt<decltype(2.0 * std::declval<const t_<float>&>())>, float>);
static_assert(std::is_same_v<vt<decltype(std::declval<const t_<std::int32_t>&>() > 10)>, bool>);
// The scalar's value is held in the compute type: f32 for f16 and bf16, f64 for f64.
static_assert(std::is_same_v<decltype(locus::detail::scalar_expr<locus::f16>::value), float>);
static_assert(std::is_same_v<decltype(locus::detail::scalar_expr<locus::bf16>::value), float>);
static_assert(std::is_same_v<decltype(locus::detail::scalar_expr<double>::value), double>);
static_assert(std::is_same_v<decltype(locus::detail::scalar_expr<std::int64_t>::value), std::int64_t>);
// Sums of integers and bool are i64; max of u8 stays u8; mean needs a floating dtype.
static_assert(std::is_same_v<decltype(locus::sum(std::declval<const t_<bool>&>())), locus::tensor<std::int64_t, cpu, 0>>);
static_assert(std::is_same_v<decltype(locus::sum(std::declval<const t_<std::uint8_t, 2>&>(), 0)), t_<std::int64_t>>);
static_assert(std::is_same_v<decltype(locus::max(std::declval<const t_<std::uint8_t>&>())), locus::tensor<std::uint8_t, cpu, 0>>);
static_assert(std::is_same_v<decltype(locus::sum(std::declval<const t_<locus::bf16>&>())), locus::tensor<locus::bf16, cpu, 0>>);
// value_error is a locus::error.
static_assert(std::is_base_of_v<locus::error, locus::value_error>);
}  // namespace

TEST_CASE("scalars: the scalar of an f16 expression is not rounded to f16 (f32 compute)") {
  auto h = locus::ones<locus::f16, cpu>({3});
  const auto e = h * 1e5f;
  CHECK(e.b.value == 1e5f);  // 1e5 is inf in f16
  const auto p = h * 0.1;   // a double scalar: rounded once, to f32
  CHECK(p.b.value == 0.1f);
  const auto q = h + locus::bf16(3.0f);
  CHECK(q.b.value == 3.0f);
  locus::tensor<locus::f16, cpu, 1> r = (h * 1e5f) / 1e5f;
  CHECK(static_cast<float>(r(0)) == 1.0f);
}

TEST_CASE("scalars: an integer scalar that fits converts exactly, a char or a bool too") {
  auto i = locus::full<std::int64_t, cpu>({1}, 0);
  locus::tensor<std::int64_t, cpu, 1> a = i + 9007199254740993LL;  // not a double
  CHECK(a(0) == 9007199254740993LL);
  locus::tensor<std::int64_t, cpu, 1> b = i + true;
  CHECK(b(0) == 1);
  auto u = locus::full<std::uint8_t, cpu>({1}, 1);
  locus::tensor<std::uint8_t, cpu, 1> c = u + 'a';
  CHECK(c(0) == 98);
  CHECK_THROWS_AS((void)(u + static_cast<signed char>(-1)), locus::value_error);
}
