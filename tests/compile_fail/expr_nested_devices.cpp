// expect: error: .*locus: operands live on different devices .cuda and cpu.
// Rule: a device mix deep inside an expression is caught, once, at the node that mixes.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cuda, 2>& a, const locus::tensor<float, locus::cpu, 2>& b,
       const locus::tensor<float, locus::cuda, 2>& c, const locus::tensor<float, locus::cuda, 2>& bc) {
#ifdef LOCUS_VIOLATION
  (void)bc;
  auto e = locus::relu(a * b + c);
#else
  (void)b;
  auto e = locus::relu(a * bc + c);
#endif
  (void)e;
}
