// expect: error: .*locus: nn::multi_head_attention<D, P, Width, Heads>: Heads does not divide Width
// Rule: with the sizes as template arguments, heads that do not divide the width do not compile.
#include <locus/nn/attention.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::multi_head_attention<D, P, 96, 5> attn{this, "attn", {.causal = true}};
#else
  locus::nn::multi_head_attention<D, P, 96, 4> attn{this, "attn", {.causal = true}};
#endif
  auto forward(const typename net::template var<3>& x) { return attn(x); }
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
