// expect: error: .*locus: linear's bias is f32 but its output is bf16; the bias is added in the output dtype
// Rule: the bias is added in the output's dtype, so it has that dtype; the control
// takes the message's second fix (an f32 output for bf16 inputs and an f32 bias).
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<locus::bf16, locus::cpu, 2>& x, const locus::tensor<locus::bf16, locus::cpu, 2>& w,
       const locus::tensor<float, locus::cpu, 1>& b) {
#ifdef LOCUS_VIOLATION
  return locus::linear(x, w, b);
#else
  return locus::linear<float>(x, w, b);
#endif
}
