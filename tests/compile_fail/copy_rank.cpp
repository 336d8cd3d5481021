// expect: error: .*locus: copy between tensors of different rank .2 and 3.; reshape one side first
// Rule: copy needs the same rank on both sides.
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor<float, locus::cpu, 3>& b,
       locus::tensor<float, locus::cpu, 2>& c) {
#ifdef LOCUS_VIOLATION
  (void)c;
  locus::copy(a, b);
#else
  (void)b;
  locus::copy(a, c);
#endif
}
