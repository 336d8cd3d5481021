// expect: error: .*locus: optimizers update f32 master weights; amp::fp64 is for gradient checks
// Rule: the optimizers update f32 master weights; an f64 model (amp::fp64) is for
// gradient checks, not for training.
#include <locus/nn/layers.hpp>
#include <locus/optim/optim.hpp>

#ifdef LOCUS_VIOLATION
using P = locus::amp::fp64;
#else
using P = locus::amp::fp32;
#endif

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
  locus::optim::sgd<locus::cpu> opt(model.parameters());
  (void)opt;
}
