// expect: error: .*locus: the grad scaler lives on pinned but the model on cpu.*grad_scaler<locus::cpu>
// Rule: the loss scale lives on the model's device, so no step waits for a transfer.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp16_mixed;

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::adamw<locus::cpu> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::amp::grad_scaler<locus::pinned> scaler;
#else
  locus::amp::grad_scaler<locus::cpu> scaler;
#endif
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, scaler);
  (void)t;
}
