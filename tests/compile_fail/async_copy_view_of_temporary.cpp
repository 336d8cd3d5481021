// expect: error: .*locus: the destination of copy_async is a tensor_view, which the pending cannot own
// Rule: a view of a temporary as the destination of an asynchronous copy would be
// written after its memory is freed; views are refused as destinations, and a new
// tensor comes from to_async.
#include <locus/transfer/async.hpp>

// A view of a tensor that dies at the end of the caller's full-expression.
locus::tensor_view<float, locus::cuda, 1> view_of(locus::tensor<float, locus::cuda, 1>&& t) { return t.view(); }

auto f(const locus::tensor<float, locus::cuda, 1>& src) {
#ifdef LOCUS_VIOLATION
  return locus::copy_async(src, view_of(locus::tensor<float, locus::cuda, 1>(src.shape())));
#else
  return locus::to_async<locus::cuda>(src);
#endif
}
