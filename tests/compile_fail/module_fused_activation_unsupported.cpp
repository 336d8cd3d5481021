// expect: error: .*locus: this layer has no fused activation
// Rule: layer(x, ag::fused::...) fuses an activation into layers that have one (linear,
// batch_norm2d); on another layer (a convolution, a pooling) it does not compile.
#include <locus/nn/module.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
  locus::nn::layer<locus::nn::conv2d<D, P>> conv{this, "conv", 1, 2, 3};
  locus::nn::layer<locus::nn::batch_norm2d<D, P>> bn{this, "bn", 2};
  locus::nn::layer<locus::nn::flatten<D, P>> flat{this, "flat"};
  auto forward(const typename net::template var<4>& x) {
#ifdef LOCUS_VIOLATION
    return flat(bn(conv(x, locus::ag::fused::relu)));
#else
    return flat(bn(conv(x), locus::ag::fused::relu));
#endif
  }
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
