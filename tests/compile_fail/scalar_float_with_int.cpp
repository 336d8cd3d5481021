// expect: error: .*locus: a floating-point scalar \(float\) with an i32 tensor would be converted to i32.*locus::cast<float>\(t\) \* 0.5f
// Rule: a floating scalar with an integer tensor does not compile (i32 * 0.5f was 0): convert the tensor explicitly.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(t * 0.5f);
#else
  return locus::eval(locus::cast<float>(t) * 0.5f);
#endif
}
