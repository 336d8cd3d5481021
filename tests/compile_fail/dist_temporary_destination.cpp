// expect: error: .*locus: a collective's destination is a temporary tensor, so its result would be lost
// Rule: reducing into a temporary tensor loses the result; a view of a named tensor is fine.
#include <locus/dist/communicator.hpp>

void f(locus::dist::communicator<locus::cpu>& c, locus::tensor<float, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  c.all_reduce(locus::zeros<float, locus::cpu>({3}));
  (void)t;
#else
  c.all_reduce(t.view());  // a view (an rvalue) of a named tensor
#endif
}
