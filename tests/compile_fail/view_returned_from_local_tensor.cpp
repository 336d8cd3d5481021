// expect: error: .*locus: a tensor_view of a temporary tensor would dangle
// Rule: a function returning a view cannot return its local tensor as that view (C++20
// treats the returned local as an rvalue, so the conversion from a temporary refuses it).
// `return t.view();` of a local is not caught: see docs/guarantees.md, "Not checked".
#include <locus/tensor/factories.hpp>

locus::tensor_view<float, locus::cpu, 1> make(locus::tensor<float, locus::cpu, 1>& keep) {
#ifdef LOCUS_VIOLATION
  auto t = locus::ones<float, locus::cpu>({4});
  return t;
#else
  keep = locus::ones<float, locus::cpu>({4});
  return keep;
#endif
}
