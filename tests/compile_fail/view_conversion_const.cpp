// expect: error: .*locus: a view of const elements does not convert to a mutable view
// Rule: constness is never dropped by a view conversion.
#include <locus/tensor/tensor.hpp>

void f(locus::tensor_view<const float, locus::cpu, 1> c) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v = c; (void)v;
#else
  locus::tensor_view<const float, locus::cpu, 1> v = c; (void)v;
#endif
}
