// expect: error: .*locus: the source of an asynchronous copy is a pinned tensor passed as an lvalue.*std::move\(h\).*get_with_source\(\)
// Rule: page-locked host memory that a copy engine still reads is owned by the pending:
// the host cannot free or rewrite it before the copy is done; it comes back after.
#include <locus/transfer/async.hpp>

void f(locus::tensor<float, locus::pinned, 2>& h, locus::tensor<float, locus::cuda, 2>& d) {
#ifdef LOCUS_VIOLATION
  auto p = locus::to_async<locus::cuda>(h);
  d = std::move(p).get();
#else
  auto p = locus::to_async<locus::cuda>(std::move(h));
  auto [value, source] = std::move(p).get_with_source();
  d = std::move(value);
  h = std::move(source);  // the same pinned buffer, ready for the next batch
#endif
}
