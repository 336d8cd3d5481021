// expect: error: .*locus: a collective's destination is a view of const elements, and the collective writes into it
// Rule: broadcast writes into its argument; a view of const elements is read-only.
#include <locus/dist/communicator.hpp>
#include <utility>

void f(locus::dist::communicator<locus::cpu>& c, locus::tensor<float, locus::cpu, 2>& t) {
#ifdef LOCUS_VIOLATION
  c.broadcast(std::as_const(t).view(), 0);
#else
  c.broadcast(t.view(), 0);
#endif
}
