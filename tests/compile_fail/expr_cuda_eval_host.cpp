// expect: error: .*locus: launching a kernel on cuda needs nvcc, but this file is compiled by a host compiler
// Rule: building a cuda expression compiles anywhere; evaluating it needs nvcc.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cuda, 2>& a, locus::tensor<float, locus::cuda, 2>& d) {
  auto e = locus::relu(a * 2.0f + 1.0f);  // fine in a host-compiled file
#ifdef LOCUS_VIOLATION
  d = e;
#else
  (void)d;
  (void)e.shape();
#endif
}
