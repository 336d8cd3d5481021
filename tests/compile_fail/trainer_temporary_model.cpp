// expect: error: .*locus: a trainer keeps pointers to its model, optimizer and scaler, but one of them is a temporary
// Rule: a trainer over a temporary model (or optimizer, or scaler) does not compile: it
// keeps pointers to them, and every step would write freed memory.
#include <locus/train.hpp>

using D = locus::cpu;
using P = locus::amp::fp32;
inline auto make() { return locus::nn::sequential(locus::nn::linear<D, P>(4, 3)); }

void f() {
  auto model = make();
  locus::optim::adamw<D> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::train::trainer t(make(), opt, locus::nn::cross_entropy{});
#else
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  locus::train::trainer t2(model, opt, locus::nn::cross_entropy{}, {.accumulate = 2});
  locus::train::options o;
  locus::train::trainer t3(model, opt, locus::nn::cross_entropy{}, o);
  (void)t2;
  (void)t3;
#endif
  (void)t;
}
