// pitfall-check: run-output
// The mistake: evaluating with the training forward (PyTorch: evaluation without
// torch.no_grad() / inference_mode() and without model.eval()). In locus the choice is
// made per call, not by a mode: model.forward(x) is the training forward (dropout drops,
// batch norm uses and updates batch statistics, activations are kept for backward),
// model.infer(x) the inference forward. locus cannot know which one an evaluation
// meant, so this is not caught; the program shows what it costs: the evaluation is
// random and does not match the model's real predictions.
#include <locus/train.hpp>

#include <cstdint>
#include <cstdio>

#include "synthetic.hpp"

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  namespace nn = locus::nn;
  nn::sequential model(nn::linear<D, P>(32, 64), nn::relu<D, P>(), nn::dropout<D, P>(0.5f, /*seed=*/1),
                       nn::linear<D, P>(64, 4));
  model.reset_parameters(/*seed=*/7);
  auto test = pitfalls::make_data(256, 32, 4, /*seed=*/2);
  const auto x = std::as_const(test.x).view();

  // "Evaluation" with the training forward, twice over the same samples.
  locus::tensor<float, D, 2> first = model.forward(x).clone();
  locus::tensor<float, D, 2> second = model.forward(x).clone();
  // What the model predicts: the inference forward.
  locus::tensor<float, D, 2> inferred = model.infer(x);

  const locus::tensor<bool, D, 2> disagree = first != second;
  const auto classes = locus::argmax(first, 1), real = locus::argmax(inferred, 1);
  const locus::tensor<bool, D, 1> wrong = classes != real;
  std::printf("evaluating with forward(), the training forward, on %lld samples:\n", (long long)x.extent(0));
  std::printf("  two passes over the same samples disagree on %lld of %lld logits\n",
              (long long)locus::sum(disagree).item(), (long long)first.numel());
  std::printf("  the predicted classes differ from infer()'s for %lld samples\n", (long long)locus::sum(wrong).item());
  std::printf("  dropout's random stream advanced %llu times, so the training that follows draws other masks\n",
              (unsigned long long)model.get<2>().counter());
}
