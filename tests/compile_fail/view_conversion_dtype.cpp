// expect: error: .*locus: a view of f64 elements cannot be a view of f32 elements; views never reinterpret memory
// Rule: a view conversion never reinterprets elements as another dtype.
#include <locus/tensor/tensor.hpp>

void f(locus::tensor_view<double, locus::cpu, 1> d) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v = d; (void)v;
#else
  locus::tensor_view<const double, locus::cpu, 1> v = d; (void)v;
#endif
}
