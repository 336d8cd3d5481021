// expect: error: .*locus: copy_async destination is const; pass a mutable tensor or tensor_view
// Rule: a const tensor or a view of const elements is read-only: copy_async does not
// write through it.
#include <locus/transfer/async.hpp>

void f(const locus::tensor<float, locus::pinned, 1>& p, const locus::tensor<float, locus::cuda, 1>& c,
       locus::tensor<float, locus::cuda, 1>& d) {
#ifdef LOCUS_VIOLATION
  (void)d;
  auto pending = locus::copy_async(p, c);
#else
  (void)c;
  auto pending = locus::copy_async(p, d);
#endif
  (void)pending.get();
}
