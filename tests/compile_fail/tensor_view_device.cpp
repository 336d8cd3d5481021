// expect: error: .*locus: tensor_view device must be locus::cpu, locus::pinned or locus::cuda
// Rule: the device parameter of a view is one of locus's device tags.
#include <locus/tensor/tensor.hpp>

struct gpu {};

#ifdef LOCUS_VIOLATION
using device = gpu;
#else
using device = locus::pinned;
#endif
locus::tensor_view<float, device, 1> v;
