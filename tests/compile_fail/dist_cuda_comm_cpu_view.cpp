// expect: error: .*locus: communicator<cuda> \(NCCL\) got a cpu tensor; reduce host tensors with locus::dist::communicator<locus::cpu> \(MPI\)
// Rule: NCCL takes device memory only; a host view into communicator<cuda> does not compile.
#include <locus/dist/communicator.hpp>

void f(locus::dist::communicator<locus::cuda>& c, locus::tensor<float, locus::cuda, 2>& d,
       locus::tensor<float, locus::cpu, 2>& h) {
#ifdef LOCUS_VIOLATION
  c.broadcast(h.view(), 0);
  (void)d;
#else
  c.broadcast(d.view(), 0);
  (void)h;
#endif
}
