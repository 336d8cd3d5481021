// expect: error: (.*locus::detail::tensor_format_spec_error.* called in a constant expression|call to consteval function .*basic_format_string.* is not a constant expression)
// expect-also: locus: a tensor's format width is larger than 2147483647 \(INT_MAX\), which \{fmt\} refuses for text too
// Rule: a width past INT_MAX ({fmt}'s "number is too big" for a string) is refused, at
// compile time in a literal format string; it used to wrap around size_t (2^64 + 100
// became 100). The first line is the compiler's (a value in a format string cannot reach
// a static_assert); the locus: message is in the call it shows.
#include <fmt/format.h>
#include <locus/fmt.hpp>
#include <locus/tensor/tensor.hpp>

#include <string>

std::string f(const locus::tensor<float, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  return fmt::format("{:>18446744073709551716}", t);
#else
  return fmt::format("{:>2147483647}", t);  // INT_MAX itself is a width (compiled, not run)
#endif
}
