// expect: error: .*locus: copy_async destination is const; pass a mutable tensor, moved in
// Rule: a const tensor is read-only: copy_async does not write into it (nor take it over).
#include <locus/transfer/async.hpp>

void f(locus::tensor<float, locus::pinned, 1> p, const locus::tensor<float, locus::cuda, 1>& c,
       locus::tensor<float, locus::cuda, 1>& d) {
#ifdef LOCUS_VIOLATION
  (void)d;
  auto pending = locus::copy_async(std::move(p), c);
#else
  (void)c;
  auto pending = locus::copy_async(std::move(p), std::move(d));
#endif
  d = std::move(pending).get();
}
