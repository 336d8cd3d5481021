// expect: error: .*locus: nn::checkpoint recomputes a segment from a value \(ag::var\), not from token ids
// Rule: activation checkpointing wraps a segment over values; token ids are the model's input.
#include <locus/nn/embedding.hpp>

template <class D, class P>
struct embed : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
  auto forward(const typename embed::template ids<1>& x) { return wte(x); }
};
template <class D, class P>
struct lm : locus::nn::module<D, P> {
  locus::nn::child<embed<D, P>> e{this, "e"};
  locus::nn::layer<locus::nn::linear<D, P>> fc{this, "fc", 4, 10};
#ifdef LOCUS_VIOLATION
  auto forward(const typename lm::template ids<1>& x) { return fc(locus::nn::checkpoint(e, x)); }
#else
  auto forward(const typename lm::template ids<1>& x) { return fc(e(x)); }
#endif
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
