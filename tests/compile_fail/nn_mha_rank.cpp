// expect: error: .*locus: nn::multi_head_attention takes sequences of rank 3
// Rule: attention runs over [T, B, E] (or [B, T, E]); a rank-2 value does not compile.
#include <locus/nn/attention.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
  locus::nn::multi_head_attention<D, P> attn{this, "attn", 8, 2, {.batch_first = true}};
#ifdef LOCUS_VIOLATION
  auto forward(const typename net::template var<3>& x) { return attn(locus::ag::reshape(x, locus::extents<2>{x.shape()[0] * x.shape()[1], 8})); }
#else
  auto forward(const typename net::template var<3>& x) { return attn(x); }
#endif
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
