// expect: error: .*locus: nn::multi_head_attention<D, P, Width, Heads>: Width / Heads is over 256 features per head
// Rule: with the sizes as template arguments, heads wider than the fused attention takes do not compile.
#include <locus/nn/attention.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::multi_head_attention<D, P, 512, 1> attn{this, "attn"};
#else
  locus::nn::multi_head_attention<D, P, 512, 2> attn{this, "attn"};
#endif
  auto forward(const typename net::template var<3>& x) { return attn(x); }
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
