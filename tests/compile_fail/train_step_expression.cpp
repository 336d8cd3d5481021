// expect: error: .*locus: trainer::step takes tensors or tensor_views .the input batch and the target., but got an expression or another type; evaluate an expression first
// Rule: a training step reads batches from memory; an expression is evaluated
// explicitly first.
#include <locus/train/trainer.hpp>

using P = locus::amp::fp32;

void train_one(locus::tensor<float, locus::cpu, 2>& x, locus::tensor<std::int64_t, locus::cpu, 1>& y) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
#ifdef LOCUS_VIOLATION
  t.step(x * 0.5f, y);
#else
  const auto xs = locus::eval(x * 0.5f);
  t.step(xs, y);
#endif
}
