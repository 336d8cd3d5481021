// The run-time side of the type rules: the raw-pointer door (locus::unsafe_view), what
// the traits say about tensors and views, swap, element access on temporaries, and
// printing of host tensors against hand-written text.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>
#include <variant>
#include <vector>

#include <locus/locus.hpp>

#include "host_devices.hpp"

namespace {
using H1 = locus::tensor<float, locus::cpu, 1>;
using V1 = locus::tensor_view<float, locus::cpu, 1>;
using CV1 = locus::tensor_view<const float, locus::cpu, 1>;

// ---- traits tell generic code the truth ------------------------------------------------
static_assert(!std::is_copy_constructible_v<H1>);
static_assert(!std::is_copy_assignable_v<H1>);
static_assert(std::is_nothrow_move_constructible_v<H1>);
static_assert(std::is_nothrow_move_assignable_v<H1>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cuda, 1>, H1>);
static_assert(!std::is_constructible_v<H1, locus::tensor<float, locus::cuda, 1>>);
static_assert(!std::is_convertible_v<locus::tensor<double, locus::cpu, 1>, H1>);
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cpu, 2>, H1>);
// views of lvalue tensors are the cheap handles they should be
static_assert(std::is_convertible_v<H1&, V1>);
static_assert(std::is_convertible_v<H1&, CV1>);
static_assert(std::is_convertible_v<const H1&, CV1>);
static_assert(std::is_convertible_v<V1, CV1>);
static_assert(std::is_trivially_copyable_v<V1>);
// std::optional and std::variant of a tensor are move-only too
static_assert(!std::is_copy_constructible_v<std::optional<H1>>);
static_assert(std::is_move_constructible_v<std::optional<H1>>);
static_assert(!std::is_copy_constructible_v<std::variant<H1, locus::tensor<float, locus::cuda, 1>>>);
// host access members exist only for what the rules allow; none takes a device argument
template <class X>
concept has_device_data_argument = requires(X& x) { x.template data<locus::cpu>(); };
static_assert(has_device_data_argument<H1>);  // declared, so that the message can fire
}  // namespace

TEST_CASE("unsafe_view: the one door for raw pointers checks what it can") {
  std::vector<float> buf(12);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  auto v = locus::unsafe_view<locus::cpu>(buf.data(), {3, 4});
  CHECK(v.shape() == locus::extents<2>{3, 4});
  CHECK(v(2, 3) == 11.0f);
  auto cols = locus::unsafe_view<locus::cpu>(buf.data() + 1, {3, 2}, {4, 2});
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols(2, 1) == 11.0f);
  const float* cp = buf.data();
  locus::tensor_view<const float, locus::cpu, 1> c = locus::unsafe_view<locus::cpu>(cp, {12});
  CHECK(c(5) == 5.0f);

  // empty views of a null pointer are fine; elements behind a null pointer are not
  CHECK(locus::unsafe_view<locus::cpu>(static_cast<float*>(nullptr), {0, 5}).empty());
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(static_cast<float*>(nullptr), {2}), locus::shape_error);
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {-1}), locus::shape_error);
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {3}, {-1}), locus::shape_error);
  constexpr locus::index_t big = std::numeric_limits<locus::index_t>::max();
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {big, 2}), locus::shape_error);
  // the element count fits but the last offset does not
  CHECK_NOTHROW((void)locus::unsafe_view<locus::cpu>(buf.data(), {3}, {big / 2}));  // last offset big - 1
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {4}, {big / 2}), locus::shape_error);
  try {
    (void)locus::unsafe_view<locus::cpu>(static_cast<float*>(nullptr), {2, 3});
    FAIL("a null pointer with elements was accepted");
  } catch (const locus::shape_error& e) {
    CHECK(std::string(e.what()).find("null pointer") != std::string::npos);
  }
}

TEST_CASE("swap exchanges tensors of one type without copying") {
  auto a = locus::arange<float, locus::cpu>(3);
  auto b = locus::arange<float, locus::cpu>(5);
  const float* pa = a.data();
  const float* pb = b.data();
  using std::swap;
  swap(a, b);
  CHECK(a.data() == pb);
  CHECK(b.data() == pa);
  CHECK(a.numel() == 5);
  CHECK(b.numel() == 3);
  std::swap(a, b);  // the standard's swap moves: the same result
  CHECK(a.data() == pa);
}

TEST_CASE("elements of a temporary tensor are read by value") {
  // no reference into the temporary escapes: operator() on an rvalue returns a value
  static_assert(std::is_same_v<decltype(locus::zeros<float, locus::cpu>({3})(1)), float>);
  static_assert(std::is_same_v<decltype(std::declval<H1&>()(1)), float&>);
  CHECK(locus::full<float, locus::cpu>({3}, 2.5f)(1) == 2.5f);
  CHECK(locus::sum(locus::ones<float, locus::cpu>({4})).item() == 4.0f);
}

TEST_CASE("printing host tensors: values, shape, dtype, device") {
  auto to_text = [](const auto& t) {
    std::ostringstream os;
    os << t;
    return os.str();
  };
  auto a = locus::arange<float, locus::cpu>(6);
  CHECK(to_text(a.reshape({2, 3})) ==
        "tensor([[0.0000, 1.0000, 2.0000],\n        [3.0000, 4.0000, 5.0000]], shape=[2, 3], "
        "dtype=f32, device=cpu)");
  auto i = locus::arange<std::int64_t, locus::cpu>(4);
  CHECK(to_text(i) == "tensor([0, 1, 2, 3], shape=[4], dtype=i64, device=cpu)");
  auto z = locus::zeros<bool, locus::cpu>({2});
  z(1) = true;
  CHECK(to_text(z) == "tensor([False, True], shape=[2], dtype=bool, device=cpu)");
  auto e = locus::zeros<float, locus::cpu>({0, 3});
  CHECK(to_text(e) == "tensor([], shape=[0, 3], dtype=f32, device=cpu)");
  CHECK(to_text(locus::sum(a)) == "tensor(15.0000, shape=[], dtype=f32, device=cpu)");
  // f16 prints the number it holds; NaN and infinities by name
  auto h = locus::full<locus::f16, locus::cpu>({3}, 0.5f);
  h(1) = locus::f16(std::numeric_limits<float>::infinity());
  h(2) = locus::f16(std::numeric_limits<float>::quiet_NaN());
  CHECK(to_text(h) == "tensor([0.5000, inf, nan], shape=[3], dtype=f16, device=cpu)");
  // magnitudes four decimals cannot show switch to scientific notation
  auto s = locus::full<double, locus::cpu>({2}, 1e-6);
  CHECK(to_text(s) == "tensor([1.0000e-06, 1.0000e-06], shape=[2], dtype=f64, device=cpu)");
  // a strided view prints its own elements
  auto m = locus::arange<std::int32_t, locus::cpu>(12);
  auto cols = locus::transpose(m.reshape({3, 4}));
  CHECK(to_text(cols.slice(0, 2)) == "tensor([[0, 4, 8],\n        [1, 5, 9]], shape=[2, 3], dtype=i32, device=cpu)");
  CHECK(locus::to_string(i) == to_text(i));
}

TEST_CASE("printing elides the middle of large tensors, as PyTorch does") {
  auto big = locus::arange<std::int32_t, locus::cpu>(2000);
  const std::string text = locus::to_string(big);
  CHECK(text == "tensor([0, 1, 2, ..., 1997, 1998, 1999], shape=[2000], dtype=i32, device=cpu)");
  auto m = locus::arange<std::int32_t, locus::cpu>(70 * 20);
  const std::string mt = locus::to_string(m.reshape({70, 20}));
  CHECK(mt.rfind("tensor([[0, 1, 2, ..., 17, 18, 19],\n        [20, 21, 22, ..., 37, 38, 39],", 0) == 0);
  CHECK(mt.find("        ...,\n        [1340, 1341, 1342, ..., 1357, 1358, 1359],") != std::string::npos);
  CHECK(mt.find("shape=[70, 20], dtype=i32, device=cpu)") != std::string::npos);
}

TEST_CASE_TEMPLATE("printing works on every host device", D, LOCUS_TEST_DEVICES) {
  auto t = locus::arange<float, D>(2);
  std::ostringstream os;
  os << t;
  CHECK(os.str() == "tensor([0.0000, 1.0000], shape=[2], dtype=f32, device=" + std::string(D::name) + ")");
}
