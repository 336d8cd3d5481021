// pitfall-check: compile
// The mistake: in a hand-written loop, the loss is built for another device than the
// model (PyTorch: nn.CrossEntropyLoss(weight=w) with w left on the cpu). locus: the
// loss state's device is part of its type; the model's output, a view of cuda memory,
// cannot be passed where a view of cpu memory is expected.
#include <locus/train.hpp>

#include <cstdint>

int main() {
  using D = locus::cuda;
  using P = locus::amp::fp32;
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::nn::cross_entropy::state<locus::cpu, P> loss(locus::nn::cross_entropy{});  // the model is on cuda

  locus::tensor<float, D, 2> x = locus::to<D>(locus::randn<float, locus::cpu>({64, 32}, /*seed=*/1));
  locus::tensor<std::int64_t, D, 1> y = locus::to<D>(locus::zeros<std::int64_t, locus::cpu>({64}));
  auto out = model.forward(x);
  auto l = loss.forward(out, y);
}
