// expect: error: .*locus: operands have different dtypes \(f32 and bf16\)
// Rule: attention's q, k and v are values of one dtype (one precision policy).
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<locus::bf16, locus::cpu>& b,
       const locus::tensor<float, locus::cpu, 4>& x, const locus::tensor<locus::bf16, locus::cpu, 4>& y) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x), a.leaf(x), b.leaf(y));
#else
  (void)b.leaf(y);
  (void)locus::ag::scaled_dot_product_attention(a.leaf(x), a.leaf(x), a.leaf(x), {.causal = true});
#endif
}
