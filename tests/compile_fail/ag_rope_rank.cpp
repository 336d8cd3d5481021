// expect: error: .*locus: ag::rope needs a value of rank 2 or more: positions along axis R-2
// Rule: rope turns feature pairs by their position; a rank-1 value has no position axis.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, const locus::tensor<float, locus::cpu, 1>& x1,
       const locus::tensor<float, locus::cpu, 2>& x2) {
#ifdef LOCUS_VIOLATION
  (void)x2;
  (void)locus::ag::rope(a.leaf(x1));
#else
  (void)x1;
  (void)locus::ag::rope(a.leaf(x2));
#endif
}
