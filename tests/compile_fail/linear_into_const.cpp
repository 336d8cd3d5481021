// expect: error: .*locus: linear_into destination is const \(a const tensor or a view of const elements\); pass a mutable tensor or tensor_view
// Rule: a view of const elements is read-only: linear_into does not write through it.
#include <locus/ops/matmul.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 2>& w,
       const locus::tensor<float, locus::cpu, 2>& y, locus::tensor<float, locus::cpu, 2>& z) {
#ifdef LOCUS_VIOLATION
  (void)z;
  locus::linear_into(y.view(), x, w);
#else
  (void)y;
  locus::linear_into(z.view(), x, w);
#endif
}
