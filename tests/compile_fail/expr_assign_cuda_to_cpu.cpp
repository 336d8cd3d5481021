// expect: error: .*locus: cannot assign a cuda tensor or expression to a cpu tensor; transfers are explicit
// Rule: a cuda expression is never evaluated into cpu memory implicitly.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cuda, 2>& a, locus::tensor<float, locus::cpu, 2>& h,
       locus::tensor<float, locus::cuda, 2>& d) {
#ifdef LOCUS_VIOLATION
  (void)d;
  h = locus::relu(a * 2.0f);
#else
  (void)d;
  auto ha = locus::to<locus::cpu>(a);  // the explicit transfer, then evaluate on the cpu
  h = locus::relu(ha * 2.0f);
#endif
}
