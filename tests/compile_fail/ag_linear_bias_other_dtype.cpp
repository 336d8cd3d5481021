// expect: error: .*locus: operands have different dtypes \(f32 and f64\)
// Rule: a linear's input, weight and bias share the tape's dtype.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& t, locus::ag::tape<double, locus::cpu>& u,
       const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 1>& b,
       const locus::tensor<double, locus::cpu, 1>& bd) {
  const auto xv = t.constant(x);
#ifdef LOCUS_VIOLATION
  (void)locus::ag::linear(xv, xv, u.leaf(bd));
#else
  (void)bd;
  (void)u;
  (void)locus::ag::linear(xv, xv, t.leaf(b));
#endif
}
