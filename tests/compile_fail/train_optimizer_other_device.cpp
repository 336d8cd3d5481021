// expect: error: .*locus: the optimizer keeps its state on cuda but the model lives on cpu.*adamw<locus::cpu>
// Rule: optimizer state lives on the model's device; PyTorch finds a mismatch only at
// the first step (or after loading a checkpoint without map_location).
#include <locus/optim/optim.hpp>
#include <locus/nn/layers.hpp>

using P = locus::amp::fp32;

void build() {
  locus::nn::sequential model(locus::nn::linear<locus::cpu, P>(4, 3));
#ifdef LOCUS_VIOLATION
  locus::optim::adamw<locus::cuda> opt(model.parameters());
#else
  locus::optim::adamw<locus::cpu> opt(model.parameters());
#endif
  (void)opt;
}
