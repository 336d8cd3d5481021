// expect: error: .*locus: tape.constant\(\) of a temporary tensor would dangle
// Rule: a function returning a const tensor gives a const temporary: refused as well.
#include <locus/ag/tape.hpp>

const locus::tensor<float, locus::cpu, 2> make();

void f(locus::ag::tape<float, locus::cpu>& t) {
#ifdef LOCUS_VIOLATION
  (void)t.constant(make());
#else
  const auto x = make();
  (void)t.constant(x);
#endif
}
