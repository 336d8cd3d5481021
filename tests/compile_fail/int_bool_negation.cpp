// expect: error: .*locus: negation is not defined for a bool tensor
// Rule: negating a bool tensor does not compile (PyTorch refuses it); logical not is mask == false.
#include <locus/locus.hpp>

auto f(const locus::tensor<bool, locus::cpu, 1>& mask) {
#ifdef LOCUS_VIOLATION
  return locus::eval(-mask);
#else
  return locus::eval(mask == false);
#endif
}
