// expect: error: (.*on_error.* called in a constant expression|call to consteval function .*basic_format_string.* is not a constant expression)
// expect-also: width/precision is not integer
// Rule: a tensor's width from an argument ({:>{}}) is checked as {fmt} checks it for a
// string: at compile time in a literal format string, an argument that is not an integer
// is {fmt}'s own error (at run time: negative, past INT_MAX, or not an integer is a
// fmt::format_error, tests/test_hostile_api.cpp).
#include <fmt/format.h>
#include <locus/fmt.hpp>
#include <locus/tensor/tensor.hpp>

#include <string>

std::string f(const locus::tensor<float, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return fmt::format("{:>{}}", t, "100");
#else
  return fmt::format("{:>{}}", t, 100);
#endif
}
