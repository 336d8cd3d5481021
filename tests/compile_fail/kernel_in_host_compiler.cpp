// expect: error: .*locus: launching a kernel on cuda needs nvcc, but this file is compiled by a host compiler; move this code into a .cu file
// Rule: kernels on cuda are instantiated only in files nvcc compiles. Allocating,
// zeroing (a memset) and copying cuda tensors work in host-compiled files.
#include <locus/tensor/factories.hpp>

int main() {
#ifdef LOCUS_VIOLATION
  auto t = locus::ones<float, locus::cuda>({4});
#else
  auto t = locus::zeros<float, locus::cuda>({4});
#endif
  return static_cast<int>(t.numel());
}
