// expect: error: .*locus: slice\(\) needs rank >= 1 .*but this tensor has rank 0
// Rule: slice(begin, end) takes rows along axis 0, which a rank-0 tensor does not have.
#include <locus/tensor/tensor.hpp>

auto rows(const locus::tensor<float, locus::cpu, 0>& s, const locus::tensor<float, locus::cpu, 1>& v) {
#ifdef LOCUS_VIOLATION
  (void)v;
  return s.slice(0, 1);
#else
  (void)s;
  return v.slice(0, 1);
#endif
}
