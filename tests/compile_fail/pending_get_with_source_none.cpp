// expect: error: .*locus: get_with_source\(\) gives back a source the pending owns, but this one owns none.*std::move\(p\).get\(\)
// Rule: only a source that was moved in comes back from a pending.
#include <locus/transfer/async.hpp>

using dev = locus::tensor<float, locus::cuda, 1>;

dev f(const dev& src) {
  auto p = locus::to_async<locus::cuda>(src);  // a cuda lvalue source stays the caller's
#ifdef LOCUS_VIOLATION
  return std::move(p).get_with_source().value;
#else
  return std::move(p).get();
#endif
}
