// expect: error: .*locus: one_hot needs integer labels .i64, i32 or u8., but got a floating or bool dtype; convert first: locus::one_hot\(locus::eval\(locus::cast<std::int64_t>\(labels\)\), classes\)
// Rule: labels are integers; a floating-point label is never truncated silently.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 1>& y, const locus::tensor<std::int64_t, locus::cpu, 1>& labels) {
#ifdef LOCUS_VIOLATION
  (void)labels;
  return locus::one_hot(y, 10);
#else
  (void)y;
  return locus::one_hot(labels, 10);
#endif
}
