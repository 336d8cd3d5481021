// pitfall-check: run-error
// The mistake: a batch whose training step does not fit in the device's memory (PyTorch:
// torch.OutOfMemoryError: CUDA out of memory). locus throws locus::out_of_memory with the
// device, the bytes requested, allocated and reserved, and the remedies; the weights are
// left as they were. To make this reproducible on any machine, the program caps the
// cpu allocator with locus::set_memory_limit<D> (a GPU with 4 MiB left for training); on
// cuda the same happens when the GPU's memory runs out.
#include <locus/train.hpp>

#include <cstdint>

int main() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
  locus::nn::sequential model(locus::nn::linear<D, P>(256, 256), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(256, 10));
  locus::optim::adamw<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  auto x = locus::zeros<float, D>({8192, 256});
  auto y = locus::zeros<std::int64_t, D>({8192});

  locus::set_memory_limit<D>(locus::memory_stats<D>().reserved_bytes + (4 << 20));  // 4 MiB left
  t.step(x, y);  // a batch of 8192
}
