// expect: error: .*locus: item\(\) reads a rank-0 tensor, but this one has rank >= 1; index the element with t\(i, \.\.\.\)
// Rule: item() reads the single element of a rank-0 tensor; on rank > 0 it would be a
// guess (the first element? a size check at run time?).
#include <locus/tensor/tensor.hpp>

float first(const locus::tensor<float, locus::cpu, 1>& a, const locus::tensor<float, locus::cpu, 0>& s) {
#ifdef LOCUS_VIOLATION
  (void)s;
  return a.item();
#else
  (void)a;
  return s.item();
#endif
}
