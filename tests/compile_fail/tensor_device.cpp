// expect: error: .*locus: tensor device must be locus::cpu, locus::pinned or locus::cuda
// Rule: the device parameter is one of locus's device tags.
#include <locus/tensor/tensor.hpp>

struct gpu {};

#ifdef LOCUS_VIOLATION
using device = gpu;
#else
using device = locus::cpu;
#endif
locus::tensor<float, device, 1> t;
