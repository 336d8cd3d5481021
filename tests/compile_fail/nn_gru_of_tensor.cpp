// expect: error: .*locus: a recurrent layer \(nn::lstm, nn::gru\) runs over a forward's value \(an ag::var\), not a tensor
// Rule: a tensor enters a forward through its tape; a layer takes the forward's values.
#include <locus/nn/recurrent.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
  locus::nn::gru<D, P> rnn{this, "rnn", 3, 5};
  locus::tensor<typename P::compute, D, 3> extra = locus::zeros<typename P::compute, D>({1, 1, 3});
#ifdef LOCUS_VIOLATION
  auto forward(const typename net::template var<3>&) { return rnn(extra); }
#else
  auto forward(const typename net::template var<3>& x) { return rnn(x); }
#endif
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
