// expect: error: .*locus: a recurrent layer \(nn::lstm, nn::gru\) takes a sequence of rank 3
// Rule: nn::lstm runs over [T, B, features] (or [B, T, features] with batch_first).
#include <locus/nn/recurrent.hpp>

template <class D, class P>
struct net : locus::nn::module<D, P> {
  locus::nn::lstm<D, P> rnn{this, "rnn", 3, 5};
#ifdef LOCUS_VIOLATION
  auto forward(const typename net::template var<2>& x) { return rnn(x); }
#else
  auto forward(const typename net::template var<3>& x) { return rnn(x); }
#endif
};

void f() { locus::nn::model<net<locus::cpu, locus::amp::fp32>> m; }
