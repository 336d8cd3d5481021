// expect: error: .*locus: reductions of bool tensors are not defined; cast<std::int64_t>\(mask\) first
// Rule: sum/max/min/argmax of a bool mask would be a guess (logical or? a count that
// wraps?); counting is explicit.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& x) {
#ifdef LOCUS_VIOLATION
  return locus::sum(x > 0.0f);
#else
  return locus::sum(locus::cast<std::int64_t>(x > 0.0f));
#endif
}
