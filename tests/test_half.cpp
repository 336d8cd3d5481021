// Tests for locus/core/half.hpp: f16 / bf16 layout, exact widening of every bit pattern,
// correctly rounded narrowing from float and from double at every rounding boundary and
// for random inputs, NaN / infinity / zero / subnormal handling, IEEE equality, and
// bit-identical bulk (vectorised) conversions. Expected values come from reference
// functions written here from the format definitions, in double arithmetic, never from
// the code under test.
#include <locus/core/half.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Format {
  int ebits;
  int mbits;
  const char* name;
  int bias() const { return (1 << (ebits - 1)) - 1; }
  std::uint16_t exp_mask() const {
    return static_cast<std::uint16_t>(((1u << ebits) - 1u) << mbits);
  }
  std::uint16_t frac_mask() const { return static_cast<std::uint16_t>((1u << mbits) - 1u); }
  std::uint16_t quiet_bit() const { return static_cast<std::uint16_t>(1u << (mbits - 1)); }
  std::uint16_t max_finite_bits() const {
    return static_cast<std::uint16_t>(exp_mask() - (1u << mbits) + frac_mask());
  }
};
constexpr Format kF16{5, 10, "f16"};
constexpr Format kBF16{8, 7, "bf16"};

template <class H>
constexpr Format format_of() {
  if constexpr (std::is_same_v<H, locus::f16>) return kF16;
  else return kBF16;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// Value of a 16-bit encoding, from the field definitions.
double ref_decode(std::uint16_t bits, Format f) {
  const bool neg = (bits >> 15) != 0;
  const int e = (bits >> f.mbits) & ((1 << f.ebits) - 1);
  const int frac = bits & f.frac_mask();
  double mag;
  if (e == (1 << f.ebits) - 1) {
    mag = frac == 0 ? kInf : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(frac), 1 - f.bias() - f.mbits);
  } else {
    mag = std::ldexp(static_cast<double>((1 << f.mbits) + frac), e - f.bias() - f.mbits);
  }
  return std::copysign(mag, neg ? -1.0 : 1.0);
}

// x rounded to the format (to nearest, ties to even; overflow to infinity), in double
// arithmetic: the quantum at x is 2^(max(exponent(x), emin) - mbits).
double ref_round(double x, Format f) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int emin = 1 - f.bias();
  const int emax = f.bias();
  const double ax = std::fabs(x);
  const int e = std::max(std::ilogb(ax), emin);
  const double q = std::ldexp(1.0, e - f.mbits);
  double r = std::nearbyint(ax / q) * q;  // ax / q is exact (power-of-two scaling)
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -f.mbits), emax);
  if (r > max_finite) r = kInf;
  return std::copysign(r, x);
}

std::string hex(std::uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
std::string show(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g (%a)", x, x);
  return buf;
}

// Collects failures so that millions of comparisons cost one assertion each.
struct Mismatches {
  std::size_t count = 0;
  std::string first;
  void add(const std::string& msg) {
    if (count++ < 8) first += "\n  " + msg;
  }
  void check(const char* what) const {
    const std::string msg =
        std::string(what) + ": " + std::to_string(count) + " mismatches; first:" + first;
    CHECK_MESSAGE(count == 0, msg);
  }
};

// Checks one narrowing result `got` (an encoding in format f) for input x.
void check_narrowed(double x, std::uint16_t got, Format f, Mismatches& bad) {
  const auto where = [&] { return std::string(f.name) + "(" + show(x) + ") = " + hex(got); };
  if (std::isnan(x)) {
    const bool is_nan = (got & f.exp_mask()) == f.exp_mask() && (got & f.frac_mask()) != 0;
    const bool quiet = (got & f.quiet_bit()) != 0;
    const bool sign_ok = ((got >> 15) != 0) == std::signbit(x);
    if (!is_nan || !quiet || !sign_ok) bad.add(where() + ": want a quiet NaN with the sign");
    return;
  }
  const double want = ref_round(x, f);
  const double have = ref_decode(got, f);
  if (!(have == want) || std::signbit(have) != std::signbit(want)) {
    bad.add(where() + " = " + show(have) + ", want " + show(want));
  }
}

float float_from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
double double_from_bits(std::uint64_t u) { return std::bit_cast<double>(u); }

// Every finite non-negative target value, the midpoint to the next one (for the largest
// finite value: the midpoint to 2^(emax+1)), and their neighbours, as doubles. All of
// them are exact in double; value and midpoint are exact in float too.
struct Boundary {
  double value;
  double midpoint;
};
std::vector<Boundary> boundaries(Format f) {
  std::vector<Boundary> out;
  for (std::uint32_t p = 0; p <= f.max_finite_bits(); ++p) {
    const double v = ref_decode(static_cast<std::uint16_t>(p), f);
    const double next = p == f.max_finite_bits()
                            ? std::ldexp(1.0, f.bias() + 1)
                            : ref_decode(static_cast<std::uint16_t>(p + 1), f);
    out.push_back({v, (v + next) / 2});
  }
  return out;
}

// Float inputs around every boundary (both signs).
std::vector<float> boundary_floats(Format f) {
  std::vector<float> out;
  std::size_t inexact = 0;
  for (const Boundary& b : boundaries(f)) {
    const float v = static_cast<float>(b.value);
    const float m = static_cast<float>(b.midpoint);
    inexact += static_cast<double>(v) != b.value || static_cast<double>(m) != b.midpoint;
    const float up = std::numeric_limits<float>::infinity();
    for (float x : {v, std::nextafter(v, -1.0f), std::nextafter(v, up), m,
                    std::nextafter(m, -1.0f), std::nextafter(m, up)}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
  REQUIRE(inexact == 0);
  return out;
}

// Double inputs around every boundary (both signs): the one-double-ulp neighbours of the
// midpoint are where rounding through float would go wrong.
std::vector<double> boundary_doubles(Format f) {
  std::vector<double> out;
  for (const Boundary& b : boundaries(f)) {
    for (double x : {b.value, std::nextafter(b.value, -1.0), std::nextafter(b.value, kInf),
                     b.midpoint, std::nextafter(b.midpoint, -1.0),
                     std::nextafter(b.midpoint, kInf)}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
  return out;
}

// ~1e6 floats with uniformly random bit patterns (all binades, NaNs, infinities,
// subnormals), plus the special values.
const std::vector<float>& random_floats() {
  static const std::vector<float> v = [] {
    std::vector<float> out;
    std::mt19937 rng(12345);
    constexpr std::size_t n = 1'000'001;  // odd: exercises bulk tails
    out.reserve(n + 16);
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(float_from_bits(static_cast<std::uint32_t>(rng())));
    }
    for (std::uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                            0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu,
                            0x00000001u, 0x80000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu}) {
      out.push_back(float_from_bits(u));
    }
    return out;
  }();
  return v;
}

// Random doubles: half with fully random bits, half with the exponent drawn from the
// range where the 16-bit formats have values (and a little beyond).
std::vector<double> random_doubles(Format f, std::size_t n) {
  std::vector<double> out;
  std::mt19937_64 rng(777);
  const int lo = 1023 - f.bias() - f.mbits - 4;
  const int hi = 1023 + f.bias() + 3;
  std::uniform_int_distribution<int> exp(lo, hi);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t u = rng();
    if (i % 2 == 0) {
      u = (u & ~(std::uint64_t{0x7ff} << 52)) | (static_cast<std::uint64_t>(exp(rng)) << 52);
    }
    out.push_back(double_from_bits(u));
  }
  return out;
}

template <class H>
void check_widening_all_patterns() {
  constexpr Format f = format_of<H>();
  Mismatches bad;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const H h = H::from_bits(static_cast<std::uint16_t>(p));
    const double want = ref_decode(static_cast<std::uint16_t>(p), f);
    const float got = locus::to_float(h);
    const float got_cast = static_cast<float>(h);
    const double got_d = static_cast<double>(h);
    const auto where = [&] {
      return std::string(f.name) + " " + hex(p) + " -> " + hex(bits_of(got));
    };
    if (bits_of(got) != bits_of(got_cast) ||
        std::bit_cast<std::uint64_t>(got_d) !=
            std::bit_cast<std::uint64_t>(static_cast<double>(got))) {
      bad.add(where() + ": to_float, float and double conversions disagree");
    }
    if (std::isnan(want)) {
      if (!std::isnan(got) || std::signbit(got) != std::signbit(want)) {
        bad.add(where() + ": want NaN with the same sign");
      }
      // Documented payload behaviour: f16 keeps the payload and sets the quiet bit,
      // bf16 keeps every bit.
      const std::uint32_t want_bits =
          std::is_same_v<H, locus::bf16>
              ? p << 16
              : ((p & 0x8000u) << 16) | 0x7fc00000u | ((p & 0x3ffu) << 13);
      if (bits_of(got) != want_bits) bad.add(where() + ": NaN payload, want " + hex(want_bits));
    } else if (!(static_cast<double>(got) == want) || std::signbit(got) != std::signbit(want)) {
      bad.add(where() + " = " + show(got) + ", want " + show(want));
    }
  }
  bad.check("widening of every pattern");
}

// The bulk narrowing `bulk` must match the scalar conversion bit for bit, for the whole
// array and for short runs at several offsets (tails), without writing past the end.
template <class H, class Bulk>
void check_bulk_narrowing(const std::vector<float>& in, Bulk bulk, const char* what) {
  Mismatches bad;
  constexpr std::uint16_t sentinel = 0xdead;
  std::vector<H> out(in.size() + 1, H::from_bits(sentinel));
  bulk(in.data(), out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint16_t want = H(in[i]).bits;
    if (out[i].bits != want) {
      bad.add("[" + std::to_string(i) + "] " + hex(bits_of(in[i])) + " -> " + hex(out[i].bits) +
              ", scalar " + hex(want));
    }
  }
  if (out[in.size()].bits != sentinel) bad.add("wrote past the end");
  for (std::size_t offset = 0; offset < 4; ++offset) {
    for (std::size_t len = 0; len <= 70 && offset + len <= in.size(); ++len) {
      std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(len + 1),
                H::from_bits(sentinel));
      bulk(in.data() + offset, out.data(), len);
      for (std::size_t i = 0; i < len; ++i) {
        if (out[i].bits != H(in[offset + i]).bits) {
          bad.add("offset " + std::to_string(offset) + " length " + std::to_string(len) +
                  " element " + std::to_string(i));
        }
      }
      if (out[len].bits != sentinel) bad.add("length " + std::to_string(len) + ": overrun");
    }
  }
  bad.check(what);
}

template <class H, class Bulk>
void check_bulk_widening(Bulk bulk, const char* what) {
  Mismatches bad;
  // Every pattern, in a scrambled order, with an odd length.
  std::vector<H> in;
  for (std::uint32_t p = 0; p < 65536; ++p) {
    in.push_back(H::from_bits(static_cast<std::uint16_t>((p * 40503u) & 0xffffu)));
  }
  in.push_back(H::from_bits(0x7c01));
  constexpr std::uint32_t sentinel = 0xdeadbeef;
  std::vector<float> out(in.size() + 1, float_from_bits(sentinel));
  bulk(in.data(), out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::uint32_t want = bits_of(static_cast<float>(in[i]));
    if (bits_of(out[i]) != want) {
      bad.add(hex(in[i].bits) + " -> " + hex(bits_of(out[i])) + ", scalar " + hex(want));
    }
  }
  if (bits_of(out[in.size()]) != sentinel) bad.add("wrote past the end");
  for (std::size_t offset = 0; offset < 4; ++offset) {
    for (std::size_t len = 0; len <= 70; ++len) {
      std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(len + 1),
                float_from_bits(sentinel));
      bulk(in.data() + offset, out.data(), len);
      for (std::size_t i = 0; i < len; ++i) {
        if (bits_of(out[i]) != bits_of(static_cast<float>(in[offset + i]))) {
          bad.add("offset " + std::to_string(offset) + " length " + std::to_string(len) +
                  " element " + std::to_string(i));
        }
      }
      if (bits_of(out[len]) != sentinel) bad.add("length " + std::to_string(len) + ": overrun");
    }
  }
  bad.check(what);
}

template <class H>
std::vector<float> bulk_inputs() {
  std::vector<float> in = boundary_floats(format_of<H>());
  const std::vector<float>& r = random_floats();
  in.insert(in.end(), r.begin(), r.end());
  if (in.size() % 2 == 0) in.push_back(1.0f);
  return in;
}

// Compile-time checks: the conversions are constexpr.
static_assert(locus::f16(1.0f).bits == 0x3c00);
static_assert(locus::f16(-2.0).bits == 0xc000);
static_assert(locus::bf16(1.0f).bits == 0x3f80);
static_assert(locus::bf16(-2.0).bits == 0xc000);
static_assert(locus::to_float(locus::f16::from_bits(0x0001)) == 0x1p-24f);
static_assert(locus::to_float(locus::bf16::from_bits(0x0001)) == 0x1p-133f);
static_assert(locus::to_f16(65520.0f).bits == 0x7c00);
static_assert(locus::to_bf16(3.0f).bits == 0x4040);
static_assert(static_cast<double>(locus::f16::from_bits(0x7bff)) == 65504.0);

}  // namespace

TEST_CASE("f16/bf16: layout construction and explicit conversions" *
          doctest::test_suite("dtype")) {
  static_assert(sizeof(locus::f16) == 2 && sizeof(locus::bf16) == 2);
  static_assert(std::is_trivially_copyable_v<locus::f16>);
  static_assert(std::is_trivially_copyable_v<locus::bf16>);
  static_assert(std::is_standard_layout_v<locus::f16>);
  static_assert(std::is_same_v<decltype(locus::f16::bits), std::uint16_t>);
  static_assert(std::is_same_v<decltype(locus::bf16::bits), std::uint16_t>);
  // Conversions are explicit in both directions.
  static_assert(!std::is_convertible_v<float, locus::f16>);
  static_assert(!std::is_convertible_v<locus::f16, float>);
  static_assert(!std::is_convertible_v<double, locus::bf16>);
  static_assert(!std::is_convertible_v<locus::bf16, float>);
  static_assert(std::is_constructible_v<locus::f16, float>);
  static_assert(std::is_constructible_v<locus::f16, double>);
  static_assert(std::is_constructible_v<float, locus::bf16>);
  static_assert(std::is_constructible_v<double, locus::bf16>);
  static_assert(std::is_same_v<locus::f32, float> && std::is_same_v<locus::f64, double>);
  static_assert(std::is_same_v<locus::i32, std::int32_t> &&
                std::is_same_v<locus::i64, std::int64_t> &&
                std::is_same_v<locus::u8, std::uint8_t>);

  locus::f16 h;
  locus::bf16 b;
  CHECK(h.bits == 0);
  CHECK(b.bits == 0);
  CHECK(locus::f16{}.bits == 0);
  CHECK(locus::f16::from_bits(0x1234).bits == 0x1234);
  CHECK(locus::bf16::from_bits(0xabcd).bits == 0xabcd);
  CHECK(locus::to_f16(0.5f).bits == 0x3800);
  CHECK(locus::to_f16(0.5).bits == 0x3800);
  CHECK(locus::to_bf16(0.5f).bits == 0x3f00);
  CHECK(locus::to_bf16(0.5).bits == 0x3f00);
  CHECK(locus::to_float(locus::f16::from_bits(0xc500)) == -5.0f);
  CHECK(locus::to_float(locus::bf16::from_bits(0xc0a0)) == -5.0f);
}

TEST_CASE("f16/bf16: every bit pattern widens exactly" * doctest::test_suite("dtype")) {
  check_widening_all_patterns<locus::f16>();
  check_widening_all_patterns<locus::bf16>();
}

TEST_CASE("f16/bf16: equality is numeric (NaN != NaN +0 == -0)" *
          doctest::test_suite("dtype")) {
  const auto check_eq = [](auto tag, Format f) {
    using H = decltype(tag);
    Mismatches bad;
    for (std::uint32_t p = 0; p < 65536; ++p) {
      const auto a = static_cast<std::uint16_t>(p);
      for (std::uint16_t q :
           {a, static_cast<std::uint16_t>(a ^ 0x8000u), static_cast<std::uint16_t>(a + 1u),
            static_cast<std::uint16_t>(a - 1u)}) {
        const bool want = ref_decode(a, f) == ref_decode(q, f);
        const bool eq = H::from_bits(a) == H::from_bits(q);
        const bool ne = H::from_bits(a) != H::from_bits(q);
        if (eq != want || ne == want) bad.add(hex(a) + " vs " + hex(q));
      }
    }
    bad.check(f.name);
  };
  check_eq(locus::f16{}, kF16);
  check_eq(locus::bf16{}, kBF16);

  const locus::f16 nan = locus::f16::from_bits(0x7e00);
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK(locus::f16(0.0f) == locus::f16(-0.0f));
  CHECK(locus::bf16(0.0f) == locus::bf16(-0.0f));
  CHECK(locus::bf16(1.0f) != locus::bf16(2.0f));
  CHECK(locus::bf16::from_bits(0x7fc0) != locus::bf16::from_bits(0x7fc0));
}

TEST_CASE("f16/bf16: special values and thresholds" * doctest::test_suite("dtype")) {
  const float inf = std::numeric_limits<float>::infinity();
  // f16 overflow: 65504 is the largest finite, 65520 the midpoint to 2^16 (ties to even
  // rounds up, to infinity).
  CHECK(locus::f16(65504.0f).bits == 0x7bff);
  CHECK(locus::f16(65519.99f).bits == 0x7bff);
  CHECK(locus::f16(std::nextafter(65520.0f, 0.0f)).bits == 0x7bff);
  CHECK(locus::f16(65520.0f).bits == 0x7c00);
  CHECK(locus::f16(-65520.0f).bits == 0xfc00);
  CHECK(locus::f16(65519.999999).bits == 0x7bff);
  CHECK(locus::f16(65520.0).bits == 0x7c00);
  CHECK(locus::f16(1e10f).bits == 0x7c00);
  CHECK(locus::f16(1e300).bits == 0x7c00);
  CHECK(locus::f16(std::numeric_limits<float>::max()).bits == 0x7c00);
  CHECK(locus::f16(inf).bits == 0x7c00);
  CHECK(locus::f16(-inf).bits == 0xfc00);
  CHECK(locus::f16(0.0f).bits == 0x0000);
  CHECK(locus::f16(-0.0f).bits == 0x8000);
  CHECK(locus::f16(-0.0).bits == 0x8000);
  // f16 subnormals: quantum 2^-24.
  CHECK(locus::f16(0x1p-24f).bits == 0x0001);
  CHECK(locus::f16(0x1p-25f).bits == 0x0000);  // tie, to even (zero)
  CHECK(locus::f16(-0x1p-25f).bits == 0x8000);
  CHECK(locus::f16(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
  CHECK(locus::f16(0x1.8p-24f).bits == 0x0002);  // tie between 1 and 2 quanta
  CHECK(locus::f16(0x1.4p-23f).bits == 0x0002);  // tie between 2 and 3 quanta
  CHECK(locus::f16(0x1p-14f - 0x1p-25f).bits == 0x0400);  // max subnormal/min normal tie
  CHECK(locus::f16(0x1p-14f - 0x1p-24f).bits == 0x03ff);
  CHECK(locus::f16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(locus::f16(-std::numeric_limits<float>::denorm_min()).bits == 0x8000);
  // bf16: same exponent range as float.
  CHECK(locus::bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(locus::bf16(0x1.fep127f).bits == 0x7f7f);
  CHECK(locus::bf16(0x1.ffp127f).bits == 0x7f80);  // midpoint above max finite
  CHECK(locus::bf16(std::nextafter(0x1.ffp127f, 0.0f)).bits == 0x7f7f);
  CHECK(locus::bf16(-inf).bits == 0xff80);
  CHECK(locus::bf16(1e300).bits == 0x7f80);
  CHECK(locus::bf16(0x1p-133f).bits == 0x0001);
  CHECK(locus::bf16(0x1p-134f).bits == 0x0000);
  CHECK(locus::bf16(std::nextafter(0x1p-134f, 1.0f)).bits == 0x0001);
  CHECK(locus::bf16(0x1p-126f).bits == 0x0080);
  CHECK(locus::bf16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(locus::bf16(1e-300).bits == 0x0000);
  CHECK(locus::bf16(-1e-300).bits == 0x8000);
  // Ties to even in the normal range.
  CHECK(locus::f16(1.0f + 0x1p-11f).bits == 0x3c00);
  CHECK(locus::f16(1.0f + 3 * 0x1p-11f).bits == 0x3c02);
  CHECK(locus::bf16(1.0f + 0x1p-8f).bits == 0x3f80);
  CHECK(locus::bf16(1.0f + 3 * 0x1p-8f).bits == 0x3f82);
  // From double, rounding is direct: 1 + 2^-11 + 2^-40 is above the f16 midpoint, but
  // rounds to the midpoint (then to even, down) if it goes through float first.
  CHECK(locus::f16(1.0 + 0x1p-11 + 0x1p-40).bits == 0x3c01);
  CHECK(locus::f16(static_cast<float>(1.0 + 0x1p-11 + 0x1p-40)).bits == 0x3c00);
  CHECK(locus::bf16(1.0 + 0x1p-8 + 0x1p-40).bits == 0x3f81);
  CHECK(locus::bf16(static_cast<float>(1.0 + 0x1p-8 + 0x1p-40)).bits == 0x3f80);
}

TEST_CASE("f16/bf16: NaN inputs give a quiet NaN with the same sign" *
          doctest::test_suite("dtype")) {
  Mismatches bad;
  for (std::uint32_t u : {0x7f800001u, 0x7f800fffu, 0x7f801fffu, 0x7f802000u, 0x7fa00000u,
                          0x7fbfffffu, 0x7fc00000u, 0x7fc00001u, 0x7fffffffu, 0x7f80ffffu,
                          0x7f810000u}) {
    for (std::uint32_t s : {0u, 0x80000000u}) {
      const float x = float_from_bits(u | s);
      check_narrowed(x, locus::f16(x).bits, kF16, bad);
      check_narrowed(x, locus::bf16(x).bits, kBF16, bad);
    }
  }
  for (std::uint64_t u : {0x7ff0000000000001ull, 0x7ff8000000000000ull, 0x7fffffffffffffffull,
                          0x7ff4000000000000ull, 0x7ff0000100000000ull}) {
    for (std::uint64_t s : {0ull, 0x8000000000000000ull}) {
      const double x = double_from_bits(u | s);
      check_narrowed(x, locus::f16(x).bits, kF16, bad);
      check_narrowed(x, locus::bf16(x).bits, kBF16, bad);
    }
  }
  bad.check("NaN inputs");
}

TEST_CASE("f16/bf16: float rounding at every value midpoint and neighbour" *
          doctest::test_suite("dtype")) {
  for (Format f : {kF16, kBF16}) {
    Mismatches bad;
    for (float x : boundary_floats(f)) {
      const std::uint16_t got = f.ebits == 5 ? locus::f16(x).bits : locus::bf16(x).bits;
      check_narrowed(x, got, f, bad);
    }
    bad.check(f.name);
  }
}

TEST_CASE("f16/bf16: double rounding at every value midpoint and neighbour" *
          doctest::test_suite("dtype")) {
  for (Format f : {kF16, kBF16}) {
    Mismatches bad;
    for (double x : boundary_doubles(f)) {
      const std::uint16_t got = f.ebits == 5 ? locus::f16(x).bits : locus::bf16(x).bits;
      check_narrowed(x, got, f, bad);
    }
    bad.check(f.name);
  }
}

TEST_CASE("f16/bf16: random floats and doubles round correctly" *
          doctest::test_suite("dtype")) {
  Mismatches bad_h, bad_b;
  for (float x : random_floats()) {
    check_narrowed(x, locus::to_f16(x).bits, kF16, bad_h);
    check_narrowed(x, locus::to_bf16(x).bits, kBF16, bad_b);
  }
  bad_h.check("random floats -> f16");
  bad_b.check("random floats -> bf16");

  Mismatches bad_hd, bad_bd;
  for (double x : random_doubles(kF16, 200'000)) {
    check_narrowed(x, locus::to_f16(x).bits, kF16, bad_hd);
  }
  for (double x : random_doubles(kBF16, 200'000)) {
    check_narrowed(x, locus::to_bf16(x).bits, kBF16, bad_bd);
  }
  bad_hd.check("random doubles -> f16");
  bad_bd.check("random doubles -> bf16");
}

TEST_CASE("f16/bf16: bulk conversions are bit-identical to the scalar ones" *
          doctest::test_suite("dtype")) {
  namespace d = locus::detail;
  const std::vector<float> in_h = bulk_inputs<locus::f16>();
  const std::vector<float> in_b = bulk_inputs<locus::bf16>();

  check_bulk_narrowing<locus::f16>(
      in_h, [](const float* s, locus::f16* o, std::size_t n) { d::convert_n(s, o, n); },
      "convert_n float -> f16");
  check_bulk_narrowing<locus::bf16>(
      in_b, [](const float* s, locus::bf16* o, std::size_t n) { d::convert_n(s, o, n); },
      "convert_n float -> bf16");
  check_bulk_widening<locus::f16>(
      [](const locus::f16* s, float* o, std::size_t n) { d::convert_n(s, o, n); },
      "convert_n f16 -> float");
  check_bulk_widening<locus::bf16>(
      [](const locus::bf16* s, float* o, std::size_t n) { d::convert_n(s, o, n); },
      "convert_n bf16 -> float");

  check_bulk_narrowing<locus::f16>(
      in_h, [](const float* s, locus::f16* o, std::size_t n) { d::convert_n_portable(s, o, n); },
      "convert_n_portable float -> f16");
  check_bulk_narrowing<locus::bf16>(
      in_b, [](const float* s, locus::bf16* o, std::size_t n) { d::convert_n_portable(s, o, n); },
      "convert_n_portable float -> bf16");
  check_bulk_widening<locus::f16>(
      [](const locus::f16* s, float* o, std::size_t n) { d::convert_n_portable(s, o, n); },
      "convert_n_portable f16 -> float");
  check_bulk_widening<locus::bf16>(
      [](const locus::bf16* s, float* o, std::size_t n) { d::convert_n_portable(s, o, n); },
      "convert_n_portable bf16 -> float");

#if LOCUS_HALF_HAS_X86_DISPATCH
  if (d::has_f16c()) {
    check_bulk_narrowing<locus::f16>(
        in_h, [](const float* s, locus::f16* o, std::size_t n) { d::convert_n_f16c(s, o, n); },
        "convert_n_f16c float -> f16");
    check_bulk_widening<locus::f16>(
        [](const locus::f16* s, float* o, std::size_t n) { d::convert_n_f16c(s, o, n); },
        "convert_n_f16c f16 -> float");
  } else {
    MESSAGE("CPU without F16C: F16C path not tested");
  }
  if (d::has_avx2()) {
    check_bulk_narrowing<locus::bf16>(
        in_b, [](const float* s, locus::bf16* o, std::size_t n) { d::convert_n_avx2(s, o, n); },
        "convert_n_avx2 float -> bf16");
    check_bulk_widening<locus::bf16>(
        [](const locus::bf16* s, float* o, std::size_t n) { d::convert_n_avx2(s, o, n); },
        "convert_n_avx2 bf16 -> float");
  } else {
    MESSAGE("CPU without AVX2: AVX2 path not tested");
  }
#else
  CHECK_FALSE(d::has_f16c());
#endif
}

#ifdef __FLT16_MAX__
TEST_CASE("f16: agrees with the compiler's _Float16 conversions" *
          doctest::test_suite("dtype")) {
  const auto f16_bits_of = [](_Float16 v) {
    std::uint16_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
  };
  Mismatches bad;
  for (float x : random_floats()) {
    const std::uint16_t want = f16_bits_of(static_cast<_Float16>(x));
    const std::uint16_t got = locus::f16(x).bits;
    const bool both_nan = std::isnan(x) && (want & 0x7fffu) > 0x7c00u && (got & 0x7fffu) > 0x7c00u;
    if (got != want && !both_nan) {
      bad.add(hex(bits_of(x)) + " -> " + hex(got) + ", _Float16 " + hex(want));
    }
  }
  for (float x : boundary_floats(kF16)) {
    const std::uint16_t want = f16_bits_of(static_cast<_Float16>(x));
    const std::uint16_t got = locus::f16(x).bits;
    if (got != want) bad.add(show(x) + " -> " + hex(got) + ", _Float16 " + hex(want));
  }
  for (double x : boundary_doubles(kF16)) {
    const std::uint16_t want = f16_bits_of(static_cast<_Float16>(x));
    const std::uint16_t got = locus::f16(x).bits;
    if (got != want) bad.add(show(x) + " (double) -> " + hex(got) + ", _Float16 " + hex(want));
  }
  for (std::uint32_t p = 0; p < 65536; ++p) {
    _Float16 v;
    const auto u = static_cast<std::uint16_t>(p);
    std::memcpy(&v, &u, sizeof v);
    const float want = static_cast<float>(v);
    const float got = locus::to_float(locus::f16::from_bits(u));
    if (bits_of(got) != bits_of(want) && !(std::isnan(got) && std::isnan(want))) {
      bad.add(hex(p) + " -> " + hex(bits_of(got)) + ", _Float16 " + hex(bits_of(want)));
    }
  }
  bad.check("_Float16 cross-check");
}
#endif

// The portable narrowing is what host code runs and what the device's conversion
// instructions are checked against (tests/cuda/test_kernels.cu compares them on all 2^32
// floats): it must be round-to-nearest-even on a dense sweep of every binade, and the
// public conversions on the host must be it.
TEST_CASE("f16/bf16: the portable conversions round to nearest even on a dense sweep of all floats" *
          doctest::test_suite("dtype")) {
  namespace d = locus::detail;
  Mismatches bad_h, bad_b, same;
  // every 509th encoding (a prime stride: every binade, sign and low-bit pattern mix) and
  // every encoding of the binades around f16's smallest subnormal and largest normal
  std::vector<std::uint32_t> inputs;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 509) inputs.push_back(static_cast<std::uint32_t>(u));
  for (std::uint32_t e : {102u, 103u, 112u, 113u, 142u, 143u})  // 2^-25, 2^-24, 2^-15, 2^-14, 2^15, 2^16
    for (std::uint32_t m = 0; m < (1u << 23); m += 7) inputs.push_back((e << 23) | m);
  for (const std::uint32_t u : inputs) {
    const float x = float_from_bits(u);
    const std::uint16_t h = d::f32_bits_to_f16_bits_portable(u), b = d::f32_bits_to_bf16_bits_portable(u);
    check_narrowed(x, h, kF16, bad_h);
    check_narrowed(x, b, kBF16, bad_b);
    if (h != locus::f16(x).bits || b != locus::bf16(x).bits) same.add(hex(u) + ": the host's conversion is not the portable one");
  }
  for (std::uint32_t p = 0; p < 65536; ++p) {
    const auto u = static_cast<std::uint16_t>(p);
    if (d::f16_bits_to_f32_bits_portable(u) != bits_of(locus::to_float(locus::f16::from_bits(u))))
      same.add(hex(p) + ": the host's widening is not the portable one");
  }
  bad_h.check("dense sweep -> f16");
  bad_b.check("dense sweep -> bf16");
  same.check("host conversions are the portable ones");
}
