// expect: error: .*locus: where\(\) needs a bool condition; compare first, e.g. where\(x > 0, x, 0\)
// Rule: the condition of where() is a bool tensor or expression; a number is never
// read as true or false.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& mask, const locus::tensor<float, locus::cpu, 1>& x) {
#ifdef LOCUS_VIOLATION
  return locus::where(mask, x, 0.0f);
#else
  return locus::where(mask > 0.0f, x, 0.0f);
#endif
}
