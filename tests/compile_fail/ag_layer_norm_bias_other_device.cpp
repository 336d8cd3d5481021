// expect: error: .*locus: operands live on different devices \(cpu and pinned\)
// Rule: layer_norm's gain and bias live on the device of the value they scale and shift.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<float, locus::pinned>& b,
       const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 1>& w,
       const locus::tensor<float, locus::pinned, 1>& wp) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::layer_norm(a.leaf(x), a.leaf(w), b.leaf(wp), 1e-5);
#else
  (void)b.leaf(wp);
  (void)locus::ag::layer_norm(a.leaf(x), a.leaf(w), a.leaf(w), 1e-5);
#endif
}
