// expect: error: .*locus: get<I>\(\) of a temporary model would dangle
// Rule: no reference into a model destroyed at the end of the statement.
#include <locus/train.hpp>

using D = locus::cpu;
using P = locus::amp::fp32;
inline auto make() { return locus::nn::sequential(locus::nn::linear<D, P>(4, 3), locus::nn::relu<D, P>()); }

void f() {
#ifdef LOCUS_VIOLATION
  auto& lin = make().get<0>();
#else
  auto m = make();
  auto& lin = m.get<0>();
#endif
  (void)lin;
}
