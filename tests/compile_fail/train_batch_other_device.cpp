// expect: error: .*locus: the batch lives on pinned but the model on cpu.*locus::to<locus::cpu>
// Rule: model, batch and labels share one device ("Expected all tensors to be on the
// same device" at the first step, in PyTorch).
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<float, locus::pinned, 2>& xp, locus::tensor<std::int64_t, locus::pinned, 1>& yp,
               locus::tensor<float, locus::cpu, 2>& xc, locus::tensor<std::int64_t, locus::cpu, 1>& yc) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  (void)xc, (void)yc;
  t.step(xp, yp);
#else
  (void)xp, (void)yp;
  t.step(xc, yc);
#endif
}
