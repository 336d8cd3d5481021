// The asynchronous-copy API as a host-compiled file sees it (g++ and clang++; the
// copies themselves run in tests/cuda/test_async.cu): the types to_async and
// copy_async return and so who owns what, traits that tell the truth, and that a call
// which throws (shape_error, or cuda_error without a GPU) moves nothing: the caller's
// tensors keep their memory and values. Builds without CUDA have no pinned or cuda
// device, hence nothing to test here.
#include <doctest/doctest.h>

#include "host_devices.hpp"

#if LOCUS_HAS_CUDA

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>

#include <locus/data/loader.hpp>
#include <locus/locus.hpp>

namespace {

using dev1 = locus::tensor<float, locus::cuda, 1>;
using dev2 = locus::tensor<float, locus::cuda, 2>;
using pin1 = locus::tensor<float, locus::pinned, 1>;
using pin2 = locus::tensor<float, locus::pinned, 2>;
using cdev2 = locus::tensor_view<const float, locus::cuda, 2>;

// ---- what each call returns: the destination, and the source when it was moved in ------
static_assert(std::is_same_v<decltype(locus::to_async<locus::cuda>(std::declval<pin2>())),
                             locus::pending<dev2, pin2>>);
static_assert(std::is_same_v<decltype(locus::to_async<locus::pinned>(std::declval<dev2&>())),
                             locus::pending<pin2>>);
static_assert(std::is_same_v<decltype(locus::to_async<locus::pinned>(std::declval<const dev2&>())),
                             locus::pending<pin2>>);
static_assert(std::is_same_v<decltype(locus::to_async<locus::pinned>(std::declval<cdev2>())),
                             locus::pending<pin2>>);  // a const cuda view: stream-ordered, not owned
static_assert(std::is_same_v<decltype(locus::to_async<locus::cuda>(std::declval<dev2>())),
                             locus::pending<dev2, dev2>>);  // a cuda rvalue: owned too
static_assert(std::is_same_v<decltype(locus::copy_async(std::declval<pin2>(), std::declval<dev2>())),
                             locus::pending<dev2, pin2>>);
static_assert(std::is_same_v<decltype(locus::copy_async(std::declval<const dev2&>(), std::declval<pin2>())),
                             locus::pending<pin2>>);
static_assert(std::is_same_v<decltype(locus::copy_async(std::declval<cdev2>(), std::declval<dev2>())),
                             locus::pending<dev2>>);

// ---- get() and get_with_source() ----------------------------------------------------------
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2>&>().get()), dev2&>);
static_assert(std::is_same_v<decltype(std::declval<const locus::pending<dev2>&>().get()), const dev2&>);
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2>>().get()), dev2>);
static_assert(std::is_same_v<decltype(std::declval<locus::pending<dev2, pin2>>().get_with_source()),
                             locus::value_and_source<dev2, pin2>>);
static_assert(std::is_aggregate_v<locus::value_and_source<dev2, pin2>>);

// ---- traits: move-only, and say so --------------------------------------------------------
static_assert(!std::is_copy_constructible_v<locus::pending<dev2>>);
static_assert(!std::is_copy_assignable_v<locus::pending<dev2, pin2>>);
static_assert(std::is_nothrow_move_constructible_v<locus::pending<dev2, pin2>>);
static_assert(std::is_nothrow_move_assignable_v<locus::pending<dev2>>);
static_assert(std::is_nothrow_destructible_v<locus::pending<dev2, pin2>>);
// A pending fits generic move-only containers.
static_assert(std::is_move_constructible_v<std::optional<locus::pending<dev2, pin2>>>);
static_assert(!std::is_copy_constructible_v<std::optional<locus::pending<dev2>>>);
// No source type is no storage.
static_assert(sizeof(locus::pending<dev2>) < sizeof(locus::pending<dev2, pin2>));

// Arguments that are not tensors, views or expressions are not candidates at all.
template <class S>
concept to_async_accepts = requires(S&& s) { locus::to_async<locus::cuda>(std::forward<S>(s)); };
static_assert(!to_async_accepts<float>);
static_assert(!to_async_accepts<int*>);
template <class S, class D>
concept copy_async_accepts = requires(S&& s, D&& d) { locus::copy_async(std::forward<S>(s), std::forward<D>(d)); };
static_assert(!copy_async_accepts<pin2, float>);
static_assert(!copy_async_accepts<double, dev2>);

// The cuda loader, the main user of copy_async, compiles in a host-compiled file (its
// copies are tested on a GPU in tests/cuda/test_async.cu).
struct rows_source {
  locus::index_t size() const { return 10; }
  locus::index_t features() const { return 3; }
  std::int64_t load(locus::index_t i, std::span<float> x) const {
    for (float& v : x) v = static_cast<float>(i);
    return i;
  }
};

pin1 numbered_pinned(locus::index_t n) {
  auto t = locus::empty<float, locus::pinned>({n});
  for (locus::index_t k = 0; k < n; ++k) t(k) = static_cast<float>(k) * 0.5f - 3.0f;
  return t;
}

bool same_values(const pin1& a, const locus::tensor<float, locus::cpu, 1>& ref) {
  return a.shape() == ref.shape() && std::memcmp(a.data_handle(), ref.data_handle(), ref.size_bytes()) == 0;
}

}  // namespace

TEST_CASE("copy_async of mismatched shapes throws shape_error and moves neither side") {
  auto h = numbered_pinned(4);
  const auto ref = locus::to<locus::cpu>(h);
  const float* memory = h.data_handle();
  dev1 d;  // shape {0}: no memory, no GPU needed
  CHECK_THROWS_AS((void)locus::copy_async(std::move(h), std::move(d)), locus::shape_error);
  CHECK(h.data_handle() == memory);  // still the caller's, unchanged
  CHECK(same_values(h, ref));
  // A cuda view source of another shape (both empty: {0, 3} and {0, 0}).
  dev1 c;
  dev2 d2;
  CHECK_THROWS_AS((void)locus::copy_async(c.reshape({0, 3}), std::move(d2)), locus::shape_error);
  CHECK(d2.shape() == locus::extents<2>{0, 0});
}

TEST_CASE("to_async and copy_async without a GPU are a cuda_error that moves nothing") {
  auto h = numbered_pinned(16);
  const auto ref = locus::to<locus::cpu>(h);
  const float* memory = h.data_handle();
  if (!locus::cuda_available()) {
    CHECK_THROWS_AS((void)locus::to_async<locus::cuda>(std::move(h)), locus::cuda_error);
    CHECK(h.data_handle() == memory);
    CHECK(same_values(h, ref));
    // Zero-size: the same (the event is created before anything else).
    auto e = locus::empty<float, locus::pinned>({0});
    CHECK_THROWS_AS((void)locus::copy_async(std::move(e), dev1{}), locus::cuda_error);
    dev1 same;
    CHECK_THROWS_AS((void)locus::copy_async(std::move(same), std::move(same)), locus::cuda_error);
  } else {
    // With a GPU: the source comes back, the same memory and values, with the copy.
    auto [d, back] = std::move(locus::to_async<locus::cuda>(std::move(h))).get_with_source();
    CHECK(back.data_handle() == memory);
    CHECK(same_values(back, ref));
    CHECK(same_values(locus::to<locus::pinned>(d), ref));
    // The same tensor on both sides: nothing copied, the destination keeps its memory.
    const float* dm = d.data_handle();
    auto [value, source] = std::move(locus::copy_async(std::move(d), std::move(d))).get_with_source();
    CHECK(value.data_handle() == dm);
    CHECK(source.numel() == 0);
    CHECK(same_values(locus::to<locus::pinned>(value), ref));
  }
}

template class locus::data::loader<locus::cuda, rows_source>;

TEST_CASE("loader<cuda> without a GPU is a cuda_error at construction") {
  if (locus::cuda_available()) return;  // the GPU case is in tests/cuda/test_async.cu
  const rows_source src;
  CHECK_THROWS_AS((locus::data::loader<locus::cuda, rows_source>(src, {.batch_size = 4})), locus::cuda_error);
}

#endif  // LOCUS_HAS_CUDA
