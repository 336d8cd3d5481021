// expect: error: .*locus: to_async and copy_async need page-locked host memory, but the destination is cpu \(pageable\)
// Rule: an asynchronous copy lands in page-locked (pinned) memory; into pageable cpu
// memory the CUDA runtime would silently make it synchronous.
#include <locus/transfer/async.hpp>

auto download(const locus::tensor<float, locus::cuda, 2>& d) {
#ifdef LOCUS_VIOLATION
  return locus::to_async<locus::cpu>(d);
#else
  return locus::to_async<locus::pinned>(d);
#endif
}
