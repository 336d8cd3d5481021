// expect: error: .*locus: matmul_into writes into a tensor or tensor_view, but the destination is an expression
// Rule: the destination of matmul_into is memory, not an expression.
#include <locus/ops/matmul.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b,
       locus::tensor<float, locus::cpu, 2>& c) {
#ifdef LOCUS_VIOLATION
  locus::matmul_into(c * 2.0f, a, b);
#else
  locus::matmul_into(c, a, b);
#endif
}
