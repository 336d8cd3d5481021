// expect: error: .*locus: operands have different dtypes \(f64 and f32\)
// Rule: a tape holds values of one dtype (its policy's compute dtype).
#include <locus/ag/tape.hpp>

void f(locus::ag::tape<float, locus::cpu>& t, const locus::tensor<double, locus::cpu, 2>& d,
       const locus::tensor<float, locus::cpu, 2>& x) {
#ifdef LOCUS_VIOLATION
  (void)t.leaf(d);
#else
  (void)d;
  (void)t.leaf(x);
#endif
}
