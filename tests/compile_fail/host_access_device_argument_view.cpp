// expect: error: .*locus: span\(\) takes no device argument
// Rule: a view's host access is its own device's to decide (v.span<locus::cpu>() on a cuda view).
#include <locus/tensor/tensor.hpp>

std::size_t f(const locus::tensor_view<float, locus::cuda, 1>& g) {
#ifdef LOCUS_VIOLATION
  return g.span<locus::cpu>().size();
#else
  return static_cast<std::size_t>(g.numel());
#endif
}
