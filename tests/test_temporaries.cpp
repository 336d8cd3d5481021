// References into temporaries and assignment through temporary views (issue 28): every
// accessor that returns a reference into its object returns a value when the object is a
// temporary, and `t.slice(0, 2) = u.slice(0, 2)` copies elements as PyTorch's
// `t[0:2] = u[0:2]` does instead of rebinding a temporary. The dangling cases were found
// with ASan (stack-use-after-scope); the sanitize workflow runs this file under ASan.
#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <locus/data/tensor_dataset.hpp>
#include <locus/locus.hpp>
#include <locus/train.hpp>

#include "host_devices.hpp"

namespace {
using H1 = locus::tensor<float, locus::cpu, 1>;
using H2 = locus::tensor<float, locus::cpu, 2>;
using V2 = locus::tensor_view<float, locus::cpu, 2>;
using CV2 = locus::tensor_view<const float, locus::cpu, 2>;

// ---- what the types say -----------------------------------------------------------------
// On a temporary, shape() and strides() are values; on an lvalue, references.
static_assert(std::is_same_v<decltype(std::declval<H2>().shape()), locus::extents<2>>);
static_assert(std::is_same_v<decltype(std::declval<H2&>().shape()), const locus::extents<2>&>);
static_assert(std::is_same_v<decltype(std::declval<V2>().shape()), locus::extents<2>>);
static_assert(std::is_same_v<decltype(std::declval<V2>().strides()), locus::extents<2>>);
static_assert(std::is_same_v<decltype(std::declval<const V2&>().strides()), const locus::extents<2>&>);
static_assert(std::is_same_v<decltype(std::declval<const V2&&>().shape()), locus::extents<2>>);
// Views stay trivially copyable (they are kernel arguments) although assignment through a
// temporary view now writes elements.
static_assert(std::is_trivially_copyable_v<V2>);
static_assert(std::is_trivially_copyable_v<CV2>);
static_assert(std::is_copy_assignable_v<V2>);
// Writing through a temporary view of a tensor of another device does not compile (the
// compile-fail tests check the messages: view_assign_across_devices, view_assign_const).
static_assert(std::is_same_v<decltype(std::declval<locus::data::tensor_dataset>().x()), H2>);

template <class T>
std::vector<float> values(const T& t) {
  std::vector<float> out;
  for (locus::index_t i = 0; i < t.shape()[0]; ++i)
    for (locus::index_t j = 0; j < t.shape()[1]; ++j) out.push_back(t(i, j));
  return out;
}

H2 filled(locus::index_t rows, locus::index_t cols, float base) {
  H2 t({rows, cols});
  for (locus::index_t i = 0; i < rows; ++i)
    for (locus::index_t j = 0; j < cols; ++j) t(i, j) = base + static_cast<float>(i * cols + j);
  return t;
}
}  // namespace

TEST_CASE("the shape of a temporary tensor or view outlives the statement") {
  // range-for over a temporary's shape: the range is the returned value, extended
  std::vector<locus::index_t> seen;
  for (auto e : locus::zeros<float, locus::cpu>({3, 5}).shape()) seen.push_back(e);
  CHECK(seen == std::vector<locus::index_t>{3, 5});

  H2 t = filled(6, 4, 0.0f);
  const auto& s = t.slice(1, 3).shape();  // bound to a value, not into the dead view
  const auto& st = t.slice(1, 3).strides();
  const auto& tz = locus::ones<float, locus::cpu>({7}).shape();
  std::vector<float> noise(4096, 1.0f);  // reuse the stack the temporaries had
  CHECK(noise[100] == 1.0f);
  CHECK(s[0] == 2);
  CHECK(s[1] == 4);
  CHECK(st[0] == 4);
  CHECK(st[1] == 1);
  CHECK(tz[0] == 7);

  // an expression is a temporary too
  H2 u = filled(6, 4, 1.0f);
  const auto& es = (t + u).shape();
  CHECK(es[0] == 6);
  CHECK(es[1] == 4);
}

TEST_CASE("a temporary dataset's tensors are moved out, not referenced") {
  H2 x = filled(3, 2, 0.5f);
  locus::tensor<std::int64_t, locus::cpu, 1> y({3});
  for (locus::index_t i = 0; i < 3; ++i) y(i) = 2 - i;
  const auto xs = values(x);
  H2 out = locus::data::tensor_dataset(x.clone(), y.clone()).x();
  CHECK(values(out) == xs);
  auto yy = locus::data::tensor_dataset(std::move(x), std::move(y)).y();
  CHECK(yy(0) == 2);
  CHECK(yy(2) == 0);
}

TEST_CASE_TEMPLATE("assigning to a temporary view copies the elements", D, LOCUS_TEST_DEVICES) {
  using T2 = locus::tensor<float, D, 2>;
  T2 t = locus::to<D>(filled(5, 3, 0.0f));
  T2 u = locus::to<D>(filled(5, 3, 100.0f));
  const auto before_u = values(u);

  t.slice(0, 2) = u.slice(3, 5);  // PyTorch: t[0:2] = u[3:5]
  std::vector<float> want = values(filled(5, 3, 0.0f));
  for (int k = 0; k < 6; ++k) want[k] = 100.0f + 9.0f + static_cast<float>(k);
  CHECK(values(t) == want);
  CHECK(values(u) == before_u);  // the source is unchanged

  t.view() = u;  // whole tensor, from a tensor
  CHECK(values(t) == before_u);

  T2 w = locus::to<D>(filled(2, 3, -50.0f));
  t.slice(3, 5) = w;  // a tensor into a slice
  CHECK(t(3, 0) == -50.0f);
  CHECK(t(4, 2) == -45.0f);
  CHECK(t(2, 2) == before_u[8]);

  // a view variable still rebinds (std::span's assignment): nothing is written
  auto v = t.slice(0, 1);
  const auto t_before = values(t);
  v = u.slice(4, 5);
  CHECK(values(t) == t_before);
  CHECK(v(0, 0) == u(4, 0));
  // ... and an explicit temporary of it writes
  std::move(v) = t.slice(0, 1);
  CHECK(u(4, 0) == t(0, 0));
}

TEST_CASE("assigning to a temporary view of another shape is a shape_error and writes nothing") {
  H2 t = filled(5, 3, 0.0f);
  H2 u = filled(5, 3, 100.0f);
  const auto before = values(t);
  CHECK_THROWS_AS(t.slice(0, 2) = u.slice(0, 3), locus::shape_error);
  CHECK_THROWS_AS(t.view() = u.slice(0, 4), locus::shape_error);
  H2 empty({0, 3});
  CHECK_THROWS_AS(t.slice(0, 1) = empty, locus::shape_error);
  CHECK(values(t) == before);
  // an empty slice from an empty source is a copy of nothing
  t.slice(2, 2) = empty;
  CHECK(values(t) == before);
}

TEST_CASE("assigning overlapping rows of one tensor through temporary views reads a separate source") {
  H2 t = filled(6, 2, 0.0f);
  const auto orig = values(t);
  t.slice(1, 6) = t.slice(0, 5);  // shift down by one row, as numpy's t[1:6] = t[0:5]
  std::vector<float> want = orig;
  for (int k = 2; k < 12; ++k) want[k] = orig[k - 2];
  CHECK(values(t) == want);
  // a transposed source that overlaps: reshape/transposed views through the general path
  locus::tensor<float, locus::cpu, 2> sq = filled(3, 3, 1.0f);
  const auto sq0 = values(sq);
  sq.view() = locus::transpose(sq.view());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CHECK(sq(i, j) == sq0[j * 3 + i]);
}
