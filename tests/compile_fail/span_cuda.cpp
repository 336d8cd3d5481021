// expect: error: .*locus: element access, span\(\) and data\(\) need host-accessible memory, but this tensor lives on cuda
// Rule: span() exists only on host-accessible devices.
#include <locus/tensor/tensor.hpp>

std::size_t count(locus::tensor<float, locus::cuda, 1>& a, locus::tensor<float, locus::pinned, 1>& h) {
#ifdef LOCUS_VIOLATION
  (void)h;
  return a.span().size();
#else
  (void)a;
  return h.span().size();
#endif
}
