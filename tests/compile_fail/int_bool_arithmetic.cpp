// expect: error: .*locus: -, / and pow are not defined for bool tensors
// Rule: bool tensors have + (or) and * (and), not - (PyTorch refuses it), / or pow.
#include <locus/locus.hpp>

auto f(const locus::tensor<bool, locus::cpu, 1>& a, const locus::tensor<bool, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  return locus::eval(a - b);
#else
  return locus::eval((a != b) + (locus::cast<locus::i32>(a) - 1 == 0));
#endif
}
