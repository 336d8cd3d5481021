// expect: error: .*locus: the destination of matmul_into/linear_into is a temporary tensor
// Rule: a product written into a temporary tensor is lost with it.
#include <locus/ops/matmul.hpp>
#include <locus/tensor/factories.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor<float, locus::cpu, 2>& c) {
#ifdef LOCUS_VIOLATION
  locus::matmul_into(locus::zeros<float, locus::cpu>({2, 2}), a, a);
#else
  locus::matmul_into(c, a, a);
#endif
}
