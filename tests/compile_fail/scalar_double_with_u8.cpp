// expect: error: .*locus: a floating-point scalar \(double\) with a u8 tensor would be converted to u8.*locus::cast<double>\(t\) \* 0.5
// Rule: a double scalar with a u8 tensor (image bytes / 255.0) does not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::uint8_t, locus::cpu, 2>& t) {
#ifdef LOCUS_VIOLATION
  return locus::eval(t / 255.0);
#else
  return locus::eval(locus::cast<double>(t) / 255.0);
#endif
}
