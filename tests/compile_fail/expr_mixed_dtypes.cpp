// expect: error: .*locus: operands have different dtypes .f32 and bf16.; convert one explicitly with locus::cast<locus::bf16>
// Rule: an operation on f32 and bf16 operands does not compile; cast<T> converts.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& a, const locus::tensor<locus::bf16, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  return a + b;
#else
  return a + locus::cast<float>(b);
#endif
}
