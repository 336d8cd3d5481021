// expect: error: .*locus: a floating-point scalar \(double\) with an i32 tensor
// Rule: pow of an integer tensor with a floating exponent does not compile (an integer exponent does: pow(t, 2)).
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(locus::pow(t, 0.5));
#else
  return locus::eval(locus::pow(t, 2) + locus::pow(2, t));
#endif
}
