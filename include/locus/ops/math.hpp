// Scalar math shared by host and device code: the compute type of each dtype (f16
// and bf16 compute in f32), loads and stores through it, and the elementwise
// operation functors that expressions are built from. Everything here is
// LOCUS_HOST_DEVICE, so the CPU suite tests the very functors the GPU runs.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <math.h>
#include <limits>
#include <string>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"


namespace locus::detail {

// ---- integers: two's complement wrapping and saturating float conversion ---------------
// Signed arithmetic goes through the unsigned type, where overflow is defined (modulo
// 2^N), and back (a conversion C++20 defines as modulo 2^N): INT_MAX + 1 == INT_MIN,
// -INT_MIN == INT_MIN, as in PyTorch. u8 and bool arithmetic promote to int, which
// cannot overflow for one operation, and convert back modulo 2^8 (bool: != 0).
template <class C>
inline constexpr bool is_signed_int_v = std::is_integral_v<C> && std::is_signed_v<C>;

template <class C>
LOCUS_HOST_DEVICE constexpr C wrap_add(C a, C b) {
  if constexpr (is_signed_int_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return static_cast<C>(a + b);
  }
}
template <class C>
LOCUS_HOST_DEVICE constexpr C wrap_sub(C a, C b) {
  if constexpr (is_signed_int_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return static_cast<C>(a - b);
  }
}
template <class C>
LOCUS_HOST_DEVICE constexpr C wrap_mul(C a, C b) {
  if constexpr (is_signed_int_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return static_cast<C>(a * b);
  }
}
template <class C>
LOCUS_HOST_DEVICE constexpr C wrap_neg(C a) {
  if constexpr (is_signed_int_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(U(0) - static_cast<U>(a)));
  } else {
    return static_cast<C>(-a);
  }
}
/// a / b truncated toward zero (C++ and torch.div(rounding_mode="trunc")); MIN / -1
/// wraps to MIN. A zero divisor never gets here: evaluation checks the divisor first
/// and throws value_error (the 0 returned for it only keeps the kernel free of a trap).
template <class C>
LOCUS_HOST_DEVICE constexpr C int_div(C a, C b) {
  if (b == C(0)) return C(0);
  if constexpr (is_signed_int_v<C>) {
    if (b == C(-1)) return wrap_neg(a);
  }
  return static_cast<C>(a / b);
}
/// a to the power b by squaring, wrapping like repeated multiplication. A negative b
/// gives what PyTorch's integer pow gives: 1 for a == 1, +-1 for a == -1, else 0 (a
/// negative *scalar* exponent is refused before this, as PyTorch refuses it).
template <class C>
LOCUS_HOST_DEVICE constexpr C int_pow(C a, C b) {
  if constexpr (is_signed_int_v<C>) {
    if (b < C(0)) {
      if (a == C(1)) return C(1);
      if (a == C(-1)) return (b & C(1)) ? C(-1) : C(1);
      return C(0);
    }
  }
  using U = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;
  U base = static_cast<U>(a), result = 1;
  for (U e = static_cast<U>(b); e != 0; e >>= 1) {
    if (e & 1u) result *= base;
    base *= base;
  }
  return static_cast<C>(result);
}

/// Floating value -> integer dtype T, defined for every input (C++ leaves out-of-range
/// conversions undefined, and so does PyTorch): NaN -> 0, truncation toward zero,
/// saturation at T's range (+-inf included). The same rule as CUDA's cvt.rzi.sat and
/// Rust's `as`. bool is v != 0.
template <class T, class F>
LOCUS_HOST_DEVICE constexpr T saturate_cast(F v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != F(0);
  } else {
    using L = std::numeric_limits<T>;
    // 2^digits: one past T's maximum, exact in every floating type locus has.
    constexpr F two_pow = F(L::max() / 2 + 1) * F(2);
    if (v != v) return T(0);
    if (v >= two_pow) return L::max();
    if constexpr (L::is_signed) {
      if (v <= -two_pow) return L::min();
    } else {
      if (v <= F(-1)) return T(0);
    }
    return static_cast<T>(v);
  }
}

/// The type arithmetic on dtype T is carried out in.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, std::remove_cv_t<T>>;

template <class T>
LOCUS_HOST_DEVICE inline compute_t<T> load(const T& v) {
  if constexpr (is_half_v<T>) return static_cast<float>(v);
  else return v;
}

/// A compute value stored as dtype T: rounded to nearest even into f16/bf16, != 0 into
/// bool, saturated (NaN -> 0) from floating into integers, modulo 2^N between integers.
template <class T, class C>
LOCUS_HOST_DEVICE inline T store(C v) {
  if constexpr (std::is_same_v<T, C>) return v;
  else if constexpr (is_half_v<T>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != C{};
  else if constexpr (std::is_integral_v<T> && std::is_floating_point_v<C>) return saturate_cast<T>(v);
  else return static_cast<T>(v);
}

/// An arithmetic (or f16/bf16) scalar converted to dtype T (by store's rules).
template <class T, class V>
LOCUS_HOST_DEVICE T scalar_cast(V v) {
  if constexpr (std::is_same_v<T, V>) return v;
  else if constexpr (is_half_v<T>) return T(static_cast<float>(v));
  else if constexpr (is_half_v<V>) return store<T>(static_cast<float>(v));
  else return store<T>(v);
}

// ---- host checks of values entering an integer dtype (scalars, fills, arange) --------

/// Does the integer (or bool) value s lie in the range of dtype T (an integer or bool
/// dtype: bool holds 0 and 1)? Compared as signed or unsigned long long, so that no
/// conversion can wrap on the way.
template <class T, class S>
constexpr bool integer_fits(S s) {
  using L = std::numeric_limits<T>;
  if constexpr (std::is_same_v<S, bool>) {
    return true;
  } else if constexpr (std::is_signed_v<S>) {
    const long long v = s;
    return v >= static_cast<long long>(L::min()) && v <= static_cast<long long>(L::max());
  } else {
    const unsigned long long v = s;
    return v <= static_cast<unsigned long long>(L::max());
  }
}

/// Does the double v name a whole number in the range of integer (or bool) dtype T?
template <class T>
bool whole_number_fits(double v) {
  using L = std::numeric_limits<T>;
  if (!(v - v == 0.0) || std::trunc(v) != v) return false;  // NaN, +-inf, a fraction
  // max() + 1 as a double is exact (a power of two) for every integer dtype; max() itself
  // may not be (i64).
  const double above = static_cast<double>(L::max() / 2 + 1) * 2.0;
  return v >= static_cast<double>(L::min()) && v < above;
}

/// A double as a message shows it: shortest round-trip form ("2.5", "0", "1e+300"),
/// in a buffer (messages pass .s to %s).
struct number_chars {
  char s[32];
  explicit number_chars(double v) noexcept {
    if (std::trunc(v) == v && std::fabs(v) < 1e15) {
      std::snprintf(s, sizeof s, "%.0f", v);
      return;
    }
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(s, sizeof s, "%.*g", digits, v);
      if (std::strtod(s, nullptr) == v || v != v) break;
    }
  }
};

inline std::string number_string(double v) { return number_chars(v).s; }

/// "0 to 255": the range of integer (or bool) dtype T, for messages.
template <class T>
std::string dtype_range_string() {
  using L = std::numeric_limits<T>;
  return std::to_string(static_cast<long long>(L::min())) + " to " + std::to_string(static_cast<long long>(L::max()));
}

/// The integer dtype a value outside T's range might be computed in instead, as
/// locus code spells it (for messages).
template <class T>
const char* wider_dtype_spelling() {
  if constexpr (sizeof(T) < 4) return "locus::i32";
  else if constexpr (sizeof(T) == 4) return "locus::i64";
  else return "locus::f64";
}

// One overload set per function, float and double, mapping to the C library names that
// exist on both host and device.
#define LOCUS_DETAIL_MATH1(NAME, FN)                                         \
  LOCUS_HOST_DEVICE inline float NAME(float x) { return ::FN##f(x); }      \
  LOCUS_HOST_DEVICE inline double NAME(double x) { return ::FN(x); }
LOCUS_DETAIL_MATH1(m_exp, exp)
LOCUS_DETAIL_MATH1(m_log, log)
LOCUS_DETAIL_MATH1(m_sqrt, sqrt)
LOCUS_DETAIL_MATH1(m_tanh, tanh)
LOCUS_DETAIL_MATH1(m_erf, erf)
LOCUS_DETAIL_MATH1(m_erfc, erfc)
LOCUS_DETAIL_MATH1(m_fabs, fabs)
LOCUS_DETAIL_MATH1(m_sin, sin)
LOCUS_DETAIL_MATH1(m_cos, cos)
#undef LOCUS_DETAIL_MATH1
LOCUS_HOST_DEVICE inline float m_pow(float x, float y) { return ::powf(x, y); }
LOCUS_HOST_DEVICE inline double m_pow(double x, double y) { return ::pow(x, y); }

template <class C>
LOCUS_HOST_DEVICE inline bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return v != v;
  else return false;
}

namespace op {
// Binary arithmetic
// (integers wrap in two's complement; see wrap_add)
struct add { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return wrap_add(a, b); } };
struct sub { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return wrap_sub(a, b); } };
struct mul { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return wrap_mul(a, b); } };
struct div {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return int_div(a, b);
    else return a / b;
  }
};
/// NaN-propagating maximum and minimum (like torch.maximum).
struct maximum {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const {
    return is_nan(a) ? a : is_nan(b) ? b : (a < b ? b : a);
  }
};
struct minimum {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const {
    return is_nan(a) ? a : is_nan(b) ? b : (b < a ? b : a);
  }
};
struct pow {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return int_pow(a, b);
    else return m_pow(a, b);
  }
};
// Comparisons (result bool)
struct eq { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a == b; } };
struct ne { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a != b; } };
struct lt { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a < b; } };
struct le { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a <= b; } };
struct gt { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a > b; } };
struct ge { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a >= b; } };
// Unary
struct neg { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return wrap_neg(a); } };
/// |a|; abs(INT_MIN) wraps to INT_MIN, as in PyTorch.
struct abs {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a) const {
    if constexpr (std::is_floating_point_v<C>) return m_fabs(a);
    else return a < C{} ? wrap_neg(a) : a;
  }
};
struct exp { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return m_exp(a); } };
struct log { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return m_log(a); } };
struct sqrt { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return m_sqrt(a); } };
struct rsqrt { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return C(1) / m_sqrt(a); } };
struct tanh { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return m_tanh(a); } };
struct sigmoid {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return C(1) / (C(1) + m_exp(-a)); }
};
/// max(x, 0); NaN stays NaN.
struct relu { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return a < C(0) ? C(0) : a; } };
/// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
/// computed as x / (1 + exp(-2u)) (the same function): 1 + tanh(u) would cancel for
/// negative x and lose most of the digits of the small result.
struct gelu_tanh {
  template <class C> LOCUS_HOST_DEVICE C operator()(C x) const {
    const C k = C(0.7978845608028654);
    const C u = k * (x + C(0.044715) * x * x * x);
    return x / (C(1) + m_exp(C(-2) * u));
  }
};
/// GELU, exact: 0.5 x (1 + erf(x / sqrt 2)), computed as 0.5 x erfc(-x / sqrt 2) (the same
/// function), which keeps its relative accuracy where 1 + erf would cancel (x < 0).
struct gelu_erf {
  template <class C> LOCUS_HOST_DEVICE C operator()(C x) const {
    return C(0.5) * x * m_erfc(x * C(-0.7071067811865476));
  }
};
}  // namespace op

}  // namespace locus::detail
