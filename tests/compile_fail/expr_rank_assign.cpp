// expect: error: .*locus: destination has rank 1 but the source has rank 2
// Rule: a tensor takes an expression of its own rank (reshape to change rank).
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor<float, locus::cpu, 1>& v) {
#ifdef LOCUS_VIOLATION
  v = a * 2.0f;
#else
  v = a.reshape({a.numel()}) * 2.0f;
#endif
}
