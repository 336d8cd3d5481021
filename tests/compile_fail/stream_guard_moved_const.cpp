// expect: error: .*locus: stream_guard got a temporary stream \(or std::move of one\)
// Rule: every rvalue stream is refused by the guard, a const one included (it would
// otherwise bind to the guard's const stream& constructor).
#include <locus/transfer/stream.hpp>


const locus::stream make();

void f() {
#ifdef LOCUS_VIOLATION
  locus::stream_guard g(make());
#else
  const locus::stream s = make();
  locus::stream_guard g(s);
#endif
}
