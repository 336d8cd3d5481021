// expect: error: .*locus: a sequential model needs at least one layer, but it was given none
// Rule: a model without layers has no device, no policy and no output: it does not
// compile.
#include <locus/nn/layers.hpp>

using P = locus::amp::fp32;

void build() {
#ifdef LOCUS_VIOLATION
  locus::nn::sequential m;
#else
  locus::nn::sequential m(locus::nn::linear<locus::cpu, P>(4, 3));
#endif
  (void)m;
}
