// expect: error: .*locus: full\(\) fills with a number \(an arithmetic type, f16 or bf16\)
// Rule: full() takes a number as its fill value.
#include <locus/locus.hpp>

int main() {
#ifdef LOCUS_VIOLATION
  auto t = locus::full<float, locus::cpu>({2, 3}, "1.5");
#else
  auto t = locus::full<float, locus::cpu>({2, 3}, 1.5);
#endif
  return static_cast<int>(t.numel());
}
