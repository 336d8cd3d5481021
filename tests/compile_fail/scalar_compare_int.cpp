// expect: error: .*locus: a floating-point scalar \(float\) with an i32 tensor
// Rule: comparing an integer tensor with a floating scalar does not compile (i32 > 10.5f compared with 10).
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(t > 10.5f);
#else
  return locus::eval(locus::cast<float>(t) > 10.5f);
#endif
}
