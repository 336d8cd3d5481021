// expect: error: .*locus: a floating-point scalar \(double\) with an i32 tensor
// Rule: where() with an integer tensor and a floating scalar does not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(locus::where(t > 0, t, 0.5));
#else
  return locus::eval(locus::where(t > 0, locus::cast<double>(t), 0.5));
#endif
}
