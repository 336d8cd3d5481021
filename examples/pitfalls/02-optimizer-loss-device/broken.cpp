// pitfall-check: compile
// The mistake: the optimizer is built for another device than the model (its state,
// AdamW's moments, would live on the cpu while the weights live on the GPU). locus: the
// optimizer's device is part of its type and must be the model's.
#include <locus/train.hpp>

int main() {
  using D = locus::cuda;
  using P = locus::amp::fp32;
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::optim::adamw<locus::cpu> opt(model.parameters(), {.lr = 1e-3});  // the model is on cuda
}
