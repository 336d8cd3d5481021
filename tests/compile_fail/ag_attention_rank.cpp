// expect: error: .*locus: ag::scaled_dot_product_attention takes rank-4 values q \[B, H, Tq, E\]
// Rule: attention takes [B, H, T, E] values; a [B, T, C] value must be split into heads first.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, const locus::tensor<float, locus::cpu, 3>& x3,
       const locus::tensor<float, locus::cpu, 4>& x4) {
#ifdef LOCUS_VIOLATION
  (void)x4;
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x3), a.leaf(x3), a.leaf(x3));
#else
  (void)x3;
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x4), a.leaf(x4), a.leaf(x4));
#endif
}
