// expect: error: .*locus: building a tensor from a tensor_view would copy its memory; write v.clone\(\)
// Rule: a view becomes an owning tensor only through an explicit copy.
#include <locus/transfer/copy.hpp>

locus::tensor<float, locus::cpu, 2> f(locus::tensor_view<float, locus::cpu, 2> v) {
#ifdef LOCUS_VIOLATION
  locus::tensor<float, locus::cpu, 2> t = v;
#else
  locus::tensor<float, locus::cpu, 2> t = locus::to<locus::cpu>(v);
#endif
  return t;
}
