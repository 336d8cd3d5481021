// expect: error: .*locus: matmul_into\(\.\.\., locus::accumulate\) adds into an f32 or f64 destination
// Rule: accumulating into f16/bf16 would round every partial sum; gradient accumulation
// adds into f32 (f16/bf16 operands accumulate into an f32 destination).
#include <locus/ops/matmul.hpp>

void accumulate(locus::tensor<locus::bf16, locus::cpu, 2>& a, locus::tensor<locus::bf16, locus::cpu, 2>& b,
                locus::tensor<locus::bf16, locus::cpu, 2>& c16, locus::tensor<float, locus::cpu, 2>& c32) {
#ifdef LOCUS_VIOLATION
  (void)c32;
  locus::matmul_into(c16, a, b, locus::accumulate);
#else
  (void)c16;
  locus::matmul_into(c32, a, b, locus::accumulate);
#endif
}
