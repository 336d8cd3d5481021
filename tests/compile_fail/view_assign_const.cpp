// expect: error: .*locus: assigning to a view of const elements
// Rule: a view of const elements is read-only, also when it is a temporary.
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& c, locus::tensor<float, locus::cpu, 2>& d,
       locus::tensor<float, locus::cpu, 2>& u) {
#ifdef LOCUS_VIOLATION
  c.slice(0, 2) = u.slice(0, 2);
#else
  d.slice(0, 2) = c.slice(0, 2);
#endif
}
