// expect: error: .*locus: cannot fill a view of const elements
// Rule: t.slice(0, 2) = 0.0f fills; a view of const elements cannot be written.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& c, locus::tensor<float, locus::cpu, 2>& t) {
#ifdef LOCUS_VIOLATION
  c.slice(0, 1) = 0.0f;
#else
  (void)c;
  t.slice(0, 1) = 0.0f;
#endif
}
