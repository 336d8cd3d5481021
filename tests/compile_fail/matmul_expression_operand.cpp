// expect: error: .*locus: matmul takes tensors or tensor_views; evaluate an expression first with locus::eval\(x\)
// Rule: a GEMM reads memory; a lazy expression is evaluated explicitly first.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::matmul(locus::relu(a), b);
#else
  const auto ra = locus::eval(locus::relu(a));
  return locus::matmul(ra, b);
#endif
}
