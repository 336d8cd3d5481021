// expect: error: .*locus: a pending copy does not convert to a tensor: the copy may still be running; write std::move\(p\).get\(\)
// Rule: the destination of an asynchronous copy is reachable only through get(), which
// waits for the copy; no conversion, operator*, -> or element access reads it early.
#include <locus/transfer/async.hpp>

using device_tensor = locus::tensor<float, locus::cuda, 2>;

device_tensor finish(locus::pending<device_tensor>& p) {
#ifdef LOCUS_VIOLATION
  return p;
#else
  return std::move(p).get();
#endif
}
