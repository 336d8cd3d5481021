// expect: error: .*locus: from_host takes host data with contiguous storage \(std::vector, std::array, std::span, a C array\), but the argument has no data\(\) and size\(\)
// Rule: from_host of a container without contiguous storage (std::list, std::deque, a
// std::set) is one static_assert naming the fix, not a list of candidates.
#include <list>
#include <vector>

#include <locus/locus.hpp>

int main() {
  const std::list<float> values{1.0f, 2.0f, 3.0f};
#ifdef LOCUS_VIOLATION
  auto t = locus::from_host<locus::cpu>(values, {3});
#else
  const std::vector<float> copy(values.begin(), values.end());
  auto t = locus::from_host<locus::cpu>(copy, {3});
#endif
  return static_cast<int>(t.numel());
}
