// expect: error: .*locus: matmul_into destination is const \(a const tensor or a view of const elements\); pass a mutable tensor or tensor_view
// Rule: a const tensor is read-only: matmul_into does not write into it (std::as_const(c)).
#include <utility>

#include <locus/ops/matmul.hpp>

void f(locus::tensor<float, locus::cpu, 2>& c, const locus::tensor<float, locus::cpu, 2>& a) {
#ifdef LOCUS_VIOLATION
  locus::matmul_into(std::as_const(c), a, a);
#else
  locus::matmul_into(c, a, a);
#endif
}
