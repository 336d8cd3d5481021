// expect: error: .*locus: softmax needs a floating dtype; convert first with locus::cast<float>\(x\)
// Rule: softmax of integers (probabilities truncated to 0 or 1) does not compile.
#include <locus/locus.hpp>

auto f(const locus::tensor<std::int32_t, locus::cpu, 2>& scores) {
#ifdef LOCUS_VIOLATION
  return locus::log_softmax(scores, 1);
#else
  return locus::log_softmax(locus::cast<float>(scores), 1);
#endif
}
