// expect: error: .*locus: to_async and copy_async copy a tensor, but the source is an expression.*locus::to_async<D>\(locus::eval\(e\)\)
// Rule: an expression has no memory to copy from; it is evaluated first.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::pinned, 1>& h) {
#ifdef LOCUS_VIOLATION
  return locus::to_async<locus::cuda>(h * 2.0f);
#else
  return locus::to_async<locus::cuda>(locus::eval(h * 2.0f));  // a pinned rvalue: owned
#endif
}
