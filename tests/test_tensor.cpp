// Host suite: the device-generic bodies for cpu and pinned, plus what only host
// memory allows (element access, span, bounds checks).
#include "host_devices.hpp"
#include "generic/tensor_cases.hpp"

#include <cstdlib>

TEST_CASE("element access span and data on host tensors") {
  auto t = locus::arange<float, locus::cpu>(12);
  auto m = t.reshape({3, 4});
  CHECK(m(2, 3) == 11.0f);
  m(1, 1) = -5.0f;
  CHECK(t(5) == -5.0f);
  CHECK(t.span().size() == 12);
  CHECK(t.data() == t.data_handle());
  const auto& ct = t;
  static_assert(std::is_same_v<decltype(ct.span()), std::span<const float>>);
  static_assert(std::is_same_v<decltype(ct.view()), locus::tensor_view<const float, locus::cpu, 1>>);
  auto s = locus::full<double, locus::cpu>(locus::extents<0>{}, 3.25);
  CHECK(s.numel() == 1);
  CHECK(s.item() == 3.25);
#if LOCUS_HAS_CUDA
  auto p = locus::ones<std::int32_t, locus::pinned>({2, 2});
  p(0, 1) = 9;
  CHECK(locus::to<locus::cpu>(p)(0, 1) == 9);
#endif
}

TEST_CASE("LOCUS_CHECK_BOUNDS: out-of-range element access throws index_error") {
  auto t = locus::zeros<float, locus::cpu>({3, 4});
  CHECK_NOTHROW((void)t(2, 3));
  CHECK_THROWS_AS((void)t(3, 0), locus::index_error);
  CHECK_THROWS_AS((void)t(0, -1), locus::index_error);
  CHECK_THROWS_AS((void)t.view()(0, 4), locus::index_error);
  try {
    (void)t(1, 7);
    FAIL("no exception");
  } catch (const locus::index_error& e) {
    CHECK(std::string(e.what()).find("[3, 4]") != std::string::npos);
  }
}

TEST_CASE("span of a non-contiguous view throws - strides are reported") {
  auto t = locus::arange<float, locus::cpu>(12);
  locus::tensor_view<float, locus::cpu, 2> v = locus::unsafe_view<locus::cpu>(t.data_handle(), {3, 2}, {4, 2});
  CHECK(v.stride(0) == 4);
  CHECK(v(2, 1) == 10.0f);
  CHECK_THROWS_AS((void)v.span(), locus::shape_error);
  CHECK_THROWS_AS((void)v.reshape({6}), locus::shape_error);
  CHECK_THROWS_AS((void)v.extent(2), locus::shape_error);
}

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  // kat_vectors from Random123 (Salmon et al.): philox4x32_10.
  auto a = locus::detail::philox4x32(0, 0, 0);
  CHECK(a.v[0] == 0x6627e8d5u);
  CHECK(a.v[1] == 0xe169c58du);
  CHECK(a.v[2] == 0xbc57ac4cu);
  CHECK(a.v[3] == 0x9b00dbd8u);
  auto b = locus::detail::philox4x32(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
  CHECK(b.v[0] == 0x408f276du);
  CHECK(b.v[1] == 0x41c83b0eu);
  CHECK(b.v[2] == 0xa20bc7c6u);
  CHECK(b.v[3] == 0x6d5451fdu);
  auto c = locus::detail::philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull);
  CHECK(c.v[0] == 0xd16cfe09u);
  CHECK(c.v[1] == 0x94fdccebu);
  CHECK(c.v[2] == 0x5001e420u);
  CHECK(c.v[3] == 0x24126ea1u);
}

#if __has_include(<Random123/philox.h>)
#include <Random123/philox.h>
#undef philox4x32  // Random123's function-like macro of that name would swallow locus's calls
#undef philox4x64
#define LOCUS_TEST_HAS_RANDOM123 1
#else
#define LOCUS_TEST_HAS_RANDOM123 0
#endif

// Random123 (librandom123-dev) is Philox's reference implementation: locus's own copy must
// give its outputs for the same key and counter on a spread of (seed, index, stream),
// extremes included. Skipped, visibly, where the package is not installed.
TEST_CASE("Philox4x32-10 equals Random123's r123::Philox4x32 on a million counters" *
          doctest::skip(!LOCUS_TEST_HAS_RANDOM123)) {
#if LOCUS_TEST_HAS_RANDOM123
  r123::Philox4x32 reference;
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&] {  // splitmix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  int wrong = 0;
  for (int i = 0; i < 1000000; ++i) {
    std::uint64_t seed = next(), counter = next(), stream = next();
    if (i < 1000) {  // small and extreme values, as the library uses them
      seed = static_cast<std::uint64_t>(i % 7);
      counter = static_cast<std::uint64_t>(i);
      stream = i % 3 == 2 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(i % 3);
    }
    const auto got = locus::detail::philox4x32(seed, counter, stream);
    const r123::Philox4x32::ctr_type c = {{static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
                                           static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}};
    const r123::Philox4x32::key_type k = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
    const auto want = reference(c, k);
    for (int w = 0; w < 4; ++w) wrong += got.v[w] != want.v[w];
  }
  CHECK(wrong == 0);
#endif
}

#include "generic/expr_cases.hpp"

TEST_CASE("cast f32 <-> bf16/f16 of a whole host tensor equals the scalar conversions") {
  auto a = locus::randn<float, locus::cpu>({100003}, 5, 0.0, 1000.0);
  locus::tensor<locus::bf16, locus::cpu, 1> b = locus::cast<locus::bf16>(a);
  locus::tensor<locus::f16, locus::cpu, 1> h = locus::cast<locus::f16>(a);
  for (locus::index_t i = 0; i < a.numel(); i += 7) {
    CHECK(b(i).bits == locus::bf16(a(i)).bits);
    CHECK(h(i).bits == locus::f16(a(i)).bits);
  }
  locus::tensor<float, locus::cpu, 1> back = locus::cast<float>(h);
  for (locus::index_t i = 0; i < a.numel(); i += 7) CHECK(back(i) == static_cast<float>(h(i)));
}

TEST_CASE("device traits: memory, name, allocator and execution of each device") {
  // Compile-time facts the type rules are built on; a wrong one would let host code
  // read GPU memory, or send a pageable buffer to an "asynchronous" copy.
  static_assert(locus::cpu::host_accessible && !locus::cpu::device_accessible && !locus::cpu::async_copyable);
  static_assert(locus::pinned::host_accessible && !locus::pinned::device_accessible && locus::pinned::async_copyable);
  static_assert(!locus::cuda::host_accessible && locus::cuda::device_accessible && locus::cuda::async_copyable);
  static_assert(locus::cpu::enabled && locus::pinned::enabled == (LOCUS_HAS_CUDA != 0) &&
                locus::cuda::enabled == (LOCUS_HAS_CUDA != 0));
  static_assert(std::is_same_v<locus::cpu::execution, locus::detail::host_execution> &&
                std::is_same_v<locus::pinned::execution, locus::detail::host_execution> &&
                std::is_same_v<locus::cuda::execution, locus::detail::cuda_execution>);
  static_assert(std::is_same_v<locus::cpu::allocator, locus::detail::host_allocator_kind> &&
                std::is_same_v<locus::pinned::allocator, locus::detail::pinned_allocator_kind> &&
                std::is_same_v<locus::cuda::allocator, locus::detail::cuda_allocator_kind>);
  static_assert(locus::HostAccessible<locus::cpu> && locus::HostAccessible<locus::pinned> &&
                !locus::HostAccessible<locus::cuda> && locus::DeviceAccessible<locus::cuda>);
  static_assert(!locus::Device<int> && !locus::Device<float>);
  CHECK(locus::cpu::name == "cpu");
  CHECK(locus::pinned::name == "pinned");
  CHECK(locus::cuda::name == "cuda");
  // The allocator a device names is the one its tensors use.
  const auto before = locus::memory_stats<locus::cpu>().allocations;
  auto t = locus::empty<float, locus::cpu>({1000});
  CHECK(locus::memory_stats<locus::cpu>().allocations == before + 1);
}
