// expect: error: .*locus: a shape cannot be a std::vector: the rank is part of the tensor's type
// Rule: a tensor's rank is in its type; a shape comes as braces or locus::extents<R>.
#include <locus/tensor/factories.hpp>

#include <cstdint>
#include <vector>

void f(const std::vector<std::int64_t>& s) {
#ifdef LOCUS_VIOLATION
  auto t = locus::zeros<float, locus::cpu>(s);
#else
  auto t = locus::zeros<float, locus::cpu>(locus::extents<2>{s[0], s[1]});
#endif
  (void)t;
}
