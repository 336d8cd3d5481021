// expect: error: .*locus: copy_async into a temporary tensor would free it while the copy writes to it
// Rule: the destination of an asynchronous copy outlives the copy.
#include <locus/transfer/async.hpp>

void f(const locus::tensor<float, locus::pinned, 1>& p, locus::tensor<float, locus::cuda, 1>& d) {
#ifdef LOCUS_VIOLATION
  (void)d;
  auto pending = locus::copy_async(p, locus::tensor<float, locus::cuda, 1>(p.shape()));
#else
  auto pending = locus::copy_async(p, d);
#endif
  (void)pending.get();
}
