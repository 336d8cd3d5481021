// expect: error: .*locus: copy_async takes ownership of its destination, but dst is an lvalue tensor.*std::move\(dst\)
// Rule: the destination of an asynchronous copy is reachable only through get(): the
// pending owns it, so it is moved in, never lent (an lvalue could be read or replaced
// while the copy writes to it).
#include <locus/transfer/async.hpp>

void f(const locus::tensor<float, locus::cuda, 1>& src, locus::tensor<float, locus::cuda, 1>& dst) {
#ifdef LOCUS_VIOLATION
  auto pending = locus::copy_async(src, dst);
  (void)pending.get();
#else
  dst = std::move(locus::copy_async(src, std::move(dst))).get();
  auto fresh = locus::to_async<locus::cuda>(src);  // or a new tensor
  (void)fresh.get();
#endif
}
