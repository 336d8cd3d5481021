// expect: error: .*locus: a floating-point scalar \(float\) with a bool tensor would be converted to bool, becoming true or false
// Rule: a floating scalar with a bool tensor does not compile (mask * 0.5f would be mask).
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& x) {
#ifdef LOCUS_VIOLATION
  return locus::eval((x > 0.0f) * 0.5f);
#else
  return locus::eval(locus::cast<float>(x > 0.0f) * 0.5f);
#endif
}
