// expect: error: .*locus: a sequential model feeds a rank-4 activation \[batch, channels, height, width\] into a layer that takes rank 2 \[batch, features\] \(such as linear\); insert locus::nn::flatten<D, P>\(\)
// Rule: ranks flow through a model's type: a linear layer after a convolution needs a
// flatten between them (PyTorch finds this at the first batch, as a shape error).
#include <locus/nn/conv.hpp>

void build() {
  using D = locus::cpu;
  using P = locus::amp::fp32;
#ifdef LOCUS_VIOLATION
  locus::nn::sequential m(locus::nn::conv2d<D, P>(1, 8, 3), locus::nn::relu<D, P>(),
                          locus::nn::linear<D, P>(8 * 26 * 26, 10));
#else
  locus::nn::sequential m(locus::nn::conv2d<D, P>(1, 8, 3), locus::nn::relu<D, P>(), locus::nn::flatten<D, P>(),
                          locus::nn::linear<D, P>(8 * 26 * 26, 10));
#endif
  (void)m;
}
