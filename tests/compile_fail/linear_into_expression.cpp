// expect: error: .*locus: linear_into writes into a tensor or tensor_view, but the destination is an expression
// Rule: the destination of linear_into is memory, not an expression.
#include <locus/ops/matmul.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 2>& w,
       locus::tensor<float, locus::cpu, 2>& y) {
#ifdef LOCUS_VIOLATION
  locus::linear_into(locus::relu(y), x, w);
#else
  locus::linear_into(y, x, w);
#endif
}
