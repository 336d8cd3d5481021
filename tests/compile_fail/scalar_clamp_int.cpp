// expect: error: .*locus: a floating-point scalar \(float\) with a u8 tensor
// Rule: clamp, maximum, minimum and pow of an integer tensor with floating bounds do not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::uint8_t, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(locus::clamp(t, 0.0f, 1.5f));
#else
  return locus::eval(locus::clamp(locus::cast<float>(t), 0.0f, 1.5f));
#endif
}
