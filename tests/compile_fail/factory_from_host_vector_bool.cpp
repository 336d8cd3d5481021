// expect: error: .*locus: from_host got a std::vector<bool>, which is bit-packed and has no data\(\) to copy from; copy it into a contiguous container first
// Rule: from_host of a std::vector<bool> (bit-packed, no data()) is one static_assert
// naming the fix, not a 40-line list of candidates.
#include <cstdint>
#include <vector>

#include <locus/locus.hpp>

int main() {
  const std::vector<bool> mask{true, false, true, true};
#ifdef LOCUS_VIOLATION
  auto t = locus::from_host<locus::cpu>(mask, {4});
#else
  const std::vector<std::uint8_t> bytes(mask.begin(), mask.end());
  locus::tensor<bool, locus::cpu, 1> t = locus::cast<bool>(locus::from_host<locus::cpu>(bytes, {4}));
#endif
  return static_cast<int>(t.numel());
}
