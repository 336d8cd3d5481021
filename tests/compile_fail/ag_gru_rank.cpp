// expect: error: .*locus: ag::gru takes x \[T, B, I\] \(rank 3\)
// Rule: a GRU runs over a sequence [T, B, I]; one step's [B, I] is a sequence of length 1.
#include <locus/ag/recurrent.hpp>

void f() {
  locus::ag::tape<float, locus::cpu> t;
#ifdef LOCUS_VIOLATION
  const auto x = locus::zeros<float, locus::cpu>({2, 3});
#else
  const auto x = locus::zeros<float, locus::cpu>({1, 2, 3});
#endif
  const auto wih = locus::zeros<float, locus::cpu>({15, 3});
  const auto whh = locus::zeros<float, locus::cpu>({15, 5});
  const auto b = locus::zeros<float, locus::cpu>({15});
  (void)locus::ag::gru(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b));
}
