// Scalar math shared by host and device code: the compute type of each dtype (f16
// and bf16 compute in f32), loads and stores through it, and the elementwise
// operation functors that expressions are built from. Everything here is
// LOCUS_HOST_DEVICE, so the CPU suite tests the very functors the GPU runs.
#pragma once

#include <cmath>
#include <math.h>
#include <type_traits>

#include "../core/config.hpp"
#include "../core/dtype.hpp"

namespace locus::detail {

/// The type arithmetic on dtype T is carried out in.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, std::remove_cv_t<T>>;

template <class T>
LOCUS_HOST_DEVICE inline compute_t<T> load(const T& v) {
  if constexpr (is_half_v<T>) return static_cast<float>(v);
  else return v;
}

template <class T, class C>
LOCUS_HOST_DEVICE inline T store(C v) {
  if constexpr (std::is_same_v<T, C>) return v;
  else if constexpr (is_half_v<T>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != C{};
  else return static_cast<T>(v);
}

/// An arithmetic (or f16/bf16) scalar converted to dtype T.
template <class T, class V>
LOCUS_HOST_DEVICE T scalar_cast(V v) {
  if constexpr (std::is_same_v<T, V>) return v;
  else if constexpr (is_half_v<T>) return T(static_cast<float>(v));
  else if constexpr (is_half_v<V>) return static_cast<T>(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != V{};
  else return static_cast<T>(v);
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
struct add { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return a + b; } };
struct sub { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return a - b; } };
struct mul { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return a * b; } };
struct div { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return a / b; } };
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
struct pow { template <class C> LOCUS_HOST_DEVICE C operator()(C a, C b) const { return m_pow(a, b); } };
// Comparisons (result bool)
struct eq { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a == b; } };
struct ne { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a != b; } };
struct lt { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a < b; } };
struct le { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a <= b; } };
struct gt { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a > b; } };
struct ge { template <class C> LOCUS_HOST_DEVICE bool operator()(C a, C b) const { return a >= b; } };
// Unary
struct neg { template <class C> LOCUS_HOST_DEVICE C operator()(C a) const { return -a; } };
struct abs {
  template <class C> LOCUS_HOST_DEVICE C operator()(C a) const {
    if constexpr (std::is_floating_point_v<C>) return m_fabs(a);
    else return a < C{} ? C(-a) : a;
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
