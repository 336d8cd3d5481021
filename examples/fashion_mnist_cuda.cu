// The main job on cuda: the one instantiation of fashion_mnist_job.hpp that launches
// kernels, so the one nvcc builds (CMake: FASHION_MNIST_HAS_CUDA=1 with CUDA enabled).
// main and the cpu job are fashion_mnist.cpp, built by the host compiler.
#include "fashion_mnist_job.hpp"

int fashion_mnist::job::run_cuda(const config& c, const std::string& precision) {
  return run_device<locus::cuda>(c, precision);
}
