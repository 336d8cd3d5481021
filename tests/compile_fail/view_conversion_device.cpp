// expect: error: .*locus: a view of cuda memory cannot be a view of cpu memory; transfers are explicit
// Rule: a view never retypes memory of one device as another's (tensor_view<float, cpu, 1> v = cuda_tensor).
#include <locus/transfer/copy.hpp>

void f(locus::tensor<float, locus::cuda, 1>& g) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v = g; (void)v;
#else
  auto h = locus::to<locus::cpu>(g); locus::tensor_view<float, locus::cpu, 1> v = h; (void)v;
#endif
}
