// expect: error: .*locus: a const tensor gives a read-only view, not a mutable one
// Rule: a const tensor gives only views of const elements.
#include <locus/tensor/tensor.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v = t; (void)v;
#else
  locus::tensor_view<const float, locus::cpu, 1> v = t; (void)v;
#endif
}
