// expect: error: .*locus: locus::stream needs a build with CUDA, but this one has LOCUS_ENABLE_CUDA=0
// Rule: without CUDA, creating a stream is a compile error, not a run-time surprise.
#define LOCUS_ENABLE_CUDA 0
#include <locus/transfer/stream.hpp>

void f() {
#ifdef LOCUS_VIOLATION
  locus::stream s;
  (void)s;
#endif
}
