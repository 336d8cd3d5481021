// expect: error: .*locus: linear needs x of rank 2 .\[N, K\]: N rows of K input features.; flatten leading axes first
// Rule: linear takes a rank-2 input [N, K]; a batch of sequences [B, T, K] is flattened
// explicitly (no hidden reshape).
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 3>& x, const locus::tensor<float, locus::cpu, 2>& w) {
#ifdef LOCUS_VIOLATION
  return locus::linear(x, w);
#else
  return locus::linear(x.reshape({x.extent(0) * x.extent(1), x.extent(2)}), w);
#endif
}
