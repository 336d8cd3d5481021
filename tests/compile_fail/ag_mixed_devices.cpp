// expect: error: .*locus: operands live on different devices \(cpu and pinned\)
// Rule: differentiable values of two devices never meet in one operation.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<float, locus::pinned>& b,
       const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::pinned, 2>& y,
       const locus::tensor<float, locus::cpu, 2>& z) {
#ifdef LOCUS_VIOLATION
  (void)(a.leaf(x) + b.leaf(y));
#else
  (void)b.leaf(y);
  (void)(a.leaf(x) + a.leaf(z));
#endif
}
