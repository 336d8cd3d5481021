// expect: error: .*locus: record_stream marks cuda or pinned memory as used on a stream, but this tensor is cpu
// Rule: record_stream(t, s) tells the caching allocator that work on stream s uses t's
// block; pageable cpu memory is never used by a stream asynchronously and its
// allocator has no streams, so recording it is a mistake (pinned memory, which the copy
// engine reads on a stream, and cuda memory are recorded).
#include <locus/transfer/stream.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& h, const locus::tensor<float, locus::pinned, 2>& p,
       const locus::tensor<float, locus::cuda, 1>& d, const locus::stream& s) {
#ifdef LOCUS_VIOLATION
  locus::record_stream(h, s);
#else
  (void)h;
  locus::record_stream(p, s);
  locus::record_stream(d.view(), s);
  locus::record_stream(d, s);
#endif
}
