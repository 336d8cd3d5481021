// The fix: copy the result to host memory first, explicitly, then read it:
// locus::to<locus::cpu>(t) (PyTorch: t.cpu().numpy()). The copy waits for the work that
// produced t; on a host device it is an ordinary copy, so the same code runs everywhere.
// Copy what you need, not the whole model state: here the predicted classes (i64 [n])
// and one rank-0 accuracy, not the logits. Runs on the best available device (cuda on a
// GPU machine, cpu here; LOCUS_DEVICE or `fixed cpu` chooses); compiled by nvcc in a
// CUDA build.
#include <locus/locus.hpp>

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "synthetic.hpp"

int main(int argc, char** argv) {
  const auto choice = argc > 1 ? locus::parse_device_choice(argv[1]) : locus::device_choice::automatic;
  return locus::with_device(choice, [](auto device) -> int {
    using D = decltype(device);
    auto data = pitfalls::make_data(1000, 32, 4, /*seed=*/3);

    // Work on D: logits of a fixed linear scorer, the predicted classes, the accuracy.
    locus::tensor<float, D, 2> x = locus::to<D>(data.x);
    locus::tensor<std::int64_t, D, 1> y = locus::to<D>(data.y);
    locus::tensor<float, D, 2> w = locus::to<D>(locus::randn<float, locus::cpu>({32, 4}, /*seed=*/1000));
    auto logits = locus::matmul(x, w);
    auto predicted = locus::argmax(logits, 1);                            // i64 [n], on D
    locus::tensor<bool, D, 1> right = predicted == y;
    auto correct = locus::sum(right);                                     // i64, rank 0, on D

    // Reading results: explicit copies to host memory.
    locus::tensor<std::int64_t, locus::cpu, 1> host = locus::to<locus::cpu>(predicted);
    std::span<const std::int64_t> classes = std::as_const(host).span();   // PyTorch: predicted.cpu().numpy()
    const std::int64_t n_correct = locus::to<locus::cpu>(correct).item(); // PyTorch: correct.item()
    std::printf("on %s: first predictions %lld %lld %lld %lld, %lld of %lld correct\n", std::string(D::name).c_str(),
                (long long)classes[0], (long long)classes[1], (long long)classes[2], (long long)classes[3],
                (long long)n_correct, (long long)classes.size());
    // The scorer is the rule that made the labels (on the host), so the predictions are
    // right but for rounding near a tie (a GPU's GEMM may sum in another order).
    if (n_correct < 990) {
      std::printf("fixed: expected at least 990 right predictions\n");
      return 1;
    }
    return 0;
  });
}
