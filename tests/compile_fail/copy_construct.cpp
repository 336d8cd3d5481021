// expect: error: .*locus: tensor is move-only, copying it would duplicate its memory; write t.clone\(\) for a deep copy
// Rule: no hidden deep copies: tensor is move-only.
#include <locus/transfer/copy.hpp>

locus::tensor<float, locus::cpu, 1> f(locus::tensor<float, locus::cpu, 1>& a) {
#ifdef LOCUS_VIOLATION
  locus::tensor<float, locus::cpu, 1> b = a;
#else
  locus::tensor<float, locus::cpu, 1> b = a.clone();
#endif
  return b;
}
