// expect: error: .*locus: transpose\(\) swaps the last two axes, so it needs rank 2 or more
// Rule: transposing a vector would be a no-op in disguise; make it a row or column.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& v) {
#ifdef LOCUS_VIOLATION
  return locus::transpose(v);
#else
  return locus::transpose(v.reshape({1, v.numel()}));
#endif
}
