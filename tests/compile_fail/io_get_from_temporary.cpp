// expect: error: .*locus: get\(\) of a temporary archive would return a view into memory freed at the end of the statement; keep the loaded file in a variable
// Rule: a view of a loaded file lives only as long as the archive; get() on the
// temporary that io::load returns would dangle (ASan: heap-use-after-free).
#define LOCUS_HAS_JSON 1
#include <locus/io/safetensors.hpp>

float first_weight(const char* path) {
#ifdef LOCUS_VIOLATION
  const auto w = locus::io::load<locus::cpu>(path).get<float, 2>("w");
#else
  const auto a = locus::io::load<locus::cpu>(path);
  const auto w = a.get<float, 2>("w");
#endif
  return w(0, 0);
}
