// pitfall-check: compile
// The mistake: reading GPU memory from the host as if it were host memory (PyTorch:
// logits.numpy() on a cuda tensor). locus: element access, span() and data() exist only
// for host-accessible devices, decided by the tensor's own device.
#include <locus/locus.hpp>

#include <cstdio>
#include <span>

int main() {
  locus::tensor<float, locus::cuda, 2> logits = locus::to<locus::cuda>(locus::randn<float, locus::cpu>({8, 4}, /*seed=*/1));
  std::span<float> values = logits.span();  // PyTorch: logits.numpy()
  std::printf("%f\n", values[0]);
}
