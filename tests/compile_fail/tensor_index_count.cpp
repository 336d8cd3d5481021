// expect: error: .*locus: element access takes exactly one index per axis, but the number of indices differs from the tensor.s rank
// Rule: t(i, j, ...) takes one index per axis; a missing or extra index is not silently
// read as a flat offset.
#include <locus/tensor/tensor.hpp>

float read(const locus::tensor<float, locus::cpu, 2>& a) {
#ifdef LOCUS_VIOLATION
  return a(3);
#else
  return a(0, 3);
#endif
}
