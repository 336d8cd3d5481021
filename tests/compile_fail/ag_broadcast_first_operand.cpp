// expect: error: .*locus: the second operand of an ag:: operation has more axes than the first
// Rule: only the second operand broadcasts (a bias [F] over [N, F]).
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& t, const locus::tensor<float, locus::cpu, 2>& x,
       const locus::tensor<float, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  (void)(t.leaf(b) + t.leaf(x));
#else
  (void)(t.leaf(x) + t.leaf(b));
#endif
}
