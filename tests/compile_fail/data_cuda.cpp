// expect: error: .*locus: element access, span\(\) and data\(\) need host-accessible memory, but this tensor lives on cuda
// Rule: data() exists only on host-accessible devices (data_handle() is the raw pointer).
#include <locus/tensor/tensor.hpp>

const float* pointer(const locus::tensor<float, locus::cuda, 1>& a) {
#ifdef LOCUS_VIOLATION
  return a.data();
#else
  return a.data_handle();
#endif
}
