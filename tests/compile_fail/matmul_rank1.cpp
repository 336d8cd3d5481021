// expect: error: .*locus: matmul needs two rank-2 operands .* or two rank-3 operands .*, but got ranks 1 and 1; reshape first
// Rule: matmul of two vectors does not compile (a dot, an outer or a matrix-vector
// product would be a guess); reshape them into a row and a column.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& a, const locus::tensor<float, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  return locus::matmul(a, b);
#else
  return locus::matmul(a.reshape({1, 3}), b.reshape({3, 1}));
#endif
}
