// expect: error: .*locus: ag::gru takes 6 values, \(x, h0, w_ih, w_hh, b_ih, b_hh\)
// Rule: the GRU has no cell state; a c0 given to it names the two forms.
#include <locus/ag/recurrent.hpp>

void f() {
  locus::ag::tape<float, locus::cpu> t;
  const auto x = locus::zeros<float, locus::cpu>({1, 2, 3});
  const auto h0 = locus::zeros<float, locus::cpu>({2, 5});
  const auto wih = locus::zeros<float, locus::cpu>({15, 3});
  const auto whh = locus::zeros<float, locus::cpu>({15, 5});
  const auto b = locus::zeros<float, locus::cpu>({15});
#ifdef LOCUS_VIOLATION
  (void)locus::ag::gru(t.constant(x), t.constant(h0), t.constant(h0), t.constant(wih), t.constant(whh), t.constant(b),
                       t.constant(b));
#else
  (void)locus::ag::gru(t.constant(x), t.constant(h0), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b));
#endif
}
