// expect: error: .*locus: a sequential model mixes layers on cpu and pinned.*same device
// Rule: one model lives on one device; a layer built for another device would need a
// hidden transfer in every forward and backward.
#include <locus/nn/layers.hpp>

using P = locus::amp::fp32;

void build() {
#ifdef LOCUS_VIOLATION
  locus::nn::sequential m(locus::nn::linear<locus::cpu, P>(4, 3), locus::nn::relu<locus::pinned, P>());
#else
  locus::nn::sequential m(locus::nn::linear<locus::cpu, P>(4, 3), locus::nn::relu<locus::cpu, P>());
#endif
  (void)m;
}
