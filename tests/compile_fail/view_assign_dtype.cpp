// expect: error: .*locus: .*dtype
// Rule: writing through a temporary view copies elements of one dtype; a conversion is
// explicit (locus::cast).
#include <locus/locus.hpp>

void f(locus::tensor<float, locus::cpu, 2>& d, locus::tensor<double, locus::cpu, 2>& s) {
#ifdef LOCUS_VIOLATION
  d.slice(0, 2) = s.slice(0, 2);
#else
  d.slice(0, 2) = locus::cast<float>(s.slice(0, 2));
#endif
}
