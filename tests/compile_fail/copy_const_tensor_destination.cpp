// expect: error: .*locus: copy destination is a const tensor .std::as_const\(t\), or a const& parameter., and copy writes into it; pass a mutable tensor
// Rule: a const tensor is read-only: copy() does not write into it.
#include <utility>

#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& a, locus::tensor<float, locus::cpu, 1>& c) {
#ifdef LOCUS_VIOLATION
  locus::copy(a, std::as_const(c));
#else
  locus::copy(a, c);
#endif
}
