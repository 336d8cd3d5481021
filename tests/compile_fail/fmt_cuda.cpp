// expect: error: .*locus: only host memory prints, but this tensor lives on cuda; copy it first
// Rule: {fmt} formats only host memory, as operator<< does: a cuda tensor is copied first.
#include <fmt/format.h>
#include <locus/fmt.hpp>
#include <locus/transfer/copy.hpp>

#include <string>

std::string f(const locus::tensor<float, locus::cuda, 2>& g) {
#ifdef LOCUS_VIOLATION
  return fmt::format("{}", g);
#else
  return fmt::format("{}", locus::to<locus::cpu>(g));
#endif
}
