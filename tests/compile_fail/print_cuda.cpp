// expect: error: .*locus: only host memory prints, but this tensor lives on cuda; copy it first
// Rule: printing reads the elements, so a cuda tensor is copied to the host first.
#include <iostream>
#include <locus/tensor/print.hpp>
#include <locus/transfer/copy.hpp>

void f(const locus::tensor<float, locus::cuda, 2>& g) {
#ifdef LOCUS_VIOLATION
  std::cout << g;
#else
  std::cout << locus::to<locus::cpu>(g);
#endif
}
