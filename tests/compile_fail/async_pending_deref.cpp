// expect: error: .*locus: the destination of an asynchronous copy can only be reached through get\(\), which waits for the copy
// Rule: *p does not read the destination of a copy that may still be running.
#include <locus/transfer/async.hpp>

using tensor_t = locus::tensor<float, locus::cuda, 1>;

tensor_t& take(locus::pending<tensor_t>& p) {
#ifdef LOCUS_VIOLATION
  return *p;
#else
  return p.get();
#endif
}
