// expect: error: .*locus: a floating-point scalar \(double\) with an i32 tensor would be converted
// Rule: filling with a scalar follows t + s: a floating scalar into an integer tensor
// does not compile (it would truncate).
#include <locus/locus.hpp>

#include <cstdint>

void f(locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  t = 2.5;
#else
  t = 2;
#endif
}
