// expect: error: .*locus: cannot assign a pinned tensor or expression to a cuda tensor
// Rule: writing through a temporary view (t.slice(0, 2) = u) copies elements, and never
// across devices: the transfer must be explicit.
#include <locus/transfer/copy.hpp>

void f(locus::tensor<float, locus::cuda, 2>& d, locus::tensor<float, locus::pinned, 2>& p) {
#ifdef LOCUS_VIOLATION
  d.slice(0, 2) = p.slice(0, 2);
#else
  locus::copy(p.slice(0, 2), d.slice(0, 2));
#endif
}
