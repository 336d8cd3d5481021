// expect: error: .*locus: an axis reduction needs rank >= 1, but this tensor has rank 0 .*reduce the whole tensor instead
// Rule: a rank-0 tensor has no axis to reduce along.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 0>& s) {
#ifdef LOCUS_VIOLATION
  return locus::sum(s, 0);
#else
  return locus::sum(s);
#endif
}
