// expect: error: .*locus: cannot assign a pinned tensor or expression to a cuda tensor
// Rule: assigning a view of another device is the same mistake as assigning a tensor.
#include <locus/transfer/copy.hpp>

void f(locus::tensor<float, locus::cuda, 1>& d, locus::tensor_view<float, locus::pinned, 1> p) {
#ifdef LOCUS_VIOLATION
  d = p;
#else
  locus::copy(p, d);
#endif
}
