// expect: error: .*locus: softmax needs rank >= 1 .it normalises along an axis., but got a rank-0 value; give it an axis first
// Rule: softmax normalises along an axis, which a rank-0 tensor does not have.
#include <locus/locus.hpp>

auto f(const locus::tensor<float, locus::cpu, 0>& s, const locus::tensor<float, locus::cpu, 1>& v) {
#ifdef LOCUS_VIOLATION
  (void)v;
  return locus::softmax(s, 0);
#else
  (void)s;
  return locus::softmax(v, 0);
#endif
}
