// expect: error: .*locus: nn::embedding got ids of another device than its table; declare the embedding with its module.s device
// Rule: an embedding's table lives in its module's store (the module's device and policy).
#include <locus/nn/embedding.hpp>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::embedding<locus::pinned, P> wte{this, "wte", 10, 4};
#else
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
#endif
  auto forward(const typename lm::template ids<2>& x) { return wte(x); }
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
