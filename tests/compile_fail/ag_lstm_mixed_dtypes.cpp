// expect: error: .*locus: ag::lstm takes values of one dtype and one device
// Rule: an LSTM's input, state, weights and biases share one dtype and device.
#include <locus/ag/recurrent.hpp>

void f() {
  locus::ag::tape<float, locus::cpu> t;
  locus::ag::tape<double, locus::cpu> u;
  const auto x = locus::zeros<float, locus::cpu>({4, 2, 3});
  const auto wih = locus::zeros<float, locus::cpu>({20, 3});
  const auto whh = locus::zeros<float, locus::cpu>({20, 5});
  const auto b = locus::zeros<float, locus::cpu>({20});
  const auto bd = locus::zeros<double, locus::cpu>({20});
#ifdef LOCUS_VIOLATION
  (void)locus::ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), u.constant(bd));
#else
  (void)bd;
  (void)u;
  (void)locus::ag::lstm(t.constant(x), t.constant(wih), t.constant(whh), t.constant(b), t.constant(b));
#endif
}
