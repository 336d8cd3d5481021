// expect: error: .*locus: nn::embedding looks up integer token ids, but got a value of floating-point features
// Rule: an embedding's input is token ids (ag::ids), not floating-point features.
#include <locus/nn/embedding.hpp>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
#ifdef LOCUS_VIOLATION
  auto forward(const typename lm::template var<2>& x) { return wte(x); }
#else
  auto forward(const typename lm::template ids<2>& x) { return wte(x); }
#endif
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
