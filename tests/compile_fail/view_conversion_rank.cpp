// expect: error: .*locus: a rank-2 tensor or view cannot be a rank-1 view; write x.reshape
// Rule: a view conversion never changes the rank (reshape does).
#include <locus/tensor/tensor.hpp>

void f(locus::tensor_view<float, locus::cpu, 2> m) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v = m; (void)v;
#else
  locus::tensor_view<float, locus::cpu, 1> v = m.reshape({m.numel()}); (void)v;
#endif
}
