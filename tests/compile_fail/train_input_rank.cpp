// expect: error: .*locus: the trainer's input batch is rank 2 \[batch, features\]
// Rule: layers take [batch, features]; images must be flattened explicitly.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<float, locus::cpu, 3>& images, locus::tensor<std::int64_t, locus::cpu, 1>& y) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(784, 10));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(images, y);
#else
  t.step(images.reshape({images.extent(0), 784}), y);
#endif
}
