// expect: error: .*locus: backward\(\) needs a scalar \(rank-0\) loss, but this value has rank 2
// Rule: backward() only from a rank-0 loss (PyTorch finds "grad can be implicitly created
// only for scalar outputs" at run time).
#include <locus/ag/ops.hpp>

void f(locus::ag::tape<float, locus::cpu>& t, const locus::tensor<float, locus::cpu, 2>& x) {
  const auto y = locus::ag::relu(t.leaf(x));
#ifdef LOCUS_VIOLATION
  t.backward(y);
#else
  t.backward(locus::ag::mean(y));
#endif
}
