// expect: error: .*locus: a trainer keeps pointers to its model, optimizer and scaler, but one of them is a temporary
// Rule: a trainer over a temporary grad scaler does not compile (it keeps a pointer).
#include <locus/train.hpp>

using D = locus::cpu;
using P = locus::amp::fp16_mixed;
inline auto make() { return locus::nn::sequential(locus::nn::linear<D, P>(4, 3)); }

void f() {
  auto model = make();
  locus::optim::adamw<D> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, locus::amp::grad_scaler<D>{});
#else
  locus::amp::grad_scaler<D> scaler;
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, scaler);
  locus::train::trainer t2(model, opt, locus::nn::cross_entropy{}, scaler, {.accumulate = 2});
  (void)t2;
#endif
  (void)t;
}
