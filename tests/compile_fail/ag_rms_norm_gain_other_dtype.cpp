// expect: error: .*locus: operands have different dtypes \(f32 and f64\)
// Rule: rms_norm's gain has the dtype of the value it scales.
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& a, locus::ag::tape<double, locus::cpu>& b,
       const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 1>& w,
       const locus::tensor<double, locus::cpu, 1>& wd) {
#ifdef LOCUS_VIOLATION
  (void)w;
  (void)locus::ag::rms_norm(a.leaf(x), b.leaf(wd), 1e-6);
#else
  (void)b.leaf(wd);
  (void)locus::ag::rms_norm(a.leaf(x), a.leaf(w), 1e-6);
#endif
}
