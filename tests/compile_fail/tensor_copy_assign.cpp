// expect: error: .*locus: tensor is move-only, copying it would duplicate its memory; write t = u.clone\(\) for a deep copy
// Rule: no hidden deep copies: copy assignment does not compile either.
#include <locus/transfer/copy.hpp>

void f(locus::tensor<float, locus::cpu, 1>& t, locus::tensor<float, locus::cpu, 1>& u) {
#ifdef LOCUS_VIOLATION
  t = u;
#else
  t = u.clone();
#endif
}
