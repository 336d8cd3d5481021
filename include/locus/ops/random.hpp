// Counter-based random numbers (Philox4x32-10, the generator behind cuRAND and
// PyTorch's CUDA RNG). Element i of a tensor is a pure function of (seed, i), so the
// same seed gives the same numbers on every device and for every thread count:
// uniform values bit for bit, normal values up to the last bit of the platform's
// log/cos (computed in f64, then rounded).
#pragma once

#include <cmath>
#include <math.h>
#include <cstdint>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/dtype.hpp"

namespace locus::detail {

struct philox_out {
  std::uint32_t v[4];
};

LOCUS_HOST_DEVICE inline std::uint32_t mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  return static_cast<std::uint32_t>(p);
}

/// Philox4x32 with 10 rounds (Salmon et al., SC'11), key = seed, counter = (index, stream).
LOCUS_HOST_DEVICE inline philox_out philox4x32(std::uint64_t seed, std::uint64_t counter,
                                                std::uint64_t stream = 0) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(stream), c3 = static_cast<std::uint32_t>(stream >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    std::uint32_t hi0, hi1;
    const std::uint32_t lo0 = mulhilo(0xD2511F53u, c0, hi0);
    const std::uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, hi1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// Uniform in [0, 1) with 24 random bits (float) or 53 (double): exact on every device.
LOCUS_HOST_DEVICE inline float uniform_float(std::uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}
LOCUS_HOST_DEVICE inline double uniform_double(std::uint32_t a, std::uint32_t b) {
  const std::uint64_t bits = (static_cast<std::uint64_t>(a) << 21) ^ (b >> 11);
  return static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) * (1.0 / 9007199254740992.0);
}

template <class T>
LOCUS_HOST_DEVICE inline T from_double(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(static_cast<float>(v));
}

/// The bits of the IEEE formats a random draw lands in (f32, f64, f16, bf16).
template <class T>
struct ieee_bits;
template <>
struct ieee_bits<float> {
  using U = std::uint32_t;
  LOCUS_HOST_DEVICE static constexpr U get(float x) noexcept { return f32_to_bits(x); }
  LOCUS_HOST_DEVICE static constexpr float make(U u) noexcept { return f32_from_bits(u); }
};
template <>
struct ieee_bits<double> {
  using U = std::uint64_t;
  LOCUS_HOST_DEVICE static constexpr U get(double x) noexcept { return f64_to_bits(x); }
  LOCUS_HOST_DEVICE static constexpr double make(U u) noexcept { return __builtin_bit_cast(double, u); }
};
template <class H>
  requires is_half_v<H>
struct ieee_bits<H> {
  using U = std::uint16_t;
  LOCUS_HOST_DEVICE static constexpr U get(H x) noexcept { return x.bits; }
  LOCUS_HOST_DEVICE static constexpr H make(U u) noexcept { return H::from_bits(u); }
};

/// The neighbour of a finite x one unit in the last place up or down (from +-0: the
/// smallest subnormal of that sign), by stepping the bits: the same on every device,
/// and no nextafter for f16 / bf16 needed.
template <class T>
LOCUS_HOST_DEVICE constexpr T ulp_step(T x, bool up) noexcept {
  using B = ieee_bits<T>;
  using U = typename B::U;
  constexpr U sign = static_cast<U>(U{1} << (sizeof(U) * 8 - 1));
  const U b = B::get(x);
  if (static_cast<U>(b & static_cast<U>(~sign)) == 0) return B::make(up ? U{1} : static_cast<U>(sign | U{1}));
  const bool negative = (b & sign) != 0;
  return B::make(negative == up ? static_cast<U>(b - 1) : static_cast<U>(b + 1));
}

/// v rounded to T (to nearest), for T a floating dtype.
template <class T>
LOCUS_HOST_DEVICE constexpr T round_to(double v) noexcept {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(v);
}
/// The smallest value of T at or above lo and the largest below hi (lo, hi inside T's
/// finite range): the ends a draw of [lo, hi) may take once rounded to T.
template <class T>
LOCUS_HOST_DEVICE constexpr double smallest_at_least(double lo) noexcept {
  T t = round_to<T>(lo);
  if (static_cast<double>(t) < lo) t = ulp_step(t, true);
  return static_cast<double>(t);
}
template <class T>
LOCUS_HOST_DEVICE constexpr double largest_below(double hi) noexcept {
  T t = round_to<T>(hi);
  if (static_cast<double>(t) >= hi) t = ulp_step(t, false);
  return static_cast<double>(t);
}
/// The largest finite value of T.
template <class T>
constexpr double finite_max() noexcept {
  if constexpr (std::is_same_v<T, double>) return 1.7976931348623157e308;
  else if constexpr (std::is_same_v<T, float>) return 3.4028234663852886e38;
  else return static_cast<double>(T::from_bits(std::is_same_v<T, f16> ? 0x7bffu : 0x7f7fu));
}

/// The largest |z| normal_fill's Box-Muller can give: sqrt(-2 ln 2^-53) (u1 >= 2^-53,
/// |cos| <= 1), rounded up. randn's bounds check uses it, so every draw is finite.
inline constexpr double normal_z_max = 8.5717;

/// dst[i] = lo + (hi - lo) * U(seed, i), computed in f64 (f64) or f32 (the others),
/// then rounded to T and kept inside [first, last]: the smallest and largest values of
/// T in [lo, hi), computed by the caller (rand), so a draw that rounds up to hi (or
/// below lo) becomes the nearest value inside the range, on every device.
template <class T>
struct uniform_fill {
  T* dst;
  std::uint64_t seed;
  double lo, hi;
  double first, last;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i));
    if constexpr (std::is_same_v<T, double>) {
      const double v = ::fma(hi - lo, uniform_double(r.v[0], r.v[1]), lo);  // explicit: no contraction differences
      dst[i] = v < first ? first : v > last ? last : v;
    } else {
      const float u = uniform_float(r.v[0]);
      float v = ::fmaf(static_cast<float>(hi - lo), u, static_cast<float>(lo));
      // first and last are values of T, exact in f32: rounding a v between them to T
      // stays between them (rounding is monotone)
      const float f = static_cast<float>(first), l = static_cast<float>(last);
      v = v < f ? f : v > l ? l : v;
      if constexpr (std::is_same_v<T, float>) dst[i] = v;
      else dst[i] = T(v);
    }
  }
};

/// dst[i] = mean + std * N(seed, i), Box-Muller in f64.
template <class T>
struct normal_fill {
  T* dst;
  std::uint64_t seed;
  double mean, stddev;
  LOCUS_HOST_DEVICE void operator()(index_t i) const {
    const philox_out r = philox4x32(seed, static_cast<std::uint64_t>(i), 1);
    const double u1 = 1.0 - uniform_double(r.v[0], r.v[1]);  // (0, 1]
    const double u2 = uniform_double(r.v[2], r.v[3]);
    const double z = ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
    dst[i] = from_double<T>(::fma(stddev, z, mean));
  }
};

}  // namespace locus::detail
