// expect: error: .*locus: assigning to a temporary tensor is lost with it
// Rule: t.clone() = e writes into a temporary that is freed at the ';'.
#include <locus/locus.hpp>

void f(locus::tensor<float, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  t.clone() = t * 2.0f;
#else
  t = t * 2.0f;
#endif
}
