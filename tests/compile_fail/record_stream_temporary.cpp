// expect: error: .*locus: record_stream got a temporary stream, .*locus::stream s; locus::record_stream\(t, s\);
// Rule: record_stream(t, stream{}) would record a use on a stream destroyed at the end
// of the statement (the allocator would later record an event on its dead handle).
#include <locus/transfer/stream.hpp>

void f(const locus::tensor<float, locus::cuda, 1>& t) {
#ifdef LOCUS_VIOLATION
  locus::record_stream(t, locus::stream{});
#else
  locus::stream s;
  locus::record_stream(t, s);
#endif
}
