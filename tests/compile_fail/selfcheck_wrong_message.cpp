// expect: error: .*locus: this message is never printed
// Harness self-check (registered WILL_FAIL): the violation fails to compile, but with
// another message, so the harness must report a failure.
#include <locus/tensor/tensor.hpp>

float f(locus::tensor<float, locus::cuda, 1>& a) {
#ifdef LOCUS_VIOLATION
  return a(0);
#else
  (void)a;
  return 0.0f;
#endif
}
