// expect: error: .*locus: linear needs a bias of rank 1 .\[M\]: one value per output feature.; flatten it first
// Rule: the bias of linear is one value per output feature, not a matrix broadcast
// against the output.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 2>& w,
       const locus::tensor<float, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::linear(x, w, b);
#else
  return locus::linear(x, w, b.reshape({b.numel()}));
#endif
}
