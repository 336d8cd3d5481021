// expect: error: .*locus: the batch lives on pinned but the model on cpu.*locus::to<locus::cpu>
// Rule: evaluate() checks the batches' device like step() (the same rule as
// train_batch_other_device, reached without a training step).
#include <locus/train/trainer.hpp>

#include <vector>

using P = locus::amp::fp32;

#ifdef LOCUS_VIOLATION
using D = locus::pinned;
#else
using D = locus::cpu;
#endif
struct batch {
  locus::tensor<float, D, 2> x;
  locus::tensor<std::int64_t, D, 1> y;
};

locus::train::metrics evaluate_all(std::vector<batch>& batches) {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  return t.evaluate(batches);
}
