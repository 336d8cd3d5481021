// expect: error: .*locus: stream_guard got a temporary stream .*; name the stream so that it outlives the guard: locus::stream s; locus::stream_guard g\(s\);
// Rule: a guard keeps its stream current for its scope, so the stream must outlive it:
// stream_guard g(stream{}) (PyTorch's `with torch.cuda.stream(torch.cuda.Stream()):`)
// would leave a destroyed stream current.
#include <locus/transfer/stream.hpp>

void f() {
#ifdef LOCUS_VIOLATION
  locus::stream_guard g(locus::stream{});
#else
  locus::stream s;
  locus::stream_guard g(s);
#endif
}
