// expect: error: .*locus: a raw pointer becomes a view only through locus::unsafe_view<D>\(p, shape\)
// Rule: raw pointers enter through one greppable door, locus::unsafe_view<D>, never an ordinary constructor.
#include <locus/tensor/tensor.hpp>

void f(locus::tensor<float, locus::cuda, 1>& g) {
#ifdef LOCUS_VIOLATION
  locus::tensor_view<float, locus::cpu, 1> v(g.data_handle(), {4}); (void)v;
#else
  auto v = locus::unsafe_view<locus::cuda>(g.data_handle(), {4}); (void)v;
#endif
}
