// expect: error: .*locus: nn::embedding takes a forward's ids \(ag::ids
// Rule: a tensor enters a forward through its tape (tape.ids(x), or the model's argument), not by a layer call.
#include <locus/nn/embedding.hpp>

#include <cstdint>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
  locus::tensor<std::int64_t, D, 2> held{locus::extents<2>{2, 3}};
#ifdef LOCUS_VIOLATION
  auto forward(const typename lm::template ids<2>&) { return wte(held); }
#else
  auto forward(const typename lm::template ids<2>& x) { return wte(x); }
#endif
};

void f() { locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m; }
