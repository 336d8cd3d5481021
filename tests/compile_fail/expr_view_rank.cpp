// expect: error: .*locus: the expression has a higher rank than the destination; assigning through a view .* broadcasts the source up to the destination.s rank, never down
// Rule: assigning through a view broadcasts the source up to the view's rank, never
// down; a source of higher rank does not compile.
#include <locus/locus.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a, locus::tensor_view<float, locus::cpu, 1> v) {
#ifdef LOCUS_VIOLATION
  v = a * 2.0f;
#else
  v = a.reshape({a.numel()}) * 2.0f;
#endif
}
