// expect: error: .*locus: an expression is lazy and has no values to print yet; evaluate it first
// Rule: an expression has no values until it is evaluated.
#include <iostream>
#include <locus/ops/expr.hpp>
#include <locus/tensor/print.hpp>

void f(const locus::tensor<float, locus::cpu, 2>& a) {
#ifdef LOCUS_VIOLATION
  std::cout << a * 2.0f;
#else
  std::cout << locus::eval(a * 2.0f);
#endif
}
