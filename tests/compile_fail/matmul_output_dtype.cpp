// expect: error: .*locus: a matmul or linear result has the inputs. dtype, or f32 for f16 or bf16 inputs
// Rule: matmul<OutT> produces the inputs' dtype, or f32 for f16/bf16 inputs (the
// accumulation dtype); any other output dtype is a cast the caller writes.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<float, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::matmul<double>(a, b);
#else
  return locus::matmul<float>(a, b);
#endif
}
