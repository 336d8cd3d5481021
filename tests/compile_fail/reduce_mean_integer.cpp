// expect: error: .*locus: mean and var need a floating dtype; convert first with locus::cast<float>\(x\)
// Rule: the mean of integers is not an integer: mean and var do not truncate silently.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int64_t, locus::cpu, 1>& counts) {
#ifdef LOCUS_VIOLATION
  return locus::mean(counts);
#else
  return locus::mean(locus::cast<float>(counts));
#endif
}
