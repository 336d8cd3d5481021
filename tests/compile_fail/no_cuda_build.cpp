// expect: error: .*locus: the cuda device needs a build with CUDA, but this one has LOCUS_ENABLE_CUDA=0
// Rule: naming cuda in a build without CUDA is a compile error, not a run-time surprise.
#define LOCUS_ENABLE_CUDA 0
#include <locus/tensor/tensor.hpp>

#ifdef LOCUS_VIOLATION
using device = locus::cuda;
#else
using device = locus::cpu;
#endif
locus::tensor<float, device, 1> t;
