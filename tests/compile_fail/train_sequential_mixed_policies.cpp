// expect: error: .*locus: a sequential model mixes precision policies
// Rule: one model computes in one precision policy (its layers share the parameter
// store's master and compute dtypes).
#include <locus/nn/layers.hpp>

void build() {
  using F = locus::amp::fp32;
#ifdef LOCUS_VIOLATION
  using B = locus::amp::bf16_mixed;
#else
  using B = locus::amp::fp32;
#endif
  locus::nn::sequential m(locus::nn::linear<locus::cpu, F>(4, 3), locus::nn::relu<locus::cpu, B>());
  (void)m;
}
