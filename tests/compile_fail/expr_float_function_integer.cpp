// expect: error: .*locus: this function needs a floating-point dtype .f32, f64, f16, bf16.; convert integers first with locus::cast<float>\(x\)
// Rule: exp, log, sqrt, tanh, sigmoid, gelu, ... of an integer tensor do not compile
// (no silent integer result, no silent promotion).
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 1>& counts) {
#ifdef LOCUS_VIOLATION
  return locus::log(counts);
#else
  return locus::log(locus::cast<float>(counts));
#endif
}
