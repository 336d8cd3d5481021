// expect: error: .*locus: cannot assign through a view of const elements; write into a mutable view
// Rule: a view of const elements is read-only.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& a, locus::tensor<float, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<const float, locus::cpu, 1> v = a.view();
#else
  locus::tensor_view<float, locus::cpu, 1> v = b.view();
#endif
  v = locus::relu(a);
  (void)b;
}
