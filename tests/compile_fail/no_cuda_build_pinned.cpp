// expect: error: .*locus: the pinned device needs a build with CUDA, but this one has LOCUS_ENABLE_CUDA=0
// Rule: pinned (page-locked) memory needs the CUDA runtime too.
#define LOCUS_ENABLE_CUDA 0
#include <locus/tensor/factories.hpp>

int main() {
#ifdef LOCUS_VIOLATION
  auto t = locus::zeros<float, locus::pinned>({4});
#else
  auto t = locus::zeros<float, locus::cpu>({4});
#endif
  return static_cast<int>(t.numel());
}
