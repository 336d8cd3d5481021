// expect: error: .*locus: rand and randn produce floating-point values; use f32, f64, f16 or bf16
// Rule: random draws are floating point; an integer tensor of uniform [0, 1) values
// would be all zeros.
#include <locus/tensor/factories.hpp>

int main() {
#ifdef LOCUS_VIOLATION
  auto t = locus::rand<std::int32_t, locus::cpu>({4}, 42);
#else
  auto t = locus::rand<float, locus::cpu>({4}, 42);
#endif
  return static_cast<int>(t.numel());
}
