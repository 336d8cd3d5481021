// expect: error: .*locus: a floating-point scalar \(float\) with an i64 tensor.*t = locus::cast<locus::i64>\(locus::cast<float>\(t\) \* 0.5f\)
// Rule: compound assignment of a floating scalar into an integer tensor does not compile (t += 0.5f on i64).
#include <locus/locus.hpp>

void f(locus::tensor<std::int64_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  t += 0.5f;
#else
  t = locus::cast<locus::i64>(locus::cast<float>(t) + 0.5f);
#endif
}
