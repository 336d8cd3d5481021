// expect: error: .*locus: slice\(\) of a temporary tensor would dangle: the tensor is freed at the end of the statement; keep it in a variable first
// Rule: a view of a temporary tensor dangles: slice(), view(), reshape(), span() and data() of an rvalue tensor do not compile.
#include <locus/tensor/factories.hpp>

float f() {
#ifdef LOCUS_VIOLATION
  auto s = locus::ones<float, locus::cpu>({4}).slice(0, 2); return s(0);
#else
  auto t = locus::ones<float, locus::cpu>({4}); auto s = t.slice(0, 2); return s(0);
#endif
}
