// expect: error: .*locus: a floating-point scalar \(locus::f16\) with an i32 tensor
// Rule: an f16 (or bf16) scalar is a floating scalar: with an integer tensor it does not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(t * locus::f16(0.5f));
#else
  return locus::eval(locus::cast<float>(t) * locus::f16(0.5f));
#endif
}
