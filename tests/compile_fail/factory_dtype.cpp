// expect: error: .*locus: tensor element type must be one of f32, f64, i32, i64, u8, bool, f16, bf16
// Rule: the factories (zeros, ones, full, rand, randn, arange, from_host) make tensors of
// locus's dtypes only, and say so with the tensor's own message, not a candidate list.
#include <cstdint>
#include <vector>

#include <locus/locus.hpp>

#ifdef LOCUS_VIOLATION
using element = std::int16_t;
#else
using element = std::int32_t;
#endif

int main() {
  auto z = locus::zeros<element, locus::cpu>({2, 3});
  std::vector<element> host(6);
  auto h = locus::from_host<locus::cpu>(host, {2, 3});
  return static_cast<int>(z.numel() + h.numel());
}
