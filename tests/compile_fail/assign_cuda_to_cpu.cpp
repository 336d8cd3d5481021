// expect: error: .*locus: cannot assign a cuda tensor or expression to a cpu tensor; transfers are explicit: write locus::to<locus::cpu>
// Rule: a cuda tensor never becomes a cpu tensor implicitly.
#include <locus/transfer/copy.hpp>

locus::tensor<float, locus::cpu, 2> f(const locus::tensor<float, locus::cuda, 2>& d) {
#ifdef LOCUS_VIOLATION
  locus::tensor<float, locus::cpu, 2> h = d;
  return h;
#else
  locus::tensor<float, locus::cpu, 2> h = locus::to<locus::cpu>(d);
  return h;
#endif
}
