// expect: error: .*locus: where\(\) needs at least one tensor value operand, but both values are scalars
// Rule: where(cond, a, b) takes its dtype from a or b, so one of them is a tensor or an
// expression (two scalars would leave the result's dtype a guess).
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& x) {
#ifdef LOCUS_VIOLATION
  return locus::where(x > 0.0f, 1.0f, 0.0f);
#else
  return locus::cast<float>(x > 0.0f);
#endif
}
