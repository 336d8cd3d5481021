// expect: error: .*locus: a collective's destination is a const tensor \(std::as_const\(t\), or a const& parameter\), and the collective writes into it
// Rule: all_reduce writes in place; a const tensor is not a destination.
#include <locus/dist/communicator.hpp>
#include <utility>

void f(locus::dist::communicator<locus::cpu>& c, locus::tensor<double, locus::cpu, 1>& t) {
#ifdef LOCUS_VIOLATION
  c.all_reduce(std::as_const(t));
#else
  c.all_reduce(t);
#endif
}
