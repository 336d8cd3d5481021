// expect: error: .*locus: the destination of copy_async is a tensor_view, which the pending cannot own.*std::move\(dst\).*to_async
// Rule: a view owns nothing, so a pending cannot keep its memory out of reach while the
// copy writes to it; the owning tensor is moved in instead.
#include <locus/transfer/async.hpp>

void f(const locus::tensor<float, locus::cuda, 1>& src, locus::tensor<float, locus::cuda, 1>& dst) {
#ifdef LOCUS_VIOLATION
  auto pending = locus::copy_async(src, dst.view());
  (void)pending.get();
#else
  dst = std::move(locus::copy_async(src, std::move(dst))).get();
#endif
}
