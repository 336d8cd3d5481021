// expect: error: .*locus: copy\(\)'s destination is a temporary tensor, so the copy would be lost
// Rule: a copy into a temporary tensor (dst.clone(), to<cpu>(dst)) is lost with it.
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cpu, 1>& src, locus::tensor<float, locus::cpu, 1>& dst) {
#ifdef LOCUS_VIOLATION
  locus::copy(src, dst.clone());
#else
  locus::copy(src, dst);
#endif
}
