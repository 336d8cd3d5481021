// expect: error: .*locus: operands live on different devices \(cpu and pinned\)
// Rule: attention's q, k and v live on one device.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<float, locus::pinned>& b,
       const locus::tensor<float, locus::cpu, 4>& x, const locus::tensor<float, locus::pinned, 4>& y) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x), b.leaf(y), a.leaf(x));
#else
  (void)b.leaf(y);
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x), a.leaf(x), a.leaf(x));
#endif
}
