// expect: error: .*locus: operands live on different devices .cuda and cpu.; transfers are explicit: move one with locus::to<locus::cuda>
// Rule: an operation on a cuda and a cpu operand does not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cuda, 2>& a, const locus::tensor<float, locus::cpu, 2>& b,
       const locus::tensor<float, locus::cuda, 2>& c) {
#ifdef LOCUS_VIOLATION
  (void)c;
  return a + b;
#else
  (void)b;
  return a + c;
#endif
}
