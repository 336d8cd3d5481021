// expect: error: .*locus: data_handle\(\) of a temporary tensor would dangle
// Rule: no pointer into a tensor freed at the end of the statement (as data(), span()).
#include <locus/tensor/factories.hpp>

float f() {
#ifdef LOCUS_VIOLATION
  const float* p = locus::ones<float, locus::cpu>({4}).data_handle();
#else
  const auto t = locus::ones<float, locus::cpu>({4});
  const float* p = t.data_handle();
#endif
  return p[0];
}
