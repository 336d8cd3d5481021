// {fmt} support (locus/fmt.hpp): fmt::format("{}", t) writes what `std::cout << t` writes,
// for tensors and views of every dtype and rank, and a string spec (fill, alignment,
// width) applies to the whole text. Built only where {fmt} is found (LOCUS_TEST_HAS_FMT).
#include <doctest/doctest.h>

#if defined(LOCUS_TEST_HAS_FMT) && LOCUS_TEST_HAS_FMT
#include <locus/fmt.hpp>
#include <locus/locus.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

namespace {

template <class X>
std::string via_stream(const X& x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

TEST_CASE("fmt: a tensor formats as it prints, for every dtype, rank and view") {
  auto a = locus::arange<float, locus::cpu>(0, 6);
  const auto m = a.reshape({2, 3});
  CHECK(fmt::format("{}", m) ==
        "tensor([[0.0000, 1.0000, 2.0000],\n        [3.0000, 4.0000, 5.0000]], shape=[2, 3], dtype=f32, device=cpu)");
  CHECK(fmt::format("{}", a) == via_stream(a));
  CHECK(fmt::format("{}", a.slice(2, 4)) == via_stream(a.slice(2, 4)));
  const auto& ca = a;
  CHECK(fmt::format("{}", ca.view()) == via_stream(ca.view()));

  auto i64 = locus::zeros<std::int64_t, locus::cpu>({3});
  i64(0) = std::numeric_limits<std::int64_t>::min();
  i64(2) = std::numeric_limits<std::int64_t>::max();
  CHECK(fmt::format("{}", i64) ==
        "tensor([-9223372036854775808, 0, 9223372036854775807], shape=[3], dtype=i64, device=cpu)");
  auto b = locus::zeros<bool, locus::cpu>({2});
  b(1) = true;
  CHECK(fmt::format("{}", b) == "tensor([False, True], shape=[2], dtype=bool, device=cpu)");
  auto h = locus::full<locus::bf16, locus::cpu>({2}, 1.5f);
  h(1) = locus::bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(fmt::format("{}", h) == "tensor([1.5000, nan], shape=[2], dtype=bf16, device=cpu)");
  auto s = locus::full<double, locus::cpu>(locus::extents<0>{}, 2.5);
  CHECK(fmt::format("{}", s) == via_stream(s));
  auto e = locus::zeros<float, locus::cpu>({0, 4});
  CHECK(fmt::format("{}", e) == "tensor([], shape=[0, 4], dtype=f32, device=cpu)");
  auto big = locus::arange<std::int32_t, locus::cpu>(0, 5000);
  const std::string t = fmt::format("{}", big);
  CHECK(t == via_stream(big));
  CHECK(t.find("...") != std::string::npos);
#if LOCUS_HAS_CUDA
  auto p = locus::ones<float, locus::pinned>({2});
  CHECK(fmt::format("{}", p) == via_stream(p));
#endif
}

TEST_CASE("fmt: fill, alignment and width apply to the tensor's whole text") {
  auto a = locus::arange<float, locus::cpu>(0, 2);
  const std::string plain = via_stream(a);
  REQUIRE(plain.size() < 100);
  const std::size_t pad = 100 - plain.size();
  CHECK(fmt::format("{:>100}", a) == std::string(pad, ' ') + plain);
  CHECK(fmt::format("{:*<100}", a) == plain + std::string(pad, '*'));
  CHECK(fmt::format("{:-^100}", a.view()) == std::string(pad / 2, '-') + plain + std::string(pad - pad / 2, '-'));
  CHECK(fmt::format("{:>5}", a) == plain);  // narrower than the text: the text
  CHECK(fmt::format("[{}|{}]", a, a.slice(0, 1)) == "[" + plain + "|" + via_stream(a.slice(0, 1)) + "]");
  // a width from an argument, as for a string (test_hostile_api.cpp: the widths refused)
  CHECK(fmt::format("{:>{}}", a, 100) == std::string(pad, ' ') + plain);
  CHECK(fmt::format("{1:*<{0}}", 100, a) == plain + std::string(pad, '*'));
  CHECK(fmt::format("{:-^{w}}", a, fmt::arg("w", 100)) == std::string(pad / 2, '-') + plain + std::string(pad - pad / 2, '-'));
  CHECK(fmt::format("{:\u00e9>{}}", a, plain.size() + 2) == "\u00e9\u00e9" + plain);  // a fill of two UTF-8 bytes
  // a precision would cut the text: refused
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:.12}"), a), fmt::format_error);
  CHECK_THROWS_AS((void)fmt::format(fmt::runtime("{:>10x}"), a), fmt::format_error);
  CHECK(fmt::format(fmt::runtime("{:x>110}"), a) == std::string(110 - plain.size(), 'x') + plain);
}
#endif
