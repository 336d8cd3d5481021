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

#include <locus/data/loader.hpp>
#include <locus/locus.hpp>
#include <locus/train.hpp>

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
#if LOCUS_HAS_CUDA  // (naming cuda is itself an error in a build without CUDA)
static_assert(!std::is_convertible_v<locus::tensor<float, locus::cuda, 1>, H1>);
static_assert(!std::is_constructible_v<H1, locus::tensor<float, locus::cuda, 1>>);
static_assert(!std::is_copy_constructible_v<std::variant<H1, locus::tensor<float, locus::cuda, 1>>>);
#endif
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
static_assert(!std::is_copy_constructible_v<std::variant<H1, locus::tensor<double, locus::cpu, 1>>>);
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
  // the element count fits but the last offset does not: in elements, and in bytes (the
  // second hostile review: an offset that fits in elements but not in bytes overflowed
  // the overlap checks)
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {4}, {big / 2}), locus::shape_error);
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {3}, {big / 2}), locus::shape_error);
  CHECK_NOTHROW((void)locus::unsafe_view<locus::cpu>(buf.data(), {3}, {big / 16}));  // last byte at big / 2
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

// ---- what an outside review found (each failed before its fix) -------------------------
TEST_CASE("unsafe_view refuses a writable view that maps two elements to one address") {
  float cell = 0.0f;
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(&cell, {1 << 20}, {0}), locus::shape_error);
  std::vector<float> buf(8);
  // rows that overlap columns: {2, 3} with strides {1, 1} reaches element 1 twice
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {2, 3}, {1, 1}), locus::shape_error);
  CHECK_THROWS_AS((void)locus::unsafe_view<locus::cpu>(buf.data(), {3, 2}, {1, 1}), locus::shape_error);
  // disjoint layouts pass, in any axis order; extent-1 axes may have any stride
  CHECK_NOTHROW((void)locus::unsafe_view<locus::cpu>(buf.data(), {2, 4}, {1, 2}));
  CHECK_NOTHROW((void)locus::unsafe_view<locus::cpu>(buf.data(), {1, 8}, {0, 1}));
  // a view of const elements may overlap itself (a broadcast read)
  const float* c = buf.data();
  auto b = locus::unsafe_view<locus::cpu>(c, {4, 8}, {0, 1});
  CHECK(b(3, 7) == 0.0f);
}

TEST_CASE("a slice of an empty view offsets no null pointer") {
  auto t = locus::zeros<float, locus::cpu>({0, 5});
  auto s = locus::transpose(t).slice(2, 4);
  CHECK(s.numel() == 0);
  CHECK(s.data_handle() == t.data_handle());
}

TEST_CASE("empty<bool> holds only valid bools") {
  auto b = locus::empty<bool, locus::cpu>({4096});
  CHECK(locus::sum(b).item() == 0);  // UBSan: a stray byte is an invalid bool
}

TEST_CASE("var with a correction at or past the element count is inf, as torch.var's") {
  auto x = locus::arange<float, locus::cpu>(3);  // 0, 1, 2: squared deviations sum to 2
  CHECK(std::isinf(locus::var(x, locus::correction(5)).item()));
  CHECK(std::isinf(locus::var(x, locus::correction(3)).item()));
  CHECK(locus::var(x, locus::correction(2)).item() == doctest::Approx(2.0));
  CHECK_THROWS_AS((void)locus::correction(-1.0), locus::value_error);
  CHECK_THROWS_AS((void)locus::correction(std::nan("")), locus::value_error);
}

TEST_CASE("an integer arange at the bottom of i64 does not wrap") {
  // in double, -2^63 - 1024 rounds to -2^63; the exact last element is out of range
  auto past_the_bottom = [] {
    return locus::arange<std::int64_t, locus::cpu>(-9223372036854775808.0, -9223372036854777856.0, -1024.0);
  };
  CHECK_THROWS_AS((void)past_the_bottom(), locus::value_error);
  auto ok = locus::arange<std::int64_t, locus::cpu>(-9223372036854775808.0, -9223372036854774784.0, 1024.0);
  REQUIRE(ok.numel() == 1);
  CHECK(ok(0) == std::numeric_limits<std::int64_t>::min());
}

TEST_CASE("optimizer options are checked at construction, as torch.optim's") {
  namespace nn = locus::nn;
  using P = locus::amp::fp32;
  nn::sequential model(nn::linear<locus::cpu, P>(4, 3));
  using adamw = locus::optim::adamw<locus::cpu>;
  using sgd = locus::optim::sgd<locus::cpu>;
  CHECK_THROWS_AS(adamw(model.parameters(), {.lr = std::nan("")}), locus::value_error);
  CHECK_THROWS_AS(adamw(model.parameters(), {.lr = -1.0}), locus::value_error);
  CHECK_THROWS_AS(adamw(model.parameters(), {.lr = 1e300}), locus::value_error);  // inf in f32
  CHECK_THROWS_AS(adamw(model.parameters(), {.beta1 = 1.0}), locus::value_error);
  CHECK_THROWS_AS(adamw(model.parameters(), {.beta2 = -0.1}), locus::value_error);
  CHECK_THROWS_AS(adamw(model.parameters(), {.eps = -1.0}), locus::value_error);
  CHECK_THROWS_AS(adamw(model.parameters(), {.weight_decay = std::numeric_limits<double>::infinity()}), locus::value_error);
  CHECK_THROWS_AS(sgd(model.parameters(), {.momentum = -0.5}), locus::value_error);
  adamw ok(model.parameters(), {.lr = 0.0});
  CHECK_THROWS_AS(ok.set_lr(std::nan("")), locus::value_error);
  CHECK(ok.lr() == 0.0);
  ok.set_lr(1e-3);
  CHECK(ok.lr() == 1e-3);
}

TEST_CASE("a trainer whose model was replaced or moved from refuses to step") {
  namespace nn = locus::nn;
  using P = locus::amp::fp32;
  auto make = [] { return nn::sequential(nn::linear<locus::cpu, P>(4, 3)); };
  auto x = locus::zeros<float, locus::cpu>({2, 4});
  auto y = locus::zeros<std::int64_t, locus::cpu>({2});
  {
    auto model = make();
    locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
    locus::train::trainer t(model, opt, nn::cross_entropy{});
    t.step(x, y);
    model = make();  // frees the buffers the optimizer writes (ASan: heap-use-after-free before)
    CHECK_THROWS_AS(t.step(x, y), locus::error);
  }
  {
    auto model = make();
    locus::optim::sgd<locus::cpu> opt(model.parameters(), {.lr = 0.1});
    locus::train::trainer t(model, opt, nn::cross_entropy{});
    auto kept = std::move(model);
    CHECK_THROWS_AS(t.step(x, y), locus::error);
    (void)kept;
  }
}

TEST_CASE("a loader with a batch larger than anything counts its batches without overflow") {
  auto ds = locus::data::idx_dataset(locus::zeros<std::uint8_t, locus::cpu>({10, 2, 2}),
                                     locus::zeros<std::int64_t, locus::cpu>({10}));
  locus::data::loader<locus::cpu> l(ds, {.batch_size = std::numeric_limits<locus::index_t>::max()});
  CHECK(l.size() == 1);
  locus::index_t seen = 0;
  for (auto& [bx, by] : l) seen += bx.extent(0) + 0 * by.extent(0);
  CHECK(seen == 10);
}

TEST_CASE("shapes: strides and element counts of extreme shapes saturate instead of overflowing") {
  // found by the structure-aware safetensors fuzzer: an empty tensor [0, 2^63 - 1, 2]
  constexpr auto big = std::numeric_limits<locus::index_t>::max();
  const locus::extents<3> s{0, big, 2};
  const auto st = locus::detail::contiguous_strides(s);
  CHECK(st[2] == 1);
  CHECK(st[1] == 2);
  CHECK(st[0] == big);  // saturated: 2 * (2^63 - 1)
  CHECK(locus::detail::numel_of(s) == 0);
  CHECK(locus::detail::numel_of(locus::extents<2>{big, 2}) == big);
  CHECK(locus::detail::mul_saturated(big, big) == big);
  CHECK(locus::detail::mul_saturated(3, 5) == 15);
}
