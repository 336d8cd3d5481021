// expect: error: .*locus: MPI has no sum of bf16 or f16; all_reduce an f32 copy
// Rule: MPI cannot add bf16 or f16; broadcasting them (bytes) is fine.
#include <locus/dist/communicator.hpp>

void f(locus::dist::communicator<locus::cpu>& c, locus::tensor<locus::bf16, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  c.all_reduce(t);
#else
  c.broadcast(t, 0);
#endif
}
