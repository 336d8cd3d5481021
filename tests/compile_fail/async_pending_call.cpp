// expect: error: .*locus: the destination of an asynchronous copy can only be reached through get\(\), which waits for the copy; write p.get\(\)\(i, \.\.\.\)
// Rule: p(i) does not read an element of a copy that may still be running.
#include <locus/transfer/async.hpp>

using tensor_t = locus::tensor<float, locus::pinned, 1>;

float first(locus::pending<tensor_t>& p) {
#ifdef LOCUS_VIOLATION
  p(0);
  return 0.0f;
#else
  return p.get()(0);
#endif
}
