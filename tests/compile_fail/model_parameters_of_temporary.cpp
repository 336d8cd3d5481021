// expect: error: .*locus: parameters\(\) of a temporary model would dangle
// Rule: no reference into a model destroyed at the end of the statement (its parameter
// store's views, master() and grad(), would point into freed memory).
#include <locus/train.hpp>

using D = locus::cpu;
using P = locus::amp::fp32;
inline auto make() { return locus::nn::sequential(locus::nn::linear<D, P>(4, 3), locus::nn::relu<D, P>()); }

void f() {
#ifdef LOCUS_VIOLATION
  auto w = make().parameters().master();
#else
  auto m = make();
  auto w = m.parameters().master();
#endif
  (void)w;
}
