// expect: error: .*locus: the target's dtype does not fit the loss: cross_entropy takes i64 labels
// Rule: cross_entropy's labels are i64 class indices; float labels are never truncated
// silently.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<float, locus::cpu, 2>& x, locus::tensor<float, locus::cpu, 1>& yf) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(x, yf);
#else
  const auto y = locus::eval(locus::cast<std::int64_t>(yf));
  t.step(x, y);
#endif
}
