// expect: error: .*locus: the source of an asynchronous copy is a pinned tensor_view, which the pending cannot own.*std::move\(h\)
// Rule: a view of page-locked memory owns nothing, so nothing would keep the host from
// freeing or rewriting it while the copy engine reads it; the owning tensor is moved in.
#include <locus/transfer/async.hpp>

void f(locus::tensor<float, locus::pinned, 2>& h, locus::tensor<float, locus::cuda, 2>& d) {
#ifdef LOCUS_VIOLATION
  d = std::move(locus::copy_async(h.view(), std::move(d))).get();
#else
  auto [value, source] = std::move(locus::copy_async(std::move(h), std::move(d))).get_with_source();
  d = std::move(value);
  h = std::move(source);
#endif
}
