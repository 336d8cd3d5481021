// expect: error: .*locus: an expression is lazy and has no values to print yet; evaluate it first
// Rule: {fmt} formats values; a lazy expression is evaluated first (not a page of
// "type is not formattable" candidates).
#include <locus/fmt.hpp>
#include <locus/locus.hpp>

#include <string>

std::string f(const locus::tensor<float, locus::cpu, 1>& a) {
#ifdef LOCUS_VIOLATION
  return fmt::format("{}", a * 2.0f);
#else
  return fmt::format("{}", locus::eval(a * 2.0f));
#endif
}
