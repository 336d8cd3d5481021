// expect: error: .*locus: nn::multi_head_attention runs over a forward's values \(ag::var\), not tensors
// Rule: a tensor enters a forward through its tape; a layer takes the forward's values.
#include <locus/nn/attention.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
  locus::nn::multi_head_attention<D, P> attn{this, "attn", 8, 2};
  locus::tensor<typename P::compute, D, 3> extra = locus::zeros<typename P::compute, D>({1, 1, 8});
#ifdef LOCUS_VIOLATION
  auto forward(const typename net::template var<3>&) { return attn(extra); }
#else
  auto forward(const typename net::template var<3>& x) { return attn(x); }
#endif
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
