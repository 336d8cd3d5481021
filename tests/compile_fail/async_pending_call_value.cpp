// expect: error: .*locus: the destination of an asynchronous copy can only be reached through get\(\), which waits for the copy; write p.get\(\)\(i, \.\.\.\)
// Rule: p(i, j) used as a value (`float x = p(0, 0);`, an argument) reads no element of a
// copy that may still be running, and the rule is the first error, not "void value not
// ignored".
#include <cstdio>
#include <locus/transfer/async.hpp>

using tensor_t = locus::tensor<float, locus::pinned, 2>;

float first(locus::pending<tensor_t>& p) {
#ifdef LOCUS_VIOLATION
  float x = p(0, 0);
  std::printf("%f\n", static_cast<double>(p(0, 1)));
  return x;
#else
  return p.get()(0, 0);
#endif
}
