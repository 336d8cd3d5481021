// pitfall-check: compile
// The mistake: the model lives on the GPU, the batch is still in host memory (PyTorch:
// model.cuda(), but x and y never moved). locus: model, batch and labels share one
// device by type, so the step does not compile.
#include <locus/train.hpp>

#include <cstdint>

int main() {
  using D = locus::cuda;
  using P = locus::amp::fp32;
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::optim::adamw<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});

  auto x = locus::randn<float, locus::cpu>({64, 32}, /*seed=*/1);  // the batch, in host memory
  auto y = locus::zeros<std::int64_t, locus::cpu>({64});
  t.step(x, y);  // model on cuda, batch on cpu
}
