// expect: error: .*locus: to_async and copy_async copy between pinned and cuda, or cuda and cuda, but both sides are pinned host memory
// Rule: an "asynchronous" host-to-host copy overlaps nothing; it is a plain copy.
#include <locus/transfer/async.hpp>

auto f(locus::tensor<float, locus::pinned, 2>& p) {
#ifdef LOCUS_VIOLATION
  return locus::to_async<locus::pinned>(std::move(p));
#else
  return locus::to_async<locus::cuda>(std::move(p));
#endif
}
