// pitfall-check: compile
// The mistake: a program for a CPU-only machine loads a checkpoint the way the GPU
// training script did, onto cuda (PyTorch: torch.load(path) of a file saved from cuda
// tensors, without map_location). locus: the device a file is loaded onto is a type,
// io::load<D>(path), and must be the device of the trainer it restores.
#include <locus/train.hpp>

int main() {
  using D = locus::cpu;  // the CPU-only machine
  using P = locus::amp::fp32;
  locus::nn::sequential model(locus::nn::linear<D, P>(32, 64), locus::nn::relu<D, P>(),
                              locus::nn::linear<D, P>(64, 4));
  locus::optim::adamw<D> opt(model.parameters());
  locus::train::trainer t(model, opt, locus::nn::cross_entropy{});
  auto epoch = locus::train::load_checkpoint(locus::io::load<locus::cuda>("ckpt/last.safetensors"), t);
  return static_cast<int>(epoch);
}
