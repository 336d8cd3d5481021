// expect: error: .*locus: ag::lstm takes 7 values, \(x, h0, c0, w_ih, w_hh, b_ih, b_hh\)
// Rule: the LSTM's state is h0 and c0 together; a call without c0 names the two forms.
#include <locus/ag/recurrent.hpp>

void f() {
  locus::ag::tape<float, locus::cpu> t;
  const auto x = locus::zeros<float, locus::cpu>({1, 2, 3});
  const auto h0 = locus::zeros<float, locus::cpu>({2, 5});
  const auto wih = locus::zeros<float, locus::cpu>({20, 3});
  const auto whh = locus::zeros<float, locus::cpu>({20, 5});
  const auto b = locus::zeros<float, locus::cpu>({20});
#ifdef LOCUS_VIOLATION
  (void)locus::ag::lstm(t.constant(x), t.constant(h0), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b));
#else
  (void)locus::ag::lstm(t.constant(x), t.constant(h0), t.constant(h0), t.constant(wih), t.constant(whh), t.constant(b),
                        t.constant(b));
#endif
}
