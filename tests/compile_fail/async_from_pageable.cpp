// expect: error: .*locus: to_async and copy_async need page-locked host memory, but the source is cpu \(pageable\).*locus::pinned
// Rule: an asynchronous copy starts from page-locked (pinned) memory; from pageable cpu
// memory the CUDA runtime would silently make it synchronous.
#include <locus/transfer/async.hpp>

auto start(locus::tensor<float, locus::cpu, 2>& h, locus::tensor<float, locus::pinned, 2>& p) {
#ifdef LOCUS_VIOLATION
  (void)p;
  return locus::to_async<locus::cuda>(h);
#else
  (void)h;
  return locus::to_async<locus::cuda>(std::move(p));
#endif
}
