// expect: error: .*locus: the trainer's losses take the model's output as rank 2 \[batch, outputs\], but this model ends with a rank-4 activation
// Rule: a model whose output is still an image cannot feed cross_entropy.
#include <locus/nn/conv.hpp>
#include <locus/train/trainer.hpp>

using D = locus::cpu;
using P = locus::amp::fp32;

void build() {
#ifdef LOCUS_VIOLATION
  locus::nn::sequential model(locus::nn::conv2d<D, P>(1, 10, 28));
#else
  locus::nn::sequential model(locus::nn::conv2d<D, P>(1, 10, 28), locus::nn::flatten<D, P>());
#endif
  locus::optim::sgd<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  (void)t;
}
