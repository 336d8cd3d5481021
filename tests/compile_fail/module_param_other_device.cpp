// expect: error: .*locus: an nn::param lives on another device or precision policy than its module
// Rule: a module's own parameter lives on the module's device (in the model's one store).
#include <locus/nn/param.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::param<locus::pinned, P, 1> gain{this, "gain", {4}};
#else
  locus::nn::param<D, P, 1> gain{this, "gain", {4}};
#endif
  auto forward(const typename net::template var<2>& x) { return x; }
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
