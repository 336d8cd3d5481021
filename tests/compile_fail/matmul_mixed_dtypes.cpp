// expect: error: .*locus: matmul operands have different dtypes .f32 and bf16.; convert one into a tensor first: locus::eval\(locus::cast<locus::bf16>\(a\)\)
// Rule: a GEMM's operands share one dtype; the suggested fix (eval of a cast, since
// matmul takes tensors) is what the control compiles.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<float, locus::cpu, 2>& a, const locus::tensor<locus::bf16, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::matmul(a, b);
#else
  return locus::matmul(locus::eval(locus::cast<locus::bf16>(a)), b);
#endif
}
