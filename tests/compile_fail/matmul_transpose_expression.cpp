// expect: error: .*locus: transpose\(\) takes a tensor or tensor_view .*evaluate the expression first
// Rule: transpose() is a view of memory (strides swapped); an expression has none.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::transpose(a + b);
#else
  (void)b;
  return locus::transpose(a);
#endif
}
