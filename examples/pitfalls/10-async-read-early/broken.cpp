// pitfall-check: compile
// The mistake: using the destination of an asynchronous copy before the copy has
// arrived (PyTorch: y = x.to("cpu", non_blocking=True), then reading y without
// torch.cuda.synchronize() or an event). locus: to_async returns a locus::pending that
// owns the destination; it does not convert to the tensor, and no accessor reads it:
// only get(), which waits for the copy.
#include <locus/locus.hpp>

int main() {
  locus::tensor<float, locus::cuda, 2> logits = locus::to<locus::cuda>(locus::randn<float, locus::cpu>({256, 10}, /*seed=*/1));
  locus::tensor<float, locus::pinned, 2> host = locus::to_async<locus::pinned>(logits);  // still in flight
  return host(0, 0) > 0.0f;
}
