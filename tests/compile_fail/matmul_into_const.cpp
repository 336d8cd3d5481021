// expect: error: .*locus: matmul_into destination is const \(a const tensor or a view of const elements\); pass a mutable tensor or tensor_view
// Rule: a view of const elements is read-only: matmul_into does not write through it.
#include <locus/ops/matmul.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b,
       const locus::tensor<float, locus::cpu, 2>& c, locus::tensor<float, locus::cpu, 2>& d) {
#ifdef LOCUS_VIOLATION
  (void)d;
  locus::matmul_into(c.view(), a, b);
#else
  (void)c;
  locus::matmul_into(d.view(), a, b);
#endif
}
