// expect: error: .*locus: to<D>\(\) copies a tensor or tensor_view, but the argument is an expression.*locus::to<D>\(locus::eval\(e\)\)
// Rule: to<D>() moves memory between devices; an expression is evaluated first (on its
// own device: a cuda expression in a .cu file).
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cuda, 1>& g, const locus::tensor<float, locus::cpu, 1>& h) {
#ifdef LOCUS_VIOLATION
  (void)h;
  auto x = locus::to<locus::cpu>(g * 2.0f);
#else
  (void)g;  // (the fix for g: to<cpu>(locus::eval(g * 2.0f)), compiled by nvcc)
  auto x = locus::to<locus::cuda>(locus::eval(h * 2.0f));
#endif
  (void)x;
}
