// expect: error: .*locus: operands have different dtypes \(f32 and f64\)
// Rule: ag::concat joins values of one dtype (one precision policy).
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<double, locus::cpu>& b,
       const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<double, locus::cpu, 2>& y) {
#ifdef LOCUS_VIOLATION
  (void)locus::ag::concat(1, a.leaf(x), b.leaf(y));
#else
  (void)b.leaf(y);
  (void)locus::ag::concat(1, a.leaf(x), a.leaf(x));
#endif
}
