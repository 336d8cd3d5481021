// expect: error: .*locus: a tensor_view of a temporary tensor would dangle
// Rule: a tensor_view does not bind to a temporary tensor (it would dangle after the statement).
#include <locus/tensor/factories.hpp>

float f() {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<const float, locus::cpu, 1> v = locus::ones<float, locus::cpu>({4}); return v(0);
#else
  auto t = locus::ones<float, locus::cpu>({4}); locus::tensor_view<const float, locus::cpu, 1> v = t; return v(0);
#endif
}
