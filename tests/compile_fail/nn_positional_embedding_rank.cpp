// expect: error: .*locus: nn::positional_embedding adds positions to a value \[batch, time, dim\] of rank 3
// Rule: learned positions are added along the time axis of [batch, time, dim].
#include <locus/nn/embedding.hpp>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
  locus::nn::positional_embedding<D, P> wpe{this, "wpe", 8, 4};
#ifdef LOCUS_VIOLATION
  auto forward(const typename lm::template ids<1>& x) { return wpe(wte(x)); }
#else
  auto forward(const typename lm::template ids<2>& x) { return wpe(wte(x)); }
#endif
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
