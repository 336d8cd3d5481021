// expect: error: .*locus: copy destination is a view of const elements; pass a tensor or a mutable tensor_view
// Rule: a view of const elements is read-only: copy() does not write through it.
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& src, const locus::tensor<float, locus::cpu, 1>& c,
       locus::tensor<float, locus::cpu, 1>& m) {
#ifdef LOCUS_VIOLATION
  (void)m;
  locus::copy(src, c.view());
#else
  (void)c;
  locus::copy(src, m.view());
#endif
}
