// expect: error: .*locus: nn::embedding got ids of a tape of another compute dtype than its table.s precision policy
// Rule: an embedding computes in its module's precision policy (its table lives in the module's store).
#include <locus/nn/embedding.hpp>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::embedding<D, locus::amp::bf16_mixed> wte{this, "wte", 10, 4};
#else
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
#endif
  auto forward(const typename lm::template ids<2>& x) { return wte(x); }
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
