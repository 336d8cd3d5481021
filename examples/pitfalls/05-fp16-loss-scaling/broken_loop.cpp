// pitfall-check: run-error
// The same mistake in a hand-written loop: forward, loss and backward in f16, then an
// optimizer step, with no loss scaling. The types cannot see that the gradient was not
// scaled, so locus checks at run time: opt.step() on a model whose policy needs loss
// scaling throws locus::error unless it is given the scaler's state.
#include <locus/train.hpp>

#include <cstdint>

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp16_mixed;
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::optim::adamw<D> opt(model.parameters());
  locus::nn::cross_entropy::state<D, P> loss(locus::nn::cross_entropy{});

  locus::tensor<float, D, 2> x = locus::randn<float, D>({64, 32}, /*seed=*/1);
  locus::tensor<locus::f16, D, 2> x16 = locus::cast<locus::f16>(x);  // the model computes in f16
  auto y = locus::zeros<std::int64_t, D>({64});
  auto out = model.forward(x16);
  auto l = loss.forward(out, y);  // the gradient of the loss itself, not of scale * loss
  model.backward(loss.grad());
  opt.step();  // an f16 model's step without the scaler
}
