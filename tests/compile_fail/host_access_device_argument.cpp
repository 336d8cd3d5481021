// expect: error: .*locus: data\(\) takes no device argument: whether host code may read the memory is decided by the tensor.s own device
// Rule: host access is decided by the tensor's own device, never by a template argument the caller sets (t.data<locus::cpu>() on cuda).
#include <locus/tensor/tensor.hpp>

const float* f(const locus::tensor<float, locus::cuda, 1>& g) {
#ifdef LOCUS_VIOLATION
  return g.data<locus::cpu>();
#else
  return g.data_handle();
#endif
}
