// expect: error: .*locus: matmul needs a floating dtype .f32, f64, f16 or bf16.; convert integer operands into a tensor first: locus::eval\(locus::cast<float>\(x\)\)
// Rule: integer GEMMs (which overflow silently) and bool products do not compile.
#include <locus/ops/matmul.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 2>& a, const locus::tensor<std::int32_t, locus::cpu, 2>& b) {
#ifdef LOCUS_VIOLATION
  return locus::matmul(a, b);
#else
  const locus::tensor<float, locus::cpu, 2> af = locus::cast<float>(a), bf = locus::cast<float>(b);
  return locus::matmul(af, bf);
#endif
}
