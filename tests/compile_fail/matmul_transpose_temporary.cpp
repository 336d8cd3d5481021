// expect: error: .*locus: transpose\(\) of a temporary tensor would return a view of memory freed at the end of the statement
// Rule: a view never outlives its tensor: transposing a temporary does not compile.
#include <locus/ops/matmul.hpp>

float f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  auto t = locus::transpose(locus::matmul(a, b));
#else
  auto c = locus::matmul(a, b);
  auto t = locus::transpose(c);
#endif
  return t(0, 0);
}
