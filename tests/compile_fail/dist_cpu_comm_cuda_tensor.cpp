// expect: error: .*locus: communicator<cpu> \(MPI\) got a cuda tensor; reduce cuda tensors with locus::dist::communicator<locus::cuda> \(NCCL\)
// Rule: a communicator takes tensors of its own device only (MPI never reads device pointers).
#include <locus/dist/communicator.hpp>

void f(locus::dist::communicator<locus::cpu>& c, locus::tensor<float, locus::cuda, 1>& d,
       locus::tensor<float, locus::cpu, 1>& h) {
#ifdef LOCUS_VIOLATION
  c.all_reduce(d);
  (void)h;
#else
  c.all_reduce(h);
  (void)d;
#endif
}
