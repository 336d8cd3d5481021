// expect: error: .*locus: linear needs w of rank 2 .\[M, K\]: out_features x in_features.*; make a vector of K weights one row: w.reshape\(\{1, K\}\)
// Rule: the weight of linear is a matrix [out_features, in_features] (PyTorch's layout).
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 1>& w) {
#ifdef LOCUS_VIOLATION
  return locus::linear(x, w);
#else
  return locus::linear(x, w.reshape({1, w.numel()}));
#endif
}
