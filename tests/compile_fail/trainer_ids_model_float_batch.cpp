// expect: error: .*locus: this model's forward takes integer token ids
// Rule: a model over token ids trains on integer batches, not on floating-point features.
#include <locus/nn/embedding.hpp>
#include <locus/train.hpp>

#include <cstdint>

template <class D, class P>
struct lm : locus::nn::module<D, P> {
  locus::nn::embedding<D, P> wte{this, "wte", 10, 4};
  auto forward(const typename lm::template ids<1>& x) { return wte(x); }
};

void f() {
  locus::nn::model<lm<locus::cpu, locus::amp::fp32>> m;
  locus::optim::adamw<locus::cpu> opt(m.parameters());
  locus::train::trainer t(m, opt, locus::nn::cross_entropy{});
  const auto y = locus::zeros<std::int64_t, locus::cpu>({3});
#ifdef LOCUS_VIOLATION
  const auto x = locus::zeros<float, locus::cpu>({3});
#else
  const auto x = locus::zeros<std::int32_t, locus::cpu>({3});
#endif
  t.step(x, y);
}
