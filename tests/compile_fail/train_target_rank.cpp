// expect: error: .*locus: the target's rank does not fit the loss: cross_entropy takes labels of rank 1 \[batch\]
// Rule: cross_entropy takes one label per sample ([batch]); a column of labels
// ([batch, 1]) is reshaped explicitly.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<float, locus::cpu, 2>& x, locus::tensor<std::int64_t, locus::cpu, 2>& y) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(x, y);
#else
  t.step(x, y.reshape({y.extent(0)}));
#endif
}
