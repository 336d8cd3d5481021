// expect: error: .*locus: all_gather of rank-0 \(scalar\) tensors gathers them into a 1-D tensor of world_size elements; gather into auto out = locus::zeros<T, D>\(\{comm.world_size\(\)\}\)
// Rule: the ranks' scalars stack into a vector; the message names that (and no rank
// mismatch between two rank-0 tensors).
#include <locus/dist/communicator.hpp>

void f(locus::dist::communicator<locus::cpu>& comm, const locus::tensor<float, locus::cpu, 0>& s) {
#ifdef LOCUS_VIOLATION
  auto out = locus::full<float, locus::cpu>(locus::extents<0>{}, 0.0f);
#else
  auto out = locus::zeros<float, locus::cpu>({comm.world_size()});
#endif
  comm.all_gather(s, out);
}
