// expect: error: .*locus: a pending copy does not convert to a tensor_view: the copy may still be running; write p.get\(\).view\(\)
// Rule: no view of the destination escapes before the copy is done.
#include <locus/transfer/async.hpp>

using tensor_t = locus::tensor<float, locus::cuda, 1>;

locus::tensor_view<float, locus::cuda, 1> peek(locus::pending<tensor_t>& p) {
#ifdef LOCUS_VIOLATION
  return p;
#else
  return p.get().view();
#endif
}
