// expect: error: .*locus: flat\(\) of a temporary archive would return a view into memory freed at the end of the statement; keep the loaded file in a variable
// Rule: as get(): flat() of the archive io::load returns, unnamed, would dangle.
#define LOCUS_HAS_JSON 1
#include <locus/io/safetensors.hpp>

#include <utility>

float first_weight(const char* path) {
  auto a = locus::io::load<locus::cpu>(path);
#ifdef LOCUS_VIOLATION
  const auto w = std::move(a).flat<float>("w");  // an xvalue: as temporary as io::load's result
#else
  const auto w = a.flat<float>("w");
#endif
  return w(0);
}
