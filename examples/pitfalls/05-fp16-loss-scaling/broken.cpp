// pitfall-check: compile
// The mistake: training in f16 without loss scaling (PyTorch: autocast to float16
// without a GradScaler). f16 gradients below 6e-8 flush to zero and training stalls or
// diverges, with no error. locus: a trainer for a policy that computes in f16 needs a
// grad scaler, by type.
#include <locus/train.hpp>

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp16_mixed;  // f16 compute, f32 master weights
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::optim::adamw<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});  // no grad scaler
}
