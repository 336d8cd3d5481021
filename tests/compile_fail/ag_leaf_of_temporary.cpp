// expect: error: .*locus: tape.leaf\(\) of a temporary tensor would dangle
// Rule: the tape reads its inputs until backward; a temporary is freed before that.
#include <locus/ag/tape.hpp>

void f(locus::ag::tape<float, locus::cpu>& t) {
#ifdef LOCUS_VIOLATION
  (void)t.leaf(locus::zeros<float, locus::cpu>({2, 3}));
#else
  const auto x = locus::zeros<float, locus::cpu>({2, 3});
  (void)t.leaf(x);
#endif
}
