// expect: error: .*locus: cannot assign an f32 expression to an f64 tensor; dtypes never convert silently: write dst = locus::cast<locus::f64>\(e\)
// Rule: writing an expression into a tensor of another dtype is a conversion, and
// conversions are explicit; the control writes what the message suggests.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor<double, locus::cpu, 2>& dst) {
#ifdef LOCUS_VIOLATION
  dst = a * 2.0f;
#else
  dst = locus::cast<locus::f64>(a * 2.0f);
#endif
}
