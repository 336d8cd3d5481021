// Hostile numerics (issue 28): the edges of the dtypes, integer extremes, NaN and inf
// given to random factories, layer geometry, the grad scaler and the data transforms.
// Every hostile case expects its typed error with nothing changed; every accepted edge
// is compared with a reference written here (PyTorch's documented output-size formula
// in 128-bit integers, direct f64 convolutions and pools, hand-derived dtype constants,
// std::nextafter).
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <locus/data/loader.hpp>
#include <locus/data/transforms.hpp>
#include <locus/train.hpp>

namespace {

using locus::extents;
using locus::index_t;
namespace nn = locus::nn;
using D = locus::cpu;
using P64 = locus::amp::fp64;
using P32 = locus::amp::fp32;
__extension__ typedef __int128 i128;

constexpr index_t imax = std::numeric_limits<index_t>::max();
constexpr index_t imin = std::numeric_limits<index_t>::min();
constexpr double nan_d = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_d = std::numeric_limits<double>::infinity();

template <class T, std::size_t R>
std::vector<double> values(const locus::tensor<T, D, R>& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  for (index_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = static_cast<double>(t.data_handle()[i]);
  return v;
}

/// Deterministic values in (-1, 1), no two alike (no ties for max pooling).
double value_at(index_t i, double salt) { return std::sin(0.37 * static_cast<double>(i) + salt) * 0.9 + 1e-3 * i; }

template <std::size_t R>
locus::tensor<double, D, R> filled(const extents<R>& s, double salt) {
  locus::tensor<double, D, R> t(s);
  for (index_t i = 0; i < t.numel(); ++i) t.data_handle()[i] = value_at(i, salt);
  return t;
}

template <class Model>
std::vector<double> master_values(Model& m) {
  const auto v = std::as_const(m.parameters()).master();
  return {v.data_handle(), v.data_handle() + v.numel()};
}

bool state_ok(const locus::amp::grad_scaler<D>& s) {
  const auto t = s.state_dict();
  return locus::amp::grad_scaler<D>::valid_state(t.view());
}

template <class T>
void draw_rand(double lo, double hi) {
  (void)locus::rand<T, D>({4}, 1, lo, hi);
}
template <class T>
void draw_randn(double mean, double stddev) {
  (void)locus::randn<T, D>({4}, 1, mean, stddev);
}

std::string message_of(auto&& f) {
  try {
    f();
  } catch (const locus::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ---- 1. random factories at the edges of the dtypes -------------------------------------

namespace {
/// n draws of rand<T>(lo, hi): none outside [lo, hi), the largest value of T below hi
/// (`below_hi`, derived by hand from the format) drawn, and every draw equal to the f32
/// draw lo + (hi - lo) * u rounded to T, except where that rounding reached hi.
template <class T>
void check_half_range(double lo, double hi, double below_hi, index_t n, std::uint64_t seed) {
  CAPTURE(lo);
  CAPTURE(hi);
  const auto t = locus::rand<T, D>({n}, seed, lo, hi);
  index_t at_hi = 0, below = 0, outside = 0, mismatched = 0;
  for (index_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(t.data_handle()[i]);
    at_hi += v == hi;
    below += v == below_hi;
    outside += !(v >= lo && v < hi);
    // the reference draw: Philox word 0's top 24 bits, in f32, then rounded to T
    const auto r = locus::detail::philox4x32(seed, static_cast<std::uint64_t>(i));
    const float u = static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
    const float f = std::fma(static_cast<float>(hi - lo), u, static_cast<float>(lo));
    const double rounded = static_cast<double>(T(f));
    const double want = rounded >= hi ? below_hi : rounded;
    mismatched += v != want;
  }
  CHECK(at_hi == 0);
  CHECK(outside == 0);
  CHECK(mismatched == 0);
  CHECK(below > n / 4096);  // the values right below hi are drawn (at least 1/4096 of them)
}
}  // namespace

TEST_CASE("hostile rand: f16 and bf16 draws never equal hi and cover the largest value below it") {
  const index_t n = index_t{1} << 22;
  // f16 has 10 fraction bits, bf16 7: the value below 1 is 1 - 2^-11 or 1 - 2^-8, the
  // one below 11 (in [8, 16)) is 11 - 2^-7 or 11 - 2^-4. Before the fix, 0.02 % (f16)
  // and 0.2 % (bf16) of the draws of [0, 1), and 3 % of bf16's [10, 11), were hi.
  check_half_range<locus::f16>(0.0, 1.0, 1.0 - 0x1p-11, n, 1);
  check_half_range<locus::bf16>(0.0, 1.0, 1.0 - 0x1p-8, n, 2);
  check_half_range<locus::f16>(10.0, 11.0, 11.0 - 0x1p-7, n, 3);
  check_half_range<locus::bf16>(10.0, 11.0, 11.0 - 0x1p-4, n, 4);
  check_half_range<locus::f16>(-1.0, -0.5, -0.5 - 0x1p-11, n / 4, 5);  // negative: hi = -0.5 rounds up too
}

TEST_CASE("hostile rand: bounds that are no value of T, and one-value ranges of f32 and f64") {
  // lo = 0.1 lies between the f16 values 0.0999755859375 and 0.10003662109375: no draw
  // may round down below it
  const auto a = values(locus::rand<locus::f16, D>({1 << 18}, 9, 0.1, 0.2));
  double lowest = 1.0;
  for (const double v : a) lowest = std::min(lowest, v);
  CHECK(lowest == 0.10003662109375);
  // [2^24, 2^24 + 2) holds one f32 value (the spacing is 2 there); [2^54, 2^54 + 4) one f64 value
  for (const double v : values(locus::rand<float, D>({4096}, 1, 16777216.0, 16777218.0))) REQUIRE(v == 16777216.0);
  for (const double v : values(locus::rand<double, D>({4096}, 1, 0x1p54, 0x1p54 + 4.0))) REQUIRE(v == 0x1p54);
  // f32 over most of its range: finite, inside, and both signs drawn
  const auto wide = values(locus::rand<float, D>({1 << 16}, 3, -1e38, 1e38));
  int neg = 0, bad = 0;
  for (const double v : wide) {
    neg += v < 0;
    bad += !(std::isfinite(v) && v >= -1e38 && v < 1e38);
  }
  CHECK(bad == 0);
  CHECK(neg > (1 << 14));
  // the full f16 range below its largest value
  for (const double v : values(locus::rand<locus::f16, D>({1 << 16}, 5, -65504.0, 65504.0)))
    REQUIRE((std::isfinite(v) && v >= -65504.0 && v < 65504.0));
}

TEST_CASE("hostile rand: non-finite bounds, empty ranges, overflowing widths and out-of-range bounds are value_errors") {
  using E = locus::value_error;
  const double fmax = static_cast<double>(FLT_MAX);
  CHECK_THROWS_AS(draw_rand<float>(-fmax, fmax), E);  // width 2 * FLT_MAX: inf in f32
  CHECK_THROWS_AS(draw_rand<double>(-DBL_MAX, DBL_MAX), E);
  CHECK_THROWS_AS(draw_rand<locus::bf16>(-3e38, 3e38), E);  // bf16 computes in f32
  CHECK_THROWS_AS(draw_rand<locus::f16>(0.0, 1e5), E);        // beyond f16's 65504
  CHECK_THROWS_AS(draw_rand<locus::f16>(-65520.0, 0.0), E);
  CHECK_THROWS_AS(draw_rand<float>(0.0, 1e39), E);
  CHECK_THROWS_AS(draw_rand<locus::f16>(1.0001, 1.0002), E);  // no f16 in between
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{
           {nan_d, 1.0}, {0.0, nan_d}, {-inf_d, 0.0}, {0.0, inf_d}, {1.0, 1.0}, {2.0, 1.0}, {-0.0, 0.0}}) {
    CAPTURE(lo);
    CAPTURE(hi);
    CHECK_THROWS_AS(draw_rand<float>(lo, hi), E);
    CHECK_THROWS_AS(draw_rand<double>(lo, hi), E);
    CHECK_THROWS_AS(draw_rand<locus::f16>(lo, hi), E);
    CHECK_THROWS_AS(draw_rand<locus::bf16>(lo, hi), E);
  }
  const std::string m = message_of([&] { draw_rand<float>(-fmax, fmax); });
  CHECK(m.rfind("locus: rand<f32>(lo = ", 0) == 0);
  CHECK(m.find("overflows f32") != std::string::npos);
  CHECK(message_of([] { draw_rand<float>(2.0, 1.0); }).find("needs lo < hi") != std::string::npos);
}

TEST_CASE("hostile randn: non-finite or negative parameters and draws beyond the dtype are value_errors") {
  using E = locus::value_error;
  CHECK_THROWS_AS(draw_randn<float>(nan_d, 1.0), E);
  CHECK_THROWS_AS(draw_randn<float>(0.0, nan_d), E);
  CHECK_THROWS_AS(draw_randn<float>(inf_d, 1.0), E);
  CHECK_THROWS_AS(draw_randn<double>(0.0, inf_d), E);
  CHECK_THROWS_AS(draw_randn<double>(0.0, -1.0), E);
  CHECK_THROWS_AS(draw_randn<double>(0.0, 1e308), E);  // std * 8.57 overflows f64
  CHECK_THROWS_AS(draw_randn<locus::f16>(0.0, 10000.0), E);  // |z| up to 8.57: 85717 > 65504
  CHECK_THROWS_AS(draw_randn<locus::f16>(65000.0, 100.0), E);
  CHECK_THROWS_AS(draw_randn<float>(0.0, 1e38), E);
  CHECK(message_of([] { draw_randn<double>(0.0, -1.0); }).find("std must be >= 0") !=
        std::string::npos);
  // accepted edges: every draw finite (the largest |z| is sqrt(-2 ln 2^-53) = 8.5716...)
  for (const double v : values(locus::randn<locus::f16, D>({1 << 18}, 2, 0.0, 7600.0))) REQUIRE(std::isfinite(v));
  for (const double v : values(locus::randn<float, D>({1 << 18}, 3, 0.0, 3.9e37))) REQUIRE(std::isfinite(v));
  for (const double v : values(locus::randn<double, D>({64}, 4, 2.5, 0.0))) REQUIRE(v == 2.5);  // std 0: the mean
  CHECK(std::sqrt(-2.0 * std::log(0x1p-53)) < locus::detail::normal_z_max);
}

TEST_CASE("hostile rand: ulp_step and the range ends equal std::nextafter and the formats' neighbours") {
  for (const float x : {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, -1e-45f, FLT_MIN, 3.0e38f, -2.5f, 0.1f}) {
    CHECK(locus::detail::ulp_step(x, true) == std::nextafter(x, INFINITY));
    CHECK(locus::detail::ulp_step(x, false) == std::nextafter(x, -INFINITY));
  }
  for (const double x : {0.0, -0.0, 1.0, -1.0, 5e-324, DBL_MAX / 2, -0.1}) {
    CHECK(locus::detail::ulp_step(x, true) == std::nextafter(x, inf_d));
    CHECK(locus::detail::ulp_step(x, false) == std::nextafter(x, -inf_d));
  }
  // f16: every finite value's neighbours against the next larger finite value by enumeration
  std::vector<double> f16s;
  for (unsigned b = 0; b < 0x10000u; ++b) {
    const double v = static_cast<double>(locus::f16::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isfinite(v)) f16s.push_back(v);
  }
  std::sort(f16s.begin(), f16s.end());
  f16s.erase(std::unique(f16s.begin(), f16s.end()), f16s.end());  // +0 and -0
  int bad = 0;
  for (std::size_t i = 1; i + 1 < f16s.size(); ++i) {
    const double v = f16s[i];
    if (v == 0.0) continue;
    const locus::f16 h(v);
    bad += static_cast<double>(locus::detail::ulp_step(h, true)) != f16s[i + 1];
    bad += static_cast<double>(locus::detail::ulp_step(h, false)) != f16s[i - 1];
    bad += locus::detail::largest_below<locus::f16>(v) != f16s[i - 1];
    bad += locus::detail::smallest_at_least<locus::f16>(v) != v;
    bad += locus::detail::smallest_at_least<locus::f16>((v + f16s[i + 1]) / 2) != f16s[i + 1];
  }
  CHECK(bad == 0);
  CHECK(locus::detail::finite_max<locus::f16>() == 65504.0);
  CHECK(locus::detail::finite_max<locus::bf16>() == 0x1.fep127);
}

TEST_CASE("hostile init: parameter initialisation draws stay at or above lo and below hi after rounding to f32") {
  // [1 - 2^-23, 1 - 2^-30): f32 holds 1 - 2^-23 and 1 - 2^-24 there; the f64 draws above
  // 1 - 2^-25 (a quarter of them) round to 1.0, beyond hi, unless kept inside
  const double lo = 1.0 - 0x1p-23, hi = 1.0 - 0x1p-30;
  const index_t n = 1 << 16;
  std::vector<float> w(static_cast<std::size_t>(n));
  locus::detail::launch_n<D>(n, locus::detail::uniform_init_kernel<float>{w.data(), 7, 1, lo, hi});
  index_t top = 0, outside = 0;
  for (const float v : w) {
    outside += !(static_cast<double>(v) >= lo && static_cast<double>(v) < hi);
    top += v == 1.0f - 0x1p-24f;
  }
  CHECK(outside == 0);
  CHECK(top > n / 4);
  // and a layer's weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), inside
  nn::sequential m(nn::conv2d<D, P32>(1, 4, 1), nn::flatten<D, P32>(), nn::linear<D, P32>(4, 3));
  m.reset_parameters(11);
  const auto bound = [](double fan_in) { return 1.0 / std::sqrt(fan_in); };
  for (const auto& e : m.parameters().entries()) {
    const double b = bound(e.name.rfind("0.", 0) == 0 ? 1.0 : 4.0);
    for (index_t j = 0; j < e.numel; ++j) {
      const double v = m.parameters().master().data_handle()[e.offset + j];
      REQUIRE((v >= -b && v < b));
    }
  }
}

// ---- 2. from_host ------------------------------------------------------------------------

TEST_CASE("hostile from_host: the fixes the vector<bool> message names work") {
  const std::vector<bool> bits{true, false, true, true};
  const std::vector<std::uint8_t> bytes(bits.begin(), bits.end());
  const auto u8 = locus::from_host<D>(bytes, {4});
  locus::tensor<bool, D, 1> b = locus::cast<bool>(u8);
  const bool raw[4] = {true, false, true, true};
  const auto direct = locus::from_host<D>(std::span<const bool>(raw), {4});
  for (index_t i = 0; i < 4; ++i) {
    CHECK(b(i) == bits[static_cast<std::size_t>(i)]);
    CHECK(direct(i) == bits[static_cast<std::size_t>(i)]);
  }
  CHECK_THROWS_AS((void)locus::from_host<D>(bytes, {5}), locus::shape_error);
}

// ---- 3. layer geometry ---------------------------------------------------------------------

namespace {
/// PyTorch's output size floor((in + 2p - d (k - 1) - 1) / s) + 1 in 128-bit integers; 0
/// when it is not positive.
i128 torch_out(i128 in, i128 k, i128 s, i128 p, i128 d) {
  const i128 room = in + 2 * p - d * (k - 1) - 1;
  return room < 0 ? 0 : room / s + 1;
}
bool fits(i128 v) { return v >= 0 && v <= static_cast<i128>(imax); }
/// Whether the product of non-negative factors fits in index_t (no i128 overflow either:
/// the running product stays below 2^63 before each factor below 2^64).
bool product_fits(std::initializer_list<i128> factors) {
  i128 p = 1;
  for (const i128 f : factors) {
    if (f == 0) return true;
  }
  for (const i128 f : factors) {
    if (!fits(f)) return false;
    p *= f;
    if (!fits(p)) return false;
  }
  return true;
}
}  // namespace

TEST_CASE("hostile conv2d: options at the integer extremes are shape_errors when the layer is built") {
  using E = locus::shape_error;
  using Conv = nn::conv2d<D, P32>;
  for (const index_t v : {index_t{0}, index_t{-1}, imin}) {
    CAPTURE(v);
    CHECK_THROWS_AS(Conv(3, 8, 3, {.stride = v}), E);
    CHECK_THROWS_AS(Conv(3, 8, 3, {.dilation = v}), E);
    CHECK_THROWS_AS(Conv(3, 8, 3, {.groups = v}), E);
    CHECK_THROWS_AS(Conv(3, 8, v), E);
    CHECK_THROWS_AS(Conv(v, 8, 3), E);
    CHECK_THROWS_AS(Conv(3, v, 3), E);
  }
  CHECK_THROWS_AS(Conv(3, 8, 3, {.padding = -1}), E);
  CHECK_THROWS_AS(Conv(3, 8, 3, {.padding = imin}), E);
  CHECK_THROWS_AS(Conv(3, 8, 3, {.padding = imax}), E);           // 2 * padding overflows
  CHECK_THROWS_AS(Conv(3, 8, 3, {.padding = imax / 2 + 1}), E);
  CHECK_THROWS_AS(Conv(3, 8, 3, {.dilation = imax}), E);          // dilation * (k - 1) overflows
  CHECK_THROWS_AS(Conv(3, 8, index_t{1} << 32), E);               // k * k overflows
  CHECK_THROWS_AS(Conv(imax, imax, 1), E);                        // the weight's count overflows
  CHECK_THROWS_AS(Conv(3, 8, 3, {.groups = 2}), E);
  CHECK_THROWS_AS(Conv(4, 6, 3, {.groups = 4}), E);
  const std::string m = message_of([] { Conv(3, 8, 3, {.dilation = imax}); });
  CHECK(m.rfind("locus: conv2d(3, 8, 3, dilation=9223372036854775807): ", 0) == 0);
  CHECK_NOTHROW(Conv(3, 8, 3, {.padding = imax / 2}));  // representable: refused only by an input it overflows
}

TEST_CASE("hostile pooling: options at the integer extremes are shape_errors when the layer is built") {
  using E = locus::shape_error;
  using Max = nn::max_pool2d<D, P32>;
  using Avg = nn::avg_pool2d<D, P32>;
  using Adaptive = nn::adaptive_avg_pool2d<D, P32>;
  for (const index_t v : {index_t{0}, index_t{-2}, imin}) {
    CAPTURE(v);
    CHECK_THROWS_AS(Max{v}, E);
    CHECK_THROWS_AS(Avg{v}, E);
    CHECK_THROWS_AS(Max(3, {.stride = v}), E);
    CHECK_THROWS_AS(Avg(3, {.stride = v}), E);
    CHECK_THROWS_AS(Adaptive{v}, E);
  }
  // PyTorch's rule: padding at most half the kernel (2 * imax overflowed before)
  for (const index_t p : {index_t{-1}, index_t{2}, imax, imin, imax / 2}) {
    CAPTURE(p);
    CHECK_THROWS_AS(Max(3, {.padding = p}), E);
    CHECK_THROWS_AS(Avg(3, {.padding = p}), E);
  }
  CHECK_THROWS_AS(Max{imax}, E);  // a window of k * k elements overflows
  CHECK_THROWS_AS(Avg(index_t{1} << 32), E);
  CHECK_THROWS_AS(Adaptive{imax}, E);
  CHECK(message_of([] { Max(3, {.padding = imax}); }) ==
        "locus: max_pool2d(3, padding=9223372036854775807): padding must be in [0, kernel_size / 2], got "
        "9223372036854775807");
}

TEST_CASE("hostile conv2d and pooling: output shapes equal PyTorch's formula in 128-bit integers, or a shape_error") {
  const index_t ins[] = {1, 7, index_t{1} << 31, index_t{1} << 62};
  const index_t ks[] = {1, 3, index_t{1} << 20};
  const index_t ss[] = {1, 2, index_t{1} << 33, imax};
  const index_t ps[] = {0, 1, index_t{1} << 40, index_t{1} << 61};
  const index_t ds[] = {1, 2, index_t{1} << 30};
  int conv_cases = 0, conv_refused = 0, pool_cases = 0;
  for (const index_t k : ks)
    for (const index_t s : ss)
      for (const index_t p : ps)
        for (const index_t d : ds) {
          const i128 span = static_cast<i128>(d) * (k - 1) + 1;
          const bool buildable = fits(span) && fits(2 * static_cast<i128>(p)) && fits(static_cast<i128>(k) * k * 2 + 2);
          std::optional<nn::conv2d<D, P32>> conv;
          try {
            conv.emplace(1, 2, k, nn::conv2d_options{.stride = s, .padding = p, .dilation = d});
          } catch (const locus::shape_error&) {
          }
          CAPTURE(k);
          CAPTURE(s);
          CAPTURE(p);
          CAPTURE(d);
          REQUIRE(conv.has_value() == buildable);
          if (!conv) continue;
          for (const index_t in : ins) {
            CAPTURE(in);
            const i128 padded = static_cast<i128>(in) + 2 * static_cast<i128>(p);
            const i128 oh = torch_out(in, k, s, p, d), ow = torch_out(9, k, s, p, d);
            // locus refuses what does not fit in 64 bits: the input [1, 1, in, 9], the
            // padded input, the output [1, 2, oh, ow] and the im2col columns [k * k, oh * ow]
            const bool ok = product_fits({in, 9}) && fits(padded) && oh > 0 && ow > 0 && product_fits({2, oh, ow}) &&
                            product_fits({k, k, oh, ow});
            ++conv_cases;
            try {
              const auto shape = conv->output_shape({1, 1, in, 9});
              CHECK(ok);
              CHECK(shape == std::vector<index_t>{1, 2, static_cast<index_t>(oh), static_cast<index_t>(ow)});
            } catch (const locus::shape_error& e) {
              ++conv_refused;
              CHECK_MESSAGE(!ok, e.what());
              CHECK(std::string(e.what()).rfind("locus: conv2d(1, 2, ", 0) == 0);
            }
          }
          if (d != 1 || 2 * static_cast<i128>(p) > k || !fits(static_cast<i128>(k) * k)) continue;
          nn::avg_pool2d<D, P32> pool(k, {.stride = s, .padding = p});
          nn::max_pool2d<D, P32> maxp(k, {.stride = s, .padding = p});
          for (const index_t in : ins) {
            CAPTURE(in);
            const i128 oh = torch_out(in, k, s, p, 1), ow = torch_out(9, k, s, p, 1);
            const bool ok = product_fits({2, 3, in, 9}) && fits(static_cast<i128>(in) + 2 * p) && oh > 0 && ow > 0 &&
                            product_fits({6, oh, ow});
            const bool max_ok = ok && static_cast<i128>(in) * 9 <= std::numeric_limits<std::int32_t>::max();
            const std::vector<index_t> want{2, 3, static_cast<index_t>(oh), static_cast<index_t>(ow)};
            ++pool_cases;
            try {
              const auto shape = pool.output_shape({2, 3, in, 9});
              CHECK(ok);
              CHECK(shape == want);
            } catch (const locus::shape_error& e) {
              CHECK_MESSAGE(!ok, e.what());
            }
            try {
              const auto shape = maxp.output_shape({2, 3, in, 9});
              CHECK(max_ok);
              CHECK(shape == want);
            } catch (const locus::shape_error& e) {
              CHECK_MESSAGE(!max_ok, e.what());
            }
          }
        }
  CHECK(conv_cases > 300);
  CHECK(conv_refused > 50);
  CHECK(pool_cases > 50);
  // shapes with negative or overflowing extents
  nn::conv2d<D, P32> c(1, 1, 3);
  CHECK_THROWS_AS((void)c.output_shape({-1, 1, 8, 8}), locus::shape_error);
  CHECK_THROWS_AS((void)c.output_shape({imax, 1, imax, 8}), locus::shape_error);
  nn::max_pool2d<D, P32> mp(2);
  CHECK_THROWS_AS((void)mp.output_shape({0, 1, index_t{1} << 40, index_t{1} << 40}), locus::shape_error);
  nn::flatten<D, P32> fl;
  CHECK_THROWS_AS((void)fl.output_shape({1, index_t{1} << 40, index_t{1} << 40, 2}), locus::shape_error);
  CHECK(fl.output_shape({3, index_t{1} << 20, index_t{1} << 20, 4}) == std::vector<index_t>{3, index_t{1} << 42});
  locus::tensor<float, D, 4> none(extents<4>{0, index_t{1} << 31, index_t{1} << 31, 4});  // empty, c * h * w = 2^64
  CHECK_THROWS_AS((void)fl.infer(std::as_const(none).view()), locus::shape_error);
  CHECK_THROWS_AS((void)fl.forward(std::as_const(none).view()), locus::shape_error);
  nn::batch_norm2d<D, P32> bn(2);
  CHECK_THROWS_AS((void)bn.output_shape({imax, 2, 2, 2}), locus::shape_error);
  nn::adaptive_avg_pool2d<D, P32> ap(index_t{1} << 20);
  CHECK_THROWS_AS((void)ap.output_shape({1, 1, index_t{1} << 50, 2}), locus::shape_error);  // window ends overflow
  CHECK(ap.output_shape({1, 1, 4, 2}) == std::vector<index_t>{1, 1, index_t{1} << 20, index_t{1} << 20});
  nn::adaptive_avg_pool2d<D, P32> ap2(index_t{1} << 40);
  CHECK_THROWS_AS((void)ap2.output_shape({1, 1, 4, 2}), locus::shape_error);  // 2^80 outputs
}

namespace {
/// The conv2d of PyTorch's definition (one group) and its input gradient for a gradient
/// of ones, in f64 loops over the output, 128-bit positions: hostile strides are safe here.
void conv_ref(const std::vector<double>& x, const double* w, const double* b, index_t n, index_t c, index_t h,
              index_t wd, index_t k, index_t ks, index_t s, index_t p, index_t d, std::vector<double>& y,
              std::vector<double>& gx, index_t& ho, index_t& wo) {
  ho = static_cast<index_t>(torch_out(h, ks, s, p, d));
  wo = static_cast<index_t>(torch_out(wd, ks, s, p, d));
  y.assign(static_cast<std::size_t>(n * k * ho * wo), 0.0);
  gx.assign(x.size(), 0.0);
  for (index_t in = 0; in < n; ++in)
    for (index_t ik = 0; ik < k; ++ik)
      for (index_t oh = 0; oh < ho; ++oh)
        for (index_t ow = 0; ow < wo; ++ow) {
          double acc = b ? b[ik] : 0.0;
          for (index_t ic = 0; ic < c; ++ic)
            for (index_t ky = 0; ky < ks; ++ky)
              for (index_t kx = 0; kx < ks; ++kx) {
                const i128 ih = static_cast<i128>(oh) * s - p + static_cast<i128>(ky) * d;
                const i128 iw = static_cast<i128>(ow) * s - p + static_cast<i128>(kx) * d;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const auto at = static_cast<std::size_t>(((in * c + ic) * h + static_cast<index_t>(ih)) * wd +
                                                         static_cast<index_t>(iw));
                const double wv = w[((ik * c + ic) * ks + ky) * ks + kx];
                acc += wv * x[at];
                gx[at] += wv;
              }
          y[static_cast<std::size_t>(((in * k + ik) * ho + oh) * wo + ow)] = acc;
        }
}

struct generic_path {
  explicit generic_path(bool on) { nn::detail::conv_generic_path() = on; }
  ~generic_path() { nn::detail::conv_generic_path() = false; }
};
}  // namespace

TEST_CASE("hostile conv2d: extreme but valid geometry equals a direct f64 convolution on both paths") {
  struct geo {
    index_t h, w, ks, s, p, d;
  };
  const geo cases[] = {
      {5, 5, 3, imax, 1, 1},            // one output: the stride never repeats
      {7, 7, 3, 3, 0, 3},               // a dilated kernel exactly as wide as the input
      {8, 7, 3, 1, 1, 4},               // wider than the input, fitting only with the padding
      {3, 3, 2, 1, 3, 1},               // padding beyond the kernel: outputs of bias alone
      {4, 9, 2, index_t{1} << 40, 5, 2},
  };
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    for (const auto& g : cases) {
      CAPTURE(generic);
      CAPTURE(g.s);
      CAPTURE(g.p);
      CAPTURE(g.d);
      nn::sequential m(nn::conv2d<D, P64>(2, 3, g.ks, {.stride = g.s, .padding = g.p, .dilation = g.d}));
      m.reset_parameters(5);
      auto x = filled<4>({2, 2, g.h, g.w}, 0.4);
      std::vector<double> xv(x.data_handle(), x.data_handle() + x.numel()), y_ref, gx_ref;
      const double* w = m.get<0>().weight().data_handle();
      const double* b = m.parameters().master().data_handle() + m.parameters().entries()[1].offset;
      index_t ho = 0, wo = 0;
      conv_ref(xv, w, b, 2, 2, g.h, g.w, 3, g.ks, g.s, g.p, g.d, y_ref, gx_ref, ho, wo);
      const auto y = m.forward(std::as_const(x).view());
      REQUIRE(y.shape() == extents<4>{2, 3, ho, wo});
      double worst = 0;
      for (index_t i = 0; i < y.numel(); ++i)
        worst = std::max(worst, std::abs(y.data_handle()[i] - y_ref[static_cast<std::size_t>(i)]));
      CHECK(worst < 1e-12);
      locus::tensor<double, D, 4> ones(y.shape());
      for (index_t i = 0; i < ones.numel(); ++i) ones.data_handle()[i] = 1.0;
      m.parameters().zero_grad();
      const auto gx = m.backward(std::as_const(ones).view(), true);
      worst = 0;
      for (index_t i = 0; i < gx.numel(); ++i)
        worst = std::max(worst, std::abs(gx.data_handle()[i] - gx_ref[static_cast<std::size_t>(i)]));
      CHECK(worst < 1e-12);
    }
  }
}

TEST_CASE("hostile conv2d: an input smaller than the dilated kernel, or an output past 64 bits, changes nothing") {
  nn::sequential m(nn::conv2d<D, P64>(1, 2, 3, {.padding = 1, .dilation = 4}));
  m.reset_parameters(3);
  auto x = filled<4>({1, 1, 7, 7}, 0.1);
  const auto before = master_values(m);
  const auto y0 = values(m.infer(std::as_const(x).view()));
  auto small = filled<4>({1, 1, 6, 6}, 0.2);  // 6 + 2 < 9: the dilated kernel does not fit
  CHECK_THROWS_WITH_AS((void)m.forward(std::as_const(small).view()),
                       "locus: conv2d(1, 2, 3, padding=1, dilation=4): the kernel (9 wide with dilation) is larger "
                       "than the padded input [1, 1, 6, 6] (padding 1)",
                       locus::shape_error);
  CHECK_THROWS_AS((void)m.infer(std::as_const(small).view()), locus::shape_error);
  CHECK(master_values(m) == before);
  CHECK(values(m.infer(std::as_const(x).view())) == y0);
  // a padding that makes the output overflow 64 bits: refused before anything is computed
  nn::sequential big(nn::conv2d<D, P64>(1, 1, 3, {.padding = index_t{1} << 61}));
  const std::string msg = message_of([&] { (void)big.forward(std::as_const(x).view()); });
  CHECK(msg.rfind("locus: conv2d(1, 1, 3, padding=2305843009213693952): the output of input [1, 1, 7, 7]", 0) == 0);
  CHECK(msg.find("more elements than fit in 64 bits") != std::string::npos);
  nn::sequential pool(nn::max_pool2d<D, P64>(3, {.stride = 2}));
  auto tiny = filled<4>({1, 1, 2, 2}, 0.3);
  CHECK_THROWS_WITH_AS((void)pool.forward(std::as_const(tiny).view()),
                       "locus: max_pool2d(3, stride=2): the window is larger than the padded input [1, 1, 2, 2] "
                       "(calculated output size 0 x 0 is too small)",
                       locus::shape_error);
}

namespace {
/// Max and average pooling of one plane by their definitions, in f64; max gradient to
/// the first maximum of each window (PyTorch's), for a gradient of ones.
void pool_ref(const double* x, index_t h, index_t w, index_t k, index_t s, index_t p, bool include_pad,
              std::vector<double>& mx, std::vector<double>& avg, std::vector<double>& gmax) {
  const auto ho = static_cast<index_t>(torch_out(h, k, s, p, 1)), wo = static_cast<index_t>(torch_out(w, k, s, p, 1));
  mx.assign(static_cast<std::size_t>(ho * wo), 0.0);
  avg = mx;
  gmax.assign(static_cast<std::size_t>(h * w), 0.0);
  for (index_t oh = 0; oh < ho; ++oh)
    for (index_t ow = 0; ow < wo; ++ow) {
      double best = -inf_d, sum = 0;
      i128 at = -1, inside = 0, padded = 0;
      for (index_t ky = 0; ky < k; ++ky)
        for (index_t kx = 0; kx < k; ++kx) {
          const i128 ih = static_cast<i128>(oh) * s - p + ky, iw = static_cast<i128>(ow) * s - p + kx;
          if (ih >= h + p || iw >= w + p) continue;  // beyond the padding: not counted
          ++padded;
          if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
          ++inside;
          const double v = x[ih * w + iw];
          sum += v;
          if (v > best) {
            best = v;
            at = ih * w + iw;
          }
        }
      mx[static_cast<std::size_t>(oh * wo + ow)] = best;
      avg[static_cast<std::size_t>(oh * wo + ow)] = sum / static_cast<double>(include_pad ? padded : inside);
      gmax[static_cast<std::size_t>(at)] += 1.0;
    }
}
}  // namespace

TEST_CASE("hostile pooling: huge strides and the largest padding give finite outputs equal to the definition") {
  struct geo {
    index_t h, w, k, s, p;
  };
  const geo cases[] = {{4, 4, 3, imax, 1}, {5, 5, 4, 5, 2}, {6, 7, 5, 7, 2}, {3, 8, 2, index_t{1} << 50, 1}, {9, 9, 9, 1, 4}};
  for (const bool generic : {false, true}) {
    generic_path gp(generic);
    for (const auto& g : cases)
      for (const bool include_pad : {true, false}) {
        CAPTURE(generic);
        CAPTURE(g.k);
        CAPTURE(g.s);
        CAPTURE(g.p);
        CAPTURE(include_pad);
        auto x = filled<4>({1, 2, g.h, g.w}, 1.3);
        nn::sequential mp(nn::max_pool2d<D, P64>(g.k, {.stride = g.s, .padding = g.p}));
        nn::sequential ap(
            nn::avg_pool2d<D, P64>(g.k, {.stride = g.s, .padding = g.p, .count_include_pad = include_pad}));
        const auto ym = mp.forward(std::as_const(x).view());
        const auto ya = ap.forward(std::as_const(x).view());
        locus::tensor<double, D, 4> ones(ym.shape());
        for (index_t i = 0; i < ones.numel(); ++i) ones.data_handle()[i] = 1.0;
        const auto gm = mp.backward(std::as_const(ones).view(), true);
        int bad = 0;
        for (index_t c = 0; c < 2; ++c) {
          std::vector<double> mx, avg, gmax;
          pool_ref(x.data_handle() + c * g.h * g.w, g.h, g.w, g.k, g.s, g.p, include_pad, mx, avg, gmax);
          const index_t plane = static_cast<index_t>(mx.size());
          REQUIRE(ym.numel() == 2 * plane);
          for (index_t i = 0; i < plane; ++i) {
            const double vm = ym.data_handle()[c * plane + i], va = ya.data_handle()[c * plane + i];
            bad += !std::isfinite(vm) || vm != mx[static_cast<std::size_t>(i)];
            bad += !std::isfinite(va) || std::abs(va - avg[static_cast<std::size_t>(i)]) > 1e-12;
          }
          for (index_t i = 0; i < g.h * g.w; ++i) bad += gm.data_handle()[c * g.h * g.w + i] != gmax[static_cast<std::size_t>(i)];
        }
        CHECK(bad == 0);
      }
  }
}

// ---- 4. loss scaling -------------------------------------------------------------------------

TEST_CASE("hostile grad_scaler: non-finite or out-of-range options are value_errors naming the option") {
  using S = locus::amp::grad_scaler<D>;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct bad_case {
    locus::amp::grad_scaler_options o;
    const char* option;
  };
  const bad_case cases[] = {
      {{.init_scale = inf}, "init_scale = inf"},
      {{.init_scale = nan}, "init_scale = nan"},
      {{.init_scale = 0.0f}, "init_scale = 0"},
      {{.init_scale = -1.0f}, "init_scale = -1"},
      {{.init_scale = 1e-40f}, "init_scale = "},  // subnormal: 1 / scale is inf
      {{.growth_factor = inf}, "growth_factor = inf"},
      {{.growth_factor = nan}, "growth_factor = nan"},
      {{.growth_factor = 1.0f}, "growth_factor = 1"},
      {{.backoff_factor = 0.0f}, "backoff_factor = 0"},
      {{.backoff_factor = 1.0f}, "backoff_factor = 1"},
      {{.backoff_factor = nan}, "backoff_factor = nan"},
      {{.growth_interval = 0}, "growth_interval = 0"},
      {{.growth_interval = -5}, "growth_interval = -5"},
      {{.growth_interval = (1 << 24) + 1}, "growth_interval = 16777217"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.option);
    const std::string m = message_of([&] { S s(c.o); });
    CHECK(m.rfind(std::string("locus: grad_scaler option ") + c.option, 0) == 0);
    CHECK_THROWS_AS(S(c.o), locus::value_error);
  }
  CHECK_NOTHROW(S({.init_scale = FLT_MAX, .growth_interval = 1 << 24}));
  CHECK_NOTHROW(S({.init_scale = FLT_MIN}));
}

TEST_CASE("hostile grad_scaler: thousands of clean updates keep the scale finite, thousands of overflows keep it normal") {
  // growth: from 2^16 by 2 every step, the largest finite power of two is 2^127
  locus::amp::grad_scaler<D> up({.init_scale = 65536.0f, .growth_interval = 1});
  for (int i = 0; i < 5000; ++i) up.update();
  CHECK(up.scale() == 0x1p127f);
  CHECK(up.growth_tracker() == 0);
  CHECK(state_ok(up));
  // a factor whose powers are no powers of two: stops at the last finite one
  locus::amp::grad_scaler<D> by3({.init_scale = 1.0f, .growth_factor = 3.0f, .growth_interval = 1});
  for (int i = 0; i < 3000; ++i) by3.update();
  const double s3 = by3.scale();
  CHECK(std::isfinite(s3));
  CHECK(s3 * 3.0 > static_cast<double>(FLT_MAX));
  // backoff: overflow after overflow ends at f32's smallest normal value, not 0
  locus::amp::grad_scaler<D> down({.init_scale = 65536.0f, .growth_interval = 3});
  for (int i = 0; i < 3000; ++i) {
    down.state()->found_inf = 1;
    down.update();
  }
  CHECK(down.scale() == FLT_MIN);
  CHECK(state_ok(down));
  for (int i = 0; i < 3; ++i) down.update();  // clean steps: it grows again
  CHECK(down.scale() == 2.0f * FLT_MIN);
  // the shared update itself, at both ends
  const auto at_top = locus::detail::next_loss_scale(FLT_MAX, 0.0f, false, 2.0f, 0.5f, 1.0f);
  CHECK(at_top.scale == FLT_MAX);
  CHECK(at_top.tracker == 0.0f);
  CHECK(locus::detail::next_loss_scale(FLT_MIN, 5.0f, true, 2.0f, 0.5f, 10.0f).scale == FLT_MIN);
  CHECK(locus::detail::next_loss_scale(1.0f, 5.0f, true, 2.0f, 0.25f, 10.0f).scale == 0.25f);
  CHECK(locus::detail::next_loss_scale(1.0f, 5.0f, false, 2.0f, 0.25f, 10.0f).tracker == 6.0f);
  // a state with a scale below that is refused, and the scaler keeps its own
  locus::tensor<float, D, 1> sub(extents<1>{3});
  sub(0) = 1e-40f;
  sub(1) = 0.0f;
  sub(2) = 0.0f;
  CHECK_THROWS_AS(down.load_state_dict(std::as_const(sub).view()), locus::value_error);
  CHECK(down.scale() == 2.0f * FLT_MIN);
}

TEST_CASE("hostile grad_scaler: on the trainer's fused path the scale stays finite and positive, and training steps") {
  using F16 = locus::amp::fp16_mixed;
  // zero weights and zero targets: every gradient is exactly 0, so every step is clean
  // and the scale grows at each (growth_interval 1) until the next growth would be inf
  nn::sequential model(nn::linear<D, F16>(16, 8), nn::relu<D, F16>(), nn::linear<D, F16>(8, 3));
  model.reset_parameters(1);
  for (auto& v : model.parameters().master().span()) v = 0.0f;
  model.parameters().sync_compute();
  locus::optim::adamw<D> opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.0});
  locus::amp::grad_scaler<D> scaler({.init_scale = 65536.0f, .growth_interval = 1});
  locus::train::trainer t(model, opt, nn::mse{}, scaler);
  const auto x = locus::rand<float, D>({8, 16}, 3);
  const auto y = locus::zeros<locus::f16, D>({8, 3});
  const int steps = 2000;
  for (int i = 0; i < steps; ++i) t.step(x, y);
  CHECK(scaler.scale() == 0x1p127f);
  CHECK(scaler.skipped_steps() == 0);
  CHECK(opt.steps() == steps);  // before the fix: the scale became inf after 112 steps, every later one skipped
  CHECK(state_ok(scaler));

  // overflow after overflow (an inf input every step): the scale stops at f32's smallest
  // normal value, and the first clean step afterwards is taken
  auto bad = locus::rand<float, D>({8, 16}, 4);
  bad(0, 0) = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 400; ++i) t.step(bad, y);
  CHECK(scaler.scale() == FLT_MIN);
  CHECK(scaler.skipped_steps() == 400);
  CHECK(opt.steps() == steps);
  t.step(x, y);
  CHECK(opt.steps() == steps + 1);
  CHECK(scaler.scale() == 2.0f * FLT_MIN);
  CHECK(state_ok(scaler));
}

// ---- 5. transforms that see the shape -----------------------------------------------------

namespace {
/// n samples of `features` floats (value = index), labels 0.
struct rows_source {
  index_t n = 8, f = 12;
  [[nodiscard]] index_t size() const { return n; }
  [[nodiscard]] index_t features() const { return f; }
  std::int64_t load(index_t i, std::span<float> x) const {
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = static_cast<float>(i * f + static_cast<index_t>(j));
    return 0;
  }
};
}  // namespace

TEST_CASE("hostile transforms: normalize with another channel count than the images is a shape_error before any batch") {
  namespace data = locus::data;
  const rows_source src{8, 3 * 4 * 4};  // 3 x 4 x 4 images: 48 floats, divisible by 1, 2, 3, 4, 6
  const data::normalize two{.mean = {0.5f, 0.5f}, .std = {0.2f, 0.2f}};
  // a loader of rows alone cannot know the channels: 48 splits into 2 planes
  data::loader<D, rows_source> rows(src, {.batch_size = 4, .transform = data::sample_transform(two)});
  // images() knows them: refused there, before the first batch
  const std::string m = message_of([&] { (void)data::images(rows, 3, 4, 4); });
  CHECK(m == "locus: data::normalize has 2 means and stds (one per channel), but the loader's samples are 3 x 4 x 4 "
             "images (48 floats) with 3 channels; give 3 values (or one for every channel)");
  int batches = 0;  // the refused images() changed nothing: the loader still runs
  for (auto& b : rows) batches += b.x.shape()[0] == 4;
  CHECK(batches == 2);
  CHECK_NOTHROW((void)data::images(rows, 2, 4, 6));  // 2 channels of 4 x 6: consistent
  // a crop or flip in the same compose declares the shape: refused by the loader itself,
  // in either order
  const data::random_crop crop{.channels = 3, .height = 4, .width = 4, .padding = 1};
  for (const bool first : {true, false}) {
    CAPTURE(first);
    const auto aug = first ? data::compose(crop, two) : data::compose(two, crop);
    CHECK_THROWS_WITH_AS((data::loader<D, rows_source>(src, {.batch_size = 4, .transform = aug})),
                         doctest::Contains("data::normalize has 2 means and stds (one per channel), but the loader's "
                                           "samples are 3 x 4 x 4 images (48 floats) with 3 channels"),
                         locus::shape_error);
  }
  // one value for every channel, or one per channel: accepted, and the values are right
  const data::normalize three{.mean = {1.0f, 2.0f, 3.0f}, .std = {2.0f, 4.0f, 8.0f}};
  data::loader<D, rows_source> good(src, {.batch_size = 8, .transform = data::compose(crop, three)});
  data::loader<D, rows_source> ok1(src, {.batch_size = 8, .transform = data::compose(crop, data::normalize{})});
  (void)ok1;
  data::loader<D, rows_source> plain(src, {.batch_size = 8});
  const auto imgs = data::images(good, 3, 4, 4);
  (void)imgs;
  std::vector<float> got, want;
  for (auto& b : good) got.assign(b.x.data_handle(), b.x.data_handle() + b.x.numel());
  index_t row = 0;
  const auto order = good.indices();
  for (auto& b : plain) {
    for (index_t i = 0; i < b.x.shape()[0]; ++i, ++row) {
      std::vector<float> s(b.x.data_handle() + i * 48, b.x.data_handle() + (i + 1) * 48);
      crop(s, {0, 0, order[static_cast<std::size_t>(row)]});
      for (index_t j = 0; j < 48; ++j) {
        const index_t c = j / 16;
        s[static_cast<std::size_t>(j)] = (s[static_cast<std::size_t>(j)] - (1.0f + static_cast<float>(c))) /
                                         (2.0f * static_cast<float>(1 << c));
      }
      want.insert(want.end(), s.begin(), s.end());
    }
  }
  REQUIRE(got.size() == want.size());
  int far = 0;
  for (std::size_t i = 0; i < got.size(); ++i) far += std::abs(got[i] - want[i]) > 1e-6f * (1.0f + std::abs(want[i]));
  CHECK(far == 0);
}

TEST_CASE("hostile transforms: crop, flip and normalize fields that cannot work are errors before any batch") {
  namespace data = locus::data;
  const rows_source src{4, 1 * 5 * 6};
  const auto refused = [&](data::sample_transform t) {
    return message_of([&] { data::loader<D, rows_source> l(src, {.batch_size = 2, .transform = t}); });
  };
  // sizes that do not match the samples, and overflowing ones
  CHECK(refused(data::random_crop{.channels = 1, .height = 5, .width = 5}).find("takes 1 x 5 x 5 samples (25 floats), "
                                                                                  "but the loader's are samples of 30 "
                                                                                  "floats") != std::string::npos);
  CHECK(refused(data::horizontal_flip{.channels = imax, .height = imax, .width = 2}).find("fits in 64 bits") !=
        std::string::npos);
  CHECK(refused(data::horizontal_flip{.channels = 0, .height = 5, .width = 6}).rfind("locus: data::horizontal_flip", 0) == 0);
  // paddings past the image, or absurd
  for (const index_t p : {index_t{5}, index_t{-1}, imax, imin, index_t{1} << 40}) {
    CAPTURE(p);
    CHECK(refused(data::random_crop{.channels = 1, .height = 5, .width = 6, .padding = p}).find("padding must be in [0, 4]") !=
          std::string::npos);
  }
  CHECK(refused(data::random_crop{.channels = 1, .height = 5, .width = 6, .fill = NAN}).find("fill must be a finite") !=
        std::string::npos);
  // probabilities outside [0, 1], NaN among them (it never flipped, silently)
  for (const float p : {-0.1f, 1.5f, NAN, INFINITY}) {
    CAPTURE(p);
    CHECK(refused(data::horizontal_flip{.channels = 1, .height = 5, .width = 6, .p = p}).find("p must be in [0, 1]") !=
          std::string::npos);
  }
  // normalize: counts, non-finite or zero stds, and counts that do not divide the sample
  CHECK(refused(data::normalize{.mean = {}, .std = {}}).find("one mean and one std") != std::string::npos);
  CHECK(refused(data::normalize{.mean = {0.f, 0.f}, .std = {1.f}}).find("2 means and 1 stds") != std::string::npos);
  CHECK(refused(data::normalize{.mean = {NAN}, .std = {1.f}}).find("mean[0] must be finite") != std::string::npos);
  for (const float s : {0.0f, -1.0f, NAN, INFINITY, 1e-40f}) {
    CAPTURE(s);
    CHECK(refused(data::normalize{.mean = {0.f}, .std = {s}}).find("std[0] must be positive") != std::string::npos);
  }
  CHECK(refused(data::normalize{.mean = {0.f, 0.f, 0.f, 0.f}, .std = {1.f, 1.f, 1.f, 1.f}})
            .find("do not split into 4 channels") != std::string::npos);
  // two shapes declared in one compose that disagree
  CHECK(refused(data::compose(data::random_crop{.channels = 1, .height = 5, .width = 6},
                              data::horizontal_flip{.channels = 1, .height = 6, .width = 5}))
            .find("data::horizontal_flip takes 1 x 6 x 5 samples") != std::string::npos);
  // a plain callable passes unchecked, as before
  CHECK(refused([](std::span<float>, const data::sample_key&) {}) == "(no error)");
  // called by hand, a transform still refuses a sample of the wrong size and bad fields
  std::vector<float> sample(30, 1.0f);
  const std::vector<float> kept = sample;
  CHECK_THROWS_AS((data::horizontal_flip{.channels = 1, .height = 5, .width = 6, .p = NAN}(sample, {})), locus::value_error);
  CHECK_THROWS_AS((data::random_crop{.channels = 1, .height = 5, .width = 6, .padding = 7}(sample, {})), locus::shape_error);
  CHECK_THROWS_AS((data::normalize{.mean = {0.f}, .std = {0.f}}(sample, {})), locus::value_error);
  CHECK(sample == kept);
}
