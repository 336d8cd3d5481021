// expect: error: .*locus: cannot swap tensors of different devices, dtypes or ranks
// Rule: swap (found by ADL) exchanges tensors of one type only.
#include <locus/tensor/tensor.hpp>

void f(locus::tensor<float, locus::cpu, 1>& a, locus::tensor<float, locus::cuda, 1>& g, locus::tensor<float, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  using std::swap; swap(a, g); (void)b;
#else
  using std::swap; swap(a, b); (void)g;
#endif
}
