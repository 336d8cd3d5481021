// expect: error: .*locus: linear takes tensors or tensor_views .x, w and the optional bias b.; evaluate an expression first
// Rule: linear's operands are memory; a lazy expression is evaluated explicitly first.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& x, const locus::tensor<float, locus::cpu, 2>& w) {
#ifdef LOCUS_VIOLATION
  return locus::linear(x * 0.5f, w);
#else
  const auto xs = locus::eval(x * 0.5f);
  return locus::linear(xs, w);
#endif
}
