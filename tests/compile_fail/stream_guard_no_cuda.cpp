// expect: error: .*locus: locus::stream_guard needs a build with CUDA, but this one has LOCUS_ENABLE_CUDA=0
// Rule: without CUDA, making a stream current is a compile error.
#define LOCUS_ENABLE_CUDA 0
#include <locus/transfer/stream.hpp>

void f(const locus::stream& s) {
#ifdef LOCUS_VIOLATION
  locus::stream_guard g(s);
#else
  (void)s;
#endif
}
