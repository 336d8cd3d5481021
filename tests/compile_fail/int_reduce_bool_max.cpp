// expect: error: .*locus: max, min, argmax and argmin of a bool tensor are not defined; count with locus::sum\(mask\)
// Rule: max/min/argmax/argmin of a bool mask do not compile; sum counts it (an i64).
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& x) {
#ifdef LOCUS_VIOLATION
  return locus::max(x > 0.0f);
#else
  return locus::sum(x > 0.0f).item() + locus::max(locus::cast<locus::i32>(x > 0.0f)).item();
#endif
}
