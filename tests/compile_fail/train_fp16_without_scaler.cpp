// expect: error: .*locus: amp::fp16_mixed needs loss scaling.*grad_scaler
// Rule: f16 training needs dynamic loss scaling; without it small gradients flush to
// zero and training stalls or diverges, found only after hours of training.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp16_mixed;

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::adamw<locus::cpu> opt(model.parameters());
#ifdef LOCUS_VIOLATION
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#else
  locus::amp::grad_scaler<locus::cpu> scaler;
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{}, scaler);
#endif
  (void)t;
}
