// pitfall-check: compile
// The mistake: an asynchronous copy to the GPU from pageable host memory (PyTorch:
// batch.to("cuda", non_blocking=True) on a tensor that was never pinned). The CUDA
// runtime then stages it through its own pinned buffer and the copy overlaps nothing.
// locus: the source of to_async / copy_async must be locus::pinned.
#include <locus/locus.hpp>

int main() {
  auto batch = locus::randn<float, locus::cpu>({256, 784}, /*seed=*/1);  // pageable host memory
  auto copy = locus::to_async<locus::cuda>(std::move(batch));             // non_blocking=True
  locus::tensor<float, locus::cuda, 2> x = std::move(copy).get();
}
