// expect: error: .*locus: element access, span\(\) and data\(\) need host-accessible memory, but this tensor lives on cuda; copy it first
// Rule: element access exists only on host-accessible devices.
#include <locus/tensor/tensor.hpp>

float read(locus::tensor<float, locus::cuda, 2>& a, locus::tensor<float, locus::cpu, 2>& h) {
#ifdef LOCUS_VIOLATION
  (void)h;
  return a(0, 0);
#else
  (void)a;
  return h(0, 0);
#endif
}
