// expect: error: .*locus:
// Harness self-check (registered WILL_FAIL): the "violation" is legal code, so the
// harness must report that it compiled.
#include <locus/tensor/tensor.hpp>

float f(locus::tensor<float, locus::cpu, 1>& a) {
#ifdef LOCUS_VIOLATION
  return a(0);
#else
  return a(0) + 1.0f;
#endif
}
