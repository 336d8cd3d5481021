// expect: error: .*locus: a module's layer lives on another device than the module
// Rule: a module's parameters live on one device: a layer of another device does not
// compile.
#include <locus/nn/module.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
#ifdef LOCUS_VIOLATION
  locus::nn::layer<locus::nn::linear<locus::pinned, P>> fc{this, "fc", 4, 2};
#else
  locus::nn::layer<locus::nn::linear<D, P>> fc{this, "fc", 4, 2};
#endif
  auto forward(const typename net::template var<2>& x) { return fc(x); }
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
