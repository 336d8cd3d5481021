// expect: error: .*locus: indices must be integers, but an index has a floating-point .*static_cast<locus::index_t>
// Rule: an index is an integer; a floating-point index is never truncated silently.
#include <locus/tensor/tensor.hpp>

float read(const locus::tensor<float, locus::cpu, 1>& a, double x) {
#ifdef LOCUS_VIOLATION
  return a(x * 2.0);
#else
  return a(static_cast<locus::index_t>(x * 2.0));
#endif
}
