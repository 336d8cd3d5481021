// expect: error: .*locus: copy\(\) copies a tensor or tensor_view, but the source is an expression.*locus::copy\(locus::eval\(e\), dst\)
// Rule: an expression is assigned (one fused kernel) or evaluated, not copied.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& a, locus::tensor<float, locus::cpu, 1>& c,
       locus::tensor<float, locus::pinned, 1>& p) {
#ifdef LOCUS_VIOLATION
  (void)c;
  locus::copy(a * 2.0f, p);
#else
  c = a * 2.0f;
  locus::copy(locus::eval(a * 2.0f), p);
#endif
}
